"""Helpers the ops share: an in-memory operand stored once, and int32 row-number columns.

An in-memory array that meets a DiskArray is written to scratch once
(:func:`jask.from_numpy`) and then read tile by tile like any other input; a
traced one (inside ``jit`` or ``grad``) has no values to write yet, so it is
refused with the alternatives. Ops that need to know which rows a tile holds
(gathers, strided views, regroups, argmax) read an int32 iota beside their
input; int32 keeps those columns small, so axes past its range are refused
instead of wrapping silently.
"""
from __future__ import annotations

import numpy as np

from jask.api.sources import from_numpy
from jask.hijax.array import is_disk_array
from jask.hijax.compat import is_traced

INT32_LIMIT = 2**31 - 1


def as_operand(name, x):
    """``x`` as a DiskArray operand: a DiskArray as is, an in-memory array stored once, a traced one refused."""
    if is_disk_array(x):
        return x
    if is_traced(x):
        raise NotImplementedError(
            f"{name}: a traced in-memory array of shape {np.shape(x)} cannot be an operand of a DiskArray op yet "
            "(inside jit or grad): pass it as a DiskArray (jask.from_numpy outside jit) or as a 0-d scalar, or "
            "read row batches into memory with jask.batches and use jax.numpy")
    return from_numpy(np.asarray(x))


def column(values, axis, ndim, name):
    """A 1-D int32 array of ``values`` laid along ``axis`` of an ``ndim``-d array (size-1 elsewhere)."""
    values = np.asarray(values)
    if values.size and int(values.max()) > INT32_LIMIT:
        raise NotImplementedError(
            f"{name}: row number {int(values.max())} is past the int32 row numbers jask reads beside a tile "
            f"(at most {INT32_LIMIT}); split the axis into slices shorter than 2**31 rows")
    values = values.astype(np.int32)
    return from_numpy(values.reshape([values.size if b == axis else 1 for b in range(ndim)]))


def iota(n, axis, ndim, name):
    """``0 .. n-1`` as an int32 column along ``axis`` (refused, before building it, past int32's range)."""
    if n - 1 > INT32_LIMIT:
        raise NotImplementedError(
            f"{name}: an axis of {n} rows is longer than the int32 row numbers jask reads beside a tile reach "
            f"({INT32_LIMIT + 1} rows); split the axis into slices shorter than 2**31 rows")
    return from_numpy(np.arange(n, dtype=np.int32).reshape([n if b == axis else 1 for b in range(ndim)]))
