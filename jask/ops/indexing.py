"""Basic indexing and concatenation: one tiled op, :class:`Strided`, gathers rows at a fixed stride.

Along each axis the output row ``r`` is the input row ``start + r * step``
(``step`` may be negative), and rows that fall outside the input are zero.
Slicing (``x[i:j:k]``, integers, ``None``, ``...``) is that with rows inside the
input; padding is that with a negative start, and ``concatenate`` joins its pieces
padded to their places by OR-ing their bits (zero outside each piece, so -0.0 and
NaN payloads survive; fused into one pass, each output tile reading only the tiles
of the pieces it overlaps).

Output tiles are the plan's tiles (one edge ``T`` for every array, so consumers'
index maps agree). A tile of ``T`` output rows takes every ``|step|``-th row of
``|step| * T`` input rows: exactly ``|step|`` input tiles when the first row sits
within ``|step|`` rows of its tile's start (``x[::2]``, ``x[1::3]``, ``x[::-1]`` of
a multiple of ``T`` rows), so every input tile feeds one output tile and is read
once; otherwise one more, which the next output tile reads too (listed as its last
entries and the next tile's first, the last such axis outermost, so the schedule
keeps that read for the next windows: :mod:`jask.exec.kept_reads`). Each input tile
an output tile takes rows from is one *entry* (as in :mod:`jask.ops.gather`): its
rows placed, zeros elsewhere, the entries folded by a select. A window thus holds
one input tile per entry, never all the tiles an output tile spans at once (a
``x[::2, ::3]`` tile spans 6, a ``x[1::2, 5::3]`` tile 8). Which rows an entry
takes depends on where its input and output tiles start, which ``forward_block``
cannot see, so it also reads an int32 iota of input and of output row numbers
per moving axis (small arrays written once per call; an axis whose output tiles
each take one input tile needs only the output's). Two kinds of axis read none
(:func:`_axis_kind`): one whose output tiles are input tiles whole (a slice or a
pad by whole tiles, as ``concatenate``'s pieces at a tile edge: nothing is picked
at all), and one that is a single output tile (``stack``'s new axis: its row
numbers are ``0..m-1``). A tiny read per window is not free: the read-ahead counts
reads, so it held back the next tile's read and halved a concatenate's read rate.
The gradient is one lazy array: each input tile gathers the cotangent rows of the
output tiles it fed.
"""
from __future__ import annotations

import functools
import itertools
import operator

import jax
import jax.numpy as jnp
import numpy as np

from jask.graph.op import BlockParallelOp
from jask.hijax.array import DiskArray, is_disk_array, type_of, zeros_node
from jask.hijax.make_op import make_op
from jask.hijax.compat import is_traced
from jask.ops import elementwise as ew
from jask.ops.axes import normalize_axis
from jask.ops.gather import keep_taken
from jask.ops.operands import as_operand, iota


def _valid_rows(n, start, step, lo, hi):
    """The output rows ``r`` in ``[lo, hi)`` whose input row ``start + r * step`` lies in ``[0, n)``, as a range."""
    if step > 0:
        first, stop = -(start // step), -((start - n) // step)          # ceil(-start / step), ceil((n - start) / step)
    else:
        first, stop = (start - n) // -step + 1, start // -step + 1
    return max(lo, first), min(hi, stop)


def _axis_sources(n, start, step, m, in_block, out_block):
    """Per output tile along one axis, the input blocks its rows come from (none: the tile is all padding)."""
    sources = []
    for lo in range(0, m, out_block):
        r0, r1 = _valid_rows(n, start, step, lo, min(lo + out_block, m))
        if r0 >= r1:
            sources.append(())
        elif abs(step) <= in_block:                    # consecutive rows never skip a block
            ends = sorted(((start + step * r0) // in_block, (start + step * (r1 - 1)) // in_block))
            sources.append(tuple(range(ends[0], ends[1] + 1)))
        else:                                          # every row in a block of its own
            sources.append(tuple(sorted(set(((start + step * np.arange(r0, r1)) // in_block).tolist()))))
    return tuple(sources)


def _shares_tiles(sources) -> bool:
    """Whether neighbouring output tiles along an axis take rows of one input tile (``x[5::3]``, not ``x[1::3]``)."""
    return any(set(a) & set(b) for a, b in zip(sources, sources[1:]))


def _axis_kind(n, start, step, m, in_block, out_block):
    """``"whole"``: each output tile along this axis is one input tile whole, or all padding (``x[1024:3072]``
    or a pad by whole tiles at edge 1024); ``"fixed"``: the axis is one output tile, whose row numbers are
    known (``0..m-1``); ``"rows"``: the output tile's row numbers must be read."""
    def whole(lo, hi):
        r0, r1 = _valid_rows(n, start, step, lo, hi)
        return r0 >= r1 or ((r0, r1) == (lo, hi) and (lo + start) % in_block == 0
                            and hi + start == min(lo + start + in_block, n))
    if step == 1 and all(whole(lo, min(lo + out_block, m)) for lo in range(0, m, out_block)):
        return "whole"
    return "fixed" if m <= out_block else "rows"


class Strided(BlockParallelOp):
    """``out[r] = x[start + r * step]`` per moving axis (zero outside ``x``); inputs ``(x, *in_rows, *out_rows)``,
    the int32 row numbers of ``x`` and of the output along each moving axis (int32: never differentiated).
    One entry per input tile read."""

    def __init__(self, shape, axes, starts, steps, out_shape, sources=(), blocks=(), kinds=()):
        self.shape, self.axes, self.starts, self.steps = tuple(shape), tuple(axes), tuple(starts), tuple(steps)
        self.out_shape, self.sources, self.blocks = tuple(out_shape), tuple(sources), tuple(blocks)
        self.kinds = tuple(kinds) or ("rows",) * len(self.axes)
        # an axis whose output tiles each read one input tile (x[4:8], aligned pieces of a concatenate) finds that
        # tile from the output row numbers: its input row numbers are never read
        self.single = tuple(all(len(s) <= 1 for s in spans) for spans in self.sources)
        self.entry_axes = sorted(range(len(self.sources)), key=lambda k: (not _shares_tiles(self.sources[k]), -k))
        d = len(self.axes)
        self.unused_inputs = frozenset(
            [1 + k for k, (one, kind) in enumerate(zip(self.single, self.kinds)) if one or kind == "whole"]
            + [1 + d + k for k, kind in enumerate(self.kinds) if kind != "rows"])

    @classmethod
    def from_inputs(cls, x, *rows, axes, starts, steps, out_shape):
        out_rows = rows[len(axes):]
        blocks = tuple(x.block_shape[a] for a in axes)
        out_blocks = tuple(o.block_shape[a] for a, o in zip(axes, out_rows))
        sources = tuple(_axis_sources(x.shape[a], s, st, out_shape[a], b, ob)
                        for a, s, st, b, ob in zip(axes, starts, steps, blocks, out_blocks))
        kinds = tuple(_axis_kind(x.shape[a], s, st, out_shape[a], b, ob)
                      for a, s, st, b, ob in zip(axes, starts, steps, blocks, out_blocks))
        return cls(x.shape, axes, starts, steps, out_shape, sources, blocks, kinds)

    def index_map(self, out_idx):
        along = lambda a, b: tuple(b if c == a else 0 for c in range(len(out_idx)))  # noqa: E731
        out_rows = tuple(along(a, out_idx[a]) for a in self.axes)
        entries = []
        for picked in itertools.product(*(self.sources[k][out_idx[self.axes[k]]] for k in self.entry_axes)):
            at = dict(zip((self.axes[k] for k in self.entry_axes), picked))      # input tile along each moving axis
            x_idx = tuple(at.get(a, i) for a, i in enumerate(out_idx))
            entries.append((x_idx, *(along(a, at[a]) for a in self.axes), *out_rows))
        return entries                                 # none: the tile is all padding (zeros, nothing read)

    def _out_rows(self, k, rows):
        """The output row numbers of this tile along moving axis ``k``."""
        if self.kinds[k] == "fixed":
            return jnp.arange(self.out_shape[self.axes[k]], dtype=jnp.int32)
        return rows[len(self.axes) + k].reshape(-1)

    def _first_row(self, k, rows, wanted):
        """The first input row of this entry's tile along moving axis ``k``."""
        if not self.single[k]:
            return rows[k].reshape(-1)[0]
        n, block = self.shape[self.axes[k]], self.blocks[k]       # the one tile the output rows come from
        return jnp.min(jnp.where((wanted >= 0) & (wanted < n), wanted, n)) // block * block

    def forward_block(self, x, *rows):
        """The output tile's rows that lie in this input tile; zeros elsewhere."""
        picks = []
        for k, (a, start, step) in enumerate(zip(self.axes, self.starts, self.steps)):
            if self.kinds[k] == "whole":
                continue                                             # the input tile is the output tile
            wanted = start + step * self._out_rows(k, rows)          # input rows of the output rows
            local = wanted - self._first_row(k, rows, wanted)
            picks.append((a, local, (local >= 0) & (local < x.shape[a])))
        return _pick(x, picks)

    def combine(self, acc, partial):
        return keep_taken(acc, partial)

    def backward_block(self, d_out_block, x, *rows):
        """The transpose, itself a gather: each input row of the tile takes the cotangent of the output row
        that read it, if any (no scatter)."""
        picks = []
        for k, (a, start, step) in enumerate(zip(self.axes, self.starts, self.steps)):
            if self.kinds[k] == "whole":
                continue
            out_rows = self._out_rows(k, rows)
            offset = self._first_row(k, rows, start + step * out_rows) + jnp.arange(x.shape[a]) - start
            local = offset // step - out_rows[0]
            picks.append((a, local, (offset % abs(step) == 0) & (local >= 0) & (local < d_out_block.shape[a])))
        dx = _pick(d_out_block.astype(x.dtype), picks)
        return (dx, *(jnp.zeros_like(r) for r in rows))

    def output_shape(self, *shapes):
        return self.out_shape

    def output_dtype(self, *dtypes):
        return dtypes[0]


def _pick(src, picks):
    """``src`` gathered along each axis at ``local`` indices (``picks``: ``(axis, local, valid)``), zero where
    not valid."""
    inside = None
    for a, local, valid in picks:
        src = jnp.take(src, local, axis=a, mode="clip")
        valid = valid.reshape([-1 if b == a else 1 for b in range(src.ndim)])
        inside = valid if inside is None else inside & valid
    return src if inside is None else jnp.where(inside, src, jnp.zeros((), src.dtype))


_strided = make_op(Strided, name="strided")


def strided(x, starts, steps, out_shape, name="strided"):
    """``out[r] = x[start + r * step]`` along each axis (identity axes: start 0, step 1, same size)."""
    t = type_of(x)
    out_shape = tuple(int(d) for d in out_shape)
    moving = [a for a in range(t.ndim) if (starts[a], steps[a], out_shape[a]) != (0, 1, t.shape[a])]
    if not moving:
        return x
    kwargs = dict(axes=tuple(moving), starts=tuple(int(starts[a]) for a in moving),
                  steps=tuple(int(steps[a]) for a in moving), out_shape=out_shape)
    in_rows = [iota(t.shape[a], a, t.ndim, name) for a in moving]
    out_rows = [iota(out_shape[a], a, t.ndim, name) for a in moving]
    return _strided(x, *in_rows, *out_rows, **kwargs)


builtins_all, builtins_sum = all, sum


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
    """``jnp.concatenate``: pieces padded to their places and joined elementwise, in one fused pass."""
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
    return _join_pieces(*pieces)


def _or_bits(pieces):
    """The pieces' bit patterns OR-ed: where all but one are +0 (all bits clear), that one's value exactly."""
    dtype = pieces[0].dtype
    if dtype == np.bool_:
        return functools.reduce(jnp.logical_or, pieces)
    if jnp.issubdtype(dtype, jnp.integer):
        return functools.reduce(jnp.bitwise_or, pieces)
    bits = np.dtype(f"uint{8 * dtype.itemsize}")
    joined = functools.reduce(jnp.bitwise_or, [jax.lax.bitcast_convert_type(p, bits) for p in pieces])
    return jax.lax.bitcast_convert_type(joined, dtype)


@jax.custom_jvp
def _join_inexact(*pieces):
    return _or_bits(pieces)


@_join_inexact.defjvp
def _join_inexact_jvp(pieces, tangents):
    # each padded piece's tangent is zero outside it, as its value is: the output's is their sum
    return _or_bits(pieces), functools.reduce(jnp.add, tangents)


def _join(*pieces):
    """Pieces padded with zeros to their places in the result, joined: each element from the piece holding it.

    OR-ing bits reads no row numbers (a select by row read an int32 iota per tile) and keeps -0.0 and NaN
    payloads, which a sum would not."""
    pieces = [jnp.asarray(p) for p in pieces]
    return _join_inexact(*pieces) if jnp.issubdtype(pieces[0].dtype, jnp.inexact) else _or_bits(pieces)


_join_pieces = ew.lift(_join, "concatenate")


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
