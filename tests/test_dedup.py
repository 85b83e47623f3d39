"""Equal op applications below a plan's roots are computed once (``jask/plan/dedup.py``): checked by the bytes
read, against the same computation with the merge switched off, and against jnp."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import zarr

import jask
import jask.numpy as knp
from jask import nn as jnn
from jask.plan import planner


@pytest.fixture
def stored(tmp_path):
    jask.config.update("tile", 32)
    jask.set_memory_budget(400_000)
    A = np.random.default_rng(0).standard_normal((128, 96)).astype(np.float32)
    path = str(tmp_path / "a.zarr")
    zarr.create_array(path, shape=A.shape, chunks=(32, 32), dtype="float32", compressors=None)[...] = A
    return A, jask.from_zarr(path)


def _read(fn, *args):
    with jask.profile() as prof:
        out = np.asarray(fn(*args))
    return out, prof.bytes_read


def _read_without_merging(monkeypatch, fn, *args):
    with monkeypatch.context() as m:
        m.setattr(planner, "merge_equal_nodes", lambda *a: 0)
        return _read(fn, *args)


def test_a_repeated_subexpression_is_computed_once(stored, monkeypatch):
    """The two means shared a pass already (a lockstep group); merged, one is computed, stored and read."""
    from jask.exec import driver
    A, a = stored
    f = lambda x: (x - knp.mean(x, axis=0)) * (x - knp.mean(x, axis=0))   # noqa: E731
    with monkeypatch.context() as m:
        m.setattr(planner, "merge_equal_nodes", lambda *args: 0)
        assert len(driver.make_plan([f(a)._node]).stages) == 3
    assert len(driver.make_plan([f(a)._node]).stages) == 2
    unmerged, reads_before = _read_without_merging(monkeypatch, f, a)
    got, reads = _read(f, a)
    np.testing.assert_allclose(got, (A - A.mean(axis=0)) ** 2, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got, unmerged)
    mean_bytes = A.shape[1] * 4
    assert reads_before - reads == mean_bytes, (reads_before, reads)    # the second mean, stored and read back


GRADIENTS = {   # jask loss and jnp loss of x and a weight v, and the shape of v (the result's) for x of shape s
    "softmax": (lambda x, v: knp.sum(jnn.softmax(x, axis=1) * v), lambda x, v: jnp.sum(jax.nn.softmax(x, axis=1) * v),
                lambda s: s),
    "logsumexp": (lambda x, v: knp.sum(jnn.logsumexp(x, axis=1, keepdims=True) * v),
                  lambda x, v: jnp.sum(jax.nn.logsumexp(x, axis=1, keepdims=True) * v), lambda s: s[:1] + (1,)),
    "max": (lambda x, v: knp.sum(knp.max(x, axis=0, keepdims=True) * v),
            lambda x, v: jnp.sum(jnp.max(x, axis=0, keepdims=True) * v), lambda s: (1,) + s[1:]),
}


@pytest.mark.parametrize("case", sorted(GRADIENTS))
def test_a_reduction_and_its_own_reference_are_computed_once_under_grad(stored, monkeypatch, case):
    """max, min and logsumexp keep a stop-gradient copy of themselves (with keepdims) for their gradient; the
    forward computed both."""
    A, a = stored
    f, f_jnp, result_shape = GRADIENTS[case]
    W = np.random.default_rng(1).standard_normal(result_shape(A.shape)).astype(np.float32)
    grad = jax.jit(jax.grad(f))
    unmerged, reads_before = _read_without_merging(monkeypatch, grad, a, jask.from_numpy(W))
    got, reads = _read(grad, a, jask.from_numpy(W))
    want = jax.grad(f_jnp)(jnp.asarray(A), W)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got, unmerged, rtol=1e-6, atol=1e-7)
    small = 4 * max(A.shape)       # a reduction's result, stored and read back once instead
    assert A.nbytes - small <= reads_before - reads <= A.nbytes, (reads_before, reads)     # one pass over A fewer


def test_roots_stay_and_inputs_kept_only_for_gradients_do_not_tell_nodes_apart(stored):
    """Two equal roots are both results; a reduction differing in an argument is not merged."""
    A, a = stored
    s1, s2, m = knp.sum(a, axis=1), knp.sum(a, axis=1), knp.max(a, axis=1)
    out1, out2, out3 = jask.persist(s1, s2, m)
    np.testing.assert_allclose(np.asarray(out1), A.sum(axis=1), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(out1), np.asarray(out2))
    np.testing.assert_array_equal(np.asarray(out3), A.max(axis=1))


REDUCTIONS = {"max": (knp.max, jnp.max, 3), "min": (knp.min, jnp.min, 3),   # result, count of maxima, gradient
              "logsumexp": (jnn.logsumexp, jax.nn.logsumexp, 2)}           # result, gradient


@pytest.mark.parametrize("case, axis, keepdims, mode", [
    ("max", 1, False, "eager"), ("max", None, True, "jit"), ("min", 0, False, "jit"),
    ("logsumexp", 1, False, "jit"), ("logsumexp", None, False, "eager"), ("logsumexp", 0, True, "eager")])
def test_a_gradient_through_a_reduction_reads_its_input_as_often_with_or_without_keepdims(stored, case, axis,
                                                                                          keepdims, mode):
    """Without keepdims the result was a second reduction beside its keepdims reference (one pass over x more);
    with keepdims the backward recomputed the result its residual named, though an equal node was stored.
    Now max and min read x three times (their maxima, the count of them, the gradient), logsumexp twice."""
    A, x = stored
    red, red_jnp, passes = REDUCTIONS[case]
    V = np.random.default_rng(2).standard_normal(np.shape(red_jnp(A, axis=axis, keepdims=keepdims)))
    V = V.astype(np.float32)
    v = jask.from_numpy(V) if V.ndim else V
    loss = lambda x: knp.sum(red(x, axis=axis, keepdims=keepdims) * v)           # noqa: E731
    grad = jax.grad(loss) if mode == "eager" else jax.jit(jax.grad(loss))
    got, reads = _read(grad, x)
    want = jax.grad(lambda x: jnp.sum(red_jnp(x, axis=axis, keepdims=keepdims) * V))(jnp.asarray(A))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    small = 16 * 4 * max(A.shape)      # results, counts and weights of a row or column, read back
    assert passes * A.nbytes <= reads <= passes * A.nbytes + small, (reads / A.nbytes, passes)
