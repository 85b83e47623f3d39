"""Fused versus unfused passes over the same chains, side by side in one run.

    python -m jask.bench.fusion --n=4096 --k=8 --budget=256MB --repeat=3

Each chain runs with ``fusion`` on and off (``jask.config.update("fusion", ...)``)
in alternation; reported: bytes read and written (deterministic) and median
wall time, with the unfused/fused ratios. Nothing is left behind: the inputs
are scratch stores, deleted with their folder at the end.
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

import numpy as np
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("n", 4096, "Arrays are n x n float32.")
flags.DEFINE_integer("k", 8, "Number of elementwise ops in the chain.")
flags.DEFINE_string("budget", "256MB", "jask memory budget.")
flags.DEFINE_integer("repeat", 3, "Runs per variant.")
flags.DEFINE_string("data_dir", None, "Where the input stores go (default: a temporary folder under "
                    "$JASK_BENCH_DIR, itself defaulting to bench-out; removed at the end).")


def elementwise_chain(a, b, k: int):
    """k elementwise ops over two inputs: alternately combine with b and a, then scale."""
    import jask
    x = a
    for i in range(k):
        x = [lambda x: x + b, lambda x: x * a, lambda x: x - b, lambda x: x * 0.5][i % 4](x)
    return x


def chains(a, b, m, k):
    import jask
    return {
        f"elementwise_{k} -> store": lambda: jask.persist(elementwise_chain(a, b, k)),
        "sum(square(a - b))": lambda: jask.sum(jask.square(a - b)),
        "sum(square(a @ m - b))": lambda: jask.sum(jask.square(a @ m - b)),
    }


def measure(fn):
    import jask
    with jask.profile() as p:
        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
    return wall, p.bytes_read, p.bytes_written


def main(argv):
    del argv
    from jask.bench import harness
    if FLAGS.data_dir:
        os.makedirs(FLAGS.data_dir, exist_ok=True)
        run_all(FLAGS.data_dir)
        return
    parent = harness.bench_dir()
    made_parent = not os.path.isdir(parent)
    os.makedirs(parent, exist_ok=True)
    root = tempfile.mkdtemp(prefix="jask-fusion-", dir=parent)
    try:
        run_all(root)
    finally:
        import gc
        gc.collect()
        shutil.rmtree(root, ignore_errors=True)
        if made_parent:
            harness.remove_empty_dirs(parent)


def run_all(root):
    """Every chain, fused and unfused, on inputs stored under ``root``."""
    import jask
    jask.set_memory_budget(FLAGS.budget, scratch_dir=os.path.join(root, "scratch"))
    rng = np.random.default_rng(0)
    n = FLAGS.n
    a, b, m = (jask.from_numpy(rng.standard_normal((n, n), dtype=np.float32)) for _ in range(3))
    print(f"arrays {n}x{n} float32 ({a.nbytes / 2**20:.0f} MiB each), budget {FLAGS.budget}, k={FLAGS.k}")
    print(f"{'chain':28s} {'fused s':>9s} {'unfused s':>10s} {'speedup':>8s} "
          f"{'fused GiB r/w':>14s} {'unfused GiB r/w':>16s}")
    for name, fn in chains(a, b, m, FLAGS.k).items():
        runs = {True: [], False: []}
        moved = {}
        for _ in range(FLAGS.repeat):
            for fusion in (True, False):
                jask.config.update("fusion", fusion)
                wall, r, w = measure(fn)
                runs[fusion].append(wall)
                moved[fusion] = (r / 2**30, w / 2**30)
        jask.config.update("fusion", True)
        f, u = statistics.median(runs[True]), statistics.median(runs[False])
        print(f"{name:28s} {f:9.2f} {u:10.2f} {u / f:7.2f}x "
              f"{moved[True][0]:6.2f}/{moved[True][1]:<6.2f} {moved[False][0]:7.2f}/{moved[False][1]:<7.2f}")


if __name__ == "__main__":
    from jask import cli
    cli.run(main)
