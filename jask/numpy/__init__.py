"""``jask.numpy``: ``jax.numpy``'s names and signatures over DiskArrays, with gradients.

Elementwise functions broadcast and promote as jnp does (Python scalars weakly
typed); with no DiskArray operand they are jnp's own. Reductions give a JAX
scalar for a full reduction and a DiskArray otherwise. Any other ``jax.numpy``
name raises ``NotImplementedError`` naming the nearest supported function.
"""
import difflib

import jax.numpy as _jnp

from jask.numpy import linalg
from jask.ops.contract import dot, einsum, matmul, tensordot  # noqa: F401
from jask.ops.creation import (  # noqa: F401
    broadcast_to, empty_like, full, full_like, ones, ones_like, zeros, zeros_like,
)
from jask.ops.gather import take  # noqa: F401
from jask.ops.indexing import concatenate, getitem as _getitem, stack  # noqa: F401
from jask.ops.shape import expand_dims, moveaxis, ravel, reshape, squeeze, swapaxes, transpose  # noqa: F401
from jask.ops.elementwise import (  # noqa: F401, A004
    abs, absolute, add, arccos, arccosh, arcsin, arcsinh, arctan, arctan2, arctanh, astype, bitwise_and,
    bitwise_invert, bitwise_left_shift, bitwise_not, bitwise_or, bitwise_right_shift, bitwise_xor, cbrt, ceil,
    clip, cos, cosh, divide, elementwise, equal, exp, exp2, expm1, float_power, floor, floor_divide, greater,
    greater_equal, hypot, invert, isfinite, isinf, isnan, left_shift, less, less_equal, log, log1p, log2, log10,
    logaddexp, right_shift,
    logical_and, logical_not, logical_or, logical_xor, maximum, minimum, mod, multiply, negative, not_equal,
    positive, power, reciprocal, remainder, round, rsqrt, sigmoid, sign, sin, sinh, sqrt, square,
    stop_gradient, subtract, tan, tanh, true_divide, trunc, where,
)
from jask.ops.reductions import (  # noqa: F401, A004
    all, amax, amin, any, argmax, argmin, logsumexp, max, mean, min, prod, std, sum, var,
)

# dtypes and constants are jnp's own
from jax.numpy import (  # noqa: F401, E402
    bfloat16, bool_, dtype, e, finfo, float16, float32, float64, iinfo, inf, int8, int16, int32, int64,
    issubdtype, nan, newaxis, pi, result_type, uint8, uint32,
)


def _reshape_method(a, *shape, order="C"):
    """``x.reshape(2, 3)`` and ``x.reshape((2, 3))``, as on jax arrays."""
    return reshape(a, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape, order)


def _transpose_method(a, *axes):
    """``x.transpose()``, ``x.transpose(1, 0)`` and ``x.transpose((1, 0))``, as on jax arrays."""
    if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))):
        axes = axes[0]
    return transpose(a, axes or None)


_HINTS = {
    "vdot": "sum(multiply(a, b))", "inner": "einsum", "outer": "einsum('i,j->ij', a, b)",
    "hstack": "concatenate", "vstack": "concatenate",
    "nanmax": "max", "nanmin": "min", "nansum": "sum with where(isnan(x), 0, x)", "nanmean": "mean",
    "average": "mean", "cumsum": "sum", "softmax": "jask.nn.softmax",
    "asarray": "jask.from_numpy", "array": "jask.from_numpy", "acos": "arccos", "acosh": "arccosh",
    "asin": "arcsin", "asinh": "arcsinh", "atan": "arctan", "atanh": "arctanh", "atan2": "arctan2", "pow": "power",
    "concat": "concatenate", "permute_dims": "transpose", "matrix_transpose": "swapaxes(x, -1, -2)",
    "around": "round", "isneginf": "isinf", "isposinf": "isinf", "count_nonzero": "sum(not_equal(x, 0))",
}
_PREFIXES = ("nan", "cum", "nancum", "cumulative_", "f", "nanarg")   # nanstd, cumprod, fmax: a variant of std...


def _nearest(name):
    """A supported function for an unsupported name: a listed hint, else the function it is a variant of
    (``nanstd`` -> ``std``, ``cumprod`` -> ``prod``), else a close spelling (not a mere shared syllable)."""
    if name in _HINTS:
        return _HINTS[name]
    supported = [n for n, v in globals().items() if callable(v) and not isinstance(v, type) and n[0] != "_"]
    variant_of = [n for n in supported if name.endswith(n) and name[:-len(n)] in _PREFIXES]
    if variant_of:
        return variant_of[0]
    close = difflib.get_close_matches(name, supported, n=1, cutoff=0.9)
    return close[0] if close else "jask.numpy.elementwise(fn) to lift an elementwise function"


def __getattr__(name):
    if not name.startswith("__") and hasattr(_jnp, name):
        raise NotImplementedError(f"jask.numpy.{name} is not supported yet; nearest supported: {_nearest(name)}")
    raise AttributeError(f"module 'jask.numpy' has no attribute {name!r}")
