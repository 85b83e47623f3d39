"""The compiled ``pallas`` backend on a TPU or GPU: the OPS table and a larger-shape sweep through the executor."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jask
from jask import kernels

try:
    import test_ops
except ImportError:  # pragma: no cover
    test_ops = None


def test_auto_picks_pallas_on_tpu_and_xla_on_gpu():
    jask.config.update("backend", "auto")
    assert kernels.backend_name() == ("pallas" if jax.default_backend() == "tpu" else "xla")


@pytest.mark.skipif(test_ops is None or not hasattr(test_ops, "CASES"), reason="tests/test_ops.py has no CASES")
@pytest.mark.parametrize("args, jask_fn, ref_fn, mode", test_ops.CASES if test_ops is not None else [])
def test_ops_table(small_tiles, args, jask_fn, ref_fn, mode):
    test_ops._RUNNERS[mode](args, jask_fn, ref_fn)


def _tol(dtype):
    return dict(rtol=2e-2, atol=2e-2) if jnp.dtype(dtype).itemsize < 4 else dict(rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("n, tile", [(1024, 256), (1000, 256), (2048, 512), (1536, 128)])
def test_sweep_executor(n, tile, dtype):
    """Ops end to end through the executor at shapes with full and ragged tiles."""
    jask.config.update("tile", tile)
    rng = np.random.default_rng(n)
    A = rng.standard_normal((n, n)).astype(dtype)
    B = rng.standard_normal((n, n)).astype(dtype)
    a, b = jask.from_numpy(A), jask.from_numpy(B)
    Af, Bf = A.astype(np.float32), B.astype(np.float32)
    np.testing.assert_allclose(np.asarray(a + b).astype(np.float32), Af + Bf, **_tol(dtype))
    np.testing.assert_allclose(np.asarray(jask.transpose(a)).astype(np.float32), Af.T, **_tol(dtype))
    # jask.sum of a bfloat16 array is a bfloat16 scalar, as jnp.sum's: 8 bits of mantissa
    np.testing.assert_allclose(float(jask.sum(a)), Af.sum(), rtol=1e-2 if dtype == "bfloat16" else 1e-3, atol=1.0)
    np.testing.assert_allclose(np.asarray(a @ b).astype(np.float32), Af @ Bf,
                               rtol=5e-2, atol=0.5 if dtype == "bfloat16" else 5e-2)


@pytest.mark.parametrize("n", [1024, 2048])
def test_sweep_gradients(n):
    jask.config.update("tile", 256)
    rng = np.random.default_rng(0)
    A = rng.standard_normal((n, n)).astype(np.float32)
    B = rng.standard_normal((n, n)).astype(np.float32)
    ga, gb = jax.jit(jax.grad(lambda a, b: jask.sum(a @ b), argnums=(0, 1)))(jask.from_numpy(A), jask.from_numpy(B))
    np.testing.assert_allclose(np.asarray(ga), np.broadcast_to(B.sum(1), (n, n)), rtol=1e-3, atol=1e-2)
    np.testing.assert_allclose(np.asarray(gb), np.broadcast_to(A.sum(0)[:, None], (n, n)), rtol=1e-3, atol=1e-2)


def test_benchmark_on_hardware():
    from jask.bench.kernels import bench_op
    for op in ("dot", "add", "sum"):
        r = bench_op(op, n=2048, block=512, backend="pallas", repeat=2, dtype="float32")
        assert r["max_abs_err"] < 1e-1
