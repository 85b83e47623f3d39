"""Workload 3: ``a @ b`` of two n x n float32 arrays, out of core, written to a new array."""
from __future__ import annotations

import os

import numpy as np

from jask.bench import data, peers
from jask.bench.workloads import default_chunk_edge

NAME = "dot"
TITLE = "a @ b for two n x n float32 arrays, written to a new Zarr array"
UNIT = "GFLOP/s"
WORK = "2 n^3 floating-point operations per second"
CACHE = ("warm",)
LIMIT = "jnp"
DEFAULT_N = (4096, 8192)
QUICK_N = (1024,)


def sizes(gib, quick):
    ns = [int(round((g * 2**30 / 4) ** 0.5)) for g in gib] if gib else (QUICK_N if quick else DEFAULT_N)
    return [dict(label=f"n={n}", gib=4.0 * n * n / 2**30, shape=[n, n]) for n in ns]


def work(p):
    n = p["shape"][0]
    return 2.0 * n ** 3


def ram_bytes(p):
    return 3 * 4.0 * p["shape"][0] ** 2


def chunk_edge(p, budget):
    return default_chunk_edge(p["shape"], budget, n_inputs=2)


def make_data(p, root, tile, layout):
    return {name: data.write_store(os.path.join(root, f"{name}.zarr"), p["shape"], tile, seed=i + 11, layout=layout)
            for i, name in enumerate("ab")}


class Jask(peers.StoreCheck, peers.JaskRunner):
    def setup(self):
        super().setup()
        self.a, self.b = (self.jask.from_zarr(self.paths[k]) for k in "ab")

    def step(self):
        self.jask.to_zarr(self.jask.dot(self.a, self.b), self.out_path(), overwrite=True)


class Dask(peers.StoreCheck, peers.DaskRunner):
    def setup(self):
        self.a, self.b = (self.open(k) for k in "ab")

    def run(self):
        self.store([self.a @ self.b], [self.out_path()])


class Cubed(peers.StoreCheck, peers.CubedRunner):
    def setup(self):
        super().setup()
        self.a, self.b = (self.open(k) for k in "ab")

    def run(self):
        self.store([self.xp.matmul(self.a, self.b)], [self.out_path()])


class Jnp(peers.JnpRunner):
    def setup(self):
        self.a, self.b = (self.load(k) for k in "ab")
        self.f = self.jax.jit(self.jnp.dot)

    def run(self):
        self.out = None
        self.out = self.f(self.a, self.b).block_until_ready()

    def check(self):
        return {"out": data.summarize(np.asarray(self.out))}


SYSTEMS = {
    "jask": Jask,
    "dask": Dask,
    "dask-manual": "not needed: dask.array multiplies directly",
    "cubed": Cubed,
    "jnp": Jnp,
    "naive-loop": "not run: dot is compute-bound; the naive loop is the baseline of the sum target",
    "raw-io": "not the limit here: dot is compute-bound, its limit is jnp.dot in RAM",
    "memcpy": "not the limit here: dot is compute-bound, its limit is jnp.dot in RAM",
}
