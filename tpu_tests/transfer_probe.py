"""Where a streamed pass spends its time on an accelerator: reads, host-to-device copies, kernels.

    python tpu_tests/transfer_probe.py --gib=1 --scratch=DIR

Measurement only (run by ``tpu-check.sh probe``), not a test. It times, in one process:
raw ``readinto`` of the store's chunk files (warm page cache); ``jax.device_put`` of
16 MiB host tiles one at a time, from two threads, and stacked four to a copy; ``jnp.sum``
of tiles already on the device; ``jask.sum`` of the store with the compute device the
accelerator and then the host CPU; and ``jit(value_and_grad)`` of an MSE over the same
store (two steps, bytes read per step). Each figure prints as ``name: seconds, GB/s``.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import time

import numpy as np

TILE_ROWS, COLS = 16384, 256      # 16 MiB float32 tiles


def _rate(name, seconds, nbytes):
    print(f"{name}: {seconds:.3f} s, {nbytes / seconds / 1e9:.2f} GB/s", flush=True)


def _timed(fn, repeat=2):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def build(path, gib):
    import zarr
    rows = int(gib * 2**30) // (COLS * 4) // TILE_ROWS * TILE_ROWS
    if os.path.exists(path):
        return path, rows
    z = zarr.create_array(path, shape=(rows, COLS), dtype="float32", chunks=(TILE_ROWS, COLS), compressors=None)
    rng = np.random.default_rng(0)
    for start in range(0, rows, TILE_ROWS):
        z[start:start + TILE_ROWS] = rng.standard_normal((TILE_ROWS, COLS), dtype=np.float32)
    return path, rows


def raw_reads(path):
    files = [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f != "zarr.json"]
    buf = bytearray(TILE_ROWS * COLS * 4)

    def run():
        for f in files:
            with open(f, "rb", buffering=0) as fh:
                fh.readinto(buf)
    return run, sum(os.path.getsize(f) for f in files)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--scratch", default="probe-data")
    args = ap.parse_args()
    import jax
    import jax.numpy as jnp

    import jask
    from jask.io.buffers import shared_pool
    os.makedirs(args.scratch, exist_ok=True)
    path, rows = build(os.path.join(args.scratch, "X.zarr"), args.gib)
    nbytes = rows * COLS * 4
    dev = jax.devices()[0]
    print("device", dev, "store", path, nbytes / 2**30, "GiB", flush=True)

    run, _ = raw_reads(path)
    _rate("raw readinto", _timed(run), nbytes)

    tiles = [np.random.default_rng(i).standard_normal((TILE_ROWS, COLS), dtype=np.float32) for i in range(16)]
    tb = 16 * tiles[0].nbytes
    _rate("device_put 16 MiB x16 serial", _timed(lambda: jax.block_until_ready([jax.device_put(t, dev) for t in tiles])), tb)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        _rate("device_put x16 two threads", _timed(
            lambda: jax.block_until_ready(list(pool.map(lambda t: jax.device_put(t, dev), tiles)))), tb)
    stacks = [np.stack(tiles[i:i + 4]) for i in range(0, 16, 4)]
    _rate("device_put 4 stacks of 4", _timed(lambda: jax.block_until_ready([jax.device_put(s, dev) for s in stacks])), tb)
    _rate("np.stack of 4 x4 (host copy)", _timed(lambda: [np.stack(tiles[i:i + 4]) for i in range(0, 16, 4)]), tb)
    on_dev = [jax.device_put(t, dev) for t in tiles]
    s = jax.jit(jnp.sum)
    jax.block_until_ready(s(on_dev[0]))
    _rate("jnp.sum of device tiles x16", _timed(lambda: jax.block_until_ready([s(t) for t in on_dev])), tb)

    X = jask.from_zarr(path)
    for name, d in (("accelerator", dev), ("host cpu", jax.devices("cpu")[0])):
        jask.config.update("device", d)
        float(jask.sum(X))   # compiles
        for _ in range(2):
            before = shared_pool.allocated
            with jask.profile() as p:
                t0 = time.perf_counter()
                got = float(jask.sum(X))
                sec = time.perf_counter() - t0
            _rate(f"jask.sum compute on {name}", sec, nbytes)
            print(f"  io_wait {p.io_wait_seconds:.3f} s, io {p.io_seconds:.3f} s, kernel calls {p.kernel_calls}, "
                  f"windows {p.windows}, read buffers allocated {shared_pool.allocated - before}, "
                  f"value {got:.6g}", flush=True)
    jask.config.update("device", None)

    w = jask.from_numpy(np.full((COLS, 1), 0.01, np.float32))

    @jax.jit
    def step(X, w):
        return jax.value_and_grad(lambda w: jask.sum(jask.square(X @ w)))(w)

    for i in range(3):
        with jask.profile() as p:
            t0 = time.perf_counter()
            loss, g = step(X, w)
            jax.block_until_ready(g)
            sec = time.perf_counter() - t0
        print(f"jit(value_and_grad) step {i}: {sec:.3f} s, bytes read {p.bytes_read / nbytes:.2f}x X, "
              f"loss {float(loss):.6g}", flush=True)


if __name__ == "__main__":
    main()
