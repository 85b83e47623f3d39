"""Workload 2: the elementwise chain ``(a - b) * c + a`` over three arrays, written to a new array."""
from __future__ import annotations

import os

import numpy as np

from jask.bench import data, peers
from jask.bench.workloads import default_chunk_edge, gib_label, rows_for, COLS

NAME = "elementwise"
TITLE = "(a - b) * c + a over three float32 arrays, written to a new Zarr array"
UNIT = "GB/s"
WORK = "bytes read and written (3 inputs + 1 output) per second"
CACHE = ("cold", "warm")
LIMIT = "raw-io"
DEFAULT_GIB = (0.25, 1.0)
QUICK_GIB = (1 / 64,)


def sizes(gib, quick):
    return [dict(label=gib_label(g) + " x 3", gib=g, shape=[rows_for(g), COLS])
            for g in (gib or (QUICK_GIB if quick else DEFAULT_GIB))]


def _nbytes(p):
    return 4.0 * p["shape"][0] * p["shape"][1]


def work(p):
    return 4 * _nbytes(p)


def ram_bytes(p):
    return 5 * _nbytes(p)  # three inputs, the output and one temporary


def chunk_edge(p, budget):
    return default_chunk_edge(p["shape"], budget, n_inputs=3)


def make_data(p, root, tile, layout):
    return {name: data.write_store(os.path.join(root, f"{name}.zarr"), p["shape"], tile, seed=i + 1, layout=layout)
            for i, name in enumerate("abc")}


def chain(a, b, c):
    return (a - b) * c + a


class Jask(peers.StoreCheck, peers.JaskRunner):
    def setup(self):
        super().setup()
        self.a, self.b, self.c = (self.jask.from_zarr(self.paths[k]) for k in "abc")

    def step(self):
        self.jask.to_zarr(chain(self.a, self.b, self.c), self.out_path(), overwrite=True)


class Dask(peers.StoreCheck, peers.DaskRunner):
    def setup(self):
        self.a, self.b, self.c = (self.open(k) for k in "abc")

    def run(self):
        self.store([chain(self.a, self.b, self.c)], [self.out_path()])


class Cubed(peers.StoreCheck, peers.CubedRunner):
    def setup(self):
        super().setup()
        self.a, self.b, self.c = (self.open(k) for k in "abc")

    def run(self):
        self.store([chain(self.a, self.b, self.c)], [self.out_path()])


class Jnp(peers.JnpRunner):
    def setup(self):
        self.a, self.b, self.c = (self.load(k) for k in "abc")
        self.f = self.jax.jit(chain)

    def run(self):
        self.out = None
        self.out = self.f(self.a, self.b, self.c).block_until_ready()

    def check(self):
        return {"out": data.summarize(np.asarray(self.out))}


class NaiveLoop(peers.StoreCheck, peers.NaiveLoopRunner):
    def setup(self):
        self.a, self.b, self.c = (self.open(k) for k in "abc")
        self.f = self.jax.jit(chain)

    def run(self):
        out = data.create_store(self.out_path(), self.a.shape, self.chunks_of(self.a.shape))
        for r in self.regions(self.a.shape):
            out[r] = np.asarray(self.f(self.a[r], self.b[r], self.c[r]))


class RawIO(peers.RawIORunner):
    inputs = ("a", "b", "c")

    def setup(self):
        self.write_bytes = int(_nbytes(self.params))


class Memcpy(peers.MemcpyRunner):
    def setup(self):
        self.nbytes = int(work(self.params))
        super().setup()


SYSTEMS = {
    "jask": Jask,
    "dask": Dask,
    "dask-manual": "not needed: dask.array runs the chain directly",
    "cubed": Cubed,
    "jnp": Jnp,
    "naive-loop": NaiveLoop,
    "raw-io": RawIO,
    "memcpy": Memcpy,
}
