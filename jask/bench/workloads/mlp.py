"""Workload 6: one epoch of minibatch training of a 2-layer MLP with ``optax.adamw``, data on disk.

X (N x 256) and a target column y stay on disk; the weights (256 x 128, 128 x 2,
biases) live in memory, as a training job keeps them. Each system runs the same
jitted step (ReLU, softmax cross-entropy on the labels ``y > 0.5``, adamw) over
the same batches in the same order; they differ only in how a batch's rows get
into memory: ``jask.batches`` (region reads, next batch prefetched), dask
(``X[i:i + b].compute()``), or slices of arrays loaded into RAM (``jnp``). One
epoch reads X and y once, so raw reads are the limit.
"""
from __future__ import annotations

import os

import numpy as np

from jask.bench import data, peers
from jask.bench.workloads import default_chunk_edge, gib_label, rows_for

NAME = "mlp"
TITLE = "one epoch of a 2-layer MLP (adamw, minibatches of 4096 rows) over X on disk"
UNIT = "GB/s"
WORK = "bytes of X and y per epoch per second"
CACHE = ("warm",)
LIMIT = "raw-io"
FEATURES, HIDDEN, BATCH = 256, 128, 4096
DEFAULT_GIB = (0.5,)
QUICK_GIB = (1 / 64,)


def sizes(gib, quick):
    out = []
    for g in gib or (QUICK_GIB if quick else DEFAULT_GIB):
        n = rows_for(g, FEATURES) // BATCH * BATCH
        out.append(dict(label=gib_label(g), gib=g, rows=n, features=FEATURES))
    return out


def work(p):
    return 4.0 * p["rows"] * (p["features"] + 1)


def ram_bytes(p):
    return work(p)


def chunk_edge(p, budget):
    return default_chunk_edge((p["rows"], p["features"]), budget, n_inputs=2)


def make_data(p, root, tile, layout):
    n, d = p["rows"], p["features"]
    j = os.path.join
    return {"X": data.write_store(j(root, "X.zarr"), (n, d), tile, seed=31, shift=-0.5, layout=layout),
            "y": data.write_store(j(root, "y.zarr"), (n, 1), tile, seed=32, layout=layout)}


def trainer(jax, jnp, features):
    """``(params, state, step)``: the same initial weights and jitted adamw step for every system."""
    import optax
    k1, k2 = jax.random.split(jax.random.key(0))
    params = {"w1": jax.random.normal(k1, (features, HIDDEN)) / 16, "b1": jnp.zeros(HIDDEN),
              "w2": jax.random.normal(k2, (HIDDEN, 2)) / 11, "b2": jnp.zeros(2)}
    opt = optax.adamw(1e-3)

    def loss_fn(params, xb, yb):
        hidden = jax.nn.relu(xb @ params["w1"] + params["b1"])
        logits = hidden @ params["w2"] + params["b2"]
        labels = (yb[:, 0] > 0.5).astype(jnp.int32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    @jax.jit
    def step(params, state, xb, yb):
        value, grads = jax.value_and_grad(loss_fn)(params, xb, yb)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    return params, opt.init(params), step


def _epoch(runner, batches):
    params, state, step = runner.start
    losses = []
    for xb, yb in batches:
        params, state, value = step(params, state, xb, yb)
        value.block_until_ready()   # as the README's loop: steps dispatched ahead would each hold a batch
        losses.append(value)
    runner.losses = [float(v) for v in losses]
    runner.final = params


def _check(runner):
    return {"first loss": runner.losses[0], "last loss": runner.losses[-1],
            "w1": data.summarize(np.asarray(runner.final["w1"]))}


class Jask(peers.JaskRunner):
    def setup(self):
        super().setup()
        self.X, self.y = (self.jask.from_zarr(self.paths[k]) for k in ("X", "y"))
        self.start = trainer(self.jax, self.jnp, self.params["features"])

    def step(self):
        _epoch(self, self.jask.batches(self.X, self.y, batch_size=BATCH))

    def check(self):
        return _check(self)


class DaskManual(peers.DaskRunner):
    """Hand-written: each batch is ``X[i:i + b].compute()``, read on the step's thread."""

    def setup(self):
        self.X, self.y = self.open("X"), self.open("y")
        import jax
        import jax.numpy as jnp
        self.start = trainer(jax, jnp, self.params["features"])

    def run(self):
        n = self.params["rows"]
        _epoch(self, (self.da.compute(self.X[i:i + BATCH], self.y[i:i + BATCH]) for i in range(0, n, BATCH)))

    def check(self):
        return _check(self)


class Jnp(peers.JnpRunner):
    def setup(self):
        self.X, self.y = self.load("X"), self.load("y")
        self.start = trainer(self.jax, self.jnp, self.params["features"])

    def run(self):
        n = self.params["rows"]
        _epoch(self, ((self.X[i:i + BATCH], self.y[i:i + BATCH]) for i in range(0, n, BATCH)))

    def check(self):
        return _check(self)


class RawIO(peers.RawIORunner):
    inputs = ("X", "y")


SYSTEMS = {
    "jask": Jask,
    "dask": "dask-manual runs it: dask.array has no minibatch iterator",
    "dask-manual": DaskManual,
    "cubed": "not run: Cubed has no minibatch iterator, and a slice per batch is a new plan",
    "jnp": Jnp,
    "naive-loop": "not defined for a training loop",
    "raw-io": RawIO,
    "memcpy": "not the limit here: one pass over X and y (raw-io) is",
}
