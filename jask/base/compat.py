"""The one place jask touches ``jax.experimental.hijax`` and other private JAX APIs.

hijax is experimental and its surface moves between releases (0.10.2 in CI,
0.11.x on accelerator machines). Every other module imports these names from
here, so a version difference is fixed in one file.
"""
from __future__ import annotations

import jax
from jax.experimental import hijax as _hijax

HiType = _hijax.HiType
VJPHiPrimitive = _hijax.VJPHiPrimitive
register_hitype = _hijax.register_hitype
ShapedArray = jax.core.ShapedArray
aval_property = _hijax.aval_property
aval_method = _hijax.aval_method
Tracer = jax.core.Tracer

try:  # symbolic-zero cotangents and gradient accumulators
    from jax._src.ad_util import Zero
    from jax._src.interpreters.ad import GradAccum, NullAccum
except ImportError:  # pragma: no cover - layout change in a future jax
    Zero = _hijax.Zero
    GradAccum = NullAccum = None


def is_traced(x) -> bool:
    """True when ``x`` is a tracer (inside ``jit``/``grad``), not a concrete value."""
    return isinstance(x, Tracer)


def wants_grad(accum) -> bool:
    """True when a VJP accumulator slot asks for a gradient (not a NullAccum)."""
    if NullAccum is not None and isinstance(accum, NullAccum):
        return False
    return GradAccum is None or isinstance(accum, GradAccum)


def is_zero_cotangent(ct) -> bool:
    """True for JAX's symbolic zero cotangent."""
    return isinstance(ct, Zero)
