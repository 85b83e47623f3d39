"""Window execution on the accelerator: kernels on the device under jit, results against NumPy.

Runs on the ``pallas`` backend (conftest) and, where marked, on ``xla``: both
must put every kernel on the accelerator, inside ``jit`` too (``io_callback``
makes the host CPU the default device while jask's host work runs).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jask


def _data(shape, seed, dtype="float32"):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("backend", ["pallas", "xla"])
@pytest.mark.parametrize("tile", [128, 256])
def test_ops_on_the_device(backend, tile):
    jask.config.update("backend", backend)
    jask.config.update("tile", tile)
    A, B = _data((1024, 768), 1), _data((768, 512), 2)
    a, b = jask.from_numpy(A), jask.from_numpy(B)
    with jask.profile() as p:
        got_dot = np.asarray(a @ b)
        got_add = np.asarray(a + a * 0.5)
        got_sum = float(jask.sum(jask.square(a)))
        got_t = np.asarray(jask.transpose(b))
    np.testing.assert_allclose(got_dot, A @ B, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(got_add, A * 1.5, rtol=1e-6)
    np.testing.assert_allclose(got_sum, float(np.sum(A.astype(np.float64) ** 2)), rtol=1e-4)
    np.testing.assert_array_equal(got_t, B.T)
    assert p.devices == {jax.devices()[0]} and jax.devices()[0].platform != "cpu", p.devices
    print(f"{backend} tile {tile}: windows {p.windows}, kernel calls {p.kernel_calls}, "
          f"xla fallbacks {p.xla_fallback_calls}")


@pytest.mark.parametrize("backend", ["pallas", "xla"])
def test_jit_value_and_grad_of_the_demo_loss_runs_on_the_device(backend):
    jask.config.update("backend", backend)
    jask.config.update("tile", 256)
    X, y, w0 = _data((4096, 64), 3), _data((4096, 1), 4), _data((64, 1), 5) * 0.1
    Xd, yd, wd = jask.from_numpy(X), jask.from_numpy(y), jask.from_numpy(w0)
    loss = lambda w: jask.sum(jask.square(Xd @ w - yd))  # noqa: E731
    with jask.profile() as p:
        value, g = jax.jit(jax.value_and_grad(loss))(wd)
        g = np.asarray(g)
    ref_v, ref_g = jax.value_and_grad(lambda w: jnp.sum(jnp.square(
        jnp.matmul(X, w, precision="highest") - y)))(w0)
    np.testing.assert_allclose(float(value), float(ref_v), rtol=1e-4)
    np.testing.assert_allclose(g, np.asarray(ref_g), rtol=1e-3, atol=1e-3)
    assert p.devices == {jax.devices()[0]}, p.devices
    # X moves to the device once: w's gradient is computed in the loss's pass (jask/hijax/unit_grads.py)
    assert p.bytes_read <= X.nbytes + y.nbytes + 4 * w0.nbytes, p.bytes_read / X.nbytes


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # pallas refuses 64-bit blocks: xla runs them, warned
@pytest.mark.parametrize("backend", ["pallas", "xla"])
def test_64bit_values_reach_the_device_whole(backend):
    """Reader threads place tiles on the device: with x64 on, int64 must stay int64 (2**40 + 2**40 came
    back 0 on a v5e while the threads placed tiles without the caller's thread-local x64 mode)."""
    jask.config.update("backend", backend)
    X = np.full((300, 200), 2**40, dtype=np.int64)
    with jax.enable_x64(True):
        np.testing.assert_array_equal(np.asarray(jask.from_numpy(X) + jask.from_numpy(X)), X + X)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("tile", [1024, 1000])
def test_products_of_large_tiles_compile_with_their_inner_blocks(tile, dtype):
    """The TPU matmul plan takes (1024, 1024, 512) inner blocks at 1024^2 tiles and whole 1000-row blocks
    at 1000^2 bf16 tiles (legality.Limits): Mosaic must compile them within the VMEM limit, with no
    window sent to xla, and the table must reach each tile through the scalar-prefetched index maps."""
    jask.config.update("backend", "pallas")
    jask.config.update("tile", tile)
    A, B = _data((2 * tile, 2 * tile), 6, dtype), _data((2 * tile, tile), 7, dtype)
    with jask.profile() as p:
        got = np.asarray(jask.from_numpy(A) @ jask.from_numpy(B)).astype(np.float32)
    want = A.astype(np.float64) @ B.astype(np.float64)
    tol = 2e-2 if dtype == "bfloat16" else 1e-4
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    assert p.xla_fallback_calls == 0 and p.kernel_calls >= 1, (p.kernel_calls, p.xla_fallback_calls)


@pytest.mark.parametrize("keepdims", [False, True])
def test_bool_reductions_to_one_element_run_without_a_fallback_warning(keepdims):
    """Mosaic on a TPU v5e refused a full ``any``'s window program (a bool of one element) and jask fell back
    to xla with a RuntimeWarning; ``legality.SCALAR_REFUSED_DTYPES`` now plans it on xla up front (the
    fifteenth session, not run on a chip then). A keepdims result (one element in a (1, 1) block) is not
    refused up front: this shows whether the chip compiles it."""
    import warnings
    import jask.numpy as knp
    jask.config.update("backend", "auto")
    jask.config.update("tile", 128)
    A = _data((512, 384), 6) > 1.5
    a = jask.from_numpy(A)
    with warnings.catch_warnings(record=True) as seen, jask.profile() as p:
        warnings.simplefilter("always")
        got = [np.asarray(knp.any(a, keepdims=keepdims)), np.asarray(knp.all(a, keepdims=keepdims)),
               np.asarray(knp.any(a, axis=1))]
    want = [A.any(keepdims=keepdims), A.all(keepdims=keepdims), A.any(axis=1)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    fallbacks = [str(w.message) for w in seen if "could not compile" in str(w.message)]
    # A full any/all (a bool of one element) is planned on xla up front and counted as run by xla; seen on the
    # chip on 2026-12-08: no warning, 2 such programs, and the keepdims (1, 1) block compiled on Pallas.
    assert not fallbacks, fallbacks
    assert p.xla_fallback_calls == (0 if keepdims else 2), p.xla_fallback_calls
