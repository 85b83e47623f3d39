"""jax.lax loops and conditionals under jit with DiskArray carries, equal to the same code on jnp arrays."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jask


@pytest.fixture
def data():
    jask.config.update("tile", 4)
    rng = np.random.default_rng(0)
    X, Y = rng.standard_normal((10, 6)).astype(np.float32), rng.standard_normal((10, 1)).astype(np.float32)
    return X, Y


def _sgd(X, Y, w, n, sum_fn):
    loss = lambda w: sum_fn((X @ w - Y) ** 2)   # noqa: E731
    return jax.lax.fori_loop(0, n, lambda i, w: w - 0.01 * jax.grad(loss)(w), w)


@pytest.mark.parametrize("static_n", [True, False])
def test_fori_loop_sgd_with_a_disk_array_carry(data, static_n):
    X, Y = data
    w0 = np.zeros((6, 1), np.float32)
    x, y = jask.from_numpy(X), jask.from_numpy(Y)
    step = jax.jit(_sgd, static_argnums=(3, 4) if static_n else (4,))
    got = step(x, y, jask.from_numpy(w0), 5, jask.numpy.sum)
    assert isinstance(got, jask.DiskArray)
    np.testing.assert_allclose(np.asarray(got), _sgd(X, Y, w0, 5, jnp.sum), rtol=1e-5, atol=1e-6)


def test_scan_with_a_tuple_carry_and_in_memory_xs(data):
    X, _ = data

    def f(x, total_fn):
        body = lambda c, t: ((c[0] * 0.5 + t, c[1] + total_fn(c[0])), t * 2)   # noqa: E731
        return jax.lax.scan(body, (x, jnp.float32(0)), jnp.arange(3.0))

    (c, total), ys = jax.jit(f, static_argnums=1)(jask.from_numpy(X), jask.numpy.sum)
    (c_ref, total_ref), ys_ref = f(X, jnp.sum)
    np.testing.assert_allclose(np.asarray(c), c_ref, rtol=1e-6)
    np.testing.assert_allclose(float(total), float(total_ref), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(ys), ys_ref)


def test_while_loop_and_cond(data):
    X, _ = data

    def halve_until_small(x, sum_fn):
        return jax.lax.while_loop(lambda c: sum_fn(c * c) > 1.0, lambda c: c * 0.5, x)

    def branch(x, p, sum_fn):
        return jax.lax.cond(sum_fn(x) > p, lambda c: c * 2.0, lambda c: c - 1.0, x)

    x = jask.from_numpy(X)
    got = jax.jit(halve_until_small, static_argnums=1)(x, jask.numpy.sum)
    np.testing.assert_allclose(np.asarray(got), halve_until_small(X, jnp.sum), rtol=1e-6)
    for p in (-100.0, 100.0):
        got = jax.jit(branch, static_argnums=2)(x, p, jask.numpy.sum)
        np.testing.assert_allclose(np.asarray(got), branch(X, p, jnp.sum), rtol=1e-6)


def test_grad_through_a_loop_and_scanning_over_a_disk_array_are_refused_with_the_alternative(data):
    x = jask.from_numpy(data[0])
    loss = lambda x: jask.numpy.sum(jax.lax.fori_loop(0, 3, lambda i, c: c * x, x))   # noqa: E731
    with pytest.raises(NotImplementedError, match="jax.grad through a scan.*gradient inside the loop body"):
        jax.jit(jax.grad(loss))(x)
    with pytest.raises(NotImplementedError, match="scanned over as xs.*jask.batches"):
        jax.jit(lambda x: jax.lax.scan(lambda c, r: (c + r, None), jnp.zeros(6), x, length=10))(x)
