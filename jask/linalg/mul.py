"""Multiplication: array x array, array x Python number, and array x traced JAX scalar.

``a * s`` with a traced scalar ``s`` is a ``make_op`` op with a scalar operand
(``ScalarMul.scalar_operands``): the gradient for ``s``, ``sum(d_out * a)`` over
every tile, is a reduction that ``make_op``'s backward runs and returns as a JAX
scalar. ``HiScalarMul``/``HiScalarMulBackward``, the hand-written primitive pair
this once took, are now make_op's own primitives (names kept for the seed).
"""
from __future__ import annotations

import math
import numbers

import jax.numpy as jnp
import numpy as np

from jask.graph.op import BlockParallelOp
from jask.hijax import compat
from jask.hijax.array import is_disk_array, type_of
from jask.hijax.make_op import make_op
from jask.hijax.primitives import BackwardPrimitive, OpPrimitive
from jask.linalg._checks import same_shape


class MulArrays(BlockParallelOp):
    """a * b elementwise."""

    def forward_block(self, a_block, b_block):
        return a_block * b_block

    def index_map(self, out_idx):
        return [(out_idx, out_idx)]

    def combine(self, acc, partial):
        return acc + partial

    def backward_block(self, d_out_block, a_block, b_block):
        return (d_out_block * b_block, d_out_block * a_block)

    def output_shape(self, a_shape, b_shape):
        return same_shape("mul", a_shape, b_shape)


class MulConstant(BlockParallelOp):
    """a * c for a Python number c, baked into the op."""

    def __init__(self, factor=1.0):
        self.factor = factor

    def forward_block(self, a_block):
        return (a_block * self.factor).astype(self.output_dtype(a_block.dtype))

    def index_map(self, out_idx):
        return [(out_idx,)]

    def combine(self, acc, partial):
        return acc + partial

    def backward_block(self, d_out_block, a_block):
        return ((d_out_block * self.factor).astype(a_block.dtype),)

    def output_shape(self, a_shape):
        return a_shape

    def output_dtype(self, a_dtype):
        """JAX's promotion with a weakly typed Python number: int32 * 2.5 is float32, int32 * 2 stays int32."""
        return jnp.result_type(a_dtype, self.factor)


class ScalarMul(BlockParallelOp):
    """a * s where s is a 0-d JAX value, traced or not: its gradient ``sum(d_out * a)`` is a reduction."""

    scalar_operands = True

    def forward_block(self, a_block, s):
        return (a_block * s).astype(self.output_dtype(a_block.dtype, s.dtype))

    def index_map(self, out_idx):
        return [(out_idx, ())]

    def combine(self, acc, partial):
        return acc + partial

    def backward_block(self, d_out_block, a_block, s):
        return ((d_out_block * s).astype(a_block.dtype), jnp.sum(d_out_block * a_block))

    def output_shape(self, a_shape, s_shape):
        return a_shape

    def output_dtype(self, a_dtype, s_dtype):
        """A float array keeps its dtype; an integer or bool array takes the scalar's float dtype."""
        return a_dtype if jnp.issubdtype(a_dtype, jnp.floating) else s_dtype


_mul_arrays = make_op(MulArrays, name="mul")
_mul_constant = make_op(MulConstant, name="mul")
_mul_scalar = make_op(ScalarMul, name="mul")


def _scalar_mul(a, s):
    s = jnp.asarray(s)
    if s.shape != ():
        raise ValueError(f"mul: a DiskArray can be multiplied by a scalar or an array of shape "
                         f"{type_of(a).shape}, not by an array of shape {s.shape}")
    if not compat.is_traced(s) and not bool(jnp.all(jnp.isfinite(s))):
        # a concrete value can be checked now, as Python numbers are; a traced one cannot
        raise ValueError(f"mul: scalar factor {s.item()!r} ({s.dtype}) is not finite")
    if not jnp.issubdtype(s.dtype, jnp.floating):
        a_dtype = type_of(a).dtype
        s = s.astype(a_dtype if jnp.issubdtype(a_dtype, jnp.floating) else jnp.float32)
    return _mul_scalar(a, s)


def mul(a, b):
    """Elementwise product of two DiskArrays, or a DiskArray scaled by a scalar.

    The scalar may be a Python number (baked into the op) or a JAX scalar,
    traced or not, whose gradient is a reduction over every tile.
    """
    if is_disk_array(a) and is_disk_array(b):
        return _mul_arrays(a, b)
    arr, s = (a, b) if is_disk_array(a) else (b, a)
    if not is_disk_array(arr):
        raise TypeError(f"mul expects at least one DiskArray, got {type(a).__name__} and {type(b).__name__}")
    if isinstance(s, numbers.Number) and not isinstance(s, bool):
        if not math.isfinite(complex(s).real) or not math.isfinite(complex(s).imag):
            raise ValueError(f"mul: scalar factor {s!r} is not finite")
        return _mul_constant(arr, factor=s if isinstance(s, int) else float(s))
    if isinstance(s, (np.ndarray, np.generic)) or hasattr(s, "dtype"):
        return _scalar_mul(arr, s)
    raise TypeError(f"mul cannot multiply a DiskArray by {type(s).__name__}")


HiScalarMul, HiScalarMulBackward = OpPrimitive, BackwardPrimitive   # the seed's names for the pattern
