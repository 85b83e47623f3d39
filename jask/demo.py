"""The main job: train a linear model on a Zarr data set several times the memory budget.

    python -m jask.demo                      # 512 MiB of features, 64 MB budget
    python -m jask.demo --rows=2097152 --budget=256MB --steps=20

Builds ``X`` (rows x features) and ``y = X @ w_true + noise`` as local Zarr
stores chunk by chunk (never whole in memory), then runs Adam on the mean
squared error with ``jax.jit(jax.value_and_grad(...))``; parameters are
DiskArrays updated in place, so the step compiles once.

Writes the data set to ``--data_dir`` (default ``jask-demo-data`` in the
working directory; 514 MiB at the default size), which is kept so the next
run reuses it: delete the folder to free the space. Op outputs and gradients
live in ``JASK_SCRATCH_DIR`` if that is set, else in ``<data_dir>/scratch``,
while the demo runs. Bad flags are refused before anything is written. The last lines split the
peak RSS into the runtime's baseline (Python, JAX and XLA, measured at
start-up) and what was added since, and compare jask's working set per step
with the budget.
"""
from __future__ import annotations

import os
import time

import numpy as np
from absl import flags

from jask import cli

FLAGS = flags.FLAGS
flags.DEFINE_integer("rows", 524_288, "Number of samples.")
flags.DEFINE_integer("features", 256, "Number of features.")
flags.DEFINE_string("budget", "64MB", "jask memory budget.")
flags.DEFINE_integer("steps", 10, "Optimizer steps.")
flags.DEFINE_float("lr", 0.01, "Adam learning rate.")
flags.DEFINE_string("data_dir", "jask-demo-data", "Where the Zarr data set is written (a real disk).")
flags.DEFINE_boolean("keep", True, "Reuse an existing data set of the same shape instead of rebuilding it.")
for _name in ("rows", "features", "steps"):
    flags.register_validator(_name, lambda v: v >= 1, message=f"--{_name} must be at least 1")
flags.register_validator("lr", lambda v: 0 < v < float("inf"), message="--lr must be a positive, finite number")
cli.check_budget_flag()


def scratch_dir() -> str:
    """``JASK_SCRATCH_DIR`` if set (a tmpfs data folder needs another place), else ``<data_dir>/scratch``."""
    return os.environ.get("JASK_SCRATCH_DIR") or os.path.join(FLAGS.data_dir, "scratch")


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

    baseline = jask.runtime_baseline()      # Python + JAX + XLA before jask does any work
    jask.set_memory_budget(FLAGS.budget, scratch_dir=scratch_dir())
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

    steps = []
    with jask.profile() as p:
        for i in range(FLAGS.steps):
            with jask.profile() as s:
                new_w, state, loss = step(w, state, X, y)
                w.update_(new_w)
            steps.append(s)
            grew = "" if s.peak_rss_is_lifetime else f", +{s.working_set_bytes / 2**20:.0f} MiB RSS during the step"
            print(f"step {i:3d}  loss {float(loss):.6f}  ({s.wall_seconds:.2f} s{grew})")
    wall = p.wall_seconds
    print(f"throughput: {p.bytes_read / wall / 1e9:.2f} GB/s read, "
          f"{FLAGS.steps * X.nbytes / wall / 1e9:.2f} GB/s of X per step-pass, {wall / FLAGS.steps:.2f} s/step")
    if len(steps) > 1:   # the first step also traces and compiles: the steady rate is what a long run sees
        later_s = sum(s.wall_seconds for s in steps[1:])
        later_b = sum(s.bytes_read for s in steps[1:])
        print(f"after the first step (which compiles): {later_b / later_s / 1e9:.2f} GB/s read, "
              f"{later_s / (len(steps) - 1):.2f} s/step, X read {later_b / (len(steps) - 1) / X.nbytes:.2f} "
              "times per step (w's gradient is computed in the loss's pass over X)")
    print(f"bytes read {p.bytes_read / 2**30:.2f} GiB, written {p.bytes_written / 2**20:.1f} MiB")
    print(memory_lines(p, steps, baseline, budget))
    print(f"final loss {float(loss):.6f}; data set kept at {os.path.abspath(FLAGS.data_dir)} "
          f"({_du(FLAGS.data_dir) / 2**20:.0f} MiB; delete the folder to free it)")
    del jnp


def memory_lines(p, steps, baseline: int, budget: int) -> str:
    """Peak RSS of the training loop, split into the runtime's baseline and what jask added.

    ``baseline`` is the RSS of Python, JAX and XLA measured at start-up. The
    rest of the peak is what the program added since: the jitted step's
    compiled code and caches (kept from the first step on) and jask's working
    set, the growth during one step, which the budget bounds. The first step
    also compiles the step, so it is shown apart.
    """
    from jask.api import observe as jask_observe
    mib = lambda n: f"{n / 2**20:.0f} MiB"
    added = max(p.peak_rss_bytes - baseline, 0)
    when = " over the process's lifetime" if p.peak_rss_is_lifetime else ""
    if p.peak_rss_is_lifetime and p.peak_rss_bytes <= jask_observe.runtime_startup_peak():
        return (f"memory: peak RSS {mib(p.peak_rss_bytes)}{when}, reached while the runtime started (Python, JAX, "
                f"XLA and the device runtime; {mib(baseline)} resident after start-up)\n"
                f"        (this platform cannot reset the peak, so jask's per-step working set is not "
                f"measured; budget {mib(budget)})")
    lines = [f"memory: peak RSS {mib(p.peak_rss_bytes)}{when} = runtime baseline {mib(baseline)} (Python, JAX, "
             f"XLA and the device runtime at start-up) + {mib(added)} added since (compiled step, caches, "
             "jask's tiles)"]
    if p.peak_rss_is_lifetime:   # e.g. gVisor: no resettable peak, so no per-step working set
        lines.append(f"        (this platform cannot reset the peak, so jask's per-step working set is not "
                     f"measured; budget {mib(budget)})")
        return "\n".join(lines)
    later = [s.working_set_bytes for s in steps[1:]]
    if later:
        ok = "within" if max(later) <= budget else "OVER"
        lines.append(f"        jask's working set: at most {mib(max(later))} per step after the first ({ok} "
                     f"the budget of {mib(budget)}; planned {mib(p.peak_projected_bytes)}); the first step, "
                     f"which also compiles it, {mib(steps[0].working_set_bytes)}")
    return "\n".join(lines)


def _du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


if __name__ == "__main__":
    cli.run(main)
