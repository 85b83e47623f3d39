"""Basic indexing and concatenation: one tiled op, :class:`Strided`, gathers rows at a fixed stride.

Along each axis the output row ``r`` is the input row ``start + r * step``
(``step`` may be negative), and rows that fall outside the input are zero.
Slicing (``x[i:j:k]``, integers, ``None``, ``...``) is that with rows inside the
input; padding is that with a negative start, and ``concatenate`` selects, row by
row, from its pieces padded to their places (fused into one pass, each output tile
reading only the tiles of the pieces it overlaps; a select, so -0.0 stays -0.0).

The planner gives every array one tile edge, so an output tile's rows come from
at most ``K`` consecutive input tiles along each axis (``K = |step| + 1`` at
most). They are passed as ``K`` input positions of ``x``; which rows of them the
tile takes depends on the tile's place, which ``forward_block`` cannot see, so
the op also reads an int32 *iota* per moving axis (the output row numbers,
one small array written once per call). The gradient is ``jax.vjp`` of the
same gather, summed over the positions by JAX.
"""
from __future__ import annotations

import itertools
import math
import operator

import jax
import jax.numpy as jnp
import numpy as np

from jask.graph.op import BlockParallelOp
from jask.hijax.array import DiskArray, is_disk_array, type_of, zeros_node
from jask.hijax.make_op import make_op
from jask.hijax.compat import is_traced
from jask.ops import elementwise as ew
from jask.ops.operands import as_operand, iota

MAX_STEP = 16   # an output tile reads |step| + 1 input tiles per axis: beyond this, refuse


def _axis_plan(n, start, step, m, in_block, out_block):
    """Per output tile along one axis: ``(first, last)`` input blocks it reads, or None (all padding)."""
    spans = []
    for i in range(math.ceil(m / out_block)):
        rows = start + step * np.arange(i * out_block, min((i + 1) * out_block, m))
        rows = rows[(rows >= 0) & (rows < n)]
        spans.append((int(rows.min()) // in_block, int(rows.max()) // in_block) if rows.size else None)
    return tuple(spans)


class Strided(BlockParallelOp):
    """``out[r] = x[start + r * step]`` per moving axis (zero outside ``x``); inputs ``(x * K, *iotas)``."""

    def __init__(self, shape, axes, starts, steps, out_shape, plans=(), blocks=()):
        self.shape, self.axes, self.starts, self.steps = tuple(shape), tuple(axes), tuple(starts), tuple(steps)
        self.out_shape, self.plans, self.blocks = tuple(out_shape), tuple(plans), tuple(blocks)
        self.ks = tuple(positions(s, self.out_shape[a]) for a, s in zip(self.axes, self.steps))
        self.n_x = math.prod(self.ks)

    @classmethod
    def from_inputs(cls, *inputs, axes, starts, steps, out_shape):
        x, iotas = inputs[0], inputs[len(inputs) - len(axes):]
        plans = tuple(_axis_plan(x.shape[a], s, st, out_shape[a], x.block_shape[a], io.block_shape[a])
                      for a, s, st, io in zip(axes, starts, steps, iotas))
        return cls(x.shape, axes, starts, steps, out_shape, plans, tuple(x.block_shape[a] for a in axes))

    def index_map(self, out_idx):
        per_axis = []
        for a, spans, k in zip(self.axes, self.plans, self.ks):
            span = spans[out_idx[a]]
            if span is None:
                return []                                  # the tile is all padding: zeros, nothing read
            first, last = span                             # positions past the last block repeat it (read once)
            per_axis.append([min(first + j, last) for j in range(k)])
        iota_idx = [tuple(out_idx[a] if b == a else 0 for b in range(len(self.shape))) for a in self.axes]
        xs = []
        for combo in itertools.product(*per_axis):
            idx = list(out_idx)
            for a, b in zip(self.axes, combo):
                idx[a] = b
            xs.append(tuple(idx))
        return [tuple(xs) + tuple(iota_idx)]

    def forward_block(self, *blocks):
        xs, iotas = blocks[:self.n_x], blocks[self.n_x:]
        cat = _assemble(list(xs), self.ks, self.axes)
        for a, start, step, block, out_rows, n in zip(self.axes, self.starts, self.steps, self.blocks, iotas,
                                                      (self.shape[a] for a in self.axes)):
            rows = start + step * out_rows.reshape(-1)
            valid = (rows >= 0) & (rows < n)
            first = jnp.min(jnp.where(valid, rows, n)) // block
            local = jnp.clip(rows - first * block, 0, cat.shape[a] - 1)
            cat = jnp.take(cat, local, axis=a)
            mask = valid.reshape([-1 if b == a else 1 for b in range(cat.ndim)])
            cat = jnp.where(mask, cat, jnp.zeros((), cat.dtype))
        return cat

    def backward_block(self, d_out_block, *blocks):
        xs, iotas = blocks[:self.n_x], blocks[self.n_x:]
        _, vjp = jax.vjp(lambda *x: self.forward_block(*x, *iotas), *xs)
        return tuple(vjp(d_out_block.astype(xs[0].dtype))) + tuple(jnp.zeros_like(i) for i in iotas)

    def output_shape(self, *shapes):
        return self.out_shape

    def output_dtype(self, *dtypes):
        return dtypes[0]


def _assemble(blocks, ks, axes):
    """The ``prod(ks)`` blocks (row-major over the moving axes) joined into one array."""
    if not ks:
        return blocks[0]
    k, rest = ks[0], math.prod(ks[1:])
    parts = [_assemble(blocks[j * rest:(j + 1) * rest], ks[1:], axes[1:]) for j in range(k)]
    return parts[0] if k == 1 else jnp.concatenate(parts, axis=axes[0])


_strided = make_op(Strided, name="strided")




def strided(x, starts, steps, out_shape, name="strided"):
    """``out[r] = x[start + r * step]`` along each axis (identity axes: start 0, step 1, same size)."""
    t = type_of(x)
    out_shape = tuple(int(d) for d in out_shape)
    moving = [a for a in range(t.ndim) if (starts[a], steps[a], out_shape[a]) != (0, 1, t.shape[a])]
    if not moving:
        return x
    for a in moving:
        if positions(steps[a], out_shape[a]) > MAX_STEP + 1:
            raise NotImplementedError(f"{name}: step {steps[a]} along axis {a} (shape {t.shape}) would read every "
                                      f"input tile {positions(steps[a], out_shape[a])} times; steps up to "
                                      f"{MAX_STEP} are supported (larger ones for a result of few rows): take a "
                                      "contiguous slice, or jask.persist a coarser slice first")
    kwargs = dict(axes=tuple(moving), starts=tuple(int(starts[a]) for a in moving),
                  steps=tuple(int(steps[a]) for a in moving), out_shape=out_shape)
    iotas = [iota(out_shape[a], a, t.ndim, name) for a in moving]
    n_x = math.prod(positions(steps[a], out_shape[a]) for a in moving)
    return _strided(*([x] * n_x), *iotas, **kwargs)


def positions(step, rows):
    """Consecutive input tiles an output tile can span along an axis of ``rows`` output rows, whatever the
    tile edge ``T``: a tile of ``r <= min(T, rows)`` rows spans ``(r - 1) * |step| + 1`` input rows, so at
    most ``ceil((r - 1) * |step| / T) + 1 <= ceil((rows - 1) * |step| / rows) + 1 <= |step| + 1`` tiles
    (one for a single row, whatever the step)."""
    if rows <= 1:
        return 1
    return min(builtins_abs(step) + 1, -(-(rows - 1) * builtins_abs(step) // rows) + 1)


builtins_abs, builtins_all, builtins_sum = abs, all, sum


def _index_int(i, n, axis, shape):
    if is_traced(i):
        raise NotImplementedError(f"indexing a DiskArray of shape {shape} with a traced index along axis {axis} "
                                  "is not supported; use Python ints (static under jit)")
    i = operator.index(i)
    if not -n <= i < n:
        raise IndexError(f"index {i} is out of bounds for axis {axis} with size {n} (shape {shape})")
    return i + n if i < 0 else i


def _is_bool_scalar(k) -> bool:
    """``True``/``False`` (or a concrete 0-d boolean array) in an index: a new axis of length 1 or 0."""
    return isinstance(k, (bool, np.bool_)) or (
        isinstance(k, (np.ndarray, jax.Array)) and not is_traced(k) and k.shape == () and k.dtype == np.bool_)


def _is_integer(k) -> bool:
    """An int, or a 0-d integer array (concrete or traced), which indexes as an int."""
    return isinstance(k, (int, np.integer)) or (
        np.shape(k) == () and np.issubdtype(getattr(k, "dtype", np.float32), np.integer))


def _bool_axis(key, ndim):
    """NumPy's rule for boolean scalars in ``key``: they and the integers form one advanced index whose
    one axis (length 0 if any is False, else 1) goes where the first of them stands when they are adjacent,
    else first. Returns ``key`` without them and ``(output position, length)``, or None without any."""
    where = [i for i, k in enumerate(key) if _is_bool_scalar(k)]
    if not where:
        return key, None
    length = int(builtins_all(bool(key[i]) for i in where))
    advanced = [i for i, k in enumerate(key) if i in where or (_is_integer(k) and not _is_bool_scalar(k))]
    position = 0
    if advanced == list(range(advanced[0], advanced[-1] + 1)):
        used = builtins_sum(1 for k in key if k is not None and k is not Ellipsis and not _is_bool_scalar(k))
        position = builtins_sum(ndim - used if k is Ellipsis else int(k is None or isinstance(k, slice))
                                for k in key[:advanced[0]])
    return tuple(k for i, k in enumerate(key) if i not in where), (position, length)


def _key_parts(key, shape):
    """``key`` as per-input-axis ``(start, step, size, keep)`` plus the output shape (with ``None`` axes)."""
    key = key if isinstance(key, tuple) else (key,)
    for k in key:
        if not (k is None or k is Ellipsis or isinstance(k, slice) or _is_integer(k)):
            raise NotImplementedError(
                f"DiskArray indexing supports ints, slices, None, ... and one 1-D integer or boolean array; got "
                f"{type(k).__name__} for an array of shape {shape}; for rows of a dataset use jask.batches, "
                "for an elementwise mask use jask.numpy.where")
    if sum(k is Ellipsis for k in key) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    used = sum(k is not None and k is not Ellipsis for k in key)
    if used > len(shape):
        raise IndexError(f"too many indices for an array of shape {shape}: {used} were indexed")
    if Ellipsis not in key:
        key = key + (Ellipsis,)
    at = key.index(Ellipsis)
    key = key[:at] + (slice(None),) * (len(shape) - used) + key[at + 1:]
    parts, out_shape, axis = [], [], 0
    for k in key:
        if k is None:
            out_shape.append(1)
            continue
        n = shape[axis]
        if isinstance(k, slice):
            for v in (k.start, k.stop, k.step):
                if is_traced(v):
                    raise NotImplementedError(f"slicing a DiskArray of shape {shape} with traced bounds is not "
                                              "supported; use Python ints (static under jit)")
            start, stop, step = k.indices(n)
            size = len(range(start, stop, step))
            parts.append((start, step, size, True))
            out_shape.append(size)
        else:
            parts.append((_index_int(k, n, axis, shape), 1, 1, False))
        axis += 1
    return parts, tuple(out_shape)


def getitem(x, key):
    """``x[key]``: basic indices (ints, slices with steps, ``None``, ``...``, ``True``/``False``) or one index
    array, with gradients."""
    from jask.ops import gather, shape as shp
    if any(gather.is_array_index(k) and np.shape(k) != () for k in (key if isinstance(key, tuple) else (key,))):
        return gather.getitem_array(x, key)            # an integer or boolean array along one axis
    t = type_of(x)
    key, bool_axis = _bool_axis(key if isinstance(key, tuple) else (key,), t.ndim)
    parts, out_shape = _key_parts(key, t.shape)
    if bool_axis is not None:
        at, length = bool_axis
        out_shape = out_shape[:at] + (length,) + out_shape[at:]
        if length == 0:                               # x[False]: an empty result, nothing to read
            return DiskArray(node=zeros_node(out_shape, t.dtype))
    sliced = strided(x, [p[0] for p in parts], [p[1] for p in parts], [p[2] for p in parts], name="getitem")
    if out_shape == ():
        return shp.scalar_of(sliced)                  # one element: a JAX scalar, as jnp gives a 0-d array
    return shp.reshape(sliced, out_shape)


def pad_axis(x, axis, before, after):
    """``x`` with ``before``/``after`` zero rows added along ``axis`` (a strided view with a negative start)."""
    t = type_of(x)
    starts, steps, shape = [0] * t.ndim, [1] * t.ndim, list(t.shape)
    starts[axis], shape[axis] = -before, t.shape[axis] + before + after
    return strided(x, starts, steps, shape, name="pad")


def concatenate(arrays, axis=0, dtype=None):
    """``jnp.concatenate``: pieces padded to their places and selected row by row, in one fused pass."""
    arrays = list(arrays)
    if not arrays:
        raise ValueError("concatenate needs at least one array")
    if not any(is_disk_array(a) for a in arrays):
        return jnp.concatenate(arrays, axis=axis, dtype=dtype)
    arrays = [as_operand("concatenate", a) for a in arrays]
    shapes = [type_of(a).shape for a in arrays]
    ndim = len(shapes[0])
    if axis is None:
        raise NotImplementedError("concatenate(axis=None) flattens its inputs, which jask does not do for "
                                  "arrays larger than one tile; reshape each to 1-D first")
    if any(len(s) != ndim for s in shapes) or ndim == 0:
        raise ValueError(f"concatenate needs arrays of one rank >= 1, got shapes {', '.join(map(str, shapes))}")
    from jask.ops.reductions import normalize_axis
    (axis,) = normalize_axis(axis, ndim, "concatenate")
    if any(s[:axis] + s[axis + 1:] != shapes[0][:axis] + shapes[0][axis + 1:] for s in shapes):
        raise ValueError(f"concatenate along axis {axis} needs equal sizes on the other axes, got shapes "
                         f"{', '.join(map(str, shapes))}")
    out_dtype = np.dtype(dtype) if dtype is not None else np.dtype(jnp.result_type(*[type_of(a).dtype
                                                                                    for a in arrays]))
    total, before, starts, pieces = sum(s[axis] for s in shapes), 0, [], []
    if total and any(s[axis] == 0 for s in shapes):   # empty pieces add nothing
        arrays, shapes = zip(*[(a, s) for a, s in zip(arrays, shapes) if s[axis]])
    for a, s in zip(arrays, shapes):
        pieces.append(pad_axis(ew.astype(a, out_dtype) if type_of(a).dtype != out_dtype else a,
                               axis, before, total - before - s[axis]))
        starts.append(before)
        before += s[axis]
    if len(pieces) == 1:
        return pieces[0]
    return _select_pieces(iota(total, axis, ndim, "concatenate"), *pieces, starts=tuple(starts[1:]))


def _pick_piece(rows, *pieces, starts):
    """Each row from the piece that holds it (a select, not a sum of the zero-padded pieces: -0.0 stays)."""
    out = pieces[0]
    for start, piece in zip(starts, pieces[1:]):
        out = jnp.where(rows >= start, piece, out)
    return out


_select_pieces = ew.lift(_pick_piece, "concatenate")


def stack(arrays, axis=0, dtype=None):
    """``jnp.stack``: each array gets a new size-1 axis, then they are concatenated along it."""
    from jask.ops import shape as shp
    arrays = list(arrays)
    if not any(is_disk_array(a) for a in arrays):
        return jnp.stack(arrays, axis=axis, dtype=dtype)
    arrays = [as_operand("stack", a) for a in arrays]
    shapes = {type_of(a).shape for a in arrays}
    if len(shapes) != 1:
        raise ValueError(f"stack needs arrays of one shape, got {', '.join(map(str, sorted(shapes)))}")
    return concatenate([shp.expand_dims(a, axis) for a in arrays], axis=axis, dtype=dtype)
