"""jask.hijax.compat on the running JAX: the names it exports exist and behave.

compat is the one module that touches hijax and private JAX APIs; jask is
tested on jax 0.10.2, 0.11.2 and 0.12.0.1. Each test here checks one piece of
the adapter directly (a tiny primitive of our own), and the jask behaviour it
exists for, so a new JAX that breaks the adapter fails here first, by name.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import hijax

import jask
from jask.hijax import compat

F32 = compat.ShapedArray((), np.float32)


class _Scale(compat.HiPrimitive):
    """``x * y * k`` on float32 scalars: the smallest primitive with expand, vjp_fwd and an accumulator vjp_bwd."""

    def __init__(self, k, log):
        self.in_avals = (F32, F32)
        self.out_aval = F32
        self.params = dict(k=k)
        self.log = log          # not a param: kept out of equality and hash
        super().__init__()

    def expand(self, x, y):
        return x * y * self.k

    def vjp_fwd(self, nzs_in, x, y):
        return self(x, y), (x, y)

    def vjp_bwd(self, res, g, x_acc, y_acc):
        x, y = res
        self.log.append((compat.wants_grad(x_acc), compat.wants_grad(y_acc)))
        if compat.is_zero_cotangent(g):
            return
        if compat.wants_grad(x_acc):
            x_acc.accum(g * y * self.k)
        if compat.wants_grad(y_acc):
            y_acc.accum(g * x * self.k)


def test_exports_are_this_jax_s_hijax_objects():
    assert compat.JAX_VERSION == tuple(int(p) for p in jax.__version__.split(".")[:3])
    base = getattr(hijax, "HiPrim", None) or hijax.VJPHiPrimitive   # 0.11+ / 0.10.2 name
    assert issubclass(compat.HiPrimitive, base)
    assert compat.HiType is hijax.HiType and compat.register_hitype is hijax.register_hitype
    assert compat.Zero is hijax.Zero and compat.ShapedArray is hijax.ShapedArray
    assert compat.aval_property is hijax.aval_property and compat.aval_method is hijax.aval_method
    assert issubclass(compat.NullAccum, compat.GradAccum)
    assert isinstance(jask.from_numpy(np.ones((2, 2), np.float32)).aval, compat.HiType)


def test_own_primitive_eager_jit_grad_and_accumulator_slots():
    log = []
    f = lambda x, y: _Scale(3.0, log)(x, y)
    x, y = jnp.float32(2.0), jnp.float32(5.0)
    assert float(f(x, y)) == 30.0
    assert float(jax.jit(f)(x, y)) == 30.0
    assert float(jax.grad(f)(x, y)) == 15.0                 # d/dx = 3y
    assert log[-1] == (True, False)                         # y's slot is a NullAccum: no gradient wanted
    dx, dy = jax.jit(jax.grad(f, argnums=(0, 1)))(x, y)
    assert (float(dx), float(dy)) == (15.0, 6.0)
    assert log[-1] == (True, True)


def test_zero_cotangent_and_null_accumulator_predicates():
    assert compat.is_zero_cotangent(compat.Zero(F32))
    assert not compat.is_zero_cotangent(jnp.float32(0.0))
    assert not compat.wants_grad(compat.NullAccum(F32))


def test_jask_ops_round_trip_through_jit_and_grad_with_a_traced_scalar():
    A = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = jask.from_numpy(A)
    loss = lambda a, s: jask.sum(jask.square(s * a))        # s * a: compat.defer_reflected_operator
    assert float(jax.jit(loss)(a, jnp.float32(2.0))) == float(np.sum(np.square(2 * A)))
    da, ds = jax.jit(jax.grad(loss, argnums=(0, 1)))(a, jnp.float32(2.0))
    np.testing.assert_allclose(np.asarray(da), 2 * 4 * A, rtol=1e-6)      # d/da sum((sa)^2) = 2 s^2 a
    np.testing.assert_allclose(float(ds), 2 * 2.0 * np.sum(A * A), rtol=1e-6)


def test_op_without_tangents_inside_grad_is_bound_plainly():
    """``HiPrimitive.skip_linearization_on_zero_tangents``: without it jax 0.11+ calls the inner
    gradient's backward primitive's ``vjp_fwd`` here, which refuses second-order gradients."""
    a = jask.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))

    def outer(s):
        g = jax.grad(lambda a: jask.sum(jask.square(a)))(a)   # does not depend on s
        return s * jask.sum(g)

    assert float(jax.grad(outer)(jnp.float32(2.0))) == 2.0 * 66.0


def test_unused_op_under_jit_runs_exactly_when_compat_says():
    a = jask.from_numpy(np.ones((8, 8), np.float32))

    @jax.jit
    def f(a, x):
        jask.sum(a)                     # result unused
        return x + 1

    with jask.profile() as p:
        jax.block_until_ready(f(a, jnp.float32(1.0)))
        jax.effects_barrier()
    assert p.bytes_read == (0 if compat.UNUSED_OPS_SKIPPED_UNDER_JIT else a.nbytes)


def test_unused_arguments_finds_arguments_never_read():
    specs = [jax.ShapeDtypeStruct((4, 4), np.float32)] * 3
    assert compat.unused_arguments(lambda x, y, z: x * 2 + z.shape[0], specs) == frozenset({1, 2})
    assert compat.unused_arguments(lambda x, y, z: x + y + z, specs) == frozenset()

    def untraceable(x, y, z):
        raise RuntimeError("cannot trace")
    assert compat.unused_arguments(untraceable, specs) == frozenset()   # assumed to read everything


def test_traced_predicate():
    seen = []
    jax.jit(lambda x: seen.append(compat.is_traced(x)) or x)(jnp.float32(1.0))
    assert seen == [True] and not compat.is_traced(jnp.float32(1.0))


@pytest.mark.parametrize("transform", [jax.vmap, jax.jacfwd])
def test_unsupported_transforms_still_refused(transform):
    a = jask.from_numpy(np.ones((2, 4, 4), np.float32))
    with pytest.raises(NotImplementedError):
        transform(lambda a: jask.sum(a))(a)
