"""Pallas window programs (``PallasBackend.compile_window``) against a plain numpy reference, and the lowering gate.

Each window program computes ``out[i] = fold_k combine(forward_block(stacks[j][table[i, k, j]]...))``
over the valid entries of tile i (see ``jask/kernels/window.py``). The reference
below is that formula written in numpy. The ``tpu`` kernels (grid folds) run in
interpret mode, as the ``pallas-interpret`` backend does; the ``gpu`` (Triton)
kernels (in-kernel folds) run in interpret mode too, so their math is checked on
CPU. Small ``Limits`` force inner blocks at small tiles.
"""
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from jask import kernels
from jask.bench import lowering
from jask.hijax.compat import JAX_VERSION
from jask.kernels import legality
from jask.kernels.legality import Limits, WindowNotLegal
from jask.kernels.pallas_window import window_program
from jask.kernels.window import WindowSpec
from jask.linalg.add import Add
from jask.linalg.dot import Dot
from jask.linalg.mul import ScalarMul
from jask.linalg.square import Square
from jask.linalg.sub import Sub
from jask.linalg.sum import Sum
from jask.linalg.transpose import Transpose
from jask.ops.reductions import Any
from jask.plan.fusion import LEAF, STEP, EntryProgram, FusedTileOp

TINY = Limits(tpu_pointwise_bytes=2048, tpu_matmul_edge=16, triton_pointwise_elems=128,
              triton_matmul=(16, 16, 16))
TARGETS = [("tpu", legality.LIMITS), ("tpu", TINY), ("gpu", legality.LIMITS), ("gpu", TINY)]
TARGET_IDS = ["tpu", "tpu-inner", "gpu", "gpu-inner"]
BF16_TOL = 2e-2   # relative, for bfloat16 inputs (8 bits of mantissa)


def _spec(blocks, dtype, rows, n, k, out_block, direct=False):
    return WindowSpec(tuple(map(tuple, blocks)), tuple(np.dtype(dtype) for _ in blocks), tuple(rows), n, k,
                      tuple(out_block), direct)


def _operands(spec, seed=0, table=None, valid=None):
    rng = np.random.default_rng(seed)
    stacks = [rng.standard_normal((m, *b)).astype(d) for m, b, d in
              zip(spec.stack_rows, spec.leaf_blocks, spec.leaf_dtypes)]
    if table is None:
        if spec.direct:
            table = np.repeat(np.arange(spec.n_tiles, dtype=np.int32)[:, None, None], len(stacks), axis=2)
        else:
            table = np.stack([rng.integers(0, m, (spec.n_tiles, spec.k)) for m in spec.stack_rows], -1)
    if valid is None:
        valid = np.ones((spec.n_tiles, spec.k), bool)
    return stacks, np.asarray(table, np.int32), np.asarray(valid)


def _reference(op, stacks, table, valid):
    """The window formula: float32 blocks (bfloat16 leaves widened first), folded in float64."""
    out = []
    for i in range(table.shape[0]):
        acc = None
        for k in range(table.shape[1]):
            if valid[i, k]:
                blocks = [jnp.asarray(np.asarray(s[table[i, k, j]], np.float32)) for j, s in enumerate(stacks)]
                p = np.asarray(op.forward_block(*blocks), np.float64)
                acc = p if acc is None else acc + p
        out.append(acc)
    return np.stack(out)


def _check(op, spec, target, limits, seed=0, table=None, valid=None):
    stacks, table, valid = _operands(spec, seed, table, valid)
    run = jax.jit(window_program(op, spec, target, interpret=True, limits=limits))
    got = run([jnp.asarray(s) for s in stacks], jnp.asarray(table), jnp.asarray(valid))
    low = any(np.dtype(d).itemsize < 4 for d in spec.leaf_dtypes)
    assert got.dtype == np.float32 and got.shape == (spec.n_tiles, *spec.out_block)
    want = _reference(op, stacks, table, valid)
    tol = dict(rtol=BF16_TOL, atol=BF16_TOL * np.abs(want).max()) if low else dict(rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(np.asarray(got), want, **tol)
    return run, (stacks, table, valid)


DTYPES = [np.float32, jnp.bfloat16]


@pytest.mark.parametrize("target, limits", TARGETS, ids=TARGET_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_elementwise_direct(target, limits, dtype):
    spec = _spec([(16, 128), (16, 128)], dtype, (3, 3), 3, 1, (16, 128), direct=True)
    _check(Add(), spec, target, limits)


@pytest.mark.parametrize("target, limits", TARGETS, ids=TARGET_IDS)
def test_scalar_leaf(target, limits):
    spec = WindowSpec(((16, 128), ()), (np.dtype(np.float32),) * 2, (4, 4), 4, 1, (16, 128), True)
    _check(ScalarMul(), spec, target, limits)


@pytest.mark.parametrize("target, limits", TARGETS, ids=TARGET_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_dot_with_padded_entries(target, limits, dtype):
    """K = 3 with tiles that have 3, 2 and 1 entries: invalid (padding) entries must not count."""
    valid = np.ones((4, 3), bool)
    valid[1, 2] = False
    valid[3, 1:] = False
    spec = _spec([(32, 32), (32, 32)], dtype, (7, 7), 4, 3, (32, 32))
    _check(Dot(), spec, target, limits, valid=valid)


@pytest.mark.parametrize("target, limits", TARGETS, ids=TARGET_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_sum_many_entries_to_one_tile(target, limits, dtype):
    spec = _spec([(8, 16)], dtype, (40,), 1, 40, ())
    _check(Sum(axes=(0, 1)), spec, target, limits, table=np.arange(40).reshape(1, 40, 1))


@pytest.mark.parametrize("target, limits", TARGETS, ids=TARGET_IDS)
def test_transpose(target, limits):
    spec = _spec([(8, 16)], np.float32, (4,), 4, 1, (16, 8), direct=True)
    _check(Transpose(None, 2), spec, target, limits)


def _fused_sub_square(dtype, shape):
    steps = [(Sub(), ((LEAF, 0), (LEAF, 1)), np.dtype(dtype), shape, "sub")]
    return FusedTileOp(EntryProgram([], steps, Square(), ((STEP, 0),), 1))


@pytest.mark.parametrize("target, limits", TARGETS, ids=TARGET_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_fused_chain(target, limits, dtype):
    """(a - b)^2 as one fused program: pointwise, so it runs on inner blocks under TINY limits."""
    spec = _spec([(16, 128), (16, 128)], dtype, (6, 6), 3, 2, (16, 128))
    _check(_fused_sub_square(dtype, (16, 128)), spec, target, limits)


@pytest.mark.parametrize("target", ["tpu", "gpu"])
def test_one_pallas_call_per_window(target):
    spec = _spec([(32, 32), (32, 32)], np.float32, (6, 6), 4, 3, (32, 32))
    stacks, table, valid = _operands(spec)
    jaxpr = jax.make_jaxpr(window_program(Dot(), spec, target, True, TINY))(stacks, table, valid)
    assert [e.primitive.name for e in jaxpr.jaxpr.eqns].count("pallas_call") == 1


def test_the_tpu_program_takes_tiles_from_the_stacks_through_the_scalar_prefetched_table():
    """On TPU the BlockSpec index maps look each (tile, entry)'s stack row up in the table (scalar
    prefetch): no gathered (n_tiles, K, *block) copy is made (it cost a v5e's n=8192 dot 0.35x -> 0.76x of
    jnp in bf16). The GPU program still gathers (Triton has no scalar prefetch)."""
    spec = _spec([(32, 32), (32, 32)], np.float32, (6, 6), 4, 3, (32, 32))
    stacks, table, valid = _operands(spec)
    for target, gathers in (("tpu", False), ("gpu", True)):
        jaxpr = jax.make_jaxpr(window_program(Dot(), spec, target, True, TINY))(stacks, table, valid)
        assert ("gather" in legality._all_prims(jaxpr.jaxpr)) == gathers, target
    call = next(e for e in jax.make_jaxpr(window_program(Dot(), spec, "tpu", True, TINY))(
        stacks, table, valid).jaxpr.eqns if e.primitive.name == "pallas_call")
    assert [v.aval.shape for v in call.invars[2:]] == [(6, 32, 32), (6, 32, 32)]


@pytest.mark.parametrize("target, limits", TARGETS[:2], ids=TARGET_IDS[:2])
def test_a_scalar_leaf_is_looked_up_through_the_table(target, limits):
    spec = WindowSpec(((16, 128), ()), (np.dtype(np.float32),) * 2, (5, 5), 4, 1, (16, 128), False)
    _check(ScalarMul(), spec, target, limits, table=np.array([[[4, 1]], [[0, 3]], [[2, 2]], [[4, 0]]]))


def test_tpu_matmul_blocks_shrink_to_the_matmul_vmem_budget():
    f32, bf16 = np.dtype(np.float32), np.dtype(jnp.bfloat16)
    big = _spec([(1024, 1024)] * 2, f32, (4, 4), 4, 2, (1024, 1024))
    assert legality.plan(Dot(), big, f32, "tpu").inner == (1024, 1024, 512)
    small = Limits(tpu_matmul_vmem=8 << 20)
    assert legality.plan(Dot(), big, f32, "tpu", small).inner == (512, 512, 512)
    odd = _spec([(1000, 1000)] * 2, bf16, (4, 4), 4, 2, (1000, 1000))
    assert legality.plan(Dot(), odd, f32, "tpu").inner == (1000, 1000, 1000)   # no 128-multiple divides 1000
    with pytest.raises(WindowNotLegal, match="exceed the TPU VMEM budget"):
        legality.plan(Dot(), odd, f32, "tpu", Limits(tpu_matmul_vmem=1 << 20))


def test_a_tpu_window_whose_table_passes_scalar_memory_is_refused_by_name():
    """The table is scalar-prefetched into SMEM (1 MiB on a v5e): a window too big for it goes to xla
    instead of failing in Mosaic's compile. The executor's windows (<= 256 entries) stay far below."""
    spec = _spec([(128, 128), (128, 128)], np.float32, (64, 64), 64, 1024, (128, 128))
    with pytest.raises(WindowNotLegal, match="scalar memory"):
        legality.plan(Dot(), spec, np.dtype(np.float32), "tpu")
    assert legality.plan(Dot(), spec, np.dtype(np.float32), "gpu").kind == "matmul"   # Triton gathers instead
    small = _spec([(128, 128), (128, 128)], np.float32, (64, 64), 16, 16, (128, 128))
    assert legality.plan(Dot(), small, np.dtype(np.float32), "tpu").kind == "matmul"


def test_backend_compile_window_is_one_call_and_exact():
    backend = kernels.get_backend("pallas-interpret")
    spec = _spec([(8, 8), (8, 8)], np.float32, (4, 4), 4, 1, (8, 8), direct=True)
    stacks, table, valid = _operands(spec)
    run = backend.compile_window(Add(), spec)
    np.testing.assert_array_equal(np.asarray(run(stacks, table, valid)), stacks[0] + stacks[1])
    jaxpr = jax.make_jaxpr(run)(stacks, table, valid)
    assert "pallas_call" in str(jaxpr) and str(jaxpr).count("pallas_call[") == 1
    assert backend.max_tile_edge([np.float32], 2) is None


def test_classify_and_refusals():
    f32 = np.float32
    acc = np.dtype(f32)
    assert legality.classify(Add(), _spec([(8, 8)] * 2, f32, (1, 1), 1, 1, (8, 8)), acc)[0] == "pointwise"
    assert legality.classify(Dot(), _spec([(8, 8)] * 2, f32, (1, 1), 1, 2, (8, 8)), acc)[0] == "matmul"
    assert legality.classify(Sum(axes=(0, 1)), _spec([(8, 8)], f32, (1,), 1, 2, ()), acc)[0] == "general"
    assert legality.classify(Transpose(None, 2), _spec([(8, 16)], f32, (1,), 1, 1, (16, 8)), acc)[0] == "general"
    big = _spec([(1024, 1024)], f32, (1,), 1, 4, ())
    with pytest.raises(WindowNotLegal, match="Triton"):
        window_program(Sum(axes=(0, 1)), big, "gpu", interpret=False)
    with pytest.raises(WindowNotLegal, match="VMEM"):
        window_program(Sum(axes=(0, 1, 2)), _spec([(2, 2048, 1024)], f32, (1,), 1, 4, ()), "tpu", interpret=False)
    assert legality.max_tile_edge("gpu", [f32], 2) == 128
    assert legality.max_tile_edge("tpu", [f32], 2) == 512


def test_refusals_found_compiling_on_a_tpu():
    """What Mosaic refused on a TPU v5e although jax.export lowered it is refused up front there only."""
    import jax.numpy as jnp
    from jask.ops.elementwise import Elementwise
    f32, f16 = np.dtype(np.float32), np.dtype(np.float16)
    expm1 = Elementwise(jnp.expm1, shapes=[(8, 128)], dtypes=[f32], name="expm1")
    spec = _spec([(8, 128)], f32, (1,), 1, 1, (8, 128))
    with pytest.raises(WindowNotLegal, match="no tpu lowering for expm1"):
        legality.plan(expm1, spec, f32, "tpu")
    assert legality.plan(expm1, spec, f32, "gpu").kind == "pointwise"
    half = _spec([(8, 128)] * 2, f16, (1, 1), 1, 1, (8, 128))
    with pytest.raises(WindowNotLegal, match="float16 vectors"):
        legality.plan(Add(), half, f16, "tpu")
    assert legality.plan(Add(), _spec([(8, 128)] * 2, jnp.bfloat16, (1, 1), 1, 1, (8, 128)),
                         np.dtype(jnp.bfloat16), "tpu").kind == "pointwise"
    through_half = Elementwise(lambda x: x.astype(jnp.float16).astype(jnp.float32), shapes=[(8, 128)],
                               dtypes=[f32], name="through_half")   # float32 in and out, float16 inside
    with pytest.raises(WindowNotLegal, match="float16 vectors"):
        legality.plan(through_half, spec, f32, "tpu")
    assert legality.plan(through_half, spec, f32, "gpu").kind == "pointwise"
    i32, i64 = np.dtype(np.int32), np.dtype(np.int64)
    int_dot = _spec([(16, 128), (128, 128)], i32, (1, 1), 1, 1, (16, 128))
    with pytest.raises(WindowNotLegal, match="no tpu lowering for integer dot_general"):
        legality.plan(Dot(), int_dot, i32, "tpu")
    assert legality.plan(Dot(), int_dot, i32, "gpu").kind == "matmul"
    assert legality.plan(Add(), _spec([(8, 128)] * 2, i32, (1, 1), 1, 1, (8, 128)), i32, "tpu").kind == "pointwise"
    boolean = np.dtype(np.bool_)
    any_all = Any(axes=(0, 1), shape=(16, 256), grid=(2, 2))        # a full reduction: one bool element
    with pytest.raises(WindowNotLegal, match="no tpu lowering for bool scalars"):
        legality.plan(any_all, _spec([(8, 128)], boolean, (4,), 1, 4, ()), boolean, "tpu")
    assert legality.plan(any_all, _spec([(8, 128)], boolean, (4,), 1, 4, ()), boolean, "gpu").kind == "general"
    along = Any(axes=(0,), shape=(16, 256), grid=(2, 2))             # one bool per column: compiled on the chip
    assert legality.plan(along, _spec([(8, 128)], boolean, (4,), 1, 2, (128,)), boolean, "tpu").kind == "general"
    for narrow in (np.dtype(np.int8), np.dtype(np.uint8)):
        with pytest.raises(WindowNotLegal, match=f"{narrow} vectors"):
            legality.plan(Add(), _spec([(8, 128)] * 2, narrow, (1, 1), 1, 1, (8, 128)), narrow, "tpu")
        assert legality.plan(Add(), _spec([(8, 128)] * 2, narrow, (1, 1), 1, 1, (8, 128)), narrow, "gpu").kind \
            == "pointwise"
    with jax.enable_x64(True):
        with pytest.raises(WindowNotLegal, match="int64 vectors"):
            legality.plan(Add(), _spec([(8, 128)] * 2, i64, (1, 1), 1, 1, (8, 128)), i64, "tpu")


# ---------------------------------------------------------------- the lowering gate

def test_gate_covers_the_ops_table():
    test_ops = pytest.importorskip("test_ops")
    names = {c.name for c in lowering.cases((8,), ("float32",))}
    operators = {"matmul_operator": "dot", "T_operator": "transpose", "arith_operators": "fused_sub_square",
                 "pow_div_operators": "fused_sub_square", "mul_jaxscalar_array": "mul_array_jaxscalar",
                 "mul_pyfloat_array": "mul_array_pyfloat", "mul_jaxscalar_array_operator": "mul_array_jaxscalar",
                 "chain_dot_sub_square": "fused_sub_square", "chain_add_scalarmul_T_dot": "fused_add_scalarmul_T",
                 "chain_shared_input": "fused_sub_square",
                 # jask.numpy rows: the generic elementwise op over broadcast operands, and the reductions
                 **{i: "np_broadcast_row" for i in ("np_add_bias_row", "np_mul_outer_broadcast", "np_sub_3d_broadcast")},
                 **{i: "np_elementwise" for i in ("np_pyscalar_rdiv_pow", "np_jaxscalar_maximum_div",
                                                  "np_where_compare", "np_clip_abs_sigmoid")},
                 **{i: "np_sum_axis" for i in ("np_sum_axis1", "np_sum_axes_keepdims", "np_mean_axis0_bias",
                                               "np_var_keepdims", "np_std_all", "np_norm_axis", "np_norm_fro")},
                 **{i: "np_max_axis" for i in ("np_max_axis", "np_min_all", "np_logsumexp_axes",
                                               "np_logsumexp_all", "nn_softmax", "nn_log_softmax_axis0",
                                               "nn_logsumexp")},
                 # shape, indexing and contractions: the strided gather, the reshape, transpose and dot
                 **{i: "np_strided" for i in ("getitem_steps", "getitem_int_none", "getitem_ellipsis",
                                              "np_concatenate", "np_concatenate_axis1", "np_stack")},
                 **{i: "np_reshape" for i in ("reshape_merge", "np_reshape_split", "np_expand_squeeze")},
                 **{i: "transpose_axes" for i in ("transpose_positional_axes", "np_moveaxis_swapaxes",
                                                  "np_einsum_transpose")},
                 "np_matmul_inmemory_weight": "dot", "np_einsum_matmul": "dot", "np_einsum_batched": "dot_batched",
                 "np_einsum_full": "fused_sub_square_sum", "nn_relu_sigmoid": "np_elementwise"}
    # issue-14 rows added 2026-12-05 (index arrays, masks, take, rechunking reshapes, broadcast_to, *_like), with
    # cases of their own since 2026-12-06; the gathers are refused (no Pallas gather lowering): they run as xla
    operators.update({"reshape_rechunk_flat": "np_reshape_rechunk", "np_reshape_rechunk_regroup": "np_reshape_rechunk",
                      "reshape_rechunk_merge_leading": "np_reshape_rechunk", "getitem_int_array": "np_take",
                      "getitem_bool_mask": "np_take", "np_take_axis": "np_take", "np_broadcast_to": "np_broadcast_to",
                      "np_like": "np_full"})
    missing = [p.id for p in test_ops.OPS if operators.get(p.id, p.id) not in names]
    assert not missing


def test_the_gather_and_fill_rows_lower_or_are_refused_by_name():
    """The gathers of take, index arrays, masks and rechunking reshapes are refused up front (xla runs
    them); broadcast_to and full/*_like lower for both platforms at 128^2 tiles."""
    names = ("np_take", "np_reshape_rechunk", "np_broadcast_to", "np_full")
    results = {(c.name, p): lowering.check(c, p) for c in lowering.cases((128,), ("float32",)) if c.name in names
               for p in ("cuda", "tpu")}
    assert {k: r.status for k, r in results.items()} == {
        **{(n, p): "refused" for n in names[:2] for p in ("cuda", "tpu")},
        **{(n, p): "ok" for n in names[2:] for p in ("cuda", "tpu")}}
    assert all("lowering for gather" in results[(n, p)].message for n in names[:2] for p in ("cuda", "tpu"))


def _whole_tile_add(target):
    """A ``pallas_call`` adding two 1024x1024 float32 tiles as whole blocks, which no window program emits."""
    def add(a, b):
        def kernel(x, y, o):
            o[...] = x[...] + y[...]
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype))(a, b)
    x = jax.ShapeDtypeStruct((1024, 1024), np.float32)
    return add, (x, x)


def _ragged_triton_add(target):
    """A Triton ``pallas_call`` over 200-element blocks: Triton loads only power-of-two blocks."""
    from jax.experimental.pallas import triton as pltriton

    def add(a, b):
        def kernel(x, y, o):
            o[...] = x[...] + y[...]
        spec = pl.BlockSpec((200,), lambda i: (i,))
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype), grid=(5,), in_specs=[spec] * 2,
                              out_specs=spec, compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=2))(a, b)
    x = jax.ShapeDtypeStruct((1000,), np.float32)
    return add, (x, x)


@pytest.mark.skipif(JAX_VERSION >= (0, 11), reason="jax 0.11+ lowers pl.pallas_call for GPU with Triton and has "
                    "no Mosaic GPU rule for it (plgpu.kernel replaced it); the Triton case below runs on every version")
def test_gate_reports_an_illegal_block_as_a_failure():
    """A whole-tile block of a 1024x1024 float32 add does not fit Mosaic GPU's shared memory (the H200's error)."""
    case = lowering.Case("whole_tile_add", 1024, "float32", "blocks=[(1024, 1024)] * 2 whole tile", _whole_tile_add)
    r = lowering.check(case, "cuda")
    assert r.status == "FAIL" and "shared memory" in r.message


def test_gate_reports_an_illegal_triton_block_as_a_failure():
    """Lowered for cuda with no GPU attached (jax 0.12 needs the abstract H200 the gate supplies)."""
    case = lowering.Case("ragged_triton_add", 200, "float32", "blocks=[(200,)] * 2", _ragged_triton_add)
    r = lowering.check(case, "cuda")
    assert r.status == "FAIL" and "power of 2" in r.message, r.message


def test_gate_reports_a_refusal_as_a_refusal():
    case = next(c for c in lowering.cases((1024,), ("float32",)) if c.name == "sum")
    assert lowering.check(case, "cuda").status == "refused"


@pytest.mark.slow
def test_quick_gate_passes():
    out = subprocess.run([sys.executable, "-m", "jask.bench.lowering", "--quick", "--platforms=cuda,tpu"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = next(line for line in out.stdout.splitlines() if line.startswith("summary:"))
    assert " 0 failed" in summary and int(summary.split()[1]) > 100


def test_tpu_matmul_accumulates_over_inner_contraction_blocks():
    limits = Limits(tpu_matmul_edge=128)
    spec = _spec([(16, 256), (256, 128)], np.float32, (5, 5), 2, 2, (16, 128))
    assert legality.plan(Dot(), spec, np.dtype(np.float32), "tpu", limits).inner == (16, 128, 128)
    _check(Dot(), spec, "tpu", limits)


def test_inner_blocks_under_small_limits():
    f32 = np.dtype(np.float32)
    pointwise = _spec([(16, 128)] * 2, f32, (1, 1), 1, 1, (16, 128))
    assert legality.plan(Add(), pointwise, f32, "tpu", TINY).inner == (8, 128)
    assert legality.plan(Add(), pointwise, f32, "gpu", TINY).inner == (128,)
    mm = _spec([(32, 32)] * 2, f32, (1, 1), 1, 2, (32, 32))
    assert legality.plan(Dot(), mm, f32, "gpu", TINY).inner == (16, 16, 16)
