"""The jask benchmark suite: jask against its peers and the physical limits, on the same Zarr stores.

    python -m jask.bench --quick                # every workload, small, < 2 minutes; writes bench-out/
    python -m jask.bench --workload=sum,elementwise --gib=0.5,2 --budget=256MB --repeat=3
    python -m jask.bench --workload=dot --n=4096,8192 --cache=warm

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
import platform
import shlex
import subprocess
import sys
import time

from absl import app, flags

from jask import kernels
from jask.bench import harness, peers, workloads

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
flags.DEFINE_float("time_cap", 20.0, "Stop repeating a system once its runs took this many seconds.")
flags.DEFINE_float("jnp_max_gb", 0.0, "Run the in-RAM jnp peer only when the workload needs at most this many "
                   "GB (0: half of the available memory).")
flags.DEFINE_enum("isolate", "task", ["task", "system"], "One subprocess per system and case (task), or one "
                  "per system for all cases (system; the default with --quick).")
flags.DEFINE_boolean("keep_data", False, "Keep the benchmark stores.")
flags.DEFINE_float("timeout", 1800.0, "Seconds before a system's subprocess is killed.")
flags.DEFINE_boolean("report_only", False, "Rebuild results.md and the plots from --out's results.json.")
flags.DEFINE_float("rtol", 2e-3, "Relative tolerance for results agreeing between systems.")

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
        self.meta = machine_info()
        self.meta.update(command="python -m jask.bench " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
                         budget=budget, started=datetime.datetime.now().isoformat(timespec="seconds"),
                         load_at_start=os.getloadavg())

    def save(self):
        os.makedirs(self.out_dir, exist_ok=True)
        with open(os.path.join(self.out_dir, "results.json"), "w") as f:
            json.dump({"meta": self.meta, "results": self.results}, f, indent=1)

    def add(self, case: dict, raw: dict, W):
        system = raw.get("task", {}).get("system") or raw.get("system")
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
                  f"read {e['read_gb']:.2f} GB  wrote {e['written_gb']:.2f} GB  check {agree}", flush=True)


def finish_case(entries, W):
    """Agreement and ratios within one case (same workload, size and cache state)."""
    ran = [e for e in entries if "median_s" in e]
    ref = next((e for e in ran if e["system"] == "jask" and e.get("check") is not None), None) \
        or next((e for e in ran if e.get("check") is not None), None)
    for e in ran:
        if e.get("check") is None or ref is None:
            e["agrees"] = None
            continue
        ok, dev = harness.agree(ref["check"], e["check"], FLAGS.rtol)
        e["agrees"], e["deviation"] = ok, dev
        e["checked_against"] = ref["system"]
    jask = next((e for e in ran if e["system"] == "jask"), None)
    for e in ran:
        if jask and e["rate"]:
            e["jask_over"] = jask["rate"] / e["rate"]
    if jask:
        for limit in (W.LIMIT, "memcpy"):
            lim = next((e for e in ran if e["system"] == limit), None)
            if lim and lim["rate"]:
                jask.setdefault("jask_over_limit", {})[limit] = jask["rate"] / lim["rate"]


def _order(entries, systems):
    """Sort a case's entries (in place, also in the suite's list) into the display order of systems."""
    rank = {s: i for i, s in enumerate(systems)}
    entries.sort(key=lambda e: rank.get(e["system"], len(rank)))


def run_suite(suite: Suite):
    systems = _selected_peers()
    budget = suite.budget
    data_dir = os.path.abspath(FLAGS.data_dir)
    os.makedirs(data_dir, exist_ok=True)
    from jask.io.scratch import filesystem_type
    fstype = filesystem_type(data_dir)
    on_ram = fstype in ("tmpfs", "ramfs")
    if on_ram and not FLAGS.quick:
        raise app.UsageError(f"--data_dir {data_dir} is on {fstype}: use a folder on a real disk")
    isolate = "system" if FLAGS.quick else FLAGS.isolate
    repeat = 1 if FLAGS.quick else FLAGS.repeat
    warmup = 0 if FLAGS.quick else FLAGS.warmup
    suite.meta.update(data_dir=data_dir, data_fs=fstype, layout=FLAGS.layout, isolate=isolate, repeat=repeat,
                      warmup=warmup, time_cap=FLAGS.time_cap, backend=FLAGS.backend)
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
                    tasks.append(harness.Task(
                        workload=W.NAME, size=params["label"], params=params, system=system, paths=paths,
                        work_dir=os.path.join(root, f"work-{system}-{cache}"), cache=cache, repeat=repeat,
                        warmup=warmup, budget=budget, tile=tile, backend=FLAGS.backend,
                        time_cap=FLAGS.time_cap, allow_tmpfs=on_ram))
                if isolate == "task":
                    for task in tasks:
                        (raw,) = harness.run_tasks([task], timeout=FLAGS.timeout)
                        entries.append(suite.add(case, raw, W))
                    _order(entries, systems)
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
            _order(entries, systems)
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


# ---------------------------------------------------------------- reporting

def machine_info() -> dict:
    def first(path, key):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith(key):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return "?"

    versions = {}
    for mod in ("jax", "jaxlib", "numpy", "zarr", "dask", "cubed", "optax", "matplotlib"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - absent or broken peers are reported, not fatal
            versions[mod] = None
    import jask
    root = os.path.dirname(os.path.dirname(os.path.abspath(jask.__file__)))
    commit = _git(root, "rev-parse", "--short", "HEAD")
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    mem = first("/proc/meminfo", "MemTotal").split()
    mem = f"{int(mem[0]) / 2**20:.1f} GiB" if mem and mem[0].isdigit() else "?"
    return dict(cpu=first("/proc/cpuinfo", "model name"), cores=os.cpu_count(), mem_total=mem, platform=platform.platform(),
                python=platform.python_version(), versions=versions, jask_path=root,
                jask_commit=(commit or "?") + (" + uncommitted changes" if dirty else ""),
                jask_source_sha1=harness.jask_source_digest())


def _git(root, *args):
    try:
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _fmt_rate(e):
    return f"{e['rate'] / 1e9:.2f}"


def targets(results, budget) -> list[dict]:
    """The issue's targets, each with the measured value beside it."""
    from jask.config import parse_bytes
    out = []
    by = {}
    for e in results:
        by.setdefault((e["workload"], e["size"], e["cache"]), {})[e["system"]] = e

    def ratio(case, a, b):
        ea, eb = case.get(a), case.get(b)
        if ea and eb and ea.get("rate") and eb.get("rate"):
            return ea["rate"] / eb["rate"]
        return None

    specs = [("sum", "raw-io", 0.8, "sum >= 0.8x raw read throughput"),
             ("sum", "naive-loop", 3.0, "sum >= 3x naive per-tile loop"),
             ("elementwise", "dask", 2.0, "elementwise chain >= 2x dask.array"),
             ("dot", "jnp", 0.9, "dot >= 0.9x in-memory jnp.dot GFLOP/s (page cache)")]
    for workload, peer, goal, text in specs:
        for (w, size, cache), case in by.items():
            if w != workload or (workload == "dot" and cache != "warm"):
                continue
            r = ratio(case, "jask", peer)
            out.append(dict(target=text, case=f"{size}, {cache}", goal=goal,
                            measured=r, met=None if r is None else r >= goal,
                            note="" if r is not None else "not measured (a system failed or was skipped)"))
    limit = parse_bytes(budget) + 150e6
    for (w, size, cache), case in by.items():
        e = case.get("jask")
        if not e or "peak_rss_growth_mb" not in e:
            continue
        d = case.get("dask") or case.get("dask-manual")
        dask = f"{d['system']} +{d['peak_rss_growth_mb']:.0f} MB" if d and "peak_rss_growth_mb" in d else "no dask run"
        out.append(dict(target=f"peak RSS growth <= budget + 150 MB ({limit / 1e6:.0f} MB)",
                        case=f"{w} {size}, {cache}", goal=limit / 1e6, measured=e["peak_rss_growth_mb"],
                        met=e["peak_rss_growth_mb"] <= limit / 1e6, note=dask))
    return out


def markdown(suite: Suite) -> str:
    meta, results = suite.meta, suite.results
    v = meta["versions"]
    lines = ["# jask benchmark results", "",
             f"- command: `{meta['command']}`",
             f"- machine: {meta['cpu']}, {meta['cores']} cores, {meta['mem_total']} RAM; {meta['platform']}",
             f"- data: {meta.get('data_dir')} ({meta.get('data_fs') or '?'}), layout {meta.get('layout')}, "
             f"uncompressed float32, chunk edge = jask tile edge",
             f"- software: python {meta['python']}, " + ", ".join(f"{k} {x}" for k, x in v.items() if x)
             + f"; jask {meta['jask_commit']} (sha1 of jask/**/*.py outside jask/bench: "
             f"{meta.get('jask_source_sha1', '?')})",
             f"- run: {meta['started']} to {meta.get('finished', '?')}, load average "
             f"{meta['load_at_start'][0]:.2f} at start, {meta.get('load_at_end', [float('nan')])[0]:.2f} at end",
             f"- each system ran in its own subprocess{' (one per system for all cases: --quick)' if meta.get('isolate') == 'system' else ''}; "
             f"times are wall seconds of up to {meta.get('repeat', '?')} timed runs per system (fewer where they "
             f"passed --time_cap={meta.get('time_cap', '?'):g} s; the count is in brackets), "
             + ("after one untimed warm-up run (compilation)" if meta.get("warmup") else
                "with no warm-up, so they include compilation") + "; throughput is per median run; `jask/x` is jask's throughput over "
             "x's (above 1: jask is faster); peak RSS is the growth over the process's RSS after imports; read and "
             "written are bytes through system calls per run (page-cache hits included)",
             "- cache: cold = every input and output file dropped from the page cache "
             "(os.sync + posix_fadvise DONTNEED) before each run; warm = read once before each run", ""]
    shas = sorted({e["jask_source_sha1"] for e in results if e.get("jask_source_sha1")})
    if len(shas) > 1:
        lines[-1:-1] = [f"- **warning**: jask's sources changed during the run (source sha1s seen: {', '.join(shas)}); "
                        "results.json says which code each result ran on"]
    tg = targets(results, meta["budget"])
    if tg:
        lines += ["## Targets", "", "| target | case | goal | measured | met |", "|---|---|---|---|---|"]
        for t in tg:
            meas = "-" if t["measured"] is None else (f"{t['measured']:.0f} MB" if "RSS" in t["target"]
                                                     else f"{t['measured']:.2f}x")
            goal = f"<= {t['goal']:.0f} MB" if "RSS" in t["target"] else f">= {t['goal']}x"
            met = {True: "yes", False: "**no**", None: "-"}[t["met"]]
            note = f" ({t['note']})" if t.get("note") else ""
            lines.append(f"| {t['target']} | {t['case']} | {goal} | {meas}{note} | {met} |")
        lines.append("")
    cases = {}
    for e in results:
        cases.setdefault((e["workload"], e["size"], e["cache"]), []).append(e)
    for entries in cases.values():
        _order(entries, peers.SYSTEMS)
    seen_workloads = []
    for (w, size, cache), entries in cases.items():
        W = workloads.get(w)
        if w not in seen_workloads:
            seen_workloads.append(w)
            lines += [f"## {w}: {W.TITLE}", "", f"Throughput: {W.UNIT}, {W.WORK}. Limit for `jask/limit`: "
                      f"{W.LIMIT}.", ""]
        e0 = entries[0]
        lines += [f"### {w} {size}, {cache} cache (tile {e0['tile']}, budget {e0['budget']})", "",
                  f"| system | median s | min - max s | {W.UNIT} | jask/system | peak RSS growth MB | "
                  f"read GB | written GB | result |", "|---|---|---|---|---|---|---|---|---|"]
        for e in entries:
            if "skipped" in e:
                lines.append(f"| {e['system']} | - | - | - | - | - | - | - | {e['skipped']} |")
            elif "error" in e:
                msg = e["error"].replace("|", "/").replace("\n", " ")[:200]
                lines.append(f"| {e['system']} | - | - | - | - | - | - | - | error: {msg} |")
            else:
                res = {True: "agrees", False: f"**differs** ({e.get('deviation', 0):.1e})", None: "-"}[e.get("agrees")]
                jo = f"{e['jask_over']:.2f}" if e.get("jask_over") else "-"
                lines.append(f"| {e['system']} | {e['median_s']:.3f} | {e['min_s']:.3f} - {e['max_s']:.3f} "
                             f"({e['runs']}) | {_fmt_rate(e)} | {jo} | {e['peak_rss_growth_mb']:.0f} | "
                             f"{e['read_gb']:.2f} | {e['written_gb']:.2f} | {res} |")
        j = next((e for e in entries if e["system"] == "jask" and "median_s" in e), None)
        if j:
            c = (j.get("raw") or {}).get("counters") or []
            if c and c[-1]:
                c = c[len(c) // 2]
                extra = ", ".join(f"{k.replace('_', ' ')} {c[k]:.2f}" for k in ("io_seconds", "io_wait_seconds",
                                                                                  "compute_seconds") if k in c)
                lines += ["", f"jask counters (median run): {c.get('tiles', 0)} tiles, read "
                          f"{c.get('bytes_read', 0) / 1e9:.2f} GB, wrote {c.get('bytes_written', 0) / 1e9:.2f} GB"
                          + (f", {extra} s" if extra else "") + f"; first run {j['raw']['first_s'] or 0:.2f} s "
                          "(includes compilation)"]
            lim = j.get("jask_over_limit")
            if lim:
                lines += ["", "jask/limit: " + ", ".join(f"jask/{k} = {x:.2f}" for k, x in lim.items())]
        lines.append("")
    lines += ["## Systems", ""] + [f"- **{k}**: {d}" for k, d in peers.DESCRIPTIONS.items()] + [""]
    return "\n".join(lines)


def plots(suite: Suite) -> list[str]:
    """Throughput and peak RSS growth against array size, one line per system; returns the PNG paths."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'jask[bench]'): no plots", flush=True)
        return []
    made = []
    for w in dict.fromkeys(e["workload"] for e in suite.results):
        W = workloads.get(w)
        rows = [e for e in suite.results if e["workload"] == w and "median_s" in e]
        caches = list(dict.fromkeys(e["cache"] for e in rows))
        if not rows:
            continue
        for kind, key, ylabel in (("throughput", "rate", W.UNIT), ("memory", "peak_rss_growth_mb",
                                                                  "peak RSS growth (MB)")):
            fig, axes = plt.subplots(1, len(caches), figsize=(5.5 * len(caches), 4), squeeze=False)
            for ax, cache in zip(axes[0], caches):
                for system in peers.SYSTEMS:
                    pts = sorted((e["gib"], e[key] / (1e9 if key == "rate" else 1)) for e in rows
                                 if e["cache"] == cache and e["system"] == system and e.get(key) is not None)
                    if pts:
                        style = "--" if system in peers.LIMITS else "-"
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=system,
                                linewidth=2.5 if system == "jask" else 1.5)
                if kind == "memory":
                    from jask.config import parse_bytes
                    ax.axhline(parse_bytes(rows[0]["budget"]) / 1e6 + 150, color="grey", linestyle=":",
                               label="budget + 150 MB")
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                ax.set_xlabel("array size (GiB, each input)")
                ax.set_ylabel(ylabel)
                ax.set_title(f"{w}, {cache} cache")
                ax.grid(True, alpha=0.3)
                ax.legend(fontsize=8)
            fig.tight_layout()
            path = os.path.join(suite.out_dir, f"{w}-{kind}.png")
            fig.savefig(path, dpi=100)
            plt.close(fig)
            made.append(path)
    return made


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    out_dir = os.path.abspath(FLAGS.out)
    budget = QUICK_BUDGET if FLAGS.quick and FLAGS.budget == "256MB" else FLAGS.budget
    suite = Suite(out_dir, budget)
    t0 = time.perf_counter()
    if FLAGS.report_only:
        with open(os.path.join(out_dir, "results.json")) as f:
            saved = json.load(f)
        suite.meta, suite.results = saved["meta"], saved["results"]
    else:
        print(f"jask.bench: {suite.meta['cores']} cores, {suite.meta['cpu']}; budget {budget}; out {out_dir}",
              flush=True)
        run_suite(suite)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(markdown(suite))
    made = plots(suite)
    bad = [e for e in suite.results if "error" in e or e.get("agrees") is False]
    print(f"done in {time.perf_counter() - t0:.0f} s: {out_dir}/results.md, results.json"
          + (f", {len(made)} plots" if made else "")
          + (f"; {len(bad)} failed or disagreeing runs" if bad else ""), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    from jask import cli
    cli.run(main)
