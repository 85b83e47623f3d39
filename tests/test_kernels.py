"""Kernel backends: the backend switch, window programs on every backend, Pallas block rules.

The OPS table of ``test_ops.py`` runs on every backend here unless ``test_ops``
parametrizes over backends itself (a ``backend`` fixture there).
"""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jask
from jask import kernels
from jask.graph.op import BlockParallelOp
from jask.hijax.make_op import make_op
from jask.kernels import pallas as P
from jask.kernels import xla
from jask.kernels.registry import ANY_PLATFORM
from jask.kernels.window import WindowSpec
from jask.linalg.add import Add
from jask.linalg.mul import ScalarMul
from jask.linalg.sum import Sum

BACKENDS = ["xla", "pallas-interpret"]
RTOL = ATOL = 1e-5


def _rand(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


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


# Under pallas-interpret every row runs forward (eager and jit); the gradient modes run for one or two rows of
# each family of ops, 12 rows (a row's backward compiles 1-8 s of interpret-mode kernels: all 77 rows took 230 s of the
# suite). test_ops.py runs every row's gradients under xla, whose window programs are built by the same code;
# tpu_tests/ runs the whole table compiled on a TPU; JASK_FULL_OPS_TABLE=1 runs it all here.
PALLAS_GRADS = {"add", "np_clip_abs_sigmoid",                                 # elementwise
                "np_max_axis", "np_logsumexp_axes", "nn_softmax",                 # reductions
                "dot_batched",                                                    # contractions
                "transpose_3d", "np_reshape_rechunk_regroup",                     # shapes
                "getitem_steps", "getitem_int_array", "np_concatenate_axis1",     # indexing, joins
                "chain_dot_sub_square"}
_FULL = os.environ.get("JASK_FULL_OPS_TABLE") == "1"
PALLAS_CASES = [c for c in (test_ops.CASES if _TABLE_HERE else [])
                if _FULL or c.id.rsplit("-", 1)[1] in ("forward", "forward_jit")
                or c.id.rsplit("-", 1)[0] in PALLAS_GRADS]


@pytest.mark.skipif(not _TABLE_HERE, reason="test_ops.py parametrizes the OPS table over backends itself")
@pytest.mark.parametrize("args, jask_fn, ref_fn, mode", PALLAS_CASES)
def test_ops_table_pallas_interpret(small_tiles, args, jask_fn, ref_fn, mode):
    """The table under pallas-interpret (every row forward, the gradients of PALLAS_GRADS); test_ops.py runs it
    all under xla."""
    jask.config.update("backend", "pallas-interpret")
    test_ops._RUNNERS[mode](args, jask_fn, ref_fn)


# ---------------------------------------------------------------- the switch

def test_auto_picks_xla_on_cpu_never_interpret():
    jask.config.update("backend", "auto")
    assert kernels.auto_backend("cpu") == "xla"
    assert kernels.auto_backend() != "pallas-interpret"


@pytest.mark.skipif(not _TABLE_HERE, reason="test_ops.py parametrizes the OPS table over backends itself")
def test_pallas_gradient_rows_are_rows_of_the_table():
    ids = {c.id.rsplit("-", 1)[0] for c in test_ops.CASES}
    assert PALLAS_GRADS <= ids, PALLAS_GRADS - ids


def test_every_backend_is_registered():
    for name in ("xla", "pallas", "pallas-interpret"):
        assert kernels.get_backend(name).name == name


class FakeBackend:
    """The smallest backend: the xla window program under another name, counting its compiles."""

    name = "fake"
    interpret = False
    platforms = (ANY_PLATFORM,)   # the xla program it wraps compiles anywhere
    separate_tiles = False

    def __init__(self):
        self.compiled = 0

    def check_settings(self, label="jask"):
        pass

    def compile_window(self, op, spec):
        self.compiled += 1
        return xla.compile_window(op, spec)


def test_a_registered_backend_is_selectable_and_listed(small_tiles):
    fake = kernels.register(FakeBackend())
    try:
        assert "fake" in kernels.names()
        with pytest.raises(NotImplementedError, match="available: .*'fake'"):
            kernels.get_backend("cuda-magic")
        with pytest.raises(ValueError, match="unknown backend .*'fake'"):
            jask.config.update("backend", "cuda-magic")
        jask.config.update("backend", "fake")
        assert kernels.get_backend() is fake
        A = _rand((9, 6))
        np.testing.assert_allclose(np.asarray(jask.from_numpy(A) + jask.from_numpy(A)), 2 * A, rtol=RTOL)
        assert fake.compiled > 0
    finally:
        kernels.unregister("fake")
    assert "fake" not in kernels.names()


def test_a_backend_that_cannot_compile_for_the_device_gives_way_to_its_auto_backend():
    """The executor's host fallback (tile math on the CPU inside a callback) asks the registry,
    not a backend name: compiled pallas gives way on the CPU; xla and interpret run anywhere."""
    pallas, interpret, xla_backend = (kernels.get_backend(n) for n in ("pallas", "pallas-interpret", "xla"))
    assert kernels.backend_for(pallas, "cpu") is xla_backend
    assert kernels.backend_for(pallas, "tpu") is pallas and kernels.backend_for(pallas, "gpu") is pallas
    assert kernels.backend_for(interpret, "cpu") is interpret
    assert kernels.backend_for(xla_backend, "tpu") is xla_backend


def test_env_variable_selects_backend():
    code = "import jask.kernels as k; print(k.backend_name(), type(k.get_backend()).__name__)"
    env = dict(os.environ, JASK_BACKEND="pallas-interpret")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["pallas-interpret", "PallasBackend"]


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown backend"):
        jask.config.update("backend", "cuda-magic")


F32 = np.dtype(np.float32)


def _direct_spec(*leaf_blocks, n=2, dtype=F32):
    """A window of ``n`` tiles, one entry each, stacks already in tile order."""
    return WindowSpec(tuple(leaf_blocks), (np.dtype(dtype),) * len(leaf_blocks), (n,) * len(leaf_blocks), n, 1,
                      leaf_blocks[0], True)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="compiled pallas is refused on a CPU only")
def test_compiled_pallas_on_cpu_says_what_to_use():
    with pytest.raises(RuntimeError, match="pallas-interpret"):
        kernels.get_backend("pallas").compile_window(Add(), _direct_spec((4, 4), (4, 4)))


def test_window_program_contains_pallas_call():
    def calls(name, op, spec):
        program = kernels.get_backend(name).compile_window(op, spec)
        return str(jax.make_jaxpr(program)(*spec.operand_structs())).count("pallas_call[")
    assert calls("pallas-interpret", Add(), _direct_spec((4, 4), (4, 4))) == 1
    assert calls("pallas-interpret", ScalarMul(), _direct_spec((4, 4), ())) == 1
    assert calls("xla", Add(), _direct_spec((4, 4), (4, 4))) == 0


def test_executor_runs_pallas_kernels(small_tiles, monkeypatch):
    """Under pallas-interpret the executor's windows really go through pallas_call, with no xla fallback."""
    programs = []
    real = P.PallasBackend.compile_window

    def spy(self, op, spec):
        program = real(self, op, spec)
        programs.append((program, spec))
        return program

    monkeypatch.setattr(P.PallasBackend, "compile_window", spy)
    from jask.exec.program_cache import ProgramCache
    from jask.exec.run_windows import kernels_cache
    monkeypatch.setattr(kernels_cache, "_programs", ProgramCache())
    jask.config.update("backend", "pallas-interpret")
    A, B = _rand((9, 6)), _rand((6, 5), 1)
    with jask.profile() as p:
        out = np.asarray(jask.dot(jask.from_numpy(A), jask.from_numpy(B)))
    np.testing.assert_allclose(out, A @ B, rtol=RTOL, atol=ATOL)
    assert programs and p.xla_fallback_calls == 0 and p.window_programs >= len(programs)
    program, spec = programs[0]
    stacks, table, valid = spec.operand_structs()
    assert str(jax.make_jaxpr(program)(stacks, table, valid)).count("pallas_call") == 1


# ---------------------------------------------------------------- windows through every backend

@pytest.mark.parametrize("backend_name", BACKENDS)
def test_low_precision_accumulates_in_float32(backend_name):
    """A window folds bfloat16 partials in float32: 512 partials of 16 (a bf16 running sum stalls at 4096)."""
    naive = jnp.bfloat16(0)
    for _ in range(512):
        naive = naive + jnp.bfloat16(16)
    assert float(naive) == 4096.0
    bf16 = np.dtype(jnp.bfloat16)
    spec = WindowSpec(((4, 4),), (bf16,), (512,), 1, 512, (), False)
    program = kernels.get_backend(backend_name).compile_window(Sum(axes=(0, 1)), spec)
    out = program([jnp.ones((512, 4, 4), bf16)], jnp.arange(512, dtype=jnp.int32).reshape(1, 512, 1),
                  jnp.ones((1, 512), bool))
    assert out.dtype == np.float32 and float(out[0]) == 8192.0


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_sum_over_many_ragged_tiles(small_tiles, backend_name):
    A = _rand((41, 9))  # 11 x 3 ragged tiles of edge 4
    jask.config.update("backend", backend_name)
    np.testing.assert_allclose(float(jask.sum(jask.from_numpy(A))), A.sum(), rtol=1e-5)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_ragged_blocks_and_scalar_operands(small_tiles, backend_name):
    jask.config.update("backend", backend_name)
    A, B = _rand((9, 6)), _rand((6, 7), 2)
    s = jnp.float32(-1.25)
    np.testing.assert_allclose(np.asarray(jask.from_numpy(A) * s), A * s, rtol=RTOL)
    np.testing.assert_allclose(np.asarray(jask.dot(jask.from_numpy(A), jask.from_numpy(B))), A @ B,
                               rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_gradient_windows(small_tiles, backend_name):
    """GradOp (backward as a block-parallel op with a tabulated index_map) through the executor's windows."""
    jask.config.update("backend", backend_name)
    A, B = _rand((9, 6)), _rand((6, 5), 1)
    ga, gb = jax.grad(lambda a, b: jask.sum(jask.dot(a, b)), argnums=(0, 1))(jask.from_numpy(A), jask.from_numpy(B))
    G = np.ones((9, 5), np.float32)
    np.testing.assert_allclose(np.asarray(ga), G @ B.T, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(np.asarray(gb), A.T @ G, rtol=RTOL, atol=ATOL)


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


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_index_dependent_k_and_empty_tiles(small_tiles, backend_name):
    jask.config.update("backend", backend_name)
    A = _rand((12, 4))
    want = np.concatenate([A[:4], A[:4] + A[4:8], A[:4] + A[4:8] + A[8:]])
    np.testing.assert_allclose(np.asarray(make_op(PrefixRows)(jask.from_numpy(A))), want, rtol=RTOL)
    want = A.copy()
    want[4:8] = 0
    np.testing.assert_allclose(np.asarray(make_op(EvenRowsOnly)(jask.from_numpy(A))), want)


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
        r = bench_op(op, n=24, block=8, backend=backend_name, repeat=1, dtype="float32", path="window")
        assert r["max_abs_err"] < 1e-3 and r["ratio"] > 0


def test_benchmark_command_line():
    out = subprocess.run([sys.executable, "-m", "jask.bench.kernels", "--op=add,sum", "--n=32", "--block=16",
                          "--backend=xla", "--repeat=1"], capture_output=True, text=True, check=True)
    assert "ratio" in out.stdout and "GB/s" in out.stdout


def test_benchmark_compares_panels_on_and_off_in_one_run():
    """``--panels=on,off`` times the tiles path both ways; both agree with jnp."""
    out = subprocess.run([sys.executable, "-m", "jask.bench.kernels", "--op=dot", "--n=48", "--block=16",
                          "--backend=xla", "--repeat=1", "--path=tiles", "--panels=on,off"],
                         capture_output=True, text=True, check=True)
    lines = [ln for ln in out.stdout.splitlines() if "ratio" in ln]
    assert [("panels=on" in ln, "panels=off" in ln) for ln in lines] == [(True, False), (False, True)], out.stdout
    errors = [float(ln.rsplit("max |err| ", 1)[1]) for ln in lines]
    assert max(errors) < 1e-3, out.stdout
    bad = subprocess.run([sys.executable, "-m", "jask.bench.kernels", "--panels=maybe"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--panels takes on, off or on,off; got 'maybe'" in bad.stderr


@pytest.mark.slow
def test_benchmark_compares_bands_on_and_off_in_one_run():
    """``--path=jask --bands=on,off``: the whole pipeline both ways, the bytes each read printed; a 2048^2
    product in tiles of 256 takes 4 windows in bands, 10 row-major (16 MiB windows), and either reads its
    32 MiB of inputs once: the panels a later window reads again are kept (jask.exec.kept_reads; without
    that, 64 MiB in bands and 160 row-major)."""
    out = subprocess.run([sys.executable, "-m", "jask.bench.kernels", "--op=dot", "--n=2048", "--block=256",
                          "--backend=xla", "--repeat=1", "--path=jask", "--bands=on,off"],
                         capture_output=True, text=True, check=True)
    lines = [ln for ln in out.stdout.splitlines() if "ratio" in ln]
    assert [("bands=on" in ln, "bands=off" in ln) for ln in lines] == [(True, False), (False, True)], out.stdout
    assert "read 32 MiB in 4 windows" in lines[0] and "read 32 MiB in 10 windows" in lines[1], out.stdout
    assert max(float(ln.rsplit("max |err| ", 1)[1]) for ln in lines) < 1e-2, out.stdout
