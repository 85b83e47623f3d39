"""Joined windows with tiles stacked on the device against the earlier Pallas path, side by side.

    python tpu_tests/stack_probe.py DIR [GIB [ROUNDS [BUDGET]]]

Measurement only (run by ``tpu-check.sh stack``), not a test. It writes the grad benchmark's stores
under DIR (X: rows x 1024 float32 in 16384-row chunks), reads X once (warm page cache), then times in
alternated rounds, in this process:

- ``apart``: the earlier path: each program of a window its own call, its tiles stacked on the host
  and sent as one array;
- ``joined``: the default: a window is one program, tiles sent one by one and stacked on the device;

for ``jask.sum(X)`` and for ``jit(value_and_grad)`` of the grad workload's two-layer MSE. Each
variant's first call (compiling) is printed apart and not counted in the medians.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np

from compile_probe import FEATURES, grad_stores


def _variant(name):
    """Set the executor to ``name``'s path (module attributes: this process only)."""
    from jask.exec import run_windows
    from jask.exec import joined_window
    run_windows.STACK_ON_DEVICE = name == "joined"
    run_windows.run_joined = joined_window.run_joined if name == "joined" else (lambda *a, **k: None)


def main():
    root = sys.argv[1]
    gib = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    import jax
    import jask
    jask.set_memory_budget(sys.argv[4] if len(sys.argv) > 4 else "2GB")
    paths, rows = grad_stores(root, gib)
    for path in paths.values():     # warm page cache
        for dirpath, _, files in os.walk(path):
            for f in files:
                with open(os.path.join(dirpath, f), "rb") as fh:
                    while fh.read(1 << 24):
                        pass
    X, Y, W1, W2 = (jask.from_zarr(paths[k]) for k in ("X", "Y", "W1", "W2"))
    scale = 1.0 / rows
    step = jax.jit(jax.value_and_grad(lambda w1, w2, x, y: jask.sum(jask.square(x @ w1 @ w2 - y)) * scale,
                                      argnums=(0, 1)))
    cases = {"sum": lambda: float(jask.sum(X)),
             "grad": lambda: [np.asarray(v) for v in jax.tree.leaves(step(W1, W2, X, Y))]}
    print(f"jax {jax.__version__}, {jax.devices()}, backend {jask.kernels.backend_name()}, X {rows} x {FEATURES} "
          f"({X.nbytes / 2**30:.2f} GiB), budget {jask.config.config.memory_budget / 2**20:.0f} MiB", flush=True)
    times = {(c, v): [] for c in cases for v in ("apart", "joined")}
    values = {}
    for r in range(rounds + 1):
        for case, fn in cases.items():
            for v in (("apart", "joined") if r % 2 == 0 else ("joined", "apart")):
                _variant(v)
                t0 = time.perf_counter()
                with jask.profile() as p:
                    out = fn()
                secs = time.perf_counter() - t0
                if r == 0:
                    print(f"first call {case:5s} {v:6s}: {secs:7.2f} s; {p.windows} windows, {p.kernel_calls} calls, "
                          f"{p.window_programs} programs ({p.xla_fallback_calls} on xla), "
                          f"{p.bytes_read / X.nbytes:.2f}x X read", flush=True)
                    values[(case, v)] = out
                else:
                    times[(case, v)].append(secs)
    for case in cases:
        a, j = (statistics.median(times[(case, v)]) for v in ("apart", "joined"))
        apart, joined = (np.atleast_1d(values[(case, v)]) if case == "sum" else values[(case, v)]
                         for v in ("apart", "joined"))
        same = all(np.allclose(x, y, rtol=1e-4, atol=1e-6) for x, y in zip(apart, joined))
        runs = [[round(t, 3) for t in times[(case, v)]] for v in ("apart", "joined")]
        print(f"{case:5s}: apart {a:.3f} s ({X.nbytes / a / 1e9:.2f} GB/s), joined {j:.3f} s "
              f"({X.nbytes / j / 1e9:.2f} GB/s): joined/apart time {j / a:.2f}; values agree: {same}; "
              f"runs {runs[0]} / {runs[1]}", flush=True)


if __name__ == "__main__":
    main()
