"""The jask benchmark suite: jask against its peers and the physical limits, on the same Zarr stores.

    python -m jask.bench --quick                # every workload, small, < 2 minutes; writes bench-out/
    python -m jask.bench --workload=sum,elementwise --gib=0.5,2 --budget=256MB --repeat=3
    python -m jask.bench --workload=dot --n=4096,8192 --cache=warm
    python -m jask.bench --workload=sum,dot --devices=1,2,4     # jask on 1, 2 and 4 local devices
    python -m jask.bench --workload=sum --processes=1,2         # and as 2 jax.distributed processes
    python -m jask.bench --workload=sum --processes=1,2 --rounds=3   # 1 and 2 processes alternated 3 times
    python -m jask.bench --store=s3 --remote_mib=256   # sum from a loopback S3 bucket vs raw GET
    python -m jask.bench --workload=sum --cache=warm --peers=raw-io --read_mmap=auto,off   # + a jask-mmap-off row

Workloads (one module each in :mod:`jask.bench.workloads`): ``sum``,
``elementwise`` ((a - b) * c + a to a new array), ``dot`` (n x n), ``grad``
(jit(grad) of an MSE through two matmuls) and ``adam`` (one jask.optim.adam
step with ``update_``). Systems (:mod:`jask.bench.peers`): jask, dask.array
(threaded), Cubed, jax.numpy in RAM, a naive per-tile loop, and the limits
raw-io (sequential readinto of the same chunk files) and memcpy (RAM
bandwidth, page-cache runs). A system that cannot do a workload gets a row
saying why.

For each workload and size the input stores are written once under
``--data_dir`` (chunked with the tile edge jask uses, uncompressed) and every
system reads the same stores, each in its own subprocess, one after another,
timed over ``--repeat`` runs after a warm-up (:mod:`jask.bench.harness`).
Results go to ``--out``: ``results.json`` (every raw measurement),
``results.md`` (tables, ratios, targets) and PNG plots of throughput and peak
memory against array size.
"""
from __future__ import annotations

import datetime
import json
import os
import shlex
import sys
import time

from absl import app, flags

from jask import kernels
from jask.bench import data, flag_checks, harness, peers, remote, report, workloads

FLAGS = flags.FLAGS
flags.DEFINE_list("workload", list(workloads.NAMES), "Workloads to run: " + ", ".join(workloads.NAMES))
flags.DEFINE_list("gib", [], "Array sizes in GiB (the main array of each workload; for dot, the size of "
                  "each input). Default: each workload's own list, from below the budget to many times it.")
flags.DEFINE_list("n", [], "Matrix sizes for dot (default 4096,8192); overrides --gib for dot.")
flags.DEFINE_string("budget", "256MB", "jask memory budget (and Cubed's allowed_mem).")
flags.DEFINE_integer("tile", 0, "Tile edge = store chunk edge (0: the edge jask derives from the budget).")
flags.DEFINE_enum("backend", "auto", ["auto", *kernels.names()], "jask tile backend.")
flags.DEFINE_integer("repeat", 3, "Timed repetitions per system (median, min and max are reported).")
flags.DEFINE_integer("warmup", 1, "Untimed warm-up repetitions (0 or 1; compiles jitted code).")
flags.DEFINE_list("peers", ["all"], "Peers to run besides jask: all, or some of " + ", ".join(peers.SYSTEMS[1:]))
flags.DEFINE_string("out", harness.bench_dir("results"), "Folder for results.json, results.md and the plots "
                    "(default: $JASK_BENCH_DIR/results, JASK_BENCH_DIR defaulting to bench-out).")
flags.DEFINE_boolean("quick", False, "Every workload once at a small size, warm cache, one run, "
                     "peers grouped in one process each: a smoke test that finishes in under two minutes.")
flags.DEFINE_list("cache", [], "Page-cache states: cold (pages dropped with posix_fadvise before each run), "
                  "warm (read once before each run). Default: each workload's own.")
flags.DEFINE_string("data_dir", harness.bench_dir("data"), "Folder for the benchmark stores (default: "
                    "$JASK_BENCH_DIR/data); a real disk (tmpfs is refused except with --quick).")
flags.DEFINE_enum("layout", "chunk", ["chunk", "shard"], "Store layout: one file per chunk, or one shard "
                  "file per row of chunks (Zarr v3 sharding codec). Both uncompressed.")
flags.DEFINE_float("time_cap", 20.0, "Stop repeating a system once its timed runs took this many seconds.")
flags.DEFINE_float("jnp_max_gb", 0.0, "Run the in-RAM jnp peer only when the workload needs at most this many "
                   "GB (0: half of the available memory).")
flags.DEFINE_enum("isolate", "task", ["task", "system"], "One subprocess per system and case (task), or one "
                  "per system for all cases (system; the default with --quick).")
flags.DEFINE_boolean("keep_data", False, "Keep the benchmark stores.")
flags.DEFINE_float("timeout", 1800.0, "Seconds before a system's subprocess is killed.")
flags.DEFINE_boolean("report_only", False, "Rebuild results.md and the plots from --out's results.json.")
flags.DEFINE_list("devices", ["1"], "jask runs once per count of local devices a pass spreads over, e.g. "
                  "1,2,4 (reported as jask, jask-2dev, jask-4dev with ratios to one device); on a CPU-only "
                  "machine the child process gets that many forced host devices.")
flags.DEFINE_list("processes", ["1"], "jask also runs as this many processes of a jax.distributed run on "
                  "loopback (CPU collectives), e.g. 1,2,4 (reported as jask-2proc, ...; process 0's figures).")
flags.DEFINE_enum("durability", "process", ["process", "power"], "jask.config durability in every system's "
                  "subprocess (JASK_DURABILITY): 'power' fsyncs each committed store (to_zarr, update_).")
flags.DEFINE_list("read_mmap", ["auto"], "jask's read_mmap setting (whole chunks read as maps): auto (the "
                  "default: maps under read leases only), on, off, or several (e.g. off,auto: jask runs once per "
                  "value in that order; the first value's rows are named jask, the others' jask-mmap-<value>).")
flags.DEFINE_integer("rounds", 1, "Run a case's systems this many times in turn (A, B, A, B, ...), each time "
                     "in a fresh subprocess, and report each system's runs of every round together: a noisy "
                     "machine's drift then falls on every system alike (with --isolate=task).")
flags.DEFINE_float("rtol", 2e-3, "Relative tolerance for results agreeing between systems.")
flags.DEFINE_enum("store", "local", ["local", "s3"], "local: the suite on local stores. s3: the remote-store "
                  "case instead (jask.bench.remote): sum of an array in a bucket on a loopback S3 server "
                  "against the server's raw GET rate, --remote_mib in size.")
flag_checks.register()
QUICK_BUDGET = "16MB"


# ---------------------------------------------------------------- planning

def _selected_peers() -> list[str]:
    chosen = [p.strip() for p in FLAGS.peers if p.strip()]
    if not chosen or "all" in chosen:
        return list(peers.SYSTEMS)
    unknown = [p for p in chosen if p not in peers.SYSTEMS]
    if unknown:
        raise app.UsageError(f"unknown --peers {unknown}; choose from {', '.join(peers.SYSTEMS[1:])}")
    return ["jask"] + [p for p in peers.SYSTEMS if p in chosen and p != "jask"]


def _mem_available() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024.0
    except OSError:
        pass
    return 8e9


def skip_reason(W, system: str, cache: str, params: dict) -> str | None:
    spec = W.SYSTEMS.get(system, "not defined for this workload")
    if isinstance(spec, str):
        return spec
    missing = peers.available(system)
    if missing:
        return missing
    if system == "memcpy" and cache != "warm":
        return "the RAM-bandwidth limit applies to page-cache (warm) runs only"
    if system == "jnp":
        limit = FLAGS.jnp_max_gb * 1e9 if FLAGS.jnp_max_gb else 0.5 * _mem_available()
        need = W.ram_bytes(params)
        if need > limit:
            return f"does not fit: needs ~{need / 1e9:.1f} GB in RAM, limit {limit / 1e9:.1f} GB (--jnp_max_gb)"
    return None


def _sizes(W):
    if W.NAME == "dot" and FLAGS.n:
        return [dict(label=f"n={int(n)}", gib=4.0 * int(n) ** 2 / 2**30, shape=[int(n), int(n)]) for n in FLAGS.n]
    return W.sizes([float(g) for g in FLAGS.gib], FLAGS.quick)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-")


# ---------------------------------------------------------------- running

class Suite:
    """Runs the cases, keeps every result, and writes results.json as it goes."""

    def __init__(self, out_dir: str, budget: str):
        self.out_dir = out_dir
        self.budget = budget
        self.results: list[dict] = []
        self.meta = report.machine_info()
        self.meta.update(command="python -m jask.bench " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
                         budget=budget, started=datetime.datetime.now().isoformat(timespec="seconds"),
                         load_at_start=os.getloadavg())

    def save(self):
        os.makedirs(self.out_dir, exist_ok=True)
        with open(os.path.join(self.out_dir, "results.json"), "w") as f:
            json.dump({"meta": self.meta, "results": self.results}, f, indent=1)

    def add(self, case: dict, raw: dict, W):
        system = raw.get("task", {}).get("system") or raw.get("system")
        if system == "jask" and raw.get("task", {}).get("devices", 1) > 1:
            system = f"jask-{raw['task']['devices']}dev"
        if system == "jask" and raw.get("task", {}).get("processes", 1) > 1:
            system = f"jask-{raw['task']['processes']}proc"
        mmap_value = raw.get("task", {}).get("read_mmap")
        if system.startswith("jask") and mmap_value and mmap_value != _mmap_settings()[0]:
            system += f"-mmap-{mmap_value}"
        entry = dict(case, system=system)
        if "skipped" in raw:
            entry["skipped"] = raw["skipped"]
        elif raw.get("error"):
            entry["error"] = raw["error"]
            entry["traceback"] = raw.get("traceback")
        else:
            entry.update(harness.summarize_result(raw, W.work(case["params"])))
            entry["raw"] = {k: raw.get(k) for k in ("times", "first_s", "setup_s", "io", "counters",
                                                   "first_counters", "run_peaks", "baseline_rss", "started",
                                                   "peak_rss_growth_setup", "peak_rss_growth_runs")}
            entry["jask_source_sha1"] = raw.get("jask_source_sha1")
            entry["check"] = raw.get("check")
        self.results.append(entry)
        return entry


def _case(W, params, cache, tile, budget, data_s):
    return dict(workload=W.NAME, size=params["label"], gib=params["gib"], cache=cache, tile=tile,
                budget=budget, unit=W.UNIT, work=W.work(params), params=params, data_write_s=data_s)


def _print_case_rows(rows):
    for e in rows:
        name = e["system"]
        if "skipped" in e:
            print(f"    {name:<12} -- {e['skipped']}", flush=True)
        elif "error" in e:
            print(f"    {name:<12} ERROR {e['error'][:300]}", flush=True)
        else:
            rate = e["rate"] / (1e9 if e["unit"] in ("GB/s", "GFLOP/s") else 1)
            agree = {True: "ok", False: "MISMATCH", None: "-"}[e.get("agrees")]
            print(f"    {name:<12} {e['median_s']:8.3f} s  (min {e['min_s']:.3f}, max {e['max_s']:.3f}, "
                  f"{e['runs']} runs)  {rate:8.2f} {e['unit']}  peak RSS +{e['peak_rss_growth_mb']:.0f} MB  "
                  f"read {e['read_gb']:.2f} GB  wrote {e['written_gb']:.2f} GB  check {agree}"
                  + (f"  {e['over_one_device']:.2f}x jask" if "over_one_device" in e else "")
                  + "".join(f"  {x:.2f}x {k}" for k, x in e.get("jask_over_limit", {}).items()), flush=True)


def finish_case(entries, W):
    """Agreement and ratios within one case (same workload, size and cache state)."""
    ran = [e for e in entries if "median_s" in e]
    ref = next((e for e in ran if e["system"] == "jask" and e.get("check") is not None), None) \
        or next((e for e in ran if e.get("check") is not None), None)
    for e in ran:
        if e.get("check") is None or ref is None:
            e["agrees"] = None
            continue
        ok, dev = data.agree(ref["check"], e["check"], FLAGS.rtol)
        e["agrees"], e["deviation"] = ok, dev
        e["checked_against"] = ref["system"]
    jask = next((e for e in ran if e["system"] == "jask"), None)
    for e in ran:
        if jask and e["rate"]:
            e["jask_over"] = jask["rate"] / e["rate"]
        if jask and jask["rate"] and e["system"].startswith("jask-") and "-mmap-" not in e["system"]:
            e["over_one_device"] = e["rate"] / jask["rate"]
    for j in (e for e in ran if e["system"] == "jask" or e["system"].startswith("jask-mmap-")):
        for limit in (W.LIMIT, "memcpy"):
            lim = next((e for e in ran if e["system"] == limit), None)
            if lim and lim["rate"]:
                j.setdefault("jask_over_limit", {})[limit] = j["rate"] / lim["rate"]


def _counts(values, flag: str) -> list[int]:
    try:
        counts = sorted({int(n) for n in values} | {1})
    except ValueError:
        raise app.UsageError(f"--{flag} takes counts like 1,2,4, got {values}") from None
    if counts[0] < 1:
        raise app.UsageError(f"--{flag} counts must be at least 1, got {values}")
    return counts


def _jask_variants() -> list[tuple[int, int]]:
    """``(devices, processes)`` of each jask run: one device and process, then each extra count."""
    return ([(1, 1)] + [(n, 1) for n in _counts(FLAGS.devices, "devices")[1:]]
            + [(1, p) for p in _counts(FLAGS.processes, "processes")[1:]])


def _rounds() -> int:
    if FLAGS.rounds < 1:
        raise app.UsageError(f"--rounds must be at least 1, got {FLAGS.rounds}")
    return FLAGS.rounds


def _mmap_settings() -> list[str]:
    """The ``read_mmap`` values jask runs with (``off``, ``on``, ``auto``), in the order given."""
    chosen = [v.strip() for v in FLAGS.read_mmap if v.strip()]
    if not chosen or any(v not in ("off", "on", "auto") for v in chosen) or len(set(chosen)) < len(chosen):
        raise app.UsageError(f"--read_mmap takes distinct values of off, on and auto (e.g. off,auto); "
                             f"got {FLAGS.read_mmap}")
    return chosen


def _run_settings(suite: Suite):
    """Data folder (checked), its filesystem, whether it is in RAM, isolation, repeats, warm-ups."""
    data_dir = os.path.abspath(FLAGS.data_dir)
    os.makedirs(data_dir, exist_ok=True)
    from jask.io.scratch import filesystem_type
    fstype = filesystem_type(data_dir)
    on_ram = fstype in ("tmpfs", "ramfs")
    if on_ram and not FLAGS.quick:
        raise app.UsageError(f"--data_dir {data_dir} is on {fstype}: use a folder on a real disk")
    isolate = "system" if FLAGS.quick else FLAGS.isolate
    if _rounds() > 1 and isolate != "task":
        raise app.UsageError("--rounds alternates one subprocess per system and case: it needs --isolate=task "
                             "(and no --quick)")
    if any(p > 1 for _, p in _jask_variants()) and (why := harness.loopback_problem()):
        raise app.UsageError(f"--processes={','.join(FLAGS.processes)}: {why}; run without --processes "
                             "or where 127.0.0.1 sockets work")
    repeat = 1 if FLAGS.quick else FLAGS.repeat
    warmup = 0 if FLAGS.quick else FLAGS.warmup
    suite.meta.update(data_dir=data_dir, data_fs=fstype, layout=FLAGS.layout, isolate=isolate, repeat=repeat,
                      warmup=warmup, time_cap=FLAGS.time_cap, backend=FLAGS.backend, durability=FLAGS.durability,
                      jask_variants=_jask_variants(), read_mmap=_mmap_settings(), rounds=_rounds())
    return data_dir, fstype, on_ram, isolate, repeat, warmup


def run_suite(suite: Suite):
    systems = _selected_peers()
    variants = _jask_variants()
    mmaps = _mmap_settings()
    labels = ["jask", *(f"jask-{d}dev" if d > 1 else f"jask-{p}proc" for d, p in variants[1:])]
    labels = labels + [f"{x}-mmap-{m}" for m in mmaps[1:] for x in labels] + systems[1:]
    data_dir, fstype, on_ram, isolate, repeat, warmup = _run_settings(suite)
    budget = suite.budget
    pending = []   # (case, entries, tasks, W) for isolate == "system"
    for name in FLAGS.workload:
        W = workloads.get(name.strip())
        for params in _sizes(W):
            tile = FLAGS.tile or W.chunk_edge(params, budget)
            root = os.path.join(data_dir, f"{W.NAME}-{_slug(params['label'])}")
            harness.shutil_rm(root)
            t0 = time.perf_counter()
            paths = W.make_data(params, root, tile, FLAGS.layout)
            data_s = time.perf_counter() - t0
            caches = FLAGS.cache or (["warm"] if FLAGS.quick else list(W.CACHE))
            for cache in caches:
                case = _case(W, params, cache, tile, budget, data_s)
                print(f"{W.NAME} {params['label']}, {cache} cache, tile {tile}, budget {budget} "
                      f"(stores written in {data_s:.1f} s) [load {os.getloadavg()[0]:.2f}]", flush=True)
                entries, tasks = [], []
                for system in systems:
                    reason = skip_reason(W, system, cache, params)
                    if reason:
                        entries.append(suite.add(case, {"system": system, "skipped": reason}, W))
                        continue
                    tasks += [harness.Task(
                        workload=W.NAME, size=params["label"], params=params, system=system, paths=paths,
                        work_dir=os.path.join(root, f"work-{system}-{d}-{pr}-{mm}-{cache}"), cache=cache,
                        repeat=repeat, warmup=warmup, budget=budget, tile=tile, backend=FLAGS.backend,
                        time_cap=FLAGS.time_cap, allow_tmpfs=on_ram, devices=d, processes=pr, read_mmap=mm)
                        for mm in (mmaps if system == "jask" else ["off"])
                        for d, pr in (variants if system == "jask" else [(1, 1)])]
                if isolate == "task":
                    rounds = [[harness.run_tasks([task], timeout=FLAGS.timeout)[0] for task in tasks]
                              for _ in range(_rounds())]
                    for per_round in zip(*rounds):
                        entries.append(suite.add(case, harness.merge_rounds(list(per_round)), W))
                    report.order(entries, labels)
                    finish_case(entries, W)
                    _print_case_rows(entries)
                    suite.save()
                else:
                    pending.append((case, entries, tasks, W))
            if isolate == "task" and not FLAGS.keep_data:
                harness.shutil_rm(root)
    if pending:
        by_system = {}
        for case, entries, tasks, W in pending:
            for t in tasks:
                by_system.setdefault(t.system, []).append((t, case, entries, W))
        for system in systems:
            group = by_system.get(system, [])
            if not group:
                continue
            t0 = time.perf_counter()
            raws = harness.run_tasks([g[0] for g in group], timeout=FLAGS.timeout)
            print(f"  {system}: {len(group)} tasks in {time.perf_counter() - t0:.1f} s", flush=True)
            for (t, case, entries, W), raw in zip(group, raws):
                entries.append(suite.add(case, raw, W))
        for case, entries, tasks, W in pending:
            report.order(entries, labels)
            finish_case(entries, W)
            print(f"{case['workload']} {case['size']}, {case['cache']} cache, tile {case['tile']}:")
            _print_case_rows(entries)
        if not FLAGS.keep_data:
            for name in FLAGS.workload:
                W = workloads.get(name.strip())
                for params in _sizes(W):
                    harness.shutil_rm(os.path.join(data_dir, f"{W.NAME}-{_slug(params['label'])}"))
            harness.remove_empty_dirs(data_dir)
    suite.meta.update(finished=datetime.datetime.now().isoformat(timespec="seconds"), load_at_end=os.getloadavg())
    suite.save()


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    out_dir = os.path.abspath(FLAGS.out)
    budget = QUICK_BUDGET if FLAGS.quick and FLAGS.budget == "256MB" else FLAGS.budget
    if FLAGS.store == "s3":
        print(remote.report(remote.run(out_dir, budget)), flush=True)
        return 0
    suite = Suite(out_dir, budget)
    t0 = time.perf_counter()
    if FLAGS.report_only:
        with open(os.path.join(out_dir, "results.json")) as f:
            saved = json.load(f)
        suite.meta, suite.results = saved["meta"], saved["results"]
    else:
        print(f"jask.bench: {suite.meta['cores']} cores, {suite.meta['cpu']}; budget {budget}; out {out_dir}",
              flush=True)
        os.environ["JASK_DURABILITY"] = FLAGS.durability    # read by jask.config in each subprocess
        run_suite(suite)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(report.markdown(suite))
    made = report.plots(suite)
    bad = [e for e in suite.results if "error" in e or e.get("agrees") is False]
    print(f"done in {time.perf_counter() - t0:.0f} s: {out_dir}/results.md, results.json"
          + (f", {len(made)} plots" if made else "")
          + (f"; {len(bad)} failed or disagreeing runs" if bad else ""), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    from jask import cli
    cli.run(main)
