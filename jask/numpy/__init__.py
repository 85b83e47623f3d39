"""``jask.numpy``: ``jax.numpy``'s names and signatures over DiskArrays, with gradients.

Elementwise functions broadcast and promote as jnp does (Python scalars weakly
typed); with no DiskArray operand they are jnp's own. Reductions give a JAX
scalar for a full reduction and a DiskArray otherwise. Any other ``jax.numpy``
name raises ``NotImplementedError`` naming the nearest supported function.
"""
import difflib

import jax.numpy as _jnp

from jask.linalg.dot import dot as _dot
from jask.linalg.transpose import transpose as _transpose
from jask.numpy import linalg
from jask.ops.elementwise import (  # noqa: F401, A004
    abs, absolute, add, arccos, arccosh, arcsin, arcsinh, arctan, arctan2, arctanh, astype, cbrt, ceil,
    clip, cos, cosh, divide, elementwise, equal, exp, exp2, expm1, float_power, floor, floor_divide, greater,
    greater_equal, hypot, isfinite, isinf, isnan, less, less_equal, log, log1p, log2, log10, logaddexp,
    logical_and, logical_not, logical_or, logical_xor, maximum, minimum, mod, multiply, negative, not_equal,
    positive, power, reciprocal, remainder, round, rsqrt, sigmoid, sign, sin, sinh, sqrt, square,
    stop_gradient, subtract, tan, tanh, true_divide, trunc, where,
)
from jask.ops.reductions import (  # noqa: F401, A004
    amax, amin, argmax, argmin, logsumexp, max, mean, min, prod, std, sum, var,
)

# dtypes and constants are jnp's own
from jax.numpy import (  # noqa: F401, E402
    bfloat16, bool_, dtype, e, finfo, float16, float32, float64, iinfo, inf, int8, int16, int32, int64,
    issubdtype, nan, newaxis, pi, result_type, uint8, uint32,
)


def matmul(a, b):
    """``a @ b`` with NumPy matmul semantics (batched, vectors)."""
    return _dot(a, b)


def dot(a, b):
    """``jnp.dot`` for 1-D and 2-D operands (equal to matmul there)."""
    if a.ndim > 2 or b.ndim > 2:
        raise NotImplementedError("jask.numpy.dot of arrays above 2-D is not supported; "
                                  "use jask.numpy.matmul (batched) instead")
    return _dot(a, b)


def transpose(a, axes=None):
    """Permute axes (reverse them by default)."""
    return _transpose(a, axes=axes)


_HINTS = {
    "reshape": "none yet for DiskArrays; for small arrays jask.from_numpy(np.asarray(x).reshape(...))",
    "einsum": "matmul and transpose", "tensordot": "matmul and transpose", "vdot": "sum(multiply(a, b))",
    "inner": "sum(multiply(a, b), axis=-1)", "outer": "multiply with broadcasting (a[:, None] as a (n, 1) array)",
    "concatenate": "to_zarr into one store", "stack": "to_zarr into one store",
    "nanmax": "max", "nanmin": "min", "nansum": "sum with where(isnan(x), 0, x)", "nanmean": "mean",
    "average": "mean", "cumsum": "sum", "softmax": "exp(x - logsumexp(x, axis, keepdims=True))",
    "asarray": "jask.from_numpy", "array": "jask.from_numpy",
    "zeros_like": "none yet; x * 0 for finite x", "ones_like": "none yet; x * 0 + 1 for finite x",
}


def _nearest(name):
    if name in _HINTS:
        return _HINTS[name]
    supported = [n for n, v in globals().items() if callable(v) and not n.startswith("_")]
    close = difflib.get_close_matches(name, supported, n=1, cutoff=0.5)
    return close[0] if close else "jask.numpy.elementwise(fn) to lift an elementwise function"


def __getattr__(name):
    if not name.startswith("__") and hasattr(_jnp, name):
        raise NotImplementedError(f"jask.numpy.{name} is not supported yet; nearest supported: {_nearest(name)}")
    raise AttributeError(f"module 'jask.numpy' has no attribute {name!r}")
