"""CustomOp: an op that is not block-parallel (a cumulative sum carries state across tiles)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jask
from jask.base import CustomOp
from jask.base.base_algo import make_op


class CumSum0(CustomOp):
    """Cumulative sum along axis 0: each row tile needs the carry of the tiles above it."""

    def output_shape(self, a_shape):
        return a_shape

    def forward(self, algo, a):
        rows, cols = algo.grid(a)
        for j in range(cols):
            carry = 0.0
            for i in range(rows):
                out = np.cumsum(np.asarray(algo.read(a, (i, j))), axis=0) + carry
                algo.write((i, j), out)
                carry = out[-1]

    def backward(self, algo, inputs, d_out):
        rows, cols = algo.grid(d_out)
        for j in range(cols):
            carry = 0.0
            for i in reversed(range(rows)):
                d = np.asarray(algo.read(d_out, (i, j)))
                out = np.cumsum(d[::-1], axis=0)[::-1] + carry
                algo.write((i, j), out, wrt=0)
                carry = out[0]


cumsum0 = make_op(CumSum0, doc="Cumulative sum along the first axis.")


@pytest.fixture
def data(small_tiles):
    rng = np.random.default_rng(3)
    return rng.standard_normal((11, 6)).astype(np.float32), rng.standard_normal((11, 6)).astype(np.float32)


def test_forward_eager_and_jit(data):
    x, _ = data
    a = jask.from_numpy(x)
    np.testing.assert_allclose(np.asarray(cumsum0(a)), np.cumsum(x, axis=0), rtol=1e-5, atol=1e-5)
    out = jax.jit(lambda a: jask.sum(cumsum0(a)))(a)
    np.testing.assert_allclose(float(out), np.cumsum(x, axis=0).sum(), rtol=1e-4)


@pytest.mark.parametrize("jit", [False, True])
def test_gradient(data, jit):
    x, w = data
    a, wd = jask.from_numpy(x), jask.from_numpy(w)
    f = jax.grad(lambda a: jask.sum(cumsum0(a) * wd))
    g = (jax.jit(f) if jit else f)(a)
    expected = jax.grad(lambda a: jnp.sum(jnp.cumsum(a, axis=0) * w))(x)
    np.testing.assert_allclose(np.asarray(g), expected, rtol=1e-4, atol=1e-4)


def test_unwritten_tile_is_an_error(small_tiles):
    class Lazy(CumSum0):
        def forward(self, algo, a):
            algo.write((0, 0), np.asarray(algo.read(a, (0, 0))))

    lazy = make_op(Lazy)
    with pytest.raises(ValueError, match="unwritten"):
        np.asarray(lazy(jask.from_numpy(np.ones((9, 9), np.float32))))


def test_a_scalar_output_is_refused_by_name(small_tiles):
    """A CustomOp of output shape () is refused when called (it crashed in the planner, which runs scalar
    results as block-parallel reductions)."""
    class Total(CumSum0):
        def output_shape(self, a_shape):
            return ()

    with pytest.raises(NotImplementedError, match=r"total: a CustomOp's output has at least one axis"):
        make_op(Total)(jask.from_numpy(np.ones((9, 9), np.float32)))


def test_explain_counts_a_custom_ops_reads_and_writes(small_tiles, tmp_path):
    """The plan's bytes match what the run reads and writes: the custom op's input read once and its stored
    output (they were left out), and a stored root copied by its sink."""
    from jask.exec.driver import make_plan, planned_io
    x = jask.from_numpy(np.ones((11, 6), np.float32))
    for i, y in enumerate((cumsum0(x) * 2.0, x)):
        read, written, _ = planned_io(make_plan([y._node]))
        with jask.profile() as p:
            jask.to_zarr(y, tmp_path / f"{i}.zarr")
        assert (read, written) == (p.bytes_read, p.bytes_written)
