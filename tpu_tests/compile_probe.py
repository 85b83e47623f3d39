"""Where the first call of a jitted out-of-core gradient spends its time: tracing, lowering, compiling.

    python tpu_tests/compile_probe.py DIR [GIB [BUDGET]]

Measurement only (run by ``tpu-check.sh compile``), not a test. It writes the grad benchmark's
stores (X: rows x 1024 float32 in 16384-row chunks, Y, W1: 1024 x 64, W2: 64 x 1) under DIR, then
times ``jit(grad)`` of its MSE three times in this process with JAX's compile log on. For each call
it prints the wall time, the seconds JAX reports per phase (``jax.monitoring`` duration events,
summed per event name), and the ten slowest compilations with their program names. The first call
traces and compiles; the later ones show what stays.
"""
from __future__ import annotations

import collections
import logging
import os
import re
import sys
import time

import numpy as np

FEATURES, HIDDEN, TILE = 1024, 64, 16384


class _Compiles(logging.Handler):
    """Collects ``Finished XLA compilation of NAME in S sec`` lines from JAX's compile log."""

    pattern = re.compile(r"Finished XLA compilation of (.+) in ([0-9.e+-]+) sec")

    def __init__(self):
        super().__init__()
        self.seen = []

    def emit(self, record):
        m = self.pattern.search(record.getMessage())
        if m:
            self.seen.append((float(m.group(2)), m.group(1)))


def grad_stores(root, gib):
    """``({name: path}, rows)``: the grad workload's X, Y, W1 and W2 under ``root`` (written once)."""
    from jask.bench import data
    rows = int(gib * 2**30) // (FEATURES * 4) // TILE * TILE
    os.makedirs(root, exist_ok=True)
    paths = {}
    for name, shape, seed, scale, shift in (("X", (rows, FEATURES), 21, 1.0, 0.0), ("Y", (rows, 1), 22, 4.0, 0.0),
                                            ("W1", (FEATURES, HIDDEN), 23, 0.2, -0.1),
                                            ("W2", (HIDDEN, 1), 24, 0.2, -0.1)):
        path = os.path.join(root, f"{name}.zarr")
        if not os.path.exists(path):
            data.write_store(path, shape, TILE, seed=seed, scale=scale, shift=shift)
        paths[name] = path
    return paths, rows


def main():
    root, gib = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    import jax
    import jask
    if len(sys.argv) > 3:
        jask.set_memory_budget(sys.argv[3])
    paths, rows = grad_stores(root, gib)
    print(f"jax {jax.__version__}, devices {jax.devices()}, backend {jask.kernels.backend_name()}, "
          f"X {rows} x {FEATURES}, budget {jask.config.config.memory_budget / 2**20:.0f} MiB", flush=True)
    X, Y, W1, W2 = (jask.from_zarr(paths[k]) for k in ("X", "Y", "W1", "W2"))
    scale = 1.0 / rows

    def loss(w1, w2, x, y):
        return jask.sum(jask.square(x @ w1 @ w2 - y)) * scale

    step = jax.jit(jax.grad(loss, argnums=(0, 1)))
    events = collections.defaultdict(float)
    jax.monitoring.register_event_duration_secs_listener(lambda name, secs, **kw: events.__setitem__(
        name, events[name] + secs))
    compiles = _Compiles()
    logging.getLogger("jax").addHandler(compiles)
    jax.config.update("jax_log_compiles", True)
    for call in range(3):
        events.clear()
        compiles.seen.clear()
        t0 = time.perf_counter()
        with jask.profile() as prof:
            g1, g2 = step(W1, W2, X, Y)
            np.asarray(g1), np.asarray(g2)
        wall = time.perf_counter() - t0
        print(f"\ncall {call}: {wall:.2f} s wall, {len(compiles.seen)} XLA compilations "
              f"({sum(s for s, _ in compiles.seen):.2f} s); jask: {prof.windows} windows, {prof.kernel_calls} kernel "
              f"calls ({prof.xla_fallback_calls} on the xla fallback), {prof.bytes_read / 1e9:.2f} GB read")
        for name, secs in sorted(events.items(), key=lambda kv: -kv[1])[:8]:
            print(f"  {secs:8.3f} s  {name}")
        for secs, name in sorted(compiles.seen, reverse=True)[:10]:
            print(f"  compile {secs:7.3f} s  {name[:110]}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
