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


def defer_reflected_operator(aval_type, name: str) -> None:
    """Make ``s <op> x`` reach ``aval_type._r<op>`` when ``s`` is a traced JAX value and ``x`` a traced hi-value.

    A tracer forwards ``s * x`` to ``s.aval._mul(s, x)``. JAX's ShapedArray
    method returns NotImplemented for an operand it does not know, and Python
    then never tries ``x.__rmul__``: both operands are tracers of one class.
    So ``traced_scalar * disk_array`` failed under ``jit`` and ``grad`` while
    ``disk_array * traced_scalar`` worked. The wrapper hands such operands to
    the hi-type's reflected method and leaves every other case to JAX.
    """
    original = getattr(ShapedArray, f"_{name}", None)
    reflected = getattr(aval_type, f"_r{name}", None)
    if original is None or reflected is None:  # another JAX layout: keep its behaviour
        return

    def method(x, y):
        if isinstance(y, Tracer) and isinstance(y.aval, aval_type):
            return reflected(y, x)
        return original(x, y)

    setattr(ShapedArray, f"_{name}", staticmethod(method))


def unused_arguments(fn, arg_specs) -> frozenset[int]:
    """Positions of arguments whose values ``fn`` never reads (shapes may still be used).

    Traced abstractly (no data) and pruned with JAX's dead-code elimination; a
    function that cannot be traced this way is assumed to read everything.
    """
    try:
        from jax._src.interpreters import partial_eval as pe
        closed = jax.make_jaxpr(fn)(*arg_specs)
        _, used = pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
    except Exception:  # untraceable backward_block, or a moved private API
        return frozenset()
    return frozenset(i for i, u in enumerate(used) if not u)
