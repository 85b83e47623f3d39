"""Timing and memory harness shared by every workload.

Every system runs in a subprocess of its own (``python -m jask.bench.harness
TASKS.json RESULTS.json``), so one system's imports, caches and freed-but-kept
heap never count against another. Inside the child, per task:

1. the runner imports its libraries; then the baseline RSS is taken and the
   kernel's high-water mark is reset (``/proc/self/clear_refs``), and again
   after setup, so the peaks of setup and of the runs are known apart;
2. ``setup`` (untimed: opening stores, or loading them for in-RAM peers);
3. one untimed warm-up repetition (compiles), unless the runner opts out;
4. ``--repeat`` timed repetitions, each preceded, untimed, by putting the
   page cache in the requested state: ``cold`` drops every file of the task's
   inputs and work folder with ``posix_fadvise(POSIX_FADV_DONTNEED)`` after an
   ``os.sync()``; ``warm`` reads them all once. Fewer repetitions run when they
   would exceed the task's time cap;
5. ``check``: numbers that must agree between systems (untimed; right after
   the first repetition for workloads whose state advances every run).

Reported per task: every repetition's wall time, the peak RSS growth over the
baseline (of setup and of the runs, and the larger of the two), and per repetition the
bytes the process read and wrote through system calls (``rchar``/``wchar`` of
``/proc/self/io``, page-cache hits included) and from the block device
(``read_bytes``/``write_bytes``).

The data helpers every workload shares are :mod:`jask.bench.data`.
"""
from __future__ import annotations

import dataclasses
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

from jask.bench import data
from jask.io.memstat import reset_peak_rss, status_bytes

GB = 1e9
MB = 1e6
GiB = 2**30


@dataclasses.dataclass
class Task:
    """One (workload, size, cache state, system) measurement, as sent to the child process."""

    workload: str
    size: str
    params: dict
    system: str
    paths: dict
    work_dir: str
    cache: str = "cold"
    repeat: int = 3
    warmup: int = 1
    budget: str = "256MB"
    tile: int = 1024
    backend: str = "auto"
    time_cap: float = 60.0
    allow_tmpfs: bool = False
    devices: int = 1               # jask: local devices a pass spreads over (CPU: forced host devices)
    processes: int = 1             # jask: processes of a jax.distributed run on loopback sharing each pass
    read_mmap: str = "auto"        # jask: the read_mmap setting (whole chunks read as maps): off, on, auto


# ---------------------------------------------------------------- memory and I/O counters

def bench_dir(*parts: str) -> str:
    """Default place for benchmark files: ``$JASK_BENCH_DIR``, else ``bench-out`` in the working directory.

    One folder (ignored by git) for everything the benchmarks write:
    ``results/`` for reports, ``data/`` for the stores they generate.
    """
    return os.path.join(os.environ.get("JASK_BENCH_DIR") or "bench-out", *parts)


def remove_empty_dirs(*paths: str) -> None:
    """Remove each folder that exists and is empty, in order (pass children before parents)."""
    for path in paths:
        try:
            os.rmdir(path)
        except OSError:
            pass


def rss() -> int:
    return status_bytes("VmRSS:") or 0


def hwm() -> int:
    return status_bytes("VmHWM:") or 0


reset_hwm = reset_peak_rss   # the kernel's peak-RSS mark back to the current RSS (Linux ``clear_refs``)


def proc_io() -> dict:
    out = {}
    try:
        with open("/proc/self/io") as f:
            for line in f:
                k, v = line.split(":")
                out[k.strip()] = int(v)
    except OSError:
        pass
    return out


# ---------------------------------------------------------------- the child

def jask_source_digest() -> str:
    """Short sha1 of jask's own sources outside ``jask/bench``: which jask code a result ran on."""
    import hashlib
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha1()
    for dirpath, dirnames, names in sorted(os.walk(pkg)):
        dirnames[:] = sorted(d for d in dirnames if d not in ("bench", "__pycache__"))
        for name in sorted(n for n in names if n.endswith(".py")):
            with open(os.path.join(dirpath, name), "rb") as f:
                digest.update(name.encode() + f.read())
    return digest.hexdigest()[:12]


def prepare_cache(runner, cache: str) -> None:
    paths = runner.cache_paths()
    if cache == "cold":
        data.drop_cache(paths)
    elif cache == "warm":
        data.warm_cache(paths)


def measure(task: Task) -> dict:
    """Run one task in this process; returns its raw measurements."""
    from jask.bench import workloads
    spec = workloads.get(task.workload).SYSTEMS[task.system]
    runner = spec(task)
    os.makedirs(task.work_dir, exist_ok=True)
    runner.imports()
    gc.collect()
    base = rss()
    resettable = reset_hwm()
    t0 = time.perf_counter()
    runner.setup()
    setup_s = time.perf_counter() - t0
    setup_peak = hwm() - base
    reset_hwm()
    result = dict(setup_s=setup_s, baseline_rss=base, hwm_resettable=resettable, first_s=None,
                  times=[], io=[], counters=[], run_peaks=[], check=None,
                  started=time.strftime("%H:%M:%S"), jask_source_sha1=jask_source_digest())
    spent = 0.0

    def checked_first():
        if runner.checks and runner.check_after_first_run and result["check"] is None:
            result["check"] = runner.check()

    if runner.warmup and task.warmup:
        prepare_cache(runner, task.cache)
        start_together(task, "warmup")
        t0 = time.perf_counter()
        runner.run()
        result["first_s"] = time.perf_counter() - t0   # not counted against time_cap: a 20-40 s compile
        # (a jit(grad) step on a TPU) would otherwise leave one timed run
        result["first_counters"] = runner.counters()
        result["run_peaks"].append(hwm() - base)
        checked_first()
    for i in range(task.repeat):
        # processes of one run stay in step (their passes meet in collectives): no time cap there
        if result["times"] and spent + result["times"][-1] > task.time_cap and task.processes == 1:
            break
        prepare_cache(runner, task.cache)
        gc.collect()
        start_together(task, f"run-{i}")
        io0 = proc_io()
        t0 = time.perf_counter()
        runner.run()
        dt = time.perf_counter() - t0
        io1 = proc_io()
        spent += dt
        result["times"].append(dt)
        result["io"].append({k: io1[k] - io0.get(k, 0) for k in io1})
        result["counters"].append(runner.counters())
        result["run_peaks"].append(hwm() - base)
        checked_first()
    result["peak_rss_growth_setup"] = setup_peak
    result["peak_rss_growth_runs"] = max(result["run_peaks"] + [0])
    result["peak_rss_growth"] = max(setup_peak, result["peak_rss_growth_runs"])
    if runner.checks and result["check"] is None:
        result["check"] = runner.check()
    runner.cleanup()
    return result


def start_together(task: Task, name: str) -> None:
    """Wait for every process of a multi-process task, so each timed run starts in all at once: the
    clock of process 0 then counts the pass, not another process still warming its page cache."""
    if task.processes > 1:
        from jask.exec import multihost
        multihost.barrier(f"jask-bench-{task.workload}-{task.size}-{task.cache}-{name}", "start a timed run")


def child_main(tasks_file: str, results_file: str) -> None:
    with open(tasks_file) as f:
        tasks = [Task(**t) for t in json.load(f)]
    if os.environ.get("JASK_BENCH_COORDINATOR"):     # one process of a jax.distributed run (run_tasks)
        import jax
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=os.environ["JASK_BENCH_COORDINATOR"],
                                   num_processes=tasks[0].processes,
                                   process_id=int(os.environ["JASK_BENCH_PROCESS"]))
    results = []
    for task in tasks:
        try:
            r = measure(task)
        except BaseException as e:  # report and go on with the next task
            r = {"error": f"{type(e).__name__}: {e}".strip()[:2000],
                 "traceback": traceback.format_exc()[-4000:]}
            if isinstance(e, KeyboardInterrupt):
                raise
        r.update(task=dataclasses.asdict(task))
        results.append(r)
        with open(results_file + ".tmp", "w") as f:
            json.dump(results, f)
        os.replace(results_file + ".tmp", results_file)
        gc.collect()


# ---------------------------------------------------------------- the parent

def run_tasks(tasks: list[Task], timeout: float = 1800.0) -> list[dict]:
    """Run ``tasks`` one after another in one fresh subprocess; returns one result per task.

    A task the child did not finish (a crash, an out-of-memory kill, the
    timeout) gets a result with ``error`` set, holding the end of the child's
    stderr. Tasks with ``processes > 1`` run in that many children joined by
    ``jax.distributed`` on loopback; process 0's measurements are reported.
    """
    results = []
    for batch in _batches(tasks):
        results += _run_batch(batch, timeout)
    for task in tasks:
        shutil_rm(task.work_dir)
    return results


def _batches(tasks):
    """Consecutive tasks with the same process count, in order."""
    out = []
    for t in tasks:
        if out and out[-1][0].processes == t.processes:
            out[-1].append(t)
        else:
            out.append([t])
    return out


def _run_batch(tasks: list[Task], timeout: float) -> list[dict]:
    n = tasks[0].processes
    with tempfile.TemporaryDirectory(prefix="jask-bench-") as d:
        tin = os.path.join(d, "tasks.json")
        outs = [os.path.join(d, f"results-{i}.json") for i in range(n)]
        with open(tin, "w") as f:
            json.dump([dataclasses.asdict(t) for t in tasks], f)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
        n_devices = max(t.devices for t in tasks)
        if n_devices > 1 and "xla_force_host_platform_device_count" not in env.get("XLA_FLAGS", ""):
            # on a CPU-only machine the child gets this many host devices (accelerators ignore it)
            env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n_devices}".strip()
        if n > 1:
            env.update(JASK_BENCH_COORDINATOR=f"127.0.0.1:{free_port()}", JAX_PLATFORMS="cpu")
        procs = [subprocess.Popen([sys.executable, "-m", "jask.bench.harness", tin, outs[i]],
                                  env=dict(env, JASK_BENCH_PROCESS=str(i)), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for i in range(n)]
        err = None
        try:
            for i, proc in enumerate(procs):
                _, stderr = proc.communicate(timeout=timeout)
                if proc.returncode != 0 and err is None:
                    err = f"child {i} exited with status {proc.returncode}: " + _tail(stderr)
        except subprocess.TimeoutExpired as e:
            err = f"child timed out after {timeout:.0f} s: " + _tail(e.stderr)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        results = []
        if os.path.exists(outs[0]):
            with open(outs[0]) as f:
                results = json.load(f)
    for task in tasks[len(results):]:
        results.append({"task": dataclasses.asdict(task), "error": err or "no result"})
    return results


class NoLoopback(RuntimeError):
    """This machine refuses loopback TCP, which a multi-process run's ``jax.distributed`` needs."""


def loopback_problem() -> str | None:
    """Why this machine cannot run a multi-process benchmark (no loopback TCP), or None."""
    try:
        free_port()
    except NoLoopback as e:
        return str(e)
    return None


def free_port() -> int:
    """A free loopback TCP port, or :class:`NoLoopback` (the lent TPU machine's sandbox refuses IPv4 sockets)."""
    import socket
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    except OSError as e:
        raise NoLoopback(f"jax.distributed processes talk over loopback TCP, and this machine refuses a "
                         f"socket on 127.0.0.1 ({e})") from e


def _tail(text, n=1500) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    lines = [ln for ln in (text or "").splitlines() if "xla_bridge" not in ln and ln.strip()]
    return "\n".join(lines)[-n:]


def shutil_rm(path) -> None:
    import shutil
    shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------- summaries

def merge_rounds(raws: list[dict]) -> dict:
    """One raw result from a task's rounds (``--rounds``): their timed runs, I/O and counters together,
    the first round's warm-up and check, the largest peaks. An error in any round is the result."""
    for r in raws:
        if r.get("error") or "skipped" in r:
            return r
    out = dict(raws[0])
    for key in ("times", "io", "counters", "run_peaks"):
        out[key] = [x for r in raws for x in r.get(key) or []]
    for key in ("peak_rss_growth", "peak_rss_growth_setup", "peak_rss_growth_runs"):
        out[key] = max(r.get(key, 0) for r in raws)
    out["rounds"] = len(raws)
    return out


def summarize_result(r: dict, work: float) -> dict:
    """Median, min, max, throughput (``work`` per median second) and I/O of one raw result."""
    if r.get("error") or not r.get("times"):
        return {}
    t = r["times"]
    med = statistics.median(t)
    io = r.get("io") or [{}]
    pick = lambda k: statistics.median([x.get(k, 0) for x in io])  # noqa: E731
    return dict(median_s=med, min_s=min(t), max_s=max(t), runs=len(t), rate=work / med if med > 0 else None,
                peak_rss_growth_mb=r["peak_rss_growth"] / MB,
                peak_rss_growth_runs_mb=r.get("peak_rss_growth_runs", r["peak_rss_growth"]) / MB, read_gb=pick("rchar") / GB,
                written_gb=pick("wchar") / GB, disk_read_gb=pick("read_bytes") / GB,
                disk_written_gb=pick("write_bytes") / GB)


if __name__ == "__main__":
    child_main(sys.argv[1], sys.argv[2])
