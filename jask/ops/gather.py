"""Advanced indexing along one axis: ``x[idx]``, ``x[:, mask]``, ``jnp.take(x, idx, axis)``, with gradients.

Output row ``r`` along ``axis`` is input row ``idx[r]``. The indices are known
when the op is built (an in-memory array; a boolean mask becomes the indices of
its true entries, as in NumPy), so each output tile lists, as its entries, the
input tiles its rows come from; each entry takes the rows that fall in its
tile and zeros elsewhere, and ``combine`` sums them. Which rows those are
depends on where the entry's input tile starts, which ``forward_block`` learns
from an int32 iota of input row numbers read alongside (the trick of
:mod:`jask.ops.indexing`). The gradient is ``jax.vjp`` of the same take: a
scatter-add into each input tile. An output tile whose rows come from many
input tiles reads each of them, so a random permutation of a long axis reads
``x`` up to ``tile edge`` times over: for shuffled minibatches use
:func:`jask.batches`, which reads rows directly.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jask.graph.op import BlockParallelOp
from jask.hijax.array import is_disk_array, type_of
from jask.hijax.compat import is_traced
from jask.hijax.make_op import make_op
from jask.ops.operands import column, iota


class Take(BlockParallelOp):
    """``out = take(x, idx, axis)``; inputs ``(x, rows of x along axis, idx)``, the last two int32 columns."""

    nondiff_inputs = (1, 2)

    def __init__(self, axis, out_shape, sources=()):
        self.axis, self.out_shape, self.sources = axis, tuple(out_shape), tuple(sources)

    @classmethod
    def from_inputs(cls, x, rows, idx, axis, indices):
        block, out_block = x.block_shape[axis], idx.block_shape[axis]
        indices = np.frombuffer(indices, np.int64) if isinstance(indices, bytes) else np.asarray(indices, np.int64)
        sources = tuple(tuple(int(b) for b in np.unique(indices[j:j + out_block] // block))
                        for j in range(0, len(indices), out_block))
        out_shape = x.shape[:axis] + (len(indices),) + x.shape[axis + 1:]
        return cls(axis, out_shape, sources)

    def index_map(self, out_idx):
        j = out_idx[self.axis]
        column = tuple(j if b == self.axis else 0 for b in range(len(out_idx)))
        entries = []
        for b in self.sources[j]:
            x_idx = tuple(b if a == self.axis else i for a, i in enumerate(out_idx))
            entries.append((x_idx, tuple(b if a == self.axis else 0 for a in range(len(out_idx))), column))
        return entries

    def forward_block(self, x, rows, idx):
        local = idx.reshape(-1) - rows.reshape(-1)[0]
        inside = (local >= 0) & (local < x.shape[self.axis])
        # rows outside the tile are masked below, so "clip" only keeps indices in bounds (jnp's default "fill"
        # adds code to fill them, and the clip of an explicit clamp would be a second one)
        taken = jnp.take(x, local, axis=self.axis, mode="clip")
        mask = inside.reshape([-1 if a == self.axis else 1 for a in range(x.ndim)])
        return jnp.where(mask, taken, jnp.zeros((), x.dtype))

    def combine(self, acc, partial):
        return keep_taken(acc, partial)

    def backward_block(self, d_out_block, x, rows, idx):
        _, vjp = jax.vjp(lambda x: self.forward_block(x, rows, idx), x)
        (dx,) = vjp(d_out_block.astype(x.dtype))
        return dx, jnp.zeros_like(rows), jnp.zeros_like(idx)

    def output_shape(self, *shapes):
        return self.out_shape

    def output_dtype(self, x_dtype, *_):
        return x_dtype


_take = make_op(Take, name="take")


def keep_taken(acc, partial):
    """Fold the entries of a gather: each output element comes from one entry and is the others' +0 fill, so
    keep the partial's value unless it is that fill (an exact +0); a -0.0 taken stays -0.0 (a sum gives +0.0)."""
    fill = partial == 0
    if jnp.issubdtype(partial.dtype, jnp.floating):
        fill = fill & ~jnp.signbit(partial)
    return jnp.where(fill, acc, partial)


def _indices(name, indices, n):
    """Concrete integer indices (a boolean mask gives its true positions), bounds-checked against ``n``."""
    if is_traced(indices):
        raise NotImplementedError(f"{name}: traced indices are not supported (the tiles to read are planned from "
                                  "the index values); use concrete NumPy indices, static under jit")
    if is_disk_array(indices):
        if type_of(indices).ndim != 1:
            raise NotImplementedError(f"{name}: a DiskArray index must be 1-D, got shape {indices.shape}")
        indices = np.asarray(indices)        # one index per row: a small 1-D array, read on purpose
    indices = np.asarray(indices)
    if indices.dtype == np.bool_:
        if indices.shape != (n,):
            raise IndexError(f"{name}: a boolean index along an axis of size {n} must have shape ({n},), "
                             f"got {indices.shape}")
        return np.flatnonzero(indices)
    if indices.ndim != 1 or not np.issubdtype(indices.dtype, np.integer):
        if indices.size == 0 and indices.ndim == 1:
            return indices.astype(np.int64)
        raise NotImplementedError(f"{name}: only 1-D integer or boolean index arrays are supported, got "
                                  f"{indices.dtype} of shape {indices.shape}")
    bad = indices[(indices < -n) | (indices >= n)]
    if bad.size:
        raise IndexError(f"{name}: index {int(bad[0])} is out of bounds for an axis of size {n}")
    return np.where(indices < 0, indices + n, indices).astype(np.int64)


def take(a, indices, axis=None, mode=None, fill_value=None):
    """``jnp.take`` along one axis with 1-D indices or one scalar index, which drops the axis as in jnp
    (negative ones count from the end; out of bounds: IndexError)."""
    if not is_disk_array(a):
        return jnp.take(a, indices, axis=axis, mode=mode, fill_value=fill_value)
    t = type_of(a)
    if axis is None:
        if t.ndim != 1:
            raise NotImplementedError("jask take(axis=None) flattens the array first, which jask does not do "
                                      "for arrays larger than one tile; pass axis=")
        axis = 0
    if mode not in (None, "raise") or fill_value is not None:
        raise NotImplementedError("jask take: mode= and fill_value= are not supported (out-of-bounds indices "
                                  "raise IndexError)")
    axis = axis + t.ndim if -t.ndim <= axis < 0 else axis
    if not 0 <= axis < t.ndim:
        raise ValueError(f"take: axis {axis} is out of bounds for an array of shape {t.shape}")
    if np.ndim(indices) == 0 and not is_traced(indices) and not is_disk_array(indices):
        from jask.ops.shape import squeeze                  # a scalar index: one row, its axis dropped
        return squeeze(take(a, np.asarray(indices, np.int64).reshape(1), axis=axis), axis)
    idx = _indices("take", indices, t.shape[axis])
    rows = iota(t.shape[axis], axis, t.ndim, "take")     # refuses an axis past int32 row numbers
    return _take(a, rows, column(idx, axis, t.ndim, "take"), axis=axis,
                 indices=idx.astype(np.int64).tobytes())   # compact and hashable: 8 B an index, not a Python int


def is_array_index(k) -> bool:
    """An index that selects by array (integer or boolean), not a basic one."""
    return is_disk_array(k) or isinstance(k, (np.ndarray, list, jax.Array)) or is_traced(k)


def getitem_array(x, key):
    """``x[..., idx, ...]``: one array index, every other entry a full slice ``:`` or ``...``."""
    ndim = type_of(x).ndim
    key = key if isinstance(key, tuple) else (key,)
    arrays = [i for i, k in enumerate(key) if is_array_index(k)]
    full = all(k is Ellipsis or (isinstance(k, slice) and k == slice(None)) for i, k in enumerate(key)
               if i not in arrays)
    index = key[arrays[0]]
    mask = None if is_disk_array(index) or is_traced(index) else np.asarray(index)
    ellipses = sum(k is Ellipsis for k in key)
    if len(arrays) != 1 or not full or ellipses > 1 or (mask is not None and mask.ndim > 1):
        raise NotImplementedError(
            f"indexing an array of shape {type_of(x).shape} with {key!r}: jask supports one 1-D integer or "
            "boolean array index along one axis, with ':' or '...' elsewhere (x[idx], x[:, mask]); slice first, "
            "then index (x[2:5][:, idx]); for rows of a dataset use jask.batches")
    at = arrays[0]
    axis = at if not any(k is Ellipsis for k in key[:at]) else ndim - (len(key) - at)
    return take(x, key[at], axis=axis)
