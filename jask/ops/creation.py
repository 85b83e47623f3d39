"""Arrays made from a shape: ``zeros``/``ones``/``full`` (and ``*_like``), ``broadcast_to``.

None of them holds a full array anywhere: zeros are the storage-free zero node,
a constant fill is an elementwise op over it (each tile filled as it is
computed), and ``broadcast_to`` reads its input's tiles against that zero
witness, so NumPy broadcasting does the work tile by tile.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jask.hijax.array import DiskArray, is_disk_array, type_of, zeros_node
from jask.hijax.compat import is_traced
from jask.hijax.make_op import make_op
from jask.ops.elementwise import Elementwise, astype
from jask.ops.operands import as_operand


def _shape(shape, name):
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if any(not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
        raise ValueError(f"{name}: shape must be non-negative integers, got {shape}")
    return tuple(int(d) for d in shape)


def _dtype(dtype, fill_value=0.0):
    """jnp's dtype: ``dtype`` if given, else the fill value's, canonical (float gives float32 without x64)."""
    if dtype is None:
        dtype = type_of(fill_value).dtype if is_disk_array(fill_value) else jnp.result_type(fill_value)
    return np.dtype(jax.dtypes.canonicalize_dtype(jnp.dtype(dtype)))


class _Witnessed(Elementwise):
    """Elementwise whose first input is an all-zero witness of the output's shape; no gradient flows to it."""

    nondiff_inputs = (0,)


_witnessed = make_op(_Witnessed, name="full")


def _fill(witness, value, dtype):
    return jnp.full(witness.shape, value, dtype)


def _broadcast(witness, x):
    return jnp.broadcast_to(x, witness.shape)


def zeros(shape, dtype=None) -> DiskArray:
    """``jnp.zeros``: an all-zero DiskArray (no storage until an op writes a result from it)."""
    return DiskArray(node=zeros_node(_shape(shape, "zeros"), _dtype(dtype)))


def full(shape, fill_value, dtype=None) -> DiskArray:
    """``jnp.full``: every element ``fill_value`` (a number or a 0-d value), filled tile by tile; a 0-d
    array of a concrete value is stored at once (an op with a 0-d result would give a JAX scalar)."""
    shape, dtype = _shape(shape, "full"), _dtype(dtype, fill_value)
    if np.ndim(fill_value) != 0:
        if not is_disk_array(fill_value) and not is_traced(fill_value):
            fill_value = np.asarray(fill_value, dtype)
        fill = as_operand("full", fill_value)
        return broadcast_to(fill if type_of(fill).dtype == dtype else astype(fill, dtype), shape)
    if shape == () and not is_disk_array(fill_value):
        if is_traced(fill_value):                 # no values to store yet: a JAX scalar, as jask's 0-d results are
            return jnp.full((), fill_value, dtype)
        return as_operand("full", np.full((), fill_value, dtype))   # stored, as zeros(()) is a DiskArray
    witness = DiskArray(node=zeros_node(shape, np.dtype(bool)))
    if isinstance(fill_value, (bool, int, float)):
        return _witnessed(witness, fn=_fill, consts=((1, fill_value),), params=(("dtype", dtype),), name="full")
    return _witnessed(witness, fill_value, fn=_fill, params=(("dtype", dtype),), name="full")


def ones(shape, dtype=None) -> DiskArray:
    """``jnp.ones``."""
    return full(shape, 1, _dtype(dtype, 1.0))


def _like(a, dtype, shape):
    t = type_of(a) if is_disk_array(a) else a
    return (t.shape if shape is None else shape), _dtype(t.dtype if dtype is None else dtype)


def zeros_like(a, dtype=None, shape=None) -> DiskArray:
    """``jnp.zeros_like`` of a DiskArray (or anything with ``shape`` and ``dtype``)."""
    return zeros(*_like(a, dtype, shape))


def empty_like(a, dtype=None, shape=None) -> DiskArray:
    """``jnp.empty_like``: zeros, as in jnp."""
    return zeros_like(a, dtype, shape)


def ones_like(a, dtype=None, shape=None) -> DiskArray:
    """``jnp.ones_like``."""
    shape, dtype = _like(a, dtype, shape)
    return full(shape, 1, dtype)


def full_like(a, fill_value, dtype=None, shape=None) -> DiskArray:
    """``jnp.full_like``."""
    shape, dtype = _like(a, dtype, shape)
    return full(shape, fill_value, dtype)


def broadcast_to(array, shape) -> DiskArray:
    """``jnp.broadcast_to``: ``array`` repeated along new or size-1 axes, lazily; its gradient sums back."""
    shape = _shape(shape, "broadcast_to")
    in_shape = tuple(np.shape(array)) if not is_disk_array(array) else type_of(array).shape
    try:
        if np.broadcast_shapes(in_shape, shape) != shape:
            raise ValueError
    except ValueError:
        raise ValueError(f"broadcast_to: cannot broadcast an array of shape {in_shape} to {shape}") from None
    if is_disk_array(array) and in_shape == shape:
        return array
    witness = DiskArray(node=zeros_node(shape, np.dtype(bool)))
    if np.ndim(array) != 0:
        array = as_operand("broadcast_to", array)    # an in-memory operand is stored once, then read per tile
    return _witnessed(witness, array, fn=_broadcast, name="broadcast_to")
