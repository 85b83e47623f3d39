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

This module also holds the data helpers every workload shares: writing
uncompressed Zarr v3 stores, dropping or warming their pages, the raw
``readinto`` baseline and the checksums results are compared with.
"""
from __future__ import annotations

import dataclasses
import gc
import glob
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

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


# ---------------------------------------------------------------- stores

def create_store(path, shape, chunks, dtype=np.float32, shards=None):
    """A new, empty, uncompressed Zarr v3 array (replacing ``path``)."""
    import zarr
    return zarr.create_array(path, shape=tuple(int(s) for s in shape), chunks=tuple(int(c) for c in chunks),
                             shards=shards, dtype=np.dtype(dtype), compressors=None, fill_value=0,
                             zarr_format=3, overwrite=True)


def write_store(path, shape, tile, seed, scale=1.0, shift=0.0, layout="chunk"):
    """Write a float32 store of uniform values in ``[shift, shift + scale)`` with ``tile``-edge chunks.

    Data comes from a fixed random pool, offset per row slab, so writing is
    fast and every slab differs. ``layout="shard"`` puts each row of chunks in
    one shard file (the Zarr v3 sharding codec). Returns ``path``.
    """
    shape = tuple(int(s) for s in shape)
    chunks = tuple(min(tile, d) for d in shape)
    shards = (chunks[0],) + tuple(shape[1:]) if layout == "shard" else None
    z = create_store(path, shape, chunks, np.float32, shards=shards)
    rows = chunks[0]
    slab = rows * int(np.prod(shape[1:], dtype=np.int64))
    pool = (np.random.default_rng(seed).random(slab + 7919, dtype=np.float32) * np.float32(scale)
            + np.float32(shift))
    for s, start in enumerate(range(0, shape[0], rows)):
        n = min(rows, shape[0] - start)
        off = (s * 1009 + seed * 7) % 7919
        size = n * (slab // rows)
        z[start:start + n] = pool[off:off + size].reshape((n,) + shape[1:])
    return path


def read_store(path) -> np.ndarray:
    """The whole store as one NumPy array (only for arrays meant to fit in RAM)."""
    import zarr
    z = zarr.open_array(path, mode="r")
    out = np.empty(z.shape, z.dtype)
    rows = z.chunks[0] if z.ndim else 1
    for start in range(0, z.shape[0] if z.ndim else 1, rows):
        if z.ndim:
            out[start:start + rows] = z[start:start + rows]
        else:
            out[...] = z[...]
    return out


def data_files(path) -> list[str]:
    """Chunk or shard files of a store, in chunk-index order (metadata excluded)."""
    files = [f for f in glob.glob(os.path.join(path, "c", "**"), recursive=True) if os.path.isfile(f)]
    return sorted(files, key=lambda f: [int(p) if p.isdigit() else p for p in f.split(os.sep)])


def _files_under(paths):
    for p in paths:
        if os.path.isfile(p):
            yield p
        elif os.path.isdir(p):
            for root, _, names in os.walk(p):
                for name in names:
                    yield os.path.join(root, name)


def drop_cache(paths) -> None:
    """Evict every file under ``paths`` from the page cache (written back first by ``os.sync``)."""
    os.sync()
    for f in _files_under(paths):
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm_cache(paths) -> None:
    """Read every file under ``paths`` once, so the timed run finds them in the page cache."""
    raw_read(list(_files_under(paths)))


def raw_read(files, bufsize=16 * 2**20) -> int:
    """Sequential ``readinto`` of ``files`` into one reused buffer; returns the bytes read."""
    view = memoryview(bytearray(bufsize))
    total = 0
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while True:
                n = fh.readinto(view)
                if not n:
                    break
                total += n
    return total


def raw_write(path, nbytes, bufsize=16 * 2**20) -> int:
    """Write ``nbytes`` to a new file from one reused buffer (no fsync, as no system under test syncs data)."""
    view = memoryview(bytearray(bufsize))
    left = int(nbytes)
    with open(path, "wb", buffering=0) as w:
        while left > 0:
            left -= w.write(view[:min(left, bufsize)])
    return int(nbytes)


# ---------------------------------------------------------------- checks

N_SAMPLES = 8


def summarize(a) -> dict:
    """Checksums of an array: float64 sum, L1 and L2 norms and a few elements at fixed positions."""
    a = np.asarray(a)
    flat = a.reshape(-1)
    picks = np.linspace(0, flat.size - 1, N_SAMPLES).astype(np.int64) if flat.size else []
    a64 = flat.astype(np.float64)
    return {"sum": float(a64.sum()), "l1": float(np.abs(a64).sum()), "l2": float(np.sqrt((a64 * a64).sum())),
            "samples": [float(flat[i]) for i in picks]}


def summarize_store(path, minus=None) -> dict:
    """:func:`summarize` of a store (or of its difference from the store ``minus``), one row slab at a time."""
    import zarr
    z = zarr.open_array(path, mode="r")
    base = None if minus is None else zarr.open_array(minus, mode="r")
    rows = max(1, z.chunks[0]) if z.ndim else 1
    if z.ndim == 0 or z.nbytes <= 64 * 2**20:
        return summarize(z[...] if base is None else np.asarray(z[...]) - np.asarray(base[...]))
    s = l1 = l2 = 0.0
    for start in range(0, z.shape[0], rows):
        b = np.asarray(z[start:start + rows])
        if base is not None:
            b = b - np.asarray(base[start:start + rows])
        b = b.astype(np.float64)
        s += float(b.sum())
        l1 += float(np.abs(b).sum())
        l2 += float((b * b).sum())
    n = int(np.prod(z.shape))
    picks = [np.unravel_index(i, z.shape) for i in np.linspace(0, n - 1, N_SAMPLES).astype(np.int64)]
    samples = [float(z[i]) - (0.0 if base is None else float(base[i])) for i in picks]
    return {"sum": s, "l1": l1, "l2": math.sqrt(l2), "samples": samples}


def agree(a, b, rtol: float = 1e-3):
    """Whether two checks agree; returns (ok, largest relative deviation).

    Scalars compare relatively. Array summaries compare their sums relative
    to the L1 norm (so cancellation cannot fail an equal result), norms
    relatively, and sampled elements relative to the largest sample.
    """
    worst = 0.0
    if isinstance(a, dict) and isinstance(b, dict) and "l1" not in a:
        keys = sorted(set(a) & set(b))
        if not keys:
            return False, float("inf")
        for k in keys:
            ok, dev = agree(a[k], b[k], rtol)
            worst = max(worst, dev)
        return worst <= rtol, worst
    if isinstance(a, dict):
        scale = max(a["l1"], b["l1"], 1e-30)
        worst = max(abs(a["sum"] - b["sum"]) / scale, abs(a["l1"] - b["l1"]) / scale,
                    abs(a["l2"] - b["l2"]) / max(a["l2"], b["l2"], 1e-30))
        smax = max([abs(x) for x in a["samples"] + b["samples"]] + [1e-30])
        for x, y in zip(a["samples"], b["samples"]):
            worst = max(worst, abs(x - y) / smax)
        return worst <= rtol, worst
    a, b = float(a), float(b)
    worst = abs(a - b) / max(abs(a), abs(b), 1e-30)
    return worst <= rtol, worst


# ---------------------------------------------------------------- memory and I/O counters

def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


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
    return _status_kb("VmRSS:")


def hwm() -> int:
    return _status_kb("VmHWM:")


def reset_hwm() -> bool:
    """Reset the kernel's peak-RSS mark to the current RSS (Linux ``clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


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
        drop_cache(paths)
    elif cache == "warm":
        warm_cache(paths)


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
        t0 = time.perf_counter()
        runner.run()
        result["first_s"] = spent = time.perf_counter() - t0
        result["first_counters"] = runner.counters()
        result["run_peaks"].append(hwm() - base)
        checked_first()
    for i in range(task.repeat):
        if result["times"] and spent + result["times"][-1] > task.time_cap:
            break
        prepare_cache(runner, task.cache)
        gc.collect()
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


def child_main(tasks_file: str, results_file: str) -> None:
    with open(tasks_file) as f:
        tasks = [Task(**t) for t in json.load(f)]
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
    stderr.
    """
    with tempfile.TemporaryDirectory(prefix="jask-bench-") as d:
        tin, tout = os.path.join(d, "tasks.json"), os.path.join(d, "results.json")
        with open(tin, "w") as f:
            json.dump([dataclasses.asdict(t) for t in tasks], f)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
        err = None
        try:
            proc = subprocess.run([sys.executable, "-m", "jask.bench.harness", tin, tout], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
            if proc.returncode != 0:
                err = f"child exited with status {proc.returncode}: " + _tail(proc.stderr)
        except subprocess.TimeoutExpired as e:
            err = f"child timed out after {timeout:.0f} s: " + _tail(e.stderr)
        results = []
        if os.path.exists(tout):
            with open(tout) as f:
                results = json.load(f)
    for task in tasks[len(results):]:
        results.append({"task": dataclasses.asdict(task), "error": err or "no result"})
    for task in tasks:
        shutil_rm(task.work_dir)
    return results


def _tail(text, n=1500) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    lines = [ln for ln in (text or "").splitlines() if "xla_bridge" not in ln and ln.strip()]
    return "\n".join(lines)[-n:]


def shutil_rm(path) -> None:
    import shutil
    shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------- summaries

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
