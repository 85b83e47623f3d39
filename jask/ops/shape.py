"""Shape ops that move no data between tiles: ``reshape``, ``expand_dims``, ``squeeze``, axis permutations.

A row-major reshape splits into *groups*: runs of input axes whose product
equals a run of output axes. Size-1 axes can be added or dropped anywhere
(their one block is block 0), and a group of one axis kept as is passes its
tiles through. A group that really merges or splits axes, as flattening
``(n, 28, 28)`` to ``(n, 784)`` does, is regrouped inside one tile, so all its
axes must fit in one tile (size <= the plan's tile edge) on both sides; then
each output tile is one input tile reshaped. Other reshapes gather each output
tile from the input tiles it spans (:mod:`jask.ops.regroup`), chosen when the
regrouped axes exceed the default tile edge; if a plan's tile turns out smaller
than that edge, the tile-by-tile path refuses with the sizes and what to do.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from jask.graph.op import BlockParallelOp
from jask.hijax.array import DiskArray, is_disk_array, type_of, zeros_node
from jask.hijax.make_op import make_op
from jask.linalg.transpose import transpose as _transpose_op
from jask.ops.axes import normalize_axis
from jask.ops.regroup import regroup
from jask.plan.tiling import default_tile


def _groups(in_shape, out_shape):
    """Pairs ``(input axes, output axes)`` over the non-unit axes whose sizes multiply to the same number."""
    ins = [a for a, d in enumerate(in_shape) if d != 1]
    outs = [a for a, d in enumerate(out_shape) if d != 1]
    groups, i, o = [], 0, 0
    while i < len(ins) or o < len(outs):
        gi, go = [ins[i]], [outs[o]]
        pi, po = in_shape[ins[i]], out_shape[outs[o]]
        i, o = i + 1, o + 1
        while pi != po:
            if pi < po:
                gi.append(ins[i])
                pi *= in_shape[ins[i]]
                i += 1
            else:
                go.append(outs[o])
                po *= out_shape[outs[o]]
                o += 1
        groups.append((tuple(gi), tuple(go)))
    return tuple(groups)


class Reshape(BlockParallelOp):
    """Row-major reshape tile by tile; input 1 is an all-zero witness whose tiling shows the output's."""

    nondiff_inputs = (1,)
    unused_inputs = frozenset({1})

    def __init__(self, in_shape, out_shape, groups):
        self.in_shape, self.out_shape, self.groups = tuple(in_shape), tuple(out_shape), groups
        self.passes = {g[1][0]: g[0][0] for g in groups if len(g[0]) == len(g[1]) == 1}

    @classmethod
    def from_inputs(cls, x, witness, out_shape):
        groups = _groups(x.shape, out_shape)
        for gin, gout in groups:
            if len(gin) == len(gout) == 1:
                continue
            fits = all(x.block_shape[a] == x.shape[a] for a in gin) and all(
                witness.block_shape[a] == out_shape[a] for a in gout)
            if not fits:
                edge = max([x.block_shape[a] for a in gin] + [witness.block_shape[a] for a in gout])
                raise ValueError(
                    f"reshape from {x.shape} to {tuple(out_shape)} regroups axes of sizes "
                    f"{tuple(x.shape[a] for a in gin)} into {tuple(out_shape[a] for a in gout)}, which jask does "
                    f"tile by tile only when each fits in one tile, and the tile edge here is {edge}; raise the "
                    f"memory budget (jask.set_memory_budget; or the forced jask.config 'tile') so a tile spans "
                    f"{max([x.shape[a] for a in gin] + [out_shape[a] for a in gout])} elements per axis, or "
                    "reshape a slice (x[i:j]) whose regrouped axes are smaller")
        return cls(x.shape, out_shape, groups)

    def out_block(self, in_block_shape):
        return tuple(1 if d == 1 else in_block_shape[self.passes[a]] if a in self.passes else d
                     for a, d in enumerate(self.out_shape))

    def forward_block(self, x_block, witness):
        return x_block.reshape(self.out_block(x_block.shape))

    def index_map(self, out_idx):
        idx = [0] * len(self.in_shape)
        for o, i in self.passes.items():
            idx[i] = out_idx[o]
        return [(tuple(idx), (0,) * len(self.out_shape))]

    def backward_block(self, d_out_block, x_block, witness):
        return (d_out_block.reshape(x_block.shape), jnp.zeros_like(witness))

    def output_shape(self, x_shape, witness_shape):
        return self.out_shape

    def output_dtype(self, x_dtype, witness_dtype):
        return x_dtype


_reshape = make_op(Reshape, name="reshape")


def _resolve_shape(shape, size, in_shape):
    shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise ValueError(f"reshape: can only specify one unknown dimension (-1); got {shape}")
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or size % known:
            raise ValueError(f"cannot reshape array of shape {in_shape} (size {size}) into shape {shape}")
        shape = tuple(size // known if d == -1 else d for d in shape)
    if math.prod(shape) != size:
        raise ValueError(f"cannot reshape array of shape {in_shape} (size {size}) into shape {shape}")
    return shape


def reshape(a, shape=None, order="C", *, newshape=None):
    """``jnp.reshape`` (row-major): free where tiles line up; see the module notes for what is refused."""
    if shape is None:
        shape = newshape
    if not is_disk_array(a):
        return jnp.reshape(a, shape, order=order)
    if order != "C":
        raise NotImplementedError(f"reshape order={order!r} is not supported; jask reshapes row-major ('C')")
    t = type_of(a)
    shape = _resolve_shape(shape, t.size, t.shape)
    if shape == t.shape:
        return a
    if shape == ():
        return scalar_of(a)
    if t.size == 0:
        return DiskArray(node=zeros_node(shape, t.dtype))     # nothing to move; _groups needs nonzero sizes
    groups = _groups(t.shape, shape)
    tile = default_tile(t.shape, t.dtype.itemsize)
    if any(len(gin) + len(gout) > 2 and (max(t.shape[a] for a in gin) > tile or max(shape[a] for a in gout) > tile)
           for gin, gout in groups):
        return regroup(a, t.shape, shape, groups)      # regrouped axes span tiles: gather across them
    regrouped = {o for gin, gout in groups if len(gin) + len(gout) > 2 for o in gout}
    witness = DiskArray(node=zeros_node(tuple(d if k in regrouped else 1 for k, d in enumerate(shape)), np.bool_))
    return _reshape(a, witness, out_shape=shape)


def scalar_of(a):
    """The one element of a size-1 DiskArray as a 0-d JAX value (jask's 0-d results), dtype and bits kept."""
    return _reshape(a, DiskArray(node=zeros_node((), np.dtype(bool))), out_shape=())


def ravel(a, order="C"):
    """``jnp.ravel``: the array as 1-D, row-major (a reshape to ``(-1,)``)."""
    if not is_disk_array(a):
        return jnp.ravel(a, order)
    return reshape(a, (-1,), order)


def expand_dims(a, axis):
    """``jnp.expand_dims``: size-1 axes inserted at ``axis`` (int or tuple), a free reshape."""
    if not is_disk_array(a):
        return jnp.expand_dims(a, axis)
    t = type_of(a)
    axes = normalize_axis(axis, t.ndim + (1 if isinstance(axis, (int, np.integer)) else len(axis)), "expand_dims")
    shape, it = [], iter(t.shape)
    for k in range(t.ndim + len(axes)):
        shape.append(1 if k in axes else next(it))
    return reshape(a, tuple(shape))


def squeeze(a, axis=None):
    """``jnp.squeeze``: size-1 axes removed (all of them, or those in ``axis``), a free reshape."""
    if not is_disk_array(a):
        return jnp.squeeze(a, axis)
    t = type_of(a)
    axes = tuple(k for k, d in enumerate(t.shape) if d == 1) if axis is None else \
        normalize_axis(axis, t.ndim, "squeeze")
    bad = [k for k in axes if t.shape[k] != 1]
    if bad:
        raise ValueError(f"cannot select an axis to squeeze out which has size not equal to one: axis {bad[0]} "
                         f"of shape {t.shape}")
    return reshape(a, tuple(d for k, d in enumerate(t.shape) if k not in axes))


def transpose(a, axes=None):
    """``jnp.transpose``: axes permuted (reversed by default); ``axes`` may be given positionally."""
    if not is_disk_array(a):
        return jnp.transpose(a, axes)
    return _transpose_op(a, axes=axes)


def transpose_op(a, *axes, **kwargs):
    """``jask.transpose(a, axes)``: the seed's strict op (DiskArrays only), ``axes`` also positional."""
    if len(axes) > 1 or (axes and "axes" in kwargs):
        raise TypeError(f"transpose takes one DiskArray and its axes, got {1 + len(axes) + len(kwargs)} arguments")
    if axes:
        kwargs["axes"] = axes[0]
    return _transpose_op(a, **kwargs)


def swapaxes(a, axis1, axis2):
    """``jnp.swapaxes``: a transpose exchanging two axes."""
    if not is_disk_array(a):
        return jnp.swapaxes(a, axis1, axis2)
    ndim = type_of(a).ndim
    perm = list(range(ndim))
    (i,), (j,) = normalize_axis(axis1, ndim, "swapaxes"), normalize_axis(axis2, ndim, "swapaxes")
    perm[i], perm[j] = j, i
    return transpose(a, perm)


def moveaxis(a, source, destination):
    """``jnp.moveaxis``: axes moved to new positions, the others kept in order (a transpose)."""
    if not is_disk_array(a):
        return jnp.moveaxis(a, source, destination)
    ndim = type_of(a).ndim
    src = source if isinstance(source, (tuple, list)) else (source,)
    dst = destination if isinstance(destination, (tuple, list)) else (destination,)
    if len(src) != len(dst):
        raise ValueError(f"moveaxis: source {source} and destination {destination} need the same number of axes")
    src = [normalize_axis(s, ndim, "moveaxis")[0] for s in src]
    dst = [normalize_axis(d, ndim, "moveaxis")[0] for d in dst]
    rest = [k for k in range(ndim) if k not in src]
    perm = [None] * ndim
    for s, d in zip(src, dst):
        perm[d] = s
    it = iter(rest)
    return transpose(a, [p if p is not None else next(it) for p in perm])
