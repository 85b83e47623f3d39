"""Axis arguments of reductions and shape ops: normalized, and the shapes they leave.

Its own module so that the shape ops and the reductions can both use it: the reductions build
their results without keepdims as a reshape of the keepdims ones (``jask.ops.shape``).
"""
from __future__ import annotations

import operator


def normalize_axis(axis, ndim, name="reduction") -> tuple[int, ...]:
    """``axis`` (None, int or tuple; negatives allowed) as a sorted tuple of distinct axes."""
    if axis is None:
        return tuple(range(ndim))
    try:
        axes = (operator.index(axis),) if not isinstance(axis, (tuple, list)) else tuple(map(operator.index, axis))
    except TypeError:
        raise TypeError(f"{name}: axis must be None, an int or a tuple of ints, got {axis!r}") from None
    norm = tuple(a + ndim if a < 0 else a for a in axes)
    if any(not 0 <= a < ndim for a in norm) or len(set(norm)) != len(norm):
        raise ValueError(f"{name}: axis {axis!r} is out of range or repeated for an array of ndim {ndim}")
    return tuple(sorted(norm))


def reduced_shape(shape, axes, keepdims):
    """``shape`` reduced over ``axes`` (normalized): size 1 there with ``keepdims``, else dropped."""
    return tuple(1 if a in axes else d for a, d in enumerate(shape) if keepdims or a not in axes)
