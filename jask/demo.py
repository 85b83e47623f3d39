"""The main job: train a linear model on a Zarr data set several times the memory budget.

    python -m jask.demo                      # 512 MiB of features, 64 MB budget
    python -m jask.demo --rows=2097152 --budget=256MB --steps=20

Builds ``X`` (rows x features) and ``y = X @ w_true + noise`` as local Zarr
stores chunk by chunk (never whole in memory), then runs Adam on the mean
squared error with ``jax.jit(jax.value_and_grad(...))``; parameters are
DiskArrays updated in place, so the step compiles once.
"""
from __future__ import annotations

import os
import resource
import time

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("rows", 524_288, "Number of samples.")
flags.DEFINE_integer("features", 256, "Number of features.")
flags.DEFINE_string("budget", "64MB", "jask memory budget.")
flags.DEFINE_integer("steps", 10, "Optimizer steps.")
flags.DEFINE_float("lr", 0.01, "Adam learning rate.")
flags.DEFINE_string("data_dir", "jask-demo-data", "Where the Zarr data set is written (a real disk).")
flags.DEFINE_boolean("keep", True, "Reuse an existing data set of the same shape instead of rebuilding it.")


def build_dataset(data_dir: str, rows: int, features: int, chunk_rows: int):
    """Write X and y as Zarr v3 stores, one row slab at a time; returns their paths."""
    import zarr
    x_path, y_path = os.path.join(data_dir, "X.zarr"), os.path.join(data_dir, "y.zarr")
    if FLAGS.keep and os.path.exists(x_path) and os.path.exists(y_path):
        if tuple(zarr.open_array(x_path, mode="r").shape) == (rows, features):
            return x_path, y_path
    rng = np.random.default_rng(0)
    w_true = rng.standard_normal((features, 1), dtype=np.float32) / np.sqrt(features)
    X = zarr.create_array(x_path, shape=(rows, features), dtype="float32",
                          chunks=(chunk_rows, features), compressors=None, overwrite=True)
    y = zarr.create_array(y_path, shape=(rows, 1), dtype="float32",
                          chunks=(chunk_rows, 1), compressors=None, overwrite=True)
    for start in range(0, rows, chunk_rows):
        n = min(chunk_rows, rows - start)
        xb = rng.standard_normal((n, features), dtype=np.float32)
        X[start:start + n] = xb
        y[start:start + n] = xb @ w_true + 0.01 * rng.standard_normal((n, 1), dtype=np.float32)
    return x_path, y_path


def main(argv):
    del argv
    import jax
    import jax.numpy as jnp

    import jask
    import jask.optim

    jask.set_memory_budget(FLAGS.budget, scratch_dir=os.path.join(FLAGS.data_dir, "scratch"))
    os.makedirs(FLAGS.data_dir, exist_ok=True)
    t0 = time.perf_counter()
    x_path, y_path = build_dataset(FLAGS.data_dir, FLAGS.rows, FLAGS.features, 8192)
    X, y = jask.from_zarr(x_path), jask.from_zarr(y_path)
    budget = jask.config.config.memory_budget
    print(f"data: X {X.shape} at {os.path.abspath(x_path)} ({X.nbytes / 2**20:.0f} MiB, "
          f"{X.nbytes / budget:.1f}x the {budget / 2**20:.0f} MiB budget), built in {time.perf_counter() - t0:.1f} s")

    w = jask.from_numpy(np.zeros((FLAGS.features, 1), np.float32))
    opt = jask.optim.adam(FLAGS.lr)
    state = opt.init(w)
    scale = 1.0 / FLAGS.rows

    def loss_fn(w, X, y):
        return jask.sum(jask.square(X @ w - y)) * scale

    @jax.jit
    def step(w, state, X, y):
        loss, g = jax.value_and_grad(loss_fn)(w, X, y)
        updates, state = opt.update(g, state, w)
        return jask.optim.apply_updates(w, updates), state, loss

    stats = jask.Stats()
    from jask.base import executor
    executor._listeners.append(stats)
    start = time.perf_counter()
    for i in range(FLAGS.steps):
        t = time.perf_counter()
        new_w, state, loss = step(w, state, X, y)
        w.update_(new_w)
        print(f"step {i:3d}  loss {float(loss):.6f}  ({time.perf_counter() - t:.2f} s)")
    wall = time.perf_counter() - start
    executor._listeners.remove(stats)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"throughput: {stats.bytes_read / wall / 1e9:.2f} GB/s read, "
          f"{FLAGS.steps * X.nbytes / wall / 1e9:.2f} GB/s of X per step-pass, {wall / FLAGS.steps:.2f} s/step")
    print(f"bytes read {stats.bytes_read / 2**30:.2f} GiB, written {stats.bytes_written / 2**20:.1f} MiB; "
          f"peak RSS {peak / 2**20:.0f} MiB (budget {budget / 2**20:.0f} MiB)")
    print(f"final loss {float(loss):.6f}; data set kept at {os.path.abspath(FLAGS.data_dir)}")
    del jnp


if __name__ == "__main__":
    app.run(main)
