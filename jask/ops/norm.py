"""``jnp.linalg.norm`` over DiskArrays: vector and Frobenius norms, each a reduction of an elementwise map."""
from __future__ import annotations

import jax.numpy as jnp

from jask.hijax.array import type_of
from jask.ops import elementwise as ew
from jask.ops.axes import normalize_axis
from jask.ops.reductions import _check, max, min, sum  # noqa: A004


def norm(x, ord=None, axis=None, keepdims=False):  # noqa: A002 - jnp's name
    """``jnp.linalg.norm`` for Frobenius / 2-norms (and vector ``ord`` 1, inf, -inf, 0, p) over ``axis``."""
    _check("norm", x)
    ndim = type_of(x).ndim
    axes = normalize_axis(axis, ndim, "norm")
    if ord is None or (ord == "fro" and len(axes) == 2) or (ord == 2 and len(axes) == 1):
        return ew.sqrt(sum(ew.square(x), axis=axes, keepdims=keepdims))   # ew.sqrt passes JAX scalars to jnp
    if len(axes) != 1:
        raise NotImplementedError(f"jask norm: ord={ord!r} over axes {axes} (a matrix norm other than 'fro') "
                                  "is not supported; use ord=None or 'fro', or a vector norm over one axis")
    if ord == jnp.inf:
        return max(ew.abs(x), axis=axes, keepdims=keepdims)
    if ord == -jnp.inf:
        return min(ew.abs(x), axis=axes, keepdims=keepdims)
    if ord == 0:
        return sum(ew.astype(ew.not_equal(x, 0), type_of(x).dtype), axis=axes, keepdims=keepdims)
    if ord == 1:
        return sum(ew.abs(x), axis=axes, keepdims=keepdims)
    return ew.power(sum(ew.power(ew.abs(x), ord), axis=axes, keepdims=keepdims), 1.0 / ord)
