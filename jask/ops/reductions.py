"""Reductions over ``axis=None | int | tuple`` with ``keepdims``, streaming over the reduced blocks.

An output tile's ``index_map`` lists every input block along the reduced axes;
``forward_block`` reduces one block and ``combine`` folds the partials, so
``sum``, ``max``, ``min``, ``prod``, ``any`` and ``logsumexp`` (blocks' logsumexps folded by
``logaddexp``) take one pass (float16 and bfloat16 sums and products accumulate in float32 and
are cast back, as in jnp). ``mean``, ``var``, ``std``, ``all``, ``argmax``/``argmin`` and ``norm``
are compositions of these with elementwise ops (``var`` and ``arg*`` take two passes).

Gradients of ``max``/``min``/``prod`` need the reduction's result, which a
``backward_block`` does not see, so their op takes it (and a count) as extra
*reference* inputs: computed only when a gradient is, never read by the
forward pass (``unused_inputs``) and never differentiated (``nondiff_inputs``).
``max``/``min`` split the gradient equally among tied maxima, as JAX does. The reference is the
keepdims reduction itself, so the result is computed as the same node where it can be
(:func:`_beside_reference`). A full reduction returns a JAX scalar; a partial one a DiskArray.
"""
from __future__ import annotations

import builtins
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jask.graph.op import BlockParallelOp
from jask.hijax.array import is_disk_array, type_of
from jask.hijax.compat import is_traced
from jask.hijax.make_op import make_op
from jask.ops import accurate_log, elementwise as ew
from jask.ops.axes import normalize_axis, reduced_shape
from jask.ops.operands import iota
from jask.ops.shape import reshape


class Reduce(BlockParallelOp):
    """Reduce input 0 over ``axes``; inputs 1.. are keepdims-shaped references for ``backward_block``."""

    reduce = staticmethod(jnp.sum)
    nondiff_inputs = (1, 2)

    def __init__(self, axes=(), keepdims=False, shape=(), grid=(), n_refs=0):
        self.axes, self.keepdims, self.shape, self.grid = tuple(axes), bool(keepdims), tuple(shape), tuple(grid)
        self.unused_inputs = frozenset(range(1, 1 + n_refs))

    @classmethod
    def from_inputs(cls, x, *refs, axis=None, keepdims=False):
        name = cls.__name__.lower()
        return cls(normalize_axis(axis, x.ndim, name), keepdims, x.shape, x.grid, len(refs))

    def forward_block(self, x, *refs):
        return self.reduce(x, axis=self.axes, keepdims=self.keepdims)

    def index_map(self, out_idx):
        out_idx = iter(out_idx)
        base = [0 if (a in self.axes and not self.keepdims) else next(out_idx) for a in range(len(self.shape))]
        ref = tuple(0 if a in self.axes else i for a, i in enumerate(base))
        entries = []
        for blocks in itertools.product(*(range(self.grid[a]) for a in self.axes)):
            idx = list(base)
            for a, b in zip(self.axes, blocks):
                idx[a] = b
            entries.append((tuple(idx),) + (ref,) * len(self.unused_inputs))
        return entries

    def combine(self, acc, partial):
        return acc + partial

    def expanded(self, d_out_block):
        """The cotangent with the reduced axes put back (size 1), to broadcast against an input block."""
        return d_out_block if self.keepdims else jnp.expand_dims(d_out_block, self.axes)

    def backward_block(self, d_out_block, x, *refs):
        return (jnp.broadcast_to(self.expanded(d_out_block), x.shape).astype(x.dtype),) + tuple(
            jnp.zeros_like(r) for r in refs)

    def output_shape(self, x_shape, *ref_shapes):
        return reduced_shape(x_shape, self.axes, self.keepdims)

    def output_dtype(self, x_dtype, *ref_dtypes):
        """As the jnp reduction: bool and small integers sum in int32."""
        return _reduced_dtype(self.reduce, np.dtype(x_dtype), bool(jax.config.jax_enable_x64))


@functools.lru_cache(maxsize=256)
def _reduced_dtype(reduce, x_dtype, x64):
    """``reduce``'s result dtype for ``x_dtype``, traced once per (function, dtype, 64-bit mode):
    each op call asks, and ``jax.eval_shape`` costs ~0.7 ms (a sixth of a small ``sum``'s call)."""
    return np.dtype(jax.eval_shape(reduce, jax.ShapeDtypeStruct((), x_dtype)).dtype)


class Sum(Reduce):
    """Sum over the axes."""

    empty_value = 0     # a sum over an empty axis, as in jnp


class Max(Reduce):
    """Maximum; references ``(max, count of maxima)``: the gradient goes to the maxima, split among ties."""

    reduce = staticmethod(jnp.max)

    def combine(self, acc, partial):
        return jnp.maximum(acc, partial)

    def backward_block(self, d_out_block, x, *refs):
        if len(refs) != 2:
            raise NotImplementedError(f"{type(self).__name__.lower()} without its reference inputs has no gradient")
        m, count = refs
        share = jnp.where(x == m, self.expanded(d_out_block) / count.astype(x.dtype), 0)
        return (share.astype(x.dtype), jnp.zeros_like(m), jnp.zeros_like(count))


class Min(Max):
    """Minimum; gradient as for :class:`Max`."""

    reduce = staticmethod(jnp.min)

    def combine(self, acc, partial):
        return jnp.minimum(acc, partial)


class Prod(Reduce):
    """Product; references ``(product of the nonzero elements, count of zeros)``, so zeros get exact gradients."""

    reduce = staticmethod(jnp.prod)

    def combine(self, acc, partial):
        return acc * partial

    def backward_block(self, d_out_block, x, *refs):
        if len(refs) != 2:
            raise NotImplementedError("prod without its reference inputs has no gradient")
        p_nonzero, zeros = refs
        others = jnp.where(zeros == 0, p_nonzero / jnp.where(x == 0, 1, x),
                           jnp.where((zeros == 1) & (x == 0), p_nonzero, 0))
        return ((self.expanded(d_out_block) * others).astype(x.dtype), jnp.zeros_like(p_nonzero),
                jnp.zeros_like(zeros))


class LogSumExp(Reduce):
    """Each block's stable logsumexp folded by ``logaddexp``: one pass (a max pass, then a sum of ``exp(x - max)``,
    read the input twice). Reference ``(the result with keepdims,)``: the gradient is ``exp(x - result)``."""

    reduce = staticmethod(accurate_log.block_logsumexp)     # its log refined: a TPU's is not IEEE

    def combine(self, acc, partial):
        return accurate_log.logaddexp(acc, partial)

    def backward_block(self, d_out_block, x, *refs):
        if len(refs) != 1:
            raise NotImplementedError("logsumexp without its reference input has no gradient")
        (result,) = refs
        return ((self.expanded(d_out_block) * jnp.exp(x - result)).astype(x.dtype), jnp.zeros_like(result))


class Any(Reduce):
    """Whether any element is true, over the axes (bool in, bool out: no gradient)."""

    reduce = staticmethod(jnp.any)
    empty_value = False     # any over an empty axis, as in jnp

    def combine(self, acc, partial):
        return jnp.logical_or(acc, partial)


_sum, _max, _min, _prod, _any = (make_op(c, name=c.__name__.lower()) for c in (Sum, Max, Min, Prod, Any))
_logsumexp = make_op(LogSumExp, name="logsumexp")


def _jnp_for_in_memory(fn):
    """``fn``, or jnp's function of that name when ``a`` is not a DiskArray (a JAX scalar a full reduction
    returned, an in-memory array): as jask.numpy's elementwise functions do, ``knp.sum(knp.std(x))`` works."""
    jnp_fn = getattr(jnp, fn.__name__)

    @functools.wraps(fn)
    def reduce(a, *args, **kwargs):
        return fn(a, *args, **kwargs) if is_disk_array(a) else jnp_fn(a, *args, **kwargs)
    return reduce


def _check(name, a, where=None, initial=None, out=None):
    if not is_disk_array(a):
        raise TypeError(f"{name} expects a DiskArray; got {type(a).__name__}. Wrap in-memory data with "
                        f"jask.from_numpy, or use jax.numpy.{name}")
    for arg, value in (("where", where), ("initial", initial), ("out", out)):
        if value is not None:
            raise NotImplementedError(f"jask.numpy.{name}: the {arg}= argument is not supported; "
                                      f"apply jask.numpy.where to the input first" if arg != "out" else
                                      f"jask.numpy.{name}: out= is not supported (arrays are immutable)")


def _count(a, axis, name="reduction"):
    """The number of elements reduced into each output element (checks ``axis``)."""
    shape = type_of(a).shape
    return math.prod(shape[i] for i in normalize_axis(axis, len(shape), name))


def _low_precision(dtype) -> bool:
    """float16 and bfloat16, which jnp's sums and products accumulate in float32."""
    return jnp.issubdtype(dtype, jnp.floating) and np.dtype(dtype).itemsize < 4


def _accumulated(op, a, axis, keepdims):
    """``op`` (``_sum``, :func:`_exact_prod`) in float32 for float16/bfloat16, cast back as jnp does: their
    tiles' partials would otherwise be rounded to 11 (8) bits at every combine."""
    dtype = type_of(a).dtype
    if not _low_precision(dtype):
        return op(a, axis=axis, keepdims=keepdims)
    return ew.astype(op(ew.astype(a, jnp.float32), axis=axis, keepdims=keepdims), dtype)


@_jnp_for_in_memory
def sum(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None):  # noqa: A001
    """Sum over ``axis`` (all axes by default): a JAX scalar for a full reduction, else a DiskArray."""
    _check("sum", a, where, initial, out)
    normalize_axis(axis, type_of(a).ndim, "sum")
    if dtype is not None:
        a = ew.astype(a, dtype)
    return _accumulated(_sum, a, axis, keepdims)


def _extremum(op, name, a, axis, keepdims):
    if _count(a, axis, name) == 0:          # an empty output with a non-empty reduced axis is fine
        raise ValueError(f"{name} of an empty array has no identity")
    m = _detached(op, a, axis)
    count = _sum(ew.equal(a, m), axis=axis, keepdims=True)
    return _beside_reference(op, a, (m, count), axis, keepdims)


def _detached(op, a, axis):
    """The reduction with keepdims, as a constant reference (no gradient of its own)."""
    return ew.stop_gradient(op(a, axis=axis, keepdims=True))


def _beside_reference(op, a, refs, axis, keepdims):
    """``op(a, *refs)``, whose gradient reads the keepdims references ``refs`` (:func:`_detached`).

    With keepdims the result is the same application as its reference, so the planner computes them
    once (:mod:`jask.plan.dedup`). Without, under a trace (``jit`` or ``grad``), it is the keepdims result
    reshaped, for the same reason: a gradient then reads ``a`` once less (both the result and the
    reference were reductions over all of it). Eagerly it is computed directly: the reshape would be a
    kernel call more, for nothing when no gradient follows.
    """
    if keepdims or not is_traced(a):
        return op(a, *refs, axis=axis, keepdims=keepdims)
    return reshape(op(a, *refs, axis=axis, keepdims=True),
                   reduced_shape(type_of(a).shape, normalize_axis(axis, type_of(a).ndim), False))


@_jnp_for_in_memory
def max(a, axis=None, out=None, keepdims=False, initial=None, where=None):  # noqa: A001
    """Maximum over ``axis``; the gradient is split equally among tied maxima (as in JAX)."""
    _check("max", a, where, initial, out)
    return _extremum(_max, "max", a, axis, keepdims)


@_jnp_for_in_memory
def min(a, axis=None, out=None, keepdims=False, initial=None, where=None):  # noqa: A001
    """Minimum over ``axis``; gradient as for :func:`max`."""
    _check("min", a, where, initial, out)
    return _extremum(_min, "min", a, axis, keepdims)


amax, amin = max, min


@_jnp_for_in_memory
def prod(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None):
    """Product over ``axis``, with exact gradients where elements are zero (float16: in float32, as jnp)."""
    _check("prod", a, where, initial, out)
    normalize_axis(axis, type_of(a).ndim, "prod")
    if dtype is not None:
        a = ew.astype(a, dtype)
    return _accumulated(_exact_prod, a, axis, keepdims)


def _exact_prod(a, axis, keepdims):
    """The product, given each output element's product of its nonzero elements and count of zeros."""
    if type_of(a).size == 0:                     # the empty product: ones (of the reduced shape)
        return ew.add(_sum(a, axis=axis, keepdims=keepdims), 1)
    nonzero = ew.stop_gradient(_prod(ew.where(ew.equal(a, 0), 1, a), axis=axis, keepdims=True))
    zeros = _sum(ew.equal(a, 0), axis=axis, keepdims=True)
    return _prod(a, nonzero, zeros, axis=axis, keepdims=keepdims)


def _moment_input(a, dtype):
    """``a`` in the dtype jnp computes a mean or variance in, and the result's dtype: integers give float32;
    float16/bfloat16 are computed in float32 (their sums would overflow or round) and cast back."""
    out_dtype = np.dtype(jnp.dtype(dtype)) if dtype is not None else type_of(a).dtype
    if not jnp.issubdtype(out_dtype, jnp.inexact):
        out_dtype = np.dtype(jnp.result_type(out_dtype, 1.0))
    compute = np.dtype(jnp.float32) if _low_precision(out_dtype) else out_dtype
    return (a if type_of(a).dtype == compute else ew.astype(a, compute)), out_dtype


def _cast(x, dtype):
    return x if np.dtype(x.dtype) == dtype else ew.astype(x, dtype)


@_jnp_for_in_memory
def mean(a, axis=None, dtype=None, out=None, keepdims=False, *, where=None):
    """Mean over ``axis`` (integers give float32, float16 is summed in float32, as in jnp)."""
    _check("mean", a, where, None, out)
    count = _count(a, axis, "mean")
    a, out_dtype = _moment_input(a, dtype)
    return _cast(ew.true_divide(_sum(a, axis=axis, keepdims=keepdims), count), out_dtype)


def _variance(name, a, axis, dtype, ddof, keepdims):
    """Two passes (mean, then squared deviations) in the computation dtype, cast to the result's."""
    count = _count(a, axis, name)
    a, out_dtype = _moment_input(a, dtype)
    centered = ew.subtract(a, ew.true_divide(_sum(a, axis=axis, keepdims=True), count))
    return _cast(ew.true_divide(_sum(ew.square(centered), axis=axis, keepdims=keepdims), count - ddof), out_dtype)


@_jnp_for_in_memory
def var(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=None, correction=None):
    """Variance over ``axis``; ``ddof`` (or ``correction``) as in jnp."""
    _check("var", a, where, None, out)
    return _variance("var", a, axis, dtype, ddof if correction is None else correction, keepdims)


@_jnp_for_in_memory
def std(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=None, correction=None):
    """Standard deviation: ``sqrt(var(...))``."""
    _check("std", a, where, None, out)
    return ew.sqrt(_variance("std", a, axis, dtype, ddof if correction is None else correction, keepdims))


@_jnp_for_in_memory
def any(a, axis=None, out=None, keepdims=False, *, where=None):  # noqa: A001
    """``jnp.any``: whether any element along ``axis`` is nonzero (NaN counts), bool."""
    _check("any", a, where, None, out)
    normalize_axis(axis, type_of(a).ndim, "any")
    return _any(_truth(a), axis=axis, keepdims=keepdims)


@_jnp_for_in_memory
def all(a, axis=None, out=None, keepdims=False, *, where=None):  # noqa: A001
    """``jnp.all``: ``not any(not a)``, so an empty axis gives True as in jnp."""
    _check("all", a, where, None, out)
    normalize_axis(axis, type_of(a).ndim, "all")
    return ew.logical_not(_any(ew.logical_not(a), axis=axis, keepdims=keepdims))


def _truth(a):
    return a if type_of(a).dtype == np.bool_ else ew.not_equal(a, 0)


def logsumexp(a, axis=None, b=None, keepdims=False, return_sign=False, where=None):
    """``log(sum(exp(a)))`` over ``axis``, stable, in one pass (:class:`LogSumExp`; float16 in float32)."""
    _check("logsumexp", a, where)
    if b is not None or return_sign:
        raise NotImplementedError("jask logsumexp: b= and return_sign= are not supported; "
                                  "scale with jask.numpy.log(b) added to a instead of b=")
    axes = normalize_axis(axis, type_of(a).ndim, "logsumexp")
    a, out_dtype = _moment_input(a, None)
    return _cast(_beside_reference(_logsumexp, a, (_detached(_logsumexp, a, axes),), axes, keepdims), out_dtype)


def _arg_extremum(name, op, a, axis, keepdims):
    """Index of the first extremum (first NaN if any, as jnp): min over positions where the value hits."""
    t = type_of(a)
    axes = normalize_axis(axis, t.ndim, name)
    if _count(a, axes, name) == 0:             # an empty output with a non-empty reduced axis is fine
        raise ValueError(f"{name} of an empty array (an empty reduced axis)")
    m = _detached(op, a, axes)
    iotas = [iota(t.shape[ax], ax, t.ndim, name) for ax in axes]
    strides = tuple(math.prod(t.shape[b] for b in axes[k + 1:]) for k in range(len(axes)))
    big = math.prod(t.shape[ax] for ax in axes)
    hit_index = ew.lift(_first_hit(strides, big), name)(a, m, *iotas)
    return _min(hit_index, axis=axes, keepdims=keepdims)


def _first_hit(strides, big):
    def position_if_hit(x, m, *iotas):
        hit = jnp.where(jnp.isnan(m), jnp.isnan(x), x == m)
        flat = builtins.sum(i * s for i, s in zip(iotas, strides))
        return jnp.where(hit, flat, big).astype(jnp.int32)
    return position_if_hit


@_jnp_for_in_memory
def argmax(a, axis=None, out=None, keepdims=None):
    """Index of the maximum along ``axis`` (flattened when None), int32; no gradient, as in JAX."""
    _check("argmax", a, out=out)
    return _arg_extremum("argmax", _max, a, axis, bool(keepdims))


@_jnp_for_in_memory
def argmin(a, axis=None, out=None, keepdims=None):
    """Index of the minimum along ``axis`` (flattened when None), int32."""
    _check("argmin", a, out=out)
    return _arg_extremum("argmin", _min, a, axis, bool(keepdims))

