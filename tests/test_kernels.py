"""Kernel backends: the backend switch, Pallas lowerings (interpret mode on CPU), window programs.

The OPS table of ``test_ops.py`` runs on every backend here unless ``test_ops``
parametrizes over backends itself (a ``backend`` fixture there).
"""
import itertools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jask
from jask import kernels
from jask.hijax.grad import GradOp
from jask.graph.nodes import OpSpec
from jask.graph.op import BlockParallelOp, TiledInput
from jask.kernels import pallas as P
from jask.linalg.add import Add
from jask.linalg.dot import Dot
from jask.linalg.mul import ScalarMul
from jask.linalg.square import Square
from jask.linalg.sum import Sum
from jask.linalg.transpose import Transpose

BACKENDS = ["xla", "pallas-interpret"]
RTOL = ATOL = 1e-5


def _rand(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _tiled(x, tile):
    x = np.asarray(x)
    return TiledInput(x.shape, x.dtype, tuple(min(tile, d) for d in x.shape))


# ---------------------------------------------------------------- the OPS table on every backend

try:
    import test_ops
except ImportError:  # pragma: no cover - the table lives in test_ops.py
    test_ops = None

_TABLE_HERE = test_ops is not None and not hasattr(test_ops, "backend") and hasattr(test_ops, "CASES")


@pytest.fixture(params=BACKENDS)
def backend(request):
    jask.config.update("backend", request.param)
    return request.param


@pytest.mark.skipif(not _TABLE_HERE, reason="test_ops.py parametrizes the OPS table over backends itself")
@pytest.mark.parametrize("args, jask_fn, ref_fn, mode", test_ops.CASES if _TABLE_HERE else [])
def test_ops_table_pallas_interpret(small_tiles, args, jask_fn, ref_fn, mode):
    """The whole table (forward and gradients) under pallas-interpret; test_ops.py runs it under xla."""
    jask.config.update("backend", "pallas-interpret")
    test_ops._RUNNERS[mode](args, jask_fn, ref_fn)


# ---------------------------------------------------------------- the switch

def test_auto_picks_xla_on_cpu_never_interpret():
    jask.config.update("backend", "auto")
    assert kernels.backend_name() == "xla"
    assert kernels.auto_backend() != "pallas-interpret"


def test_every_backend_is_registered():
    for name in ("xla", "pallas", "pallas-interpret"):
        assert kernels.get_backend(name).name == name


def test_env_variable_selects_backend():
    code = "import jask.kernels as k; print(k.backend_name(), type(k.get_backend()).__name__)"
    env = dict(os.environ, JASK_BACKEND="pallas-interpret")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["pallas-interpret", "PallasBackend"]


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown backend"):
        jask.config.update("backend", "cuda-magic")


def test_compiled_pallas_on_cpu_says_what_to_use():
    with pytest.raises(RuntimeError, match="pallas-interpret"):
        kernels.get_backend("pallas").compile(Add())


def test_tile_program_contains_pallas_call():
    a = _rand((4, 4))
    prims = lambda jaxpr: {e.primitive.name for e in jaxpr.jaxpr.eqns}  # noqa: E731
    assert "pallas_call" in prims(kernels.tile_jaxpr(Add(), a, a, backend="pallas-interpret"))
    assert "pallas_call" in prims(kernels.tile_jaxpr(ScalarMul(), a, np.float32(2), backend="pallas-interpret"))
    assert "pallas_call" not in prims(kernels.tile_jaxpr(Add(), a, a, backend="xla"))


def test_executor_runs_pallas_kernels(small_tiles, monkeypatch):
    """Under pallas-interpret the executor's windows really go through pallas_call, with no xla fallback."""
    programs = []
    real = P.PallasBackend.compile_window

    def spy(self, op, spec):
        program = real(self, op, spec)
        programs.append((program, spec))
        return program

    monkeypatch.setattr(P.PallasBackend, "compile_window", spy)
    from jask.exec.run_windows import kernels_cache
    monkeypatch.setattr(kernels_cache, "_programs", {})
    jask.config.update("backend", "pallas-interpret")
    A, B = _rand((9, 6)), _rand((6, 5), 1)
    with jask.profile() as p:
        out = np.asarray(jask.dot(jask.from_numpy(A), jask.from_numpy(B)))
    np.testing.assert_allclose(out, A @ B, rtol=RTOL, atol=ATOL)
    assert programs and p.xla_fallback_calls == 0 and p.kernel_calls >= len(programs)
    program, spec = programs[0]
    stacks, table, valid = spec.operand_structs()
    assert str(jax.make_jaxpr(program)(stacks, table, valid)).count("pallas_call") == 1


# ---------------------------------------------------------------- the seam: output_tile

def _drive(op, arrays, tile, backend_name):
    """Compute a whole output through backend.output_tile from in-memory blocks (like the executor)."""
    backend = kernels.get_backend(backend_name)
    kernel = backend.compile(op)
    shapes = [np.shape(a) for a in arrays]
    out_shape = tuple(op.output_shape(*shapes))
    out_dtype = np.dtype(op.output_dtype(*[np.asarray(a).dtype for a in arrays]))

    def region(idx, shape):
        return tuple(slice(i * tile, min((i + 1) * tile, d)) for i, d in zip(idx, shape))

    def fetch(entry):
        return [np.asarray(a)[region(b, np.shape(a))] if np.ndim(a) else np.asarray(a) for a, b in zip(arrays, entry)]

    out = np.zeros(out_shape, out_dtype)
    for idx in itertools.product(*[range(-(-d // tile)) for d in out_shape]):
        t = backend.output_tile(kernel, op.index_map(idx), fetch, out_dtype)
        if t is not None:
            out[region(idx, out_shape)] = np.asarray(t)
    return out


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_sum_over_more_entries_than_a_chunk(backend_name):
    A = _rand((41, 9))  # 11 x 3 ragged blocks of tile 4: 33 entries > MAX_CHUNK
    op = Sum.from_inputs(_tiled(A, 4))
    np.testing.assert_allclose(_drive(op, [A], 4, backend_name), A.sum(), rtol=1e-5)


def test_chunks_are_bounded_by_the_budget(monkeypatch):
    jask.set_memory_budget(1 << 20)
    assert P.chunk_size(64) == P.MAX_CHUNK
    assert P.chunk_size(1 << 20) == 1
    assert P.chunk_size((1 << 20) // (P.CHUNK_BUDGET_SHARE * 2 * 3)) == 3
    sizes = []
    real = P.PallasKernel.run_group
    monkeypatch.setattr(P.PallasKernel, "run_group", lambda self, sig, g: sizes.append(len(g)) or real(self, sig, g))
    A = _rand((64, 8))
    jask.set_memory_budget(P.CHUNK_BUDGET_SHARE * 2 * 3 * 4 * 4 * 4)  # 3 blocks of 4x4 float32 per chunk
    op = Sum.from_inputs(_tiled(A, 4))
    np.testing.assert_allclose(_drive(op, [A], 4, "pallas-interpret"), A.sum(), rtol=1e-5)
    assert max(sizes) == 3 and sum(sizes) == 32


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_low_precision_accumulates_in_float32(backend_name):
    ones = np.ones((64, 128), jnp.bfloat16)  # 512 partials of 16: a bf16 running sum stalls at 4096
    op = Sum.from_inputs(_tiled(ones, 4))
    naive = jnp.bfloat16(0)
    for _ in range(512):
        naive = naive + jnp.bfloat16(16)
    assert float(naive) == 4096.0
    out = _drive(op, [ones], 4, backend_name)
    assert out.dtype == jnp.bfloat16 and float(out) == 8192.0


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_ragged_blocks_and_scalar_operands(backend_name):
    A = _rand((9, 6))
    s = np.float32(-1.25)
    np.testing.assert_allclose(_drive(ScalarMul(), [A, s], 4, backend_name), A * s, rtol=RTOL)
    B = _rand((6, 7), 2)
    np.testing.assert_allclose(_drive(Dot.from_inputs(_tiled(A, 4), _tiled(B, 4)), [A, B], 4, backend_name),
                               A @ B, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_gradient_tiles_through_the_seam(backend_name):
    """GradOp (backward as a block-parallel op with a tabulated index_map) through output_tile."""
    A, B = _rand((9, 6)), _rand((6, 5), 1)
    G = _rand((9, 5), 2)
    ins = [_tiled(A, 4), _tiled(B, 4)]
    for wrt, want in ((0, G @ B.T), (1, A.T @ G)):
        op = GradOp.from_inputs(_tiled(G, 4), *ins, forward=OpSpec(Dot), wrt=wrt)
        np.testing.assert_allclose(_drive(op, [G, A, B], 4, backend_name), want, rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------- the window program

def _window(op, *arrays, tile=4, **kw):
    return np.asarray(P.window_call(op, *arrays, tile=tile, interpret=True, **kw))


@pytest.mark.parametrize("index_map", ["traced", "table"])
def test_window_elementwise(index_map):
    A, B = _rand((9, 6)), _rand((9, 6), 1)
    np.testing.assert_allclose(_window(Add(), A, B, index_map=index_map), A + B, rtol=RTOL)
    np.testing.assert_allclose(_window(Square(), A, index_map=index_map), A * A, rtol=RTOL)
    np.testing.assert_allclose(_window(ScalarMul(), A, np.float32(3), index_map=index_map), 3 * A, rtol=RTOL)


@pytest.mark.parametrize("index_map", ["traced", "table"])
@pytest.mark.parametrize("a_shape, b_shape", [((9, 6), (6, 5)), ((8, 8), (8, 8)), ((3, 5, 6), (3, 6, 7)),
                                              ((5, 7), (7,))])
def test_window_dot(index_map, a_shape, b_shape):
    A, B = _rand(a_shape), _rand(b_shape, 1)
    op = Dot.from_inputs(_tiled(A, 4), _tiled(B, 4))
    np.testing.assert_allclose(_window(op, A, B, index_map=index_map), A @ B, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("index_map", ["traced", "table"])
def test_window_cut_from_larger_arrays(index_map):
    """A window of output row-blocks 1..2 of a dot, with block offsets into the op's grid."""
    A, B = _rand((13, 6)), _rand((6, 9), 1)
    op = Dot.from_inputs(_tiled(A, 4), _tiled(B, 4))
    out = _window(op, A[4:13], B, out_shape=(9, 9), out_offset=(1, 0), in_offsets=[(1, 0), (0, 0)],
                  index_map=index_map)
    np.testing.assert_allclose(out, (A @ B)[4:13], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("shape, axes", [((9, 6), None), ((3, 5, 6), (2, 0, 1))])
def test_window_transpose(shape, axes):
    A = _rand(shape)
    op = Transpose.from_inputs(_tiled(A, 4), axes=axes)
    np.testing.assert_allclose(_window(op, A), np.transpose(A, axes), rtol=RTOL)


@pytest.mark.parametrize("index_map", ["auto", "traced", "table"])
def test_window_sum_padding_never_leaks(index_map):
    A = _rand((9, 6)) + 10.0  # ragged in both dims; interpret mode reads NaN past the edge
    op = Sum.from_inputs(_tiled(A, 4))
    out = _window(op, A, index_map=index_map)
    assert out.shape == ()
    np.testing.assert_allclose(out, A.sum(), rtol=1e-5)


def test_window_many_entries_are_tabulated():
    A = _rand((40, 40))
    op = Sum.from_inputs(_tiled(A, 4))  # 100 entries > MAX_SELECT
    np.testing.assert_allclose(_window(op, A), A.sum(), rtol=1e-5)


def test_window_program_contains_pallas_call():
    A, B = _rand((9, 6)), _rand((6, 5), 1)
    op = Dot.from_inputs(_tiled(A, 4), _tiled(B, 4))
    jaxpr = jax.make_jaxpr(lambda a, b: P.window_call(op, a, b, tile=4, interpret=True))(A, B)
    assert "pallas_call" in {e.primitive.name for e in jaxpr.jaxpr.eqns}


@pytest.mark.parametrize("wrt", [0, 1])
def test_window_gradient_falls_back_to_tables(wrt):
    """GradOp's index_map is a dict lookup: it cannot be traced, so it is tabulated."""
    A, B, G = _rand((9, 6)), _rand((6, 5), 1), _rand((9, 5), 2)
    op = GradOp.from_inputs(_tiled(G, 4), _tiled(A, 4), _tiled(B, 4), forward=OpSpec(Dot), wrt=wrt)
    want = G @ B.T if wrt == 0 else A.T @ G
    np.testing.assert_allclose(_window(op, G, A, B), want, rtol=RTOL, atol=ATOL)
    with pytest.raises(ValueError, match="GradOp.index_map cannot be traced"):
        _window(op, G, A, B, index_map="traced")


class PrefixRows(BlockParallelOp):
    """Output row-block i sums input row-blocks 0..i: K depends on i (Python range on the index)."""

    def forward_block(self, a):
        return a

    def index_map(self, out_idx):
        i, j = out_idx
        return [((r, j),) for r in range(i + 1)]

    def output_shape(self, a_shape):
        return a_shape


class EvenRowsOnly(BlockParallelOp):
    """Odd row-blocks have no entries at all (their tiles are zero)."""

    def forward_block(self, a):
        return a

    def index_map(self, out_idx):
        return [] if out_idx[0] % 2 else [(tuple(out_idx),)]

    def output_shape(self, a_shape):
        return a_shape


def test_window_index_dependent_k_is_tabulated():
    A = _rand((12, 4))
    want = np.concatenate([A[:4], A[:4] + A[4:8], A[:4] + A[4:8] + A[8:]])
    np.testing.assert_allclose(_window(PrefixRows(), A), want, rtol=RTOL)
    np.testing.assert_allclose(_drive(PrefixRows(), [A], 4, "pallas-interpret"), want, rtol=RTOL)


def test_window_empty_entries_give_zero_tiles():
    A = _rand((12, 4))
    want = A.copy()
    want[4:8] = 0
    np.testing.assert_allclose(_window(EvenRowsOnly(), A), want)


class Broken(BlockParallelOp):
    def forward_block(self, a):
        return a

    def index_map(self, out_idx):
        raise KeyError("no table for this tiling")

    def output_shape(self, a_shape):
        return a_shape


def test_index_map_that_cannot_run_names_the_op():
    with pytest.raises(ValueError, match="Broken.index_map can neither be traced"):
        _window(Broken(), _rand((4, 4)))


def test_compiled_window_on_cpu_is_refused():
    with pytest.raises(RuntimeError, match="pallas-interpret"):
        P.window_call(Add(), _rand((4, 4)), _rand((4, 4)), tile=4, interpret=False)


# ---------------------------------------------------------------- block constraints

def test_block_constraints():
    f32 = np.float32
    assert P.block_shape_problem((1024, 1024), (256, 512), f32, "tpu") is None
    assert P.block_shape_problem((9, 6), (9, 6), f32, "tpu") is None           # full dims
    assert "(8, 128)" in P.block_shape_problem((1024, 1024), (4, 128), f32, "tpu")
    assert "(8, 128)" in P.block_shape_problem((1024, 1024), (8, 100), f32, "tpu")
    assert P.block_shape_problem((100, 100), (32, 64), f32, "gpu") is None
    assert "power-of-two" in P.block_shape_problem((100, 100), (24, 64), f32, "gpu")
    assert P.block_shape_problem((64, 64), (8, 4), f32, "mosaic_gpu") is None
    assert "16 bytes" in P.block_shape_problem((64, 64), (8, 2), f32, "mosaic_gpu")
    with pytest.raises(ValueError, match=r"Dot: block shape \(4, 100\) is illegal .* on tpu"):
        P.check_block_shape("Dot", (1024, 1024), (4, 100), f32, "tpu")


@pytest.mark.parametrize("platform", ["tpu", "gpu", "mosaic_gpu"])
@pytest.mark.parametrize("shape", [(1000, 3000), (7, 130), (4096, 4096), (5,)])
def test_legal_block_shape_is_legal(platform, shape):
    block = P.legal_block_shape(shape, np.float32, platform, 512)
    assert P.block_shape_problem(shape, block, np.float32, platform) is None
    assert all(1 <= b <= d for b, d in zip(block, shape))


# ---------------------------------------------------------------- benchmark smoke

@pytest.mark.parametrize("backend_name", BACKENDS)
def test_benchmark_runs(backend_name):
    from jask.bench.kernels import bench_op
    for op in ("dot", "add", "sum"):
        r = bench_op(op, n=24, block=8, backend=backend_name, repeat=1, dtype="float32", path="kernel")
        assert r["max_abs_err"] < 1e-3 and r["ratio"] > 0


def test_benchmark_command_line():
    out = subprocess.run([sys.executable, "-m", "jask.bench.kernels", "--op=add,sum", "--n=32", "--block=16",
                          "--backend=xla", "--repeat=1"], capture_output=True, text=True, check=True)
    assert "ratio" in out.stdout and "GB/s" in out.stdout
