"""Elementwise ops, generically: any jnp function lifted to a tiled op.

One class, :class:`Elementwise`, applies a function to one tile of each operand.
Operands follow NumPy broadcasting: an input of shape ``(7,)`` or ``(5, 1)``
feeding a ``(5, 7)`` output is read at block 0 along its broadcast (size-1 or
missing leading) axes, and its block there has size 1, so the function sees
the same broadcast it would in jnp. Python numbers are baked into the op
(weakly typed, as in jnp: ``float32 + 1.0`` stays float32); 0-d JAX or NumPy
values, traced or not, are scalar operands of the op. A weakly typed one (a
Python number passed through ``jit``, ``jnp.asarray(2.0)``) takes the array's
dtype as in jnp: ``float16 * lr`` stays float16.

The gradient is ``jax.vjp`` of the same function on the tile: its cotangent for a
broadcast input is already summed to that input's block shape, and
contributions from the output tiles that read one input block are summed by the
gradient op's ``combine``. Bool and integer outputs carry no gradient.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jask.graph.op import BlockParallelOp
from jask.hijax.array import is_disk_array
from jask.hijax.make_op import is_scalar_operand, make_op
from jask.hijax.compat import is_traced
from jask.linalg.add import add as _seed_add
from jask.linalg.mul import mul as _seed_mul
from jask.linalg.sub import sub as _seed_sub
from jask.ops.operands import as_operand

_PYTHON_SCALARS = (bool, int, float, complex)


def broadcast_shapes(name, *shapes):
    """NumPy's broadcast shape, with an error that names the op and every shape."""
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"{name} got incompatible shapes for broadcasting: "
                         f"{', '.join(map(str, shapes))}") from None


def broadcast_block(shape, out_idx):
    """The block of an input of ``shape`` that output tile ``out_idx`` reads (broadcast axes: block 0)."""
    lead = len(out_idx) - len(shape)
    return tuple(0 if d == 1 else out_idx[lead + k] for k, d in enumerate(shape))


class Elementwise(BlockParallelOp):
    """``fn(*operands, **params)`` tile by tile; ``consts`` are ``(position, Python value)`` pairs baked in."""

    scalar_operands = True

    def __init__(self, fn, consts=(), params=(), shapes=(), dtypes=(), name="elementwise", weak=()):
        self.fn, self.consts, self.params, self.name = fn, tuple(consts), dict(params), name
        self.weak = _weak_dtypes(weak, dtypes)
        self.shapes = tuple(tuple(s) for s in shapes)
        self.out_shape = broadcast_shapes(name, *self.shapes) if self.shapes else ()
        out = jax.eval_shape(self.call, *[jax.ShapeDtypeStruct(s, d) for s, d in zip(self.shapes, dtypes)])
        if not isinstance(out, jax.ShapeDtypeStruct) or tuple(out.shape) != self.out_shape:
            raise ValueError(f"{name}: the lifted function must be elementwise; for operands of shapes "
                             f"{', '.join(map(str, self.shapes))} it returned {out}, not one array of shape "
                             f"{self.out_shape}")
        self.out_dtype = np.dtype(out.dtype)
        if jnp.issubdtype(self.out_dtype, jnp.complexfloating):
            raise TypeError(f"{name} would give a complex result ({self.out_dtype}); jask stores no complex dtypes")

    @classmethod
    def from_inputs(cls, *inputs, fn, consts=(), params=(), name="elementwise", weak=()):
        return cls(fn, consts, params, [i.shape for i in inputs], [i.dtype for i in inputs], name, weak)

    def call(self, *operands):
        """The lifted function with weak scalars in their jnp dtype and the baked-in constants put back."""
        args = [jnp.asarray(x).astype(self.weak[i]) if i in self.weak else x for i, x in enumerate(operands)]
        for pos, value in self.consts:
            args.insert(pos, value)
        return self.fn(*args, **self.params)

    def forward_block(self, *blocks):
        return self.call(*blocks)

    def index_map(self, out_idx):
        return [tuple(broadcast_block(s, out_idx) for s in self.shapes)]

    def combine(self, acc, partial):
        return acc + partial

    def backward_block(self, d_out_block, *blocks):
        grads = [jnp.zeros_like(b) for b in blocks]
        diff = [i for i, b in enumerate(blocks) if jnp.issubdtype(b.dtype, jnp.inexact)]
        if not diff or not jnp.issubdtype(self.out_dtype, jnp.inexact):
            return tuple(grads)

        def of_inexact(*xs):
            args = list(blocks)
            for i, x in zip(diff, xs):
                args[i] = x
            return self.call(*args)

        _, vjp = jax.vjp(of_inexact, *[blocks[i] for i in diff])
        for i, g in zip(diff, vjp(d_out_block.astype(self.out_dtype))):
            grads[i] = g
        return tuple(grads)

    def output_shape(self, *shapes):
        return self.out_shape

    def output_dtype(self, *dtypes):
        return self.out_dtype


def _weak_dtypes(weak, dtypes) -> dict:
    """Operand position -> the dtype jnp gives a weakly typed scalar there: the other operands' promotion with
    a Python number of its kind (``float16`` and a weak float32 give float16, ``int8`` and a weak int int8)."""
    strong = [d for i, d in enumerate(dtypes) if i not in weak]
    if not weak or not strong:
        return {}
    kind = {"b": True, "i": 0, "u": 0, "f": 0.0, "c": 0j}
    return {i: np.dtype(jnp.result_type(*strong, kind.get(np.dtype(dtypes[i]).kind, 0.0))) for i in weak}


def _is_weak(x) -> bool:
    """A weakly typed 0-d JAX value (a Python number passed through jit, ``jnp.asarray(2.0)``)."""
    return bool(getattr(getattr(x, "aval", x), "weak_type", False))


def _operands(name, args):
    """Split call arguments into op operands (DiskArrays, 0-d values) and baked-in Python constants, and
    the positions (among the operands) of weakly typed scalars."""
    operands, consts, weak = [], [], []
    for pos, x in enumerate(args):
        if is_disk_array(x) or is_scalar_operand(x):
            if not is_disk_array(x) and _is_weak(x):
                weak.append(len(operands))
            operands.append(x)
        elif x is None or isinstance(x, _PYTHON_SCALARS):
            consts.append((pos, x))
        elif isinstance(x, (np.ndarray, jax.Array, list, tuple)) or is_traced(x):
            operands.append(as_operand(name, x))   # in-memory operand: written to scratch once; traced: refused
        else:
            raise TypeError(f"{name} cannot take an operand of type {type(x).__name__}")
    return operands, tuple(consts), tuple(weak)


def lift(fn, name=None, fast=None):
    """``fn`` (elementwise over jnp arrays) as a function of DiskArrays, scalars and in-memory arrays.

    ``fast(*args)`` may return a result from a hand-written op with the same
    value (or None): ``backward_block`` stays the fast path where one exists.
    """
    name = name or getattr(fn, "__name__", "elementwise")
    op = make_op(Elementwise, name=name)

    @functools.wraps(fn)
    def lifted(*args, **params):
        if not any(is_disk_array(x) for x in args):
            return fn(*args, **params)
        if fast is not None and not params:
            out = fast(*args)
            if out is not None:
                return out
        operands, consts, weak = _operands(name, args)
        return op(*operands, fn=fn, consts=consts, params=params, name=name, weak=weak)

    lifted.__name__ = lifted.__qualname__ = name
    lifted.__doc__ = f"Elementwise ``{name}`` of disk-backed arrays with jnp broadcasting and promotion."
    return lifted


def elementwise(fn):
    """Lift a user's elementwise jnp function ``fn(*arrays, **static)`` to DiskArrays, with gradients.

    ``fn`` must map broadcast operands to one array of the broadcast shape; its
    gradient comes from ``jax.vjp`` of ``fn`` on each tile. Keyword arguments
    are static (hashable) parameters.
    """
    return lift(fn, getattr(fn, "__name__", "elementwise"))


def _same_arrays(*args):
    return (len(args) == 2 and all(is_disk_array(x) for x in args)
            and args[0].shape == args[1].shape and args[0].dtype == args[1].dtype)


def _fast(op_name):
    """The seed's hand-written op for two DiskArrays of one shape and dtype (equal values, fused by name)."""
    def fast(*args):
        if _same_arrays(*args):
            return {"add": _seed_add, "sub": _seed_sub, "mul": _seed_mul}[op_name](*args)
        return None
    return fast


def _astype_fn(x, dtype):
    return jnp.asarray(x).astype(dtype)


def _clip(x, lo, hi):
    return jnp.clip(x, lo, hi)


def _round_fn(x, decimals=0):
    return jnp.round(x, decimals)


add = lift(jnp.add, "add", _fast("add"))
subtract = lift(jnp.subtract, "subtract", _fast("sub"))
multiply = lift(jnp.multiply, "multiply", _fast("mul"))
divide = lift(jnp.divide, "divide")
true_divide = lift(jnp.true_divide, "true_divide")
floor_divide = lift(jnp.floor_divide, "floor_divide")
power = lift(jnp.power, "power")
float_power = lift(jnp.float_power, "float_power")
remainder = lift(jnp.remainder, "remainder")
mod = lift(jnp.mod, "mod")
negative = lift(jnp.negative, "negative")
positive = lift(jnp.positive, "positive")
abs = lift(jnp.abs, "abs")  # noqa: A001
absolute = lift(jnp.absolute, "absolute")
reciprocal = lift(jnp.reciprocal, "reciprocal")
exp = lift(jnp.exp, "exp")
exp2 = lift(jnp.exp2, "exp2")
expm1 = lift(jnp.expm1, "expm1")
log = lift(jnp.log, "log")
log1p = lift(jnp.log1p, "log1p")
log2 = lift(jnp.log2, "log2")
log10 = lift(jnp.log10, "log10")
logaddexp = lift(jnp.logaddexp, "logaddexp")
sqrt = lift(jnp.sqrt, "sqrt")
rsqrt = lift(jax.lax.rsqrt, "rsqrt")
cbrt = lift(jnp.cbrt, "cbrt")
square = lift(jnp.square, "square")
sin = lift(jnp.sin, "sin")
cos = lift(jnp.cos, "cos")
tan = lift(jnp.tan, "tan")
arcsin = lift(jnp.arcsin, "arcsin")
arccos = lift(jnp.arccos, "arccos")
arctan = lift(jnp.arctan, "arctan")
arctan2 = lift(jnp.arctan2, "arctan2")
sinh = lift(jnp.sinh, "sinh")
cosh = lift(jnp.cosh, "cosh")
tanh = lift(jnp.tanh, "tanh")
arcsinh = lift(jnp.arcsinh, "arcsinh")
arccosh = lift(jnp.arccosh, "arccosh")
arctanh = lift(jnp.arctanh, "arctanh")
hypot = lift(jnp.hypot, "hypot")
sigmoid = lift(jax.nn.sigmoid, "sigmoid")
maximum = lift(jnp.maximum, "maximum")
minimum = lift(jnp.minimum, "minimum")
sign = lift(jnp.sign, "sign")
floor = lift(jnp.floor, "floor")
ceil = lift(jnp.ceil, "ceil")
trunc = lift(jnp.trunc, "trunc")
isnan = lift(jnp.isnan, "isnan")
isinf = lift(jnp.isinf, "isinf")
isfinite = lift(jnp.isfinite, "isfinite")
logical_and = lift(jnp.logical_and, "logical_and")
logical_or = lift(jnp.logical_or, "logical_or")
logical_not = lift(jnp.logical_not, "logical_not")
logical_xor = lift(jnp.logical_xor, "logical_xor")
bitwise_and = lift(jnp.bitwise_and, "bitwise_and")       # bitwise ops: bool and integer dtypes, as jnp
bitwise_or = lift(jnp.bitwise_or, "bitwise_or")
bitwise_xor = lift(jnp.bitwise_xor, "bitwise_xor")
bitwise_not = lift(jnp.bitwise_not, "bitwise_not")
invert = lift(jnp.invert, "invert")
bitwise_invert = lift(jnp.bitwise_invert, "bitwise_invert")
left_shift = lift(jnp.left_shift, "left_shift")
right_shift = lift(jnp.right_shift, "right_shift")
bitwise_left_shift = lift(jnp.bitwise_left_shift, "bitwise_left_shift")
bitwise_right_shift = lift(jnp.bitwise_right_shift, "bitwise_right_shift")
equal = lift(jnp.equal, "equal")
not_equal = lift(jnp.not_equal, "not_equal")
less = lift(jnp.less, "less")
less_equal = lift(jnp.less_equal, "less_equal")
greater = lift(jnp.greater, "greater")
greater_equal = lift(jnp.greater_equal, "greater_equal")
_where3 = lift(jnp.where, "where")
_clip3 = lift(_clip, "clip")
_round = lift(_round_fn, "round")
_astype = lift(_astype_fn, "astype")


def where(condition, x=None, y=None, /):
    """``jnp.where(condition, x, y)``: elements of ``x`` where ``condition``, else of ``y`` (broadcast)."""
    if x is None or y is None:
        raise NotImplementedError("jask.numpy.where(condition) (the indices of nonzero elements) is not "
                                  "supported; use where(condition, x, y)")
    return _where3(condition, x, y)


def clip(arr, /, min=None, max=None):  # noqa: A002 - jnp's names
    """``jnp.clip``: ``arr`` limited to ``[min, max]`` (either may be None, a scalar or an array)."""
    return _clip3(arr, min, max)


def round(a, decimals=0):  # noqa: A001
    """``jnp.round`` to ``decimals`` places."""
    return _round(a, decimals=int(decimals))


def astype(x, dtype):
    """``x`` converted to ``dtype`` (the gradient is converted back, as in JAX)."""
    return _astype(x, dtype=np.dtype(jnp.dtype(dtype)))


class _Detached(Elementwise):
    """The identity with no gradient: ``jax.lax.stop_gradient`` does not accept DiskArrays."""

    nondiff_inputs = (0,)


def _identity(x):
    return x


_detach = make_op(_Detached, name="stop_gradient")


def stop_gradient(x):
    """``x`` as a constant for differentiation (a fused identity; its gradient is zero)."""
    return _detach(x, fn=_identity, name="stop_gradient")
