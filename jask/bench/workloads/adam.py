"""Workload 5: one Adam step over a DiskArray parameter, committed in place with ``update_``.

The parameter ``W`` and a target ``T`` are float32 arrays of the given size;
``loss(W) = sum((W - T) ** 2)``. jask runs ``jask.optim.adam`` inside one
``jax.jit`` step (gradient, moments persisted, update) and ``W.update_`` on a
store opened ``r+``; jnp runs ``optax.adam`` in RAM; dask-manual writes the
same update by hand. Throughput counts parameter bytes updated per second;
the raw-io limit reads W, T, m and v and writes W, m and v once (the least
traffic of one step). Every system starts from the same parameters, and
the parameters after its first step (and their change) must agree.
"""
from __future__ import annotations

import os
import shutil

import numpy as np

from jask.bench import data, peers
from jask.bench.workloads import default_chunk_edge, gib_label, rows_for, COLS

NAME = "adam"
TITLE = "one Adam step (jit: grad, moments, update) on a parameter array, then update_"
UNIT = "GB/s"
WORK = "parameter bytes updated per second"
CACHE = ("cold",)
LIMIT = "raw-io"
LR, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-8
DEFAULT_GIB = (0.25, 0.5)
QUICK_GIB = (1 / 64,)


def sizes(gib, quick):
    return [dict(label=gib_label(g), gib=g, shape=[rows_for(g), COLS]) for g in (gib or (QUICK_GIB if quick else DEFAULT_GIB))]


def work(p):
    return 4.0 * p["shape"][0] * p["shape"][1]


def ram_bytes(p):
    return 6 * work(p)


def chunk_edge(p, budget):
    # one pass reads W, T, m and v and computes m, v and W in lockstep (about 20 fused elementwise
    # ops): budget it as 16 inputs, which gives the edge jask's planner picks for it (512 at 256MB)
    return default_chunk_edge(p["shape"], budget, n_inputs=16)


def make_data(p, root, tile, layout):
    j = os.path.join
    paths = {"W": data.write_store(j(root, "W.zarr"), p["shape"], tile, seed=31, layout=layout),
             "T": data.write_store(j(root, "T.zarr"), p["shape"], tile, seed=32, layout=layout)}
    # stand-ins for the moments m and v, read only by the raw-io limit (distinct files, so none is cached)
    for name, seed in (("m", 33), ("v", 34)):
        paths[name] = data.write_store(j(root, f"{name}.zarr"), p["shape"], tile, seed=seed, layout=layout)
    return paths


def _check_store(path, start):
    """The final parameters, and their change from the start (an update too small to move ``W`` shows here)."""
    return {"W": data.summarize_store(path), "step": data.summarize_store(path, minus=start)}


class Jask(peers.JaskRunner):
    check_after_first_run = True

    def setup(self):
        super().setup()
        jask, jax = self.jask, self.jax
        shutil.copytree(self.paths["W"], self.out_path("W.zarr"))
        self.W = jask.from_zarr(self.out_path("W.zarr"), mode="r+")
        self.T = jask.from_zarr(self.paths["T"])
        opt = jask.optim.adam(LR, B1, B2, EPS)
        self.state = opt.init(self.W)

        def loss(w, t):
            return jask.sum(jask.square(w - t))

        @jax.jit
        def step(w, state, t):
            g = jax.grad(loss)(w, t)
            updates, state = opt.update(g, state, w)
            return jask.optim.apply_updates(w, updates), state

        self.f = step

    def step(self):
        new_w, self.state = self.f(self.W, self.state, self.T)
        self.W.update_(new_w)

    def check(self):
        return _check_store(self.out_path("W.zarr"), self.paths["W"])


class Jnp(peers.JnpRunner):
    check_after_first_run = True

    def setup(self):
        import optax
        jax, jnp = self.jax, self.jnp
        self.W, self.T = self.load("W"), self.load("T")
        opt = optax.adam(LR, B1, B2, EPS)
        self.state = opt.init(self.W)

        @jax.jit
        def step(w, state, t):
            g = jax.grad(lambda w: jnp.sum(jnp.square(w - t)))(w)
            updates, state = opt.update(g, state, w)
            return optax.apply_updates(w, updates), state

        self.f = step

    def run(self):
        self.W, self.state = self.jax.block_until_ready(self.f(self.W, self.state, self.T))

    def check(self):
        w, w0 = np.asarray(self.W), data.read_store(self.paths["W"])
        return {"W": data.summarize(w), "step": data.summarize(w - w0)}


class DaskManual(peers.DaskRunner):
    """Adam written out: g = 2 (W - T); moments; bias correction; W, m and v stored in one pass."""

    check_after_first_run = True

    def setup(self):
        self.count = 0
        self.current = {"W": self.paths["W"], "m": None, "v": None}
        self.T = self.open("T")

    def run(self):
        da = self.da
        self.count += 1
        t = self.count
        W = da.from_zarr(self.current["W"])
        g = (W - self.T) * np.float32(2.0)
        zeros = lambda: da.zeros(W.shape, dtype=W.dtype, chunks=W.chunks)  # noqa: E731
        m = da.from_zarr(self.current["m"]) if self.current["m"] else zeros()
        v = da.from_zarr(self.current["v"]) if self.current["v"] else zeros()
        m = m * np.float32(B1) + g * np.float32(1 - B1)
        v = v * np.float32(B2) + (g * g) * np.float32(1 - B2)
        mhat = m * np.float32(1 / (1 - B1 ** t))
        vhat = v * np.float32(1 / (1 - B2 ** t))
        W = W - np.float32(LR) * (mhat / (da.sqrt(vhat) + np.float32(EPS)))
        paths = {k: self.out_path(f"{k}-{t % 2}.zarr") for k in "Wmv"}
        self.store([W, m, v], [paths["W"], paths["m"], paths["v"]])
        self.current = paths

    def check(self):
        return _check_store(self.current["W"], self.paths["W"])


class RawIO(peers.RawIORunner):
    """The least traffic of one step: read W, T, m and v, write W, m and v."""

    inputs = ("W", "T", "m", "v")

    def setup(self):
        self.write_bytes = 3 * int(work(self.params))


SYSTEMS = {
    "jask": Jask,
    "dask": "cannot: no autodiff and no optax; dask-manual runs the hand-written Adam update",
    "dask-manual": DaskManual,
    "cubed": "cannot: no autodiff and no optax; hand-written version not run (see dask-manual)",
    "jnp": Jnp,
    "naive-loop": "not defined for an optimizer step",
    "raw-io": RawIO,
    "memcpy": "not the limit here: the least I/O of one step (raw-io) is",
}
