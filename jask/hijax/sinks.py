"""The hi-primitives of the sinks that work under ``jit``: ``materialize`` and ``persist``."""
from __future__ import annotations

import dataclasses

import numpy as np

from jask.exec.driver import run, store_with_next_run
from jask.exec.sinks import MemorySink, store_numpy
from jask.graph.tiling import block_shape
from jask.hijax import compat, runtime
from jask.hijax.array import DiskArray, zeros_node
from jask.plan.tiling import default_tile


@dataclasses.dataclass(frozen=True)
class _ToMemory:
    def __call__(self, node):
        if 0 in node.shape:     # empty: nothing to compute
            return (np.zeros(node.shape, node.dtype),)
        return run([node], lambda n, tile: MemorySink(n, tile))


def store_value(a, tag: str = "input"):
    """An in-memory array stored to scratch in the chunks jask writes new arrays with (a StoredNode)."""
    a = np.asarray(a)
    return store_numpy(a, block_shape(a.shape, default_tile(a.shape, a.dtype.itemsize)), tag=tag)


@dataclasses.dataclass(frozen=True)
class _FromMemory:
    """The gradient of ``materialize``: an in-memory cotangent (the size the user materialized) stored."""

    def __call__(self, g):
        return (store_value(g),)


class MaterializePrimitive(compat.HiPrimitive):
    """``materialize`` under jit: the one op whose output is a full in-memory array, by request."""

    def __init__(self, in_type):
        self.in_avals = (in_type,)
        self.out_aval = compat.ShapedArray(in_type.shape, in_type.dtype)
        self.params = dict(signature=in_type)
        super().__init__()

    def expand(self, x):
        (out,) = runtime.host_call(_ToMemory(), (self.out_aval,), [runtime.ref_of(x)], [True])
        return out

    def vjp_fwd(self, nzs, x):
        return self(x), None

    def vjp_bwd_retval(self, res, g):
        if 0 in g.shape:
            return (DiskArray(node=zeros_node(g.shape, g.dtype)),)
        return (FromMemoryPrimitive(self.in_avals[0])(g),)


class FromMemoryPrimitive(compat.HiPrimitive):
    """An in-memory array stored as a DiskArray, under jit too: the backward pass of ``materialize``."""

    def __init__(self, out_type):
        self.in_avals = (compat.ShapedArray(out_type.shape, out_type.dtype),)
        self.out_aval = out_type
        self.params = dict(signature=out_type)
        super().__init__()

    def expand(self, g):
        (out,) = runtime.host_call(_FromMemory(), (self.out_aval,), [g], [False])
        return out

    def vjp_fwd(self, nzs, g):
        raise NotImplementedError("second-order gradients through jask.materialize are not supported")


@dataclasses.dataclass(frozen=True)
class _Persist:
    defer: bool = False
    only: object = None       # with ``defer``: store only the nodes this predicate accepts
    optional: object = True   # with ``only``: a saving, which a shared loss pass drops (or a predicate)

    def __call__(self, *nodes):
        if self.defer:
            # a predicate marks a gradient's residuals: a saving, which a shared loss pass drops unless
            # a big input's gradient, which that pass never computes, needs it (residuals.keep_output)
            for n in nodes:
                if self.only is None or self.only(n):
                    optional = self.optional(n) if callable(self.optional) else self.optional
                    store_with_next_run([n], optional=self.only is not None and optional)
            return nodes
        return tuple(run(nodes))


class PersistPrimitive(compat.HiPrimitive):
    """``persist`` under jit: compute arrays into scratch now (or with the next run); the identity for gradients.

    ``only`` (with ``defer``): a predicate on nodes; the others are passed through unstored
    (:mod:`jask.hijax.residuals` keeps only small residuals so), and those stored are ``optional``.
    """

    def __init__(self, types, defer=False, only=None, optional=True):
        self.in_avals = tuple(types)
        self.out_aval = tuple(types)
        self.defer, self.only, self.optional = defer, only, optional
        self.params = dict(signature=tuple(types), defer=defer, only=only, optional=optional)
        super().__init__()

    def expand(self, *xs):
        return runtime.host_call(_Persist(self.defer, self.only, self.optional), self.out_aval,
                                 [runtime.ref_of(x) for x in xs], [True] * len(xs))

    def vjp_fwd(self, nzs, *xs):
        return self(*xs), None

    def vjp_bwd_retval(self, res, gs):
        return tuple(gs)
