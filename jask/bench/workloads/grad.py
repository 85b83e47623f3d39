"""Workload 4: ``jit(grad)`` of a mean squared error through two matmuls, data on disk.

``loss(W1, W2) = sum((X @ W1 @ W2 - Y) ** 2) / N`` with ``X`` (N x 1024) the
big array, ``W1`` (1024 x 64), ``W2`` (64 x 1) and ``Y`` (N x 1); the gradient
with respect to both weights. Throughput counts the bytes of ``X`` and ``Y``
per gradient evaluation: one pass over the data is the least any system reads.
"""
from __future__ import annotations

import os

import numpy as np

from jask.bench import data, peers
from jask.bench.workloads import default_chunk_edge, gib_label, rows_for

NAME = "grad"
TITLE = "jit(grad) of MSE(X @ W1 @ W2, Y) w.r.t. W1 (1024 x 64) and W2 (64 x 1)"
UNIT = "GB/s"
WORK = "bytes of X and Y per gradient evaluation per second"
CACHE = ("cold",)
LIMIT = "raw-io"
FEATURES, HIDDEN = 1024, 64
DEFAULT_GIB = (0.25, 1.0)
QUICK_GIB = (1 / 64,)


def sizes(gib, quick):
    out = []
    for g in gib or (QUICK_GIB if quick else DEFAULT_GIB):
        n = rows_for(g, FEATURES)
        out.append(dict(label=gib_label(g), gib=g, rows=n, features=FEATURES, hidden=HIDDEN,
                        flops=2.0 * n * FEATURES * HIDDEN * 2 + 6.0 * n * HIDDEN))
    return out


def work(p):
    return 4.0 * p["rows"] * (p["features"] + 1)


def ram_bytes(p):
    return work(p) + 8.0 * p["rows"] * p["hidden"]


def chunk_edge(p, budget):
    return default_chunk_edge((p["rows"], p["features"]), budget, n_inputs=2)


def make_data(p, root, tile, layout):
    n, d, h = p["rows"], p["features"], p["hidden"]
    j = os.path.join
    return {"X": data.write_store(j(root, "X.zarr"), (n, d), tile, seed=21, layout=layout),
            "Y": data.write_store(j(root, "Y.zarr"), (n, 1), tile, seed=22, scale=4.0, layout=layout),
            "W1": data.write_store(j(root, "W1.zarr"), (d, h), tile, seed=23, scale=0.2, shift=-0.1),
            "W2": data.write_store(j(root, "W2.zarr"), (h, 1), tile, seed=24, scale=0.2, shift=-0.1)}


def _check(g1, g2):
    return {"dW1": data.summarize(np.asarray(g1)), "dW2": data.summarize(np.asarray(g2))}


class Jask(peers.JaskRunner):
    def setup(self):
        super().setup()
        jask = self.jask
        self.X, self.Y, self.W1, self.W2 = (jask.from_zarr(self.paths[k]) for k in ("X", "Y", "W1", "W2"))
        scale = 1.0 / self.params["rows"]

        def loss(w1, w2, x, y):
            return jask.sum(jask.square(x @ w1 @ w2 - y)) * scale

        self.g = self.jax.jit(self.jax.grad(loss, argnums=(0, 1)))

    def step(self):
        g1, g2 = self.g(self.W1, self.W2, self.X, self.Y)
        self.out = (np.asarray(g1), np.asarray(g2))

    def check(self):
        return _check(*self.out)


class Jnp(peers.JnpRunner):
    def setup(self):
        self.X, self.Y, self.W1, self.W2 = (self.load(k) for k in ("X", "Y", "W1", "W2"))
        jnp, scale = self.jnp, 1.0 / self.params["rows"]

        def loss(w1, w2, x, y):
            return jnp.sum(jnp.square(x @ w1 @ w2 - y)) * scale

        self.g = self.jax.jit(self.jax.grad(loss, argnums=(0, 1)))

    def run(self):
        self.out = self.jax.block_until_ready(self.g(self.W1, self.W2, self.X, self.Y))

    def check(self):
        return _check(*self.out)


class DaskManual(peers.DaskRunner):
    """The gradient derived by hand: dP = 2 R / N, dW2 = H^T dP, dW1 = X^T (dP W2^T)."""

    def setup(self):
        self.X, self.Y = self.open("X"), self.open("Y")
        self.W1, self.W2 = data.read_store(self.paths["W1"]), data.read_store(self.paths["W2"])

    def run(self):
        H = self.X @ self.W1
        dP = (H @ self.W2 - self.Y) * np.float32(2.0 / self.params["rows"])
        dW2 = H.T @ dP
        dW1 = self.X.T @ (dP @ self.W2.T)
        self.out = self.da.compute(dW1, dW2)

    def check(self):
        return _check(*self.out)


class RawIO(peers.RawIORunner):
    inputs = ("X", "Y")


SYSTEMS = {
    "jask": Jask,
    "dask": "cannot: dask.array has no autodiff (jax.grad); dask-manual runs the hand-derived gradient",
    "dask-manual": DaskManual,
    "cubed": "cannot: Cubed has no autodiff (jax.grad); hand-derived version not run (see dask-manual)",
    "jnp": Jnp,
    "naive-loop": "not defined for an autodiff workload",
    "raw-io": RawIO,
    "memcpy": "not the limit here: one pass over X and Y (raw-io) is",
}
