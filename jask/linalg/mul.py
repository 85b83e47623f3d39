"""Multiplication: array x array, array x Python number, and array x traced JAX scalar.

``a * s`` with a traced scalar ``s`` cannot be a plain ``make_op`` op: the
gradient for ``s`` is ``sum(d_out * a)`` over every tile, a scalar, not a tile
shaped like an input. So it is its own hijax primitive pair,
:class:`HiScalarMul` and :class:`HiScalarMulBackward`, built from the same
lazy-graph pieces as ``make_op``.
"""
from __future__ import annotations

import dataclasses
import math
import numbers

import jax.numpy as jnp
import numpy as np

from jask.exec.driver import run
from jask.graph.op import BlockParallelOp
from jask.hijax import compat, runtime
from jask.hijax.array import DiskArrayType, is_disk_array, type_of
from jask.hijax.grad import GradOp
from jask.hijax.make_op import make_op
from jask.graph.nodes import OpNode, OpSpec
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
    """a * s where s is a scalar operand; the graph node behind HiScalarMul."""

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
_SCALAR_MUL = OpSpec(ScalarMul, (), "mul")


@dataclasses.dataclass(frozen=True)
class _ScalarMulForward:
    def __call__(self, a, s):
        s = runtime.as_node(s)
        return (OpNode(_SCALAR_MUL, (a, s), a.shape, ScalarMul().output_dtype(a.dtype, s.dtype)),)


@dataclasses.dataclass(frozen=True)
class _ScalarMulBackward:
    want_a: bool
    want_s: bool

    def __call__(self, g, a, s):
        inputs = (g, a, runtime.as_node(s))
        outs = []
        if self.want_a:
            outs.append(OpNode(OpSpec(GradOp, (("forward", _SCALAR_MUL), ("wrt", 0)), "grad[mul]"),
                               inputs, a.shape, a.dtype))
        if self.want_s:
            ds = OpNode(OpSpec(GradOp, (("forward", _SCALAR_MUL), ("wrt", 1)), "grad[mul]"),
                        inputs, (), np.asarray(s).dtype)
            outs.extend(run([ds]))
        return tuple(outs)


class HiScalarMul(compat.HiPrimitive):
    """``a * s`` for a DiskArray ``a`` and a (possibly traced) JAX scalar ``s``."""

    def __init__(self, a_type, s_type):
        self.in_avals = (a_type, s_type)
        self.out_aval = DiskArrayType(a_type.shape, np.dtype(ScalarMul().output_dtype(a_type.dtype, s_type.dtype)))
        self.params = dict(signature=(a_type, s_type))
        super().__init__()

    def expand(self, a, s):
        (out,) = runtime.host_call(_ScalarMulForward(), (self.out_aval,),
                                   [runtime.ref_of(a), s], [True, False])
        return out

    def vjp_fwd(self, nzs_in, a, s):
        return self(a, s), (a, s)

    def vjp_bwd(self, res, g, a_acc, s_acc):
        if compat.is_zero_cotangent(g):
            return
        want_a, want_s = compat.wants_grad(a_acc), compat.wants_grad(s_acc)
        if not (want_a or want_s):
            return
        grads = HiScalarMulBackward(self.in_avals[0], self.in_avals[1], want_a, want_s)(g, *res)
        grads = list(grads)
        if want_a:
            a_acc.accum(grads.pop(0))
        if want_s:
            s_acc.accum(grads.pop(0))

    def batch(self, axis_data, args, dims):
        raise NotImplementedError("jax.vmap of jask.mul is not supported")


class HiScalarMulBackward(compat.HiPrimitive):
    """Gradients of ``a * s``: a lazy DiskArray ``g * s`` and the scalar ``sum(g * a)`` (a reduction)."""

    def __init__(self, a_type, s_type, want_a, want_s):
        self.in_avals = (a_type, a_type, s_type)
        self.out_aval = tuple(t for t, w in ((a_type, want_a), (s_type, want_s)) if w)
        self.params = dict(signature=(a_type, s_type), want=(want_a, want_s))
        super().__init__()

    def expand(self, g, a, s):
        want_a, want_s = self.want
        return runtime.host_call(_ScalarMulBackward(want_a, want_s), self.out_aval,
                                 [runtime.ref_of(g), runtime.ref_of(a), s], [True, True, False])

    def vjp_fwd(self, nzs_in, *args):
        raise NotImplementedError("second-order gradients of jask.mul are not supported")


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
    if not compat.is_traced(a) and not compat.is_traced(s):
        runtime.safe_point()
    return HiScalarMul(type_of(a), compat.ShapedArray((), s.dtype))(a, s)


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
