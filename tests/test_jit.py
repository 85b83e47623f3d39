"""jask under jax.jit: zero materialization, one compile per type, correct and unmixed results."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jask

RTOL = ATOL = 1e-4

_STABLEHLO_TENSOR = re.compile(r"tensor<((?:[0-9?]+x)*)([a-z][a-z0-9]*)>")
_HLO_TENSOR = re.compile(r"\b(?:pred|bf16|[fsu][0-9]+|c64|c128)\[([0-9,]*)\]")


def tensor_shapes(text):
    """Every tensor shape named in StableHLO (``tensor<37x29xf32>``) or HLO (``f32[37,29]``) text."""
    shapes = set()
    for dims, _ in _STABLEHLO_TENSOR.findall(text):
        shapes.add(tuple(int(d) for d in dims.split("x") if d))
    for dims in _HLO_TENSOR.findall(text):
        shapes.add(tuple(int(d) for d in dims.split(",") if d))
    return shapes


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _loss(a, b, t):
    return jask.sum(jask.square(a @ b - t))


def _ref_loss(a, b, t):
    return jnp.sum(jnp.square(a @ b - t))


@pytest.fixture
def problem():
    jask.config.update("tile", 8)
    A, B, T = _rand((37, 29), 1), _rand((29, 23), 2), _rand((37, 23), 3)
    return (A, B, T), tuple(jask.from_numpy(x) for x in (A, B, T))


def _full_shapes(*arrays):
    shapes = set()
    for x in arrays:
        shapes.add(tuple(x.shape))
        shapes.add(tuple(reversed(x.shape)))
    return shapes


def test_shape_parser_sees_materialized_arrays():
    """Positive control: the same loss in plain jnp does show its full shapes, so the checks below can fail."""
    A, B, T = _rand((37, 29), 1), _rand((29, 23), 2), _rand((37, 23), 3)
    lowered = jax.jit(_ref_loss).lower(A, B, T)
    for text in (lowered.as_text(), lowered.compile().as_text()):
        found = tensor_shapes(text)
        assert {(37, 29), (29, 23), (37, 23)} <= found


@pytest.mark.parametrize("kind", ["loss", "grad"])
def test_zero_materialization(problem, kind):
    (A, B, T), (a, b, t) = problem
    fn = _loss if kind == "loss" else jax.grad(_loss, argnums=(0, 1))
    # As the README says for accelerators: AOT lowering places the program where the handles live.
    with jax.default_device(jax.devices("cpu")[0]):
        lowered = jax.jit(fn).lower(a, b, t)
    compiled = lowered.compile()
    forbidden = _full_shapes(A, B, T)
    for text in (lowered.as_text(), compiled.as_text()):
        # host callbacks: a custom call on CPU and GPU, host send/recv pairs on a TPU
        assert "callback" in text or "host_transfer" in text, "expected host callbacks in the program"
        found = tensor_shapes(text)
        assert found, "the shape parser found no tensors at all"
        assert not (found & forbidden), f"full-array tensors in the compiled program: {found & forbidden}"
        # nothing bigger than a scalar crosses the program at all
        assert all(len(s) <= 1 for s in found), sorted(found)
    # and the compiled program computes the right thing
    out = compiled(a, b, t)
    if kind == "loss":
        np.testing.assert_allclose(float(out), float(_ref_loss(A, B, T)), rtol=RTOL)
    else:
        want = jax.grad(_ref_loss, argnums=(0, 1))(A, B, T)
        for g, w in zip(out, want):
            assert isinstance(g, jask.DiskArray) and g.shape == w.shape
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=RTOL, atol=1e-3)


def test_compiles_once_per_shape_and_dtype(small_tiles):
    traces = []

    @jax.jit
    def f(x, y):
        traces.append(1)
        return jask.sum(jask.mul(x, y))

    X1, Y1, X2, Y2 = (_rand((5, 7), s) for s in range(4))
    r1 = f(jask.from_numpy(X1), jask.from_numpy(Y1))
    r2 = f(jask.from_numpy(X2), jask.from_numpy(Y2))
    assert len(traces) == 1
    np.testing.assert_allclose(float(r1), float(np.sum(X1 * Y1)), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(float(r2), float(np.sum(X2 * Y2)), rtol=RTOL, atol=ATOL)
    # a different shape is a different type: one more trace
    X3 = _rand((6, 7), 9)
    r3 = f(jask.from_numpy(X3), jask.from_numpy(X3))
    assert len(traces) == 2
    np.testing.assert_allclose(float(r3), float(np.sum(X3 * X3)), rtol=RTOL, atol=ATOL)


def test_jitted_function_returns_diskarray(small_tiles):
    A, B = _rand((5, 7), 1), _rand((7, 6), 2)

    @jax.jit
    def f(a, b):
        return jask.square(a @ b) * 0.5 - (a @ b)

    out = f(jask.from_numpy(A), jask.from_numpy(B))
    assert isinstance(out, jask.DiskArray)
    assert out.shape == (5, 6) and out.dtype == np.float32
    np.testing.assert_allclose(np.asarray(out), 0.5 * (A @ B) ** 2 - A @ B, rtol=RTOL, atol=ATOL)


def test_jitted_function_returns_several_arrays_and_scalars(small_tiles):
    A, B = _rand((5, 7), 1), _rand((5, 7), 2)

    @jax.jit
    def f(a, b):
        d = a - b
        return d, jask.sum(jask.square(d)), d.T

    d, s, dt = f(jask.from_numpy(A), jask.from_numpy(B))
    np.testing.assert_allclose(np.asarray(d), A - B, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(np.asarray(dt), (A - B).T, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(float(s), np.sum((A - B) ** 2), rtol=RTOL, atol=ATOL)


def test_mixed_jask_and_jnp_loss(small_tiles):
    A, B = _rand((5, 7), 1), _rand((5, 7), 2)
    Wv = _rand((3,), 3)

    def loss(a, b, w):
        return jask.sum(jask.square(a - b)) * jnp.sum(w) + jnp.sum(w ** 2)

    def ref(a, b, w):
        return jnp.sum(jnp.square(a - b)) * jnp.sum(w) + jnp.sum(w ** 2)

    a, b = jask.from_numpy(A), jask.from_numpy(B)
    val, (ga, gw) = jax.jit(jax.value_and_grad(loss, argnums=(0, 2)))(a, b, jnp.asarray(Wv))
    want_val, (wa, ww) = jax.value_and_grad(ref, argnums=(0, 2))(A, B, Wv)
    np.testing.assert_allclose(float(val), float(want_val), rtol=RTOL, atol=ATOL)
    assert isinstance(ga, jask.DiskArray)
    np.testing.assert_allclose(np.asarray(ga), np.asarray(wa), rtol=RTOL, atol=ATOL)
    assert isinstance(gw, jax.Array) and gw.shape == (3,)
    np.testing.assert_allclose(np.asarray(gw), np.asarray(ww), rtol=RTOL, atol=ATOL)


def test_mixed_loss_jnp_scalar_flows_into_jask(small_tiles):
    """A jnp value computed in the traced program scales a DiskArray (a traced scalar operand of ScalarMul)."""
    A = _rand((5, 7), 4)
    Wv = _rand((3,), 5)

    def loss(a, w):
        return jask.sum(jask.square(a * jnp.sum(w ** 2)))

    def ref(a, w):
        return jnp.sum(jnp.square(a * jnp.sum(w ** 2)))

    ga, gw = jax.jit(jax.grad(loss, argnums=(0, 1)))(jask.from_numpy(A), jnp.asarray(Wv))
    wa, ww = jax.grad(ref, argnums=(0, 1))(A, Wv)
    np.testing.assert_allclose(np.asarray(ga), np.asarray(wa), rtol=RTOL, atol=1e-3)
    np.testing.assert_allclose(np.asarray(gw), np.asarray(ww), rtol=RTOL, atol=1e-3)


def test_different_arrays_do_not_mix_up(small_tiles):
    f = jax.jit(lambda a, b: a @ b - a @ b * 2.0)
    data = [(_rand((5, 7), 10 + i), _rand((7, 6), 20 + i)) for i in range(3)]
    arrays = [(jask.from_numpy(A), jask.from_numpy(B)) for A, B in data]
    # keep every lazy result alive and only read them at the end, in reverse order
    outs = [f(a, b) for a, b in arrays]
    outs_again = [f(a, b) for a, b in reversed(arrays)][::-1]
    for (A, B), o, o2 in reversed(list(zip(data, outs, outs_again))):
        np.testing.assert_allclose(np.asarray(o), -(A @ B), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(np.asarray(o2), -(A @ B), rtol=RTOL, atol=ATOL)
    # swapped argument roles under the same compiled function
    (A0, B0), (A1, B1) = data[0], data[1]
    g = jax.jit(lambda x, y: jask.sum(x - y))
    x, y = jask.from_numpy(A0), jask.from_numpy(A1)
    np.testing.assert_allclose(float(g(x, y)), float(np.sum(A0 - A1)), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(float(g(y, x)), float(np.sum(A1 - A0)), rtol=RTOL, atol=ATOL)


def test_jitted_gradient_step_loop(small_tiles):
    """A few SGD steps with a jitted step and update_: matches the same loop in jnp."""
    X, Y, W0 = _rand((5, 7), 1), _rand((5, 6), 2), _rand((7, 6), 3)

    @jax.jit
    def step(w, x, y):
        loss, g = jax.value_and_grad(lambda w: jask.sum(jask.square(x @ w - y)))(w)
        return loss, w - g * 0.01

    def ref_step(w):
        loss, g = jax.value_and_grad(lambda w: jnp.sum(jnp.square(X @ w - Y)))(w)
        return loss, w - 0.01 * g

    w, x, y = jask.from_numpy(W0), jask.from_numpy(X), jask.from_numpy(Y)
    wr = jnp.asarray(W0)
    for _ in range(3):
        loss, new_w = step(w, x, y)
        w.update_(new_w)
        want_loss, wr = ref_step(wr)
        np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-4)
    np.testing.assert_allclose(np.asarray(w), np.asarray(wr), rtol=1e-4, atol=1e-4)


def test_closed_over_diskarray(small_tiles):
    """A DiskArray captured by a jitted function (not an argument) is used correctly."""
    A, B = _rand((5, 7), 1), _rand((5, 7), 2)
    a = jask.from_numpy(A)
    f = jax.jit(lambda b: jask.sum(jask.mul(a, b)))
    np.testing.assert_allclose(float(f(jask.from_numpy(B))), float(np.sum(A * B)), rtol=RTOL, atol=ATOL)


def test_scalar_of_only_closed_over_diskarrays(small_tiles):
    """A jitted function whose scalar result depends on closed-over DiskArrays alone: its window programs ran
    inside the trace and crashed (ConcretizationTypeError); they run when traced, as a closed-over constant's."""
    A = _rand((5, 7), 3)
    a = jask.from_numpy(A)
    assert float(jax.jit(lambda: jask.sum(a * 2.0))()) == pytest.approx(float(np.sum(A * 2)), rel=1e-5)
    assert float(jax.jit(lambda: jask.numpy.max(a))()) == float(A.max())
    assert float(jax.jit(lambda: a[1, 2])()) == float(A[1, 2])
