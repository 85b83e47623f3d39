"""The one place jask touches ``jax.experimental.hijax`` and other private JAX APIs.

hijax is experimental and its surface moves between releases. jask is tested
on jax 0.10.2 (CI, Python 3.11), 0.11.2 and 0.12.0.1. Every other module
imports these names from here, so a version difference is fixed in one file;
each difference below has its own section naming the versions it concerns.
"""
from __future__ import annotations

import os
import sys

import jax
import jax.extend.core as _extend_core
from jax.experimental import hijax as _hijax

JAX_VERSION = tuple(int(p) for p in jax.__version__.split(".")[:3] if p.isdigit())

# Names unchanged in 0.10.2, 0.11.x and 0.12.x.
HiType = _hijax.HiType
register_hitype = _hijax.register_hitype
ShapedArray = jax.core.ShapedArray
aval_property = _hijax.aval_property
aval_method = _hijax.aval_method
Tracer = jax.core.Tracer
Zero = _hijax.Zero  # symbolic-zero cotangent
# jax 0.10.2: scan and cond compare their carries' manual-axis types (``aval.mat``, shard_map's
# varying axes) while type-checking; a hi-type carry needs one, and a DiskArray varies along none.
from jax._src.core import empty_mat as NO_MANUAL_AXES  # noqa: E402
Literal = _extend_core.Literal  # a constant operand in a jaxpr (jask.ops.interpret evaluates jaxprs)


# --- Hi-primitive base class -------------------------------------------------
# jax 0.10.2: ``hijax.VJPHiPrimitive``. jax 0.11.x, 0.12.x: renamed ``hijax.HiPrim``
# (same contract for what jask uses: in_avals/out_aval/params set before
# ``super().__init__()``, ``expand``, ``vjp_fwd``, ``vjp_bwd`` or
# ``vjp_bwd_retval``, ``batch``). 0.12 also drops the default ``batch`` (it
# raises), changes the ``dce``/``remat`` hooks' signatures and prints
# ``params`` in jaxprs; jask overrides none of those hooks.
_HiPrimBase = getattr(_hijax, "HiPrim", None) or getattr(_hijax, "VJPHiPrimitive")


class HiPrimitive(_HiPrimBase):
    """Base of every jask hi-primitive, whichever name this JAX gives the hijax class.

    ``skip_linearization_on_zero_tangents``: jax 0.11.x and 0.12.x call a
    hi-primitive's ``vjp_fwd`` under ``grad`` even when none of its inputs
    carries a tangent; 0.10.2 binds the primitive plainly then, and so does
    0.11+ with this flag (0.10.2 ignores it). Without it, an inner
    ``jax.grad`` of a jask loss inside an outer ``jax.grad`` that does not
    differentiate it fails: the inner gradient's backward primitive is
    linearized by the outer grad and its ``vjp_fwd`` refuses second-order
    gradients (tests/test_compat.py).
    """

    skip_linearization_on_zero_tangents = True


# --- Gradient accumulators given to vjp_bwd ----------------------------------
# jax 0.10.2: only in ``jax._src.interpreters.ad``. jax 0.11.x, 0.12.x: exported by hijax.
if hasattr(_hijax, "GradAccum"):
    GradAccum, NullAccum = _hijax.GradAccum, _hijax.NullAccum
else:
    from jax._src.interpreters.ad import GradAccum, NullAccum


# --- Unused op results under jit ---------------------------------------------
# jax 0.12.x: lowering a jitted function first dead-code-eliminates its high-level
# jaxpr (``partial_eval.lower_jaxpr`` calls ``dce_jaxpr`` before expanding
# hi-primitives), so a jask op whose result is unused never runs: under
# ``jit(grad(loss))`` the loss value itself is not computed.
# jax 0.10.2, 0.11.x: hi-primitives are expanded first, into ordered io_callbacks
# that are never eliminated, so every op traced under jit runs.
# jask's primitives declare no effects: skipping an unused one is correct, it
# only changes how many bytes a step reads (tests count them).
UNUSED_OPS_SKIPPED_UNDER_JIT = JAX_VERSION >= (0, 12)


def jaxpr_and_consts(closed):
    """``(jaxpr, consts)`` of what ``jax.make_jaxpr`` returns, or of a sub-jaxpr in an equation's params.

    jax 0.10.2, 0.11.x: a ``ClosedJaxpr`` wraps a ``Jaxpr`` (``.jaxpr``) and holds the constants'
    values (``.consts``); an open ``Jaxpr`` has neither. jax 0.12: ``ClosedJaxpr`` is gone, a
    ``Jaxpr`` holds its constants' values itself and ``.jaxpr`` returns the same object.
    """
    return getattr(closed, "jaxpr", closed), tuple(getattr(closed, "consts", ()))


def bind_equation(eqn, *args):
    """Apply a jaxpr equation's primitive to ``args`` as ``jax.core.eval_jaxpr`` does.

    jax 0.10.2: ``get_bind_params`` returns the parameters; older JAX returned
    ``(subfuns, params)``, so both forms are accepted.
    """
    got = eqn.primitive.get_bind_params(eqn.params)
    subfuns, params = got if isinstance(got, tuple) else ((), got)
    return eqn.primitive.bind(*subfuns, *args, **params)


def is_traced(x) -> bool:
    """True when ``x`` is a tracer (inside ``jit``/``grad``), not a concrete value."""
    return isinstance(x, Tracer)


def tracing() -> bool:
    """Whether this thread is tracing (inside ``jit``), where JAX calls are staged, not run (all three
    versions: ``jax._src.core.trace_state_clean``; the trace context is per thread)."""
    from jax._src import core
    return not core.trace_state_clean()


def wants_grad(accum) -> bool:
    """True when a VJP accumulator slot asks for a gradient (a GradAccum, not a NullAccum)."""
    return isinstance(accum, GradAccum) and not isinstance(accum, NullAccum)


def is_zero_cotangent(ct) -> bool:
    """True for JAX's symbolic zero cotangent."""
    return isinstance(ct, Zero)


def defer_reflected_operator(aval_type, name: str, reflected_name: str | None = None) -> None:
    """Make ``s <op> x`` reach ``aval_type._r<op>`` when ``s`` is a traced JAX value and ``x`` a traced hi-value.

    A tracer forwards ``s * x`` to ``s.aval._mul(s, x)``. JAX's ShapedArray
    method returns NotImplemented for an operand it does not know, and Python
    then never tries ``x.__rmul__``: both operands are tracers of one class.
    So ``traced_scalar * disk_array`` failed under ``jit`` and ``grad`` while
    ``disk_array * traced_scalar`` worked. The wrapper hands such operands to
    the hi-type's reflected method and leaves every other case to JAX.
    """
    original = getattr(ShapedArray, f"_{name}", None)
    reflected = getattr(aval_type, reflected_name or f"_r{name}", None)
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


# --- Who called: JAX's own code, and which jax.numpy function ------------------
# Only for error messages: ``jnp.asarray(disk_array)`` or ``jnp.zeros_like(disk_array)``
# would otherwise read a DiskArray whole or build its shape in memory, silently.
_JAX_DIR = os.path.dirname(jax.__file__) + os.sep


def jax_caller(depth: int = 2) -> str | None:
    """The name of the function ``depth`` frames up (2: our caller's caller) if it is JAX's own code, else None."""
    code = sys._getframe(depth).f_code
    return code.co_name if code.co_filename.startswith(_JAX_DIR) else None


def called_by_jax(names, frames: int = 4) -> bool:
    """True when a JAX function named in ``names`` is among the next ``frames`` callers up the stack."""
    frame = sys._getframe(2)
    for _ in range(frames):
        if frame is None:
            return False
        if frame.f_code.co_name in names and frame.f_code.co_filename.startswith(_JAX_DIR):
            return True
        frame = frame.f_back
    return False


def jnp_function_name(default: str = "function") -> str:
    """The ``jax.numpy`` function running on the stack: its ``fun_name`` argument, else the outermost one."""
    frame, outermost = sys._getframe(1), None
    numpy_dir = _JAX_DIR + os.path.join("_src", "numpy") + os.sep
    while frame is not None:
        if frame.f_code.co_filename.startswith(_JAX_DIR):
            name = frame.f_locals.get("fun_name")
            if isinstance(name, str):
                return name
            if frame.f_code.co_filename.startswith(numpy_dir) and not frame.f_code.co_name.startswith("_"):
                outermost = frame.f_code.co_name
        frame = frame.f_back
    return outermost or default
