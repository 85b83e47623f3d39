"""Workload 1: the sum of every element of one multi-GiB array (a pure streaming read)."""
from __future__ import annotations

import os

from jask.bench import data, peers
from jask.bench.workloads import default_chunk_edge, gib_label, rows_for, COLS

NAME = "sum"
TITLE = "full sum of one float32 array"
UNIT = "GB/s"
WORK = "input bytes per second"
CACHE = ("cold", "warm")
LIMIT = "raw-io"
DEFAULT_GIB = (0.5, 2.0)
QUICK_GIB = (1 / 32,)


def sizes(gib, quick):
    return [dict(label=gib_label(g), gib=g, shape=[rows_for(g), COLS]) for g in (gib or (QUICK_GIB if quick else DEFAULT_GIB))]


def work(p):
    return 4.0 * p["shape"][0] * p["shape"][1]


def ram_bytes(p):
    return work(p)


def chunk_edge(p, budget):
    return default_chunk_edge(p["shape"], budget, n_inputs=1)


def make_data(p, root, tile, layout):
    return {"x": data.write_store(os.path.join(root, "x.zarr"), p["shape"], tile, seed=1, layout=layout)}


class Jask(peers.JaskRunner):
    def setup(self):
        super().setup()
        self.x = self.jask.from_zarr(self.paths["x"])

    def step(self):
        self.value = float(self.jask.sum(self.x))

    def check(self):
        return {"sum": self.value}


class Dask(peers.DaskRunner):
    def setup(self):
        self.x = self.open("x")

    def run(self):
        self.value = float(self.x.sum().compute())

    def check(self):
        return {"sum": self.value}


class Cubed(peers.CubedRunner):
    def setup(self):
        super().setup()
        self.x = self.open("x")

    def run(self):
        self.value = float(self.xp.sum(self.x).compute())

    def check(self):
        return {"sum": self.value}


class Jnp(peers.JnpRunner):
    def setup(self):
        self.x = self.load("x")
        self.f = self.jax.jit(self.jnp.sum)

    def run(self):
        self.value = float(self.f(self.x))

    def check(self):
        return {"sum": self.value}


class NaiveLoop(peers.NaiveLoopRunner):
    def setup(self):
        self.z = self.open("x")
        self.f = self.jax.jit(self.jnp.sum)

    def run(self):
        acc = 0.0
        for r in self.regions(self.z.shape):
            acc += float(self.f(self.z[r]))   # float() waits: nothing overlaps
        self.value = acc

    def check(self):
        return {"sum": self.value}


class RawIO(peers.RawIORunner):
    inputs = ("x",)


class Memcpy(peers.MemcpyRunner):
    def setup(self):
        self.nbytes = int(work(self.params))
        super().setup()


SYSTEMS = {
    "jask": Jask,
    "dask": Dask,
    "dask-manual": "not needed: dask.array sums directly",
    "cubed": Cubed,
    "jnp": Jnp,
    "naive-loop": NaiveLoop,
    "raw-io": RawIO,
    "memcpy": Memcpy,
}
