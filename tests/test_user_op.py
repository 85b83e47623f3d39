"""Ops written by a user with only the five BlockParallelOp methods (+ from_inputs) and make_op."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jask
from jask.base import BlockParallelOp
from jask.base.base_algo import make_op

RTOL = ATOL = 1e-4


class Cube(BlockParallelOp):
    """a ** 3 elementwise."""

    def forward_block(self, a_block):
        return a_block * a_block * a_block

    def index_map(self, out_idx):
        return [(out_idx,)]

    def combine(self, acc, partial):
        return acc + partial

    def backward_block(self, d_out_block, a_block):
        return (3 * a_block * a_block * d_out_block,)

    def output_shape(self, a_shape):
        return a_shape


cube = make_op(Cube)


class Axpy(BlockParallelOp):
    """alpha * a + b, with alpha a keyword argument handed over by from_inputs."""

    def __init__(self, alpha=1.0):
        self.alpha = alpha

    @classmethod
    def from_inputs(cls, a, b, alpha=1.0):
        return cls(alpha=alpha)

    def forward_block(self, a_block, b_block):
        return self.alpha * a_block + b_block

    def index_map(self, out_idx):
        return [(out_idx, out_idx)]

    def combine(self, acc, partial):
        return acc + partial

    def backward_block(self, d_out_block, a_block, b_block):
        return (self.alpha * d_out_block, d_out_block)

    def output_shape(self, a_shape, b_shape):
        if a_shape != b_shape:
            raise ValueError(f"axpy got shapes {a_shape} and {b_shape}")
        return a_shape


axpy = make_op(Axpy, doc="alpha * a + b")


class Scale(BlockParallelOp):
    """factor * a, with factor given as a keyword through from_inputs."""

    def __init__(self, factor):
        self.factor = factor

    @classmethod
    def from_inputs(cls, a, factor=1.0):
        return cls(factor=factor)

    def forward_block(self, a_block):
        return a_block * self.factor

    def index_map(self, out_idx):
        return [(out_idx,)]

    def combine(self, acc, partial):
        return acc + partial

    def backward_block(self, d_out_block, a_block):
        return (d_out_block * self.factor,)

    def output_shape(self, a_shape):
        return a_shape


scale = make_op(Scale)


class RowSum(BlockParallelOp):
    """Sum over the last axis: (m, n) -> (m,). A reduction whose index_map lists several entries."""

    def __init__(self, n_blocks=1):
        self.n_blocks = n_blocks

    @classmethod
    def from_inputs(cls, a):
        return cls(n_blocks=a.grid[-1])

    def forward_block(self, a_block):
        return jnp.sum(a_block, axis=-1)

    def index_map(self, out_idx):
        (i,) = out_idx
        return [((i, k),) for k in range(self.n_blocks)]

    def combine(self, acc, partial):
        return acc + partial

    def backward_block(self, d_out_block, a_block):
        return (jnp.broadcast_to(d_out_block[:, None], a_block.shape),)

    def output_shape(self, a_shape):
        return a_shape[:-1]


rowsum = make_op(RowSum)


class BlockMax(BlockParallelOp):
    """Max over the last axis, with a non-additive ``combine`` (maximum)."""

    def __init__(self, n_blocks=1):
        self.n_blocks = n_blocks

    @classmethod
    def from_inputs(cls, a):
        return cls(n_blocks=a.grid[-1])

    def forward_block(self, a_block):
        return jnp.max(a_block, axis=-1)

    def index_map(self, out_idx):
        (i,) = out_idx
        return [((i, k),) for k in range(self.n_blocks)]

    def combine(self, acc, partial):
        return jnp.maximum(acc, partial)

    def backward_block(self, d_out_block, a_block):
        raise NotImplementedError

    def output_shape(self, a_shape):
        return a_shape[:-1]


rowmax = make_op(BlockMax)


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _weights(shape):
    return _rand(shape, 999)


# (inputs, user op, jnp reference)
USER_OPS = [
    pytest.param([(5, 7)], cube, lambda a: a ** 3, id="cube"),
    pytest.param([(5, 7), (5, 7)], lambda a, b: axpy(a, b, alpha=-2.5),
                 lambda a, b: -2.5 * a + b, id="axpy_kwarg"),
    pytest.param([(3, 5, 6)], lambda a: scale(a, factor=0.25), lambda a: 0.25 * a, id="scale_kwarg"),
    pytest.param([(9, 6)], rowsum, lambda a: jnp.sum(a, axis=-1), id="rowsum"),
    pytest.param([(5, 7), (7, 6)], lambda a, b: cube(scale(a @ b, factor=0.5)),
                 lambda a, b: (0.5 * (a @ b)) ** 3, id="chain_with_builtin_dot"),
]


def _inputs(shapes):
    arrays = [_rand(s, i) for i, s in enumerate(shapes)]
    return arrays, [jask.from_numpy(x) for x in arrays]


@pytest.mark.parametrize("shapes, op, ref", USER_OPS)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_user_op_forward(small_tiles, shapes, op, ref, jit):
    np_in, jask_in = _inputs(shapes)
    out = (jax.jit(op) if jit else op)(*jask_in)
    want = ref(*np_in)
    assert isinstance(out, jask.DiskArray)
    assert out.shape == want.shape and out.dtype == want.dtype
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("shapes, op, ref", USER_OPS)
@pytest.mark.parametrize("mode", ["eager", "jit_of_grad"])
def test_user_op_grad(small_tiles, shapes, op, ref, mode):
    np_in, jask_in = _inputs(shapes)
    out_shape = jnp.shape(ref(*np_in))
    W = _weights(out_shape)
    w = jask.from_numpy(W)
    argnums = tuple(range(len(shapes)))

    def loss(*xs):
        return jask.sum(jask.mul(op(*xs), w))

    def ref_loss(*xs):
        return jnp.sum(ref(*xs) * W)

    grad = jax.grad(loss, argnums=argnums)
    if mode == "jit_of_grad":
        grad = jax.jit(grad)
    got = grad(*jask_in)
    want = jax.grad(ref_loss, argnums=argnums)(*np_in)
    for g, x, wg in zip(got, np_in, want):
        assert isinstance(g, jask.DiskArray) and g.shape == x.shape and g.dtype == x.dtype
        np.testing.assert_allclose(np.asarray(g), np.asarray(wg), rtol=RTOL, atol=ATOL)


def test_make_op_metadata():
    assert cube.__name__ == "cube" and cube.op_class is Cube
    assert cube.__doc__ == Cube.__doc__
    assert axpy.__doc__ == "alpha * a + b"
    named = make_op(Cube, name="my_cube")
    assert named.__name__ == "my_cube"


def test_make_op_rejects_non_op_class():
    with pytest.raises(TypeError, match="BlockParallelOp"):
        make_op(object)


def test_kwargs_reach_from_inputs_and_distinguish_ops(small_tiles):
    """Two calls with different keyword values are different ops (no cache mix-up), eagerly and under jit."""
    A = _rand((5, 7), 3)
    a = jask.from_numpy(A)
    f = jax.jit(lambda a: (scale(a, factor=2.0), scale(a, factor=-3.0)))
    for x, y in (f(a), (scale(a, factor=2.0), scale(a, factor=-3.0))):
        np.testing.assert_allclose(np.asarray(x), 2.0 * A, rtol=RTOL)
        np.testing.assert_allclose(np.asarray(y), -3.0 * A, rtol=RTOL)


def test_zero_and_negative_zero_keywords_are_different_ops(small_tiles):
    """0.0 == -0.0 in Python, but ``1 / (a * -0.0)`` is -inf: two calls with them were one op, and the second
    got the first's result (a user op's keyword and an operator's baked-in constant alike)."""
    A = np.abs(_rand((5, 7), 3)) + 1
    a = jask.from_numpy(A)
    for factor in (0.0, -0.0, 0.0):
        with np.errstate(divide="ignore"):
            want = 1.0 / (A * np.float32(factor))
        np.testing.assert_array_equal(np.asarray(1.0 / scale(a, factor=factor)), want)
        np.testing.assert_array_equal(np.asarray(1.0 / (a * factor)), want)
        np.testing.assert_array_equal(np.asarray(jax.jit(lambda a: 1.0 / (a * factor))(a)), want)


def test_numpy_array_keywords_are_frozen(small_tiles):
    """A 0-d NumPy keyword reaches the op as its NumPy scalar (it failed to freeze), an n-d one as nested tuples."""
    A = _rand((5, 7), 4)
    a = jask.from_numpy(A)
    np.testing.assert_allclose(np.asarray(scale(a, factor=np.array(2.5, np.float32))), 2.5 * A, rtol=RTOL)
    out = jask.transpose(a.reshape(5, 7, 1), axes=np.array([2, 0, 1]))
    np.testing.assert_array_equal(np.asarray(out), np.transpose(A.reshape(5, 7, 1), (2, 0, 1)))


def test_list_kwarg_is_frozen(small_tiles):
    """A list keyword argument is accepted (made hashable) and reaches from_inputs as a tuple."""
    A = _rand((3, 5, 6), 4)
    out = jask.transpose(jask.from_numpy(A), axes=[1, 2, 0])
    np.testing.assert_allclose(np.asarray(out), np.transpose(A, (1, 2, 0)))


def test_unhashable_kwarg_rejected(small_tiles):
    a = jask.from_numpy(_rand((5, 7), 5))
    with pytest.raises(TypeError, match="hashable"):
        scale(a, factor={1, 2})


def test_user_output_shape_errors_propagate(small_tiles):
    a, b = jask.from_numpy(_rand((5, 7), 1)), jask.from_numpy(_rand((7, 5), 2))
    with pytest.raises(ValueError, match=r"axpy got shapes \(5, 7\) and \(7, 5\)"):
        axpy(a, b, alpha=1.0)


class _Shifted(Cube):
    """A mistake: reads the input block one row of tiles down, past the grid at the last row."""

    def index_map(self, out_idx):
        return [((out_idx[0] + 1, out_idx[1]),)]


class _Gradients(Cube):
    """A backward_block returning ``self.grads`` (a mistake, in each test)."""

    def __init__(self, grads=None):
        self.grads = grads

    def backward_block(self, d_out_block, a_block):
        return {"two": (d_out_block, d_out_block), "none": (None,), "bare": d_out_block}[self.grads]


@pytest.mark.parametrize("grads, says", [("two", "one gradient per input \\(1\\), got 2 values"),
                                         ("none", "gradient for input 0 has None"),
                                         ("bare", "one gradient per input \\(1\\), got a")])
def test_contract_mistakes_are_named_by_method(small_tiles, grads, says):
    """Errors name the method a user got wrong: an index_map block past the input's grid (it was reported
    as a missing chunk file), backward_block's gradients (an IndexError, or accepted), a positional
    parameter, a negative output_shape."""
    a = jask.from_numpy(_rand((5, 7), 8))
    with pytest.raises(ValueError, match=r"_shifted.index_map\(\(1, 1\)\) asks input 0 for block \(2, 1\), but "
                                         r"that input has 2 axes and a grid of \(2, 2\) tiles"):
        make_op(_Shifted)(a)
    with pytest.raises(TypeError, match=f"_Gradients.backward_block.*{says}"):
        np.asarray(jax.grad(lambda a: jask.sum(make_op(_Gradients)(a, grads=grads)))(a))
    with pytest.raises(TypeError, match=r"scale takes 1 DiskArray argument, got 2; pass its parameters by keyword "
                                        r"\(factor\)"):
        scale(a, 2.0)


def test_non_additive_combine(small_tiles):
    """combine is used as written: a max-reduction over several blocks."""
    A = _rand((9, 6), 6)
    out = rowmax(jask.from_numpy(A))
    np.testing.assert_allclose(np.asarray(out), A.max(axis=-1), rtol=RTOL)


def test_unfused_user_op_result_reused(small_tiles):
    """A user op consumed twice is materialized once and read by both consumers."""
    A = _rand((5, 7), 7)
    a = jask.from_numpy(A)
    c = cube(a)
    total = jask.sum(c + jask.square(c))
    np.testing.assert_allclose(float(total), float(np.sum(A ** 3 + A ** 6)), rtol=1e-4)


class _Results(Cube):
    """A forward_block returning ``self.result`` (a mistake, in each test)."""

    def __init__(self, result=None):
        self.result = result

    def forward_block(self, a_block):
        return {"pair": (a_block, a_block), "rows": a_block[:1], "list": [a_block]}[self.result]


@pytest.mark.parametrize("result, error, says", [
    ("pair", TypeError, r"_results.forward_block must return one array \(an op has one output\), got a tuple of 2"),
    ("list", TypeError, r"_results.forward_block must return one array .*got a list of 1"),
    ("rows", ValueError, r"_results.forward_block returned a block of shape \(1, 4\) for output tile \(0, 0\) from "
                         r"input blocks of shapes \[\(4, 4\)\]; that output tile has shape \(4, 4\)")])
def test_forward_block_results_are_checked_when_called(small_tiles, result, error, says):
    """A forward_block of the wrong kind is named at the op's call, before any sink reads data (a tuple
    failed inside the kernel layer with an AttributeError about ``dtype``; a wrong shape at the sink)."""
    a = jask.from_numpy(_rand((5, 7), 9))
    with pytest.raises(error, match=says):
        make_op(_Results)(a, result=result)
    with pytest.raises(error, match=says):
        jax.jit(lambda a: jask.sum(make_op(_Results)(a, result=result)))(a)


class _WrongInTheMiddle(Cube):
    """A mistake only away from the edges: the middle row of tiles asks for a block past the grid."""

    def index_map(self, out_idx):
        return [((7 if out_idx[0] == 1 else out_idx[0], out_idx[1]),)]


def test_an_index_map_wrong_only_in_the_middle_is_named_at_the_call(small_tiles):
    """The first and last output tiles were the only ones checked at the call: this was named at the sink."""
    a = jask.from_numpy(_rand((12, 4), 10))
    with pytest.raises(ValueError, match=r"_wronginthemiddle.index_map\(\(1, 0\)\) asks input 0 for block \(7, 0\)"):
        make_op(_WrongInTheMiddle)(a)
