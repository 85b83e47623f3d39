"""Empty arrays (a 0-size axis) as in jnp, and the gradient of materialize under jit."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jask
import jask.numpy as jkn


@pytest.fixture(autouse=True)
def small_tiles():
    jask.config.update("tile", 4)


@pytest.mark.parametrize("shape, dtype", [((0, 5), np.float32), ((3, 0), np.int32), ((0,), np.bool_)])
def test_round_trip_stores_nothing(shape, dtype):
    a = np.zeros(shape, dtype)
    with jask.profile() as p:
        x = jask.from_numpy(a)
        back = np.asarray(x)
    assert x.shape == shape and x.dtype == dtype and back.shape == shape and back.dtype == dtype
    assert p.bytes_written == 0 and p.bytes_read == 0
    assert jask.materialize(x).shape == shape


@pytest.mark.parametrize("jit", [False, True])
def test_elementwise_and_reductions_match_jnp(jit):
    A, row = np.zeros((0, 5), np.float32), np.arange(5, dtype=np.float32)
    wrap = jax.jit if jit else (lambda f: f)
    x, r = jask.from_numpy(A), jask.from_numpy(row)
    got = wrap(lambda x, r: x * r + 1.0)(x, r)
    assert isinstance(got, jask.DiskArray)
    np.testing.assert_array_equal(np.asarray(got), A * row + 1.0)
    assert float(wrap(jkn.sum)(x)) == float(jnp.sum(A)) == 0.0
    np.testing.assert_array_equal(np.asarray(wrap(lambda x: jkn.sum(x, axis=0))(x)), jnp.sum(A, axis=0))
    assert np.asarray(wrap(lambda x: jkn.sum(x, axis=1))(x)).shape == (0,)
    np.testing.assert_array_equal(np.asarray(wrap(lambda x: jkn.prod(x, axis=0))(x)), jnp.prod(A, axis=0))
    assert float(wrap(jkn.prod)(x)) == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert np.isnan(float(wrap(jkn.mean)(x))) and np.isnan(float(jnp.mean(A)))


@pytest.mark.parametrize("name", ["max", "min", "argmax"])
def test_reductions_without_identity_raise_like_jnp(name):
    A = np.zeros((0, 5), np.float32)
    with pytest.raises(ValueError):
        getattr(jnp, name)(A)
    with pytest.raises(ValueError, match="empty array"):
        getattr(jkn, name)(jask.from_numpy(A))


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("name", ["max", "min", "argmax", "argmin"])
def test_extrema_over_a_non_empty_axis_of_an_empty_array(name, jit):
    """Shape (0, 4) reduced over axis 1 has an empty result, as in jnp; over axis 0 (or all) it raises."""
    A = np.zeros((0, 4), np.float32)
    wrap = jax.jit if jit else (lambda f: f)
    for axis, keepdims in ((1, False), (1, True), (-1, False)):
        want = getattr(jnp, name)(A, axis=axis, keepdims=keepdims)
        got = wrap(lambda x: getattr(jkn, name)(x, axis=axis, keepdims=keepdims))(jask.from_numpy(A))
        assert isinstance(got, jask.DiskArray) and got.shape == want.shape and got.dtype == want.dtype
        assert np.asarray(got).shape == want.shape
    for axis in (0, None):
        with pytest.raises(ValueError, match="empty"):
            getattr(jkn, name)(jask.from_numpy(A), axis=axis)


def test_contraction_over_an_empty_axis_slices_and_concatenate():
    A, B = np.ones((3, 0), np.float32), np.ones((0, 2), np.float32)
    np.testing.assert_array_equal(np.asarray(jask.from_numpy(A) @ jask.from_numpy(B)), A @ B)
    C = np.arange(20, dtype=np.float32).reshape(4, 5)
    c = jask.from_numpy(C)
    np.testing.assert_array_equal(np.asarray(c[2:2]), C[2:2])
    np.testing.assert_array_equal(np.asarray(c[:, 5:]), C[:, 5:])
    joined = jkn.concatenate([jask.from_numpy(np.zeros((0, 5), np.float32)), c, c[1:1]])
    np.testing.assert_array_equal(np.asarray(joined), C)


def test_gradients_of_empty_arrays():
    x = jask.from_numpy(np.zeros((0, 5), np.float32))
    for f in (jax.grad, lambda f: jax.jit(jax.grad(f))):
        g = f(lambda x: jkn.sum(x * x))(x)
        assert isinstance(g, jask.DiskArray) and np.asarray(g).shape == (0, 5)


@pytest.mark.parametrize("jit", [False, True])
def test_grad_through_materialize(jit):
    X = np.random.default_rng(0).standard_normal((6, 5)).astype(np.float32)

    def loss(x, materialize):
        return jnp.sum(jnp.sin(materialize(x * 2.0)) ** 2)

    fn = jax.value_and_grad(loss)
    fn = jax.jit(fn, static_argnums=1) if jit else fn
    value, g = fn(jask.from_numpy(X), jask.materialize)
    ref_value, ref_g = jax.value_and_grad(loss)(jnp.asarray(X), lambda v: v)
    assert isinstance(g, jask.DiskArray)
    np.testing.assert_allclose(float(value), float(ref_value), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(g), ref_g, rtol=1e-5, atol=1e-6)


def test_an_identity_other_than_zero_is_refused_for_an_array_result():
    from jask.base.base_algo import make_op
    from jask.ops.reductions import Sum

    class SumFromOne(Sum):
        empty_value = 1
    f = make_op(SumFromOne)
    x = jask.from_numpy(np.zeros((0, 5), np.float32))
    assert float(f(x)) == 1.0
    with pytest.raises(NotImplementedError, match="empty_value=1"):
        f(x, axis=0)


def test_reshape_of_an_empty_array_matches_jnp(small_tiles):
    for src, dst in [((0, 12), (12, 0)), ((3, 0), (0, 5, 2)), ((0, 4), (-1,))]:
        e = jnp.zeros(src, jnp.float32)
        got = jask.from_numpy(np.asarray(e)).reshape(dst)
        want = e.reshape(dst)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), want)
