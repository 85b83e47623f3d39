"""The suite's report: machine facts, targets met or missed, results.md and the plots.

``suite`` below is a :class:`jask.bench.__main__.Suite`: its ``results``,
``meta``, ``budget`` and ``out_dir``.
"""
from __future__ import annotations

import os
import platform
import subprocess

from jask.bench import harness, peers, workloads

def order(entries, systems):
    """Sort a case's entries (in place, also in the suite's list) into the display order of systems."""
    rank = {s: i for i, s in enumerate(systems)}
    entries.sort(key=lambda e: rank.get(e["system"], len(rank)))


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


def _header(meta) -> list[str]:
    """The report's opening lines: command, machine, data, software, how runs were timed and cached."""
    v = meta["versions"]
    return ["# jask benchmark results", "",
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


def markdown(suite) -> str:
    meta, results = suite.meta, suite.results
    lines = _header(meta)
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
        order(entries, peers.SYSTEMS)
    seen_workloads = []
    for (w, size, cache), entries in cases.items():
        W = workloads.get(w)
        if w not in seen_workloads:
            seen_workloads.append(w)
            lines += [f"## {w}: {W.TITLE}", "", f"Throughput: {W.UNIT}, {W.WORK}. Limit for `jask/limit`: "
                      f"{W.LIMIT}. `read GB` counts read system calls (`rchar`): chunks jask maps "
                      "(`read_mmap`) are read without one, so a warm jask row may show less than it reads.", ""]
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
            for r in (e for e in entries if e["system"] == "jask" or e["system"].startswith("jask-mmap-")):
                lim = r.get("jask_over_limit")
                if lim:
                    lines += ["", f"{r['system']}/limit: " + ", ".join(f"{r['system']}/{k} = {x:.2f}"
                                                                      for k, x in lim.items())]
        lines.append("")
    lines += ["## Systems", ""] + [f"- **{k}**: {d}" for k, d in peers.DESCRIPTIONS.items()] + [""]
    return "\n".join(lines)


def plots(suite) -> list[str]:
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
