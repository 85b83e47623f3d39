"""Lowering gate: every window program jask emits, lowered for TPU and GPU without an accelerator.

    python -m jask.bench.lowering --platforms=cuda,tpu [--quick]

For each op of the ``OPS`` table in ``tests/test_ops.py`` (built from its
class's ``from_inputs``), a few fused chains (:class:`FusedTileOp`) and window
shapes (direct elementwise, ``dot`` with K > 1, ``sum`` with many entries, a joined window), at
tile edges 4..1024 and one ragged edge, in float32 and bfloat16, the Pallas
window program is exported with ``jax.export.export(jax.jit(f), platforms=[p])``.
One line per kernel: ``ok``, ``refused`` (the backend raised WindowNotLegal up
front: the executor runs the ``xla`` program for that window) or ``FAIL`` with
the compiler's message. Exit status 1 if any kernel the backend claimed legal
failed to lower.

It lives with the tools, not in ``jask/kernels``: it builds ops and fused
programs (``jask.linalg``, ``jask.ops``, ``jask.plan``) as the executor would,
and the kernels layer imports nothing outside its folder.
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from jask.kernels.legality import WindowNotLegal
from jask.kernels.pallas_window import window_program
from jask.kernels.window import WindowSpec

TARGET = {"cuda": "gpu", "tpu": "tpu"}
EDGES = (4, 8, 16, 32, 64, 128, 256, 512, 1024, 200)   # 200: a ragged edge (not a power of two)
QUICK_EDGES = (8, 128, 1024, 200)
DTYPES = ("float32", "bfloat16")
_DISABLED = [jax.export.DisabledSafetyCheck.custom_call(t)
             for t in ("__gpu$xla.gpu.triton", "triton_kernel_call", "mosaic_gpu", "mosaic_gpu_v2")]


@dataclasses.dataclass
class Case:
    """One kernel to lower: ``build()`` gives the function and its argument structs, or raises WindowNotLegal."""

    name: str
    edge: int
    dtype: str
    describe: str
    build: object   # (target) -> (fn, arg structs)


@dataclasses.dataclass
class Result:
    status: str     # ok | refused | FAIL
    message: str = ""


def _lowering_target(platform: str):
    """Where no GPU is attached, an abstract H200 for lowering to ``cuda``: jax 0.12's Triton lowering asks
    the default device for its compute capability (jax 0.10/0.11 lowered without one)."""
    if platform != "cuda" or any(d.platform == "gpu" for d in jax.devices()):
        return contextlib.nullcontext()
    h200 = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=None, platform="gpu")
    mesh = jax.sharding.AbstractMesh((1,), ("gate",), (jax.sharding.AxisType.Auto,), abstract_device=h200)
    return jax.sharding.use_abstract_mesh(mesh)


def check(case: Case, platform: str) -> Result:
    """Lower ``case`` for ``platform``: ok, refused (WindowNotLegal) or FAIL with the compiler's message."""
    try:
        fn, structs = case.build(TARGET[platform])
    except WindowNotLegal as e:
        return Result("refused", str(e))
    try:
        with _lowering_target(platform):
            jax.export.export(jax.jit(fn), platforms=[platform], disabled_checks=_DISABLED)(*structs)
    except Exception as e:  # noqa: BLE001 - any lowering failure is the report
        msg = " ".join(str(e).split())
        return Result("FAIL", f"{type(e).__name__}: {msg[:400]}")
    return Result("ok")


# ---------------------------------------------------------------- what jask emits

def _tiled(shape, dtype, edge):
    from jask.graph.op import TiledInput
    return TiledInput(tuple(shape), np.dtype(dtype), tuple(min(edge, d) for d in shape))


def _window_case(name, op, blocks, dtypes, out_block, k, edge, dtype, n_tiles=2, direct=None):
    direct = k == 1 if direct is None else direct
    spec = WindowSpec(tuple(map(tuple, blocks)), tuple(np.dtype(d) for d in dtypes),
                      tuple(n_tiles * k for _ in blocks), n_tiles, k, tuple(out_block), direct)

    def build(target):
        return window_program(op, spec, target, interpret=False), spec.operand_structs()

    describe = f"blocks={list(spec.leaf_blocks)} out={spec.out_block} K={k}{' direct' if direct else ''}"
    return Case(name, edge, dtype, describe, build)


def _op_case(name, cls, shapes, edge, dtype, scalar=None, **kw):
    """An op built by ``cls.from_inputs`` over arrays of ``shapes`` (one window of its first output tile)."""
    ins = [_tiled(s, dtype, edge) for s in shapes]
    op = cls.from_inputs(*ins, **kw) if hasattr(cls, "from_inputs") else cls()
    if scalar is not None:
        ins.insert(scalar, None)
    out_shape = op.output_shape(*[() if i is None else i.shape for i in ins])
    entries = op.index_map((0,) * len(out_shape))
    blocks = [() if i is None else i.block_shape for i in ins]
    out_block = tuple(min(edge, d) for d in out_shape)
    return _window_case(name, op, blocks, [dtype] * len(blocks), out_block, len(entries), edge, dtype)


def _fused_case(name, steps, root, n_leaves, blocks, out_block, k, edge, dtype):
    from jask.plan.fusion import EntryProgram, FusedTileOp
    op = FusedTileOp(EntryProgram([], steps, root[0], root[1], len(steps)))
    return _window_case(name, op, blocks, [dtype] * n_leaves, out_block, k, edge, dtype)


def _joined_case(edge, dtype):
    """A joined window (``jask.exec.joined_window``) as the executor builds it on Pallas: two ``dot`` output
    tiles (K = 3) from separate tiles stacked in the program, then the sum of both, folded into a carried
    partial that may be a placeholder (``stacked_tiles_program`` with ``carried`` and ``maybe``)."""
    from jask.kernels.window import stacked_tiles_program
    from jask.linalg.dot import Dot
    from jask.linalg.sum import Sum
    t, k, dt = (edge, edge), 3, np.dtype(dtype)
    dot_spec = WindowSpec((t, t), (dt, dt), (2 * k, 2 * k), 2, k, t)
    dot_table = np.arange(2 * k, dtype=np.int32).reshape(2, k, 1).repeat(2, axis=2)
    sum_spec = WindowSpec((t,), (dt,), (2,), 1, 2, ())
    sum_table = np.arange(2, dtype=np.int32).reshape(1, 2, 1)

    def build(target):
        products = stacked_tiles_program(window_program(Dot(), dot_spec, target, interpret=False), Dot(), dot_spec,
                                         dot_table, np.ones((2, k), bool))
        sums = stacked_tiles_program(window_program(Sum(axes=(0, 1)), sum_spec, target, interpret=False),
                                     Sum(axes=(0, 1)), sum_spec, sum_table, np.ones((1, 2), bool), (0,), (0,))

        def window(*flat):
            tiles, acc, present = flat[:4 * k], flat[4 * k], flat[4 * k + 1]
            return sums(*[p.astype(dt) for p in products(*tiles)], acc, present)

        structs = [jax.ShapeDtypeStruct(t, dt)] * (4 * k) + [jax.ShapeDtypeStruct((), np.float32),
                                                             jax.ShapeDtypeStruct((1,), np.bool_)]
        return window, structs

    return Case("joined_dot_then_sum", edge, dtype, f"dot tiles {t} K={k} -> sum, carried partial", build)


def _shape_cases(edge, dtype):
    """jask.numpy shape ops: a strided row gather (slices, concatenate) and a regrouping reshape."""
    from jask.ops.indexing import Strided
    from jask.ops.shape import Reshape
    n, m = 3 * edge, 3 * edge // 2
    x, in_rows, out_rows = _tiled((n, n), dtype, edge), _tiled((n, 1), np.int32, edge), _tiled((m, 1), np.int32, edge)
    op = Strided.from_inputs(x, in_rows, out_rows, axes=(0,), starts=(1,), steps=(2,), out_shape=(m, n))
    strided = _window_case("np_strided", op, [x.block_shape, in_rows.block_shape, out_rows.block_shape],
                           [dtype, np.int32, np.int32], (min(edge, m), min(edge, n)), len(op.index_map((0, 0))),
                           edge, dtype)
    x, witness = _tiled((n, 2, 2), dtype, edge), _tiled((1, 4), np.bool_, edge)
    op = Reshape.from_inputs(x, witness, out_shape=(n, 4))
    reshape = _window_case("np_reshape", op, [x.block_shape, witness.block_shape], [dtype, np.bool_],
                           (min(edge, n), 4), 1, edge, dtype)
    return [strided, reshape]


def _gather_and_fill_cases(edge, dtype):
    """jask.numpy rows of issue 14 that are ops of their own: ``take``/index arrays/masks (a row gather),
    reshapes that cross tiles (a regrouping gather), ``broadcast_to`` and ``full``/``ones``/``*_like``
    (elementwise over an all-zero witness). The gathers are refused (no Pallas gather lowering)."""
    from jask.ops.creation import _Witnessed, _broadcast, _fill
    from jask.ops.gather import Take
    from jask.ops.regroup import Regroup
    from jask.ops.shape import _groups
    n, m = 3 * edge, 2 * edge
    x, rows, idx = _tiled((n, n), dtype, edge), _tiled((n, 1), np.int32, edge), _tiled((m, 1), np.int32, edge)
    take = Take.from_inputs(x, rows, idx, axis=0, indices=np.arange(m, dtype=np.int64)[::-1] * 3 // 2)
    cases = [_window_case("np_take", take, [x.block_shape, rows.block_shape, idx.block_shape],
                          [dtype, np.int32, np.int32], (min(edge, m), min(edge, n)), 2, edge, dtype)]
    out_shape = (n * n // edge, edge) if edge > 1 else (n * n, 1)
    iotas = [_tiled(tuple(d if a == k else 1 for a in range(2)), np.int32, edge)
             for shape in ((n, n), out_shape) for k, d in enumerate(shape)]
    regroup = Regroup.from_inputs(x, *iotas, out_shape=out_shape, groups=_groups((n, n), out_shape))
    cases.append(_window_case("np_reshape_rechunk", regroup, [x.block_shape] + [i.block_shape for i in iotas],
                              [dtype] + [np.int32] * 4, (min(edge, out_shape[0]), min(edge, out_shape[1])),
                              len(regroup.index_map((0, 0))), edge, dtype))
    witness, row = _tiled((n, n), np.bool_, edge), _tiled((n,), dtype, edge)
    bcast = _Witnessed.from_inputs(witness, row, fn=_broadcast, name="broadcast_to")
    cases.append(_window_case("np_broadcast_to", bcast, [witness.block_shape, row.block_shape], [np.bool_, dtype],
                              witness.block_shape, 1, edge, dtype))
    fill = _Witnessed.from_inputs(witness, fn=_fill, consts=((1, 1.5),), params=(("dtype", np.dtype(dtype)),),
                                  name="full")
    cases.append(_window_case("np_full", fill, [witness.block_shape], [np.bool_], witness.block_shape, 1,
                              edge, dtype))
    return cases


def _np_elementwise(a, b):
    """A jask.numpy-style chain: comparison, where, exp, maximum, clip."""
    return jnp.clip(jnp.where(a > b, jnp.exp(a), jnp.maximum(a, b)), -3.0, 3.0)


def cases(edges, dtypes):
    """Every kernel the gate lowers, at each tile edge and dtype."""
    from jask.plan.fusion import LEAF, STEP
    from jask.linalg.add import Add
    from jask.linalg.dot import Dot
    from jask.linalg.mul import MulArrays, MulConstant, ScalarMul
    from jask.linalg.square import Square
    from jask.linalg.sub import Sub
    from jask.linalg.sum import Sum
    from jask.linalg.transpose import Transpose
    from jask.ops.elementwise import Elementwise
    from jask.ops.reductions import LogSumExp, Max, Prod
    out = []
    for dtype in dtypes:
        for e in edges:
            n, b = 3 * e, 2          # arrays of 3 tiles per dim: K = 3 for dot; b: batch dims
            sq = (n, n)
            out += [
                _op_case("add", Add, [sq, sq], e, dtype),
                _op_case("sub", Sub, [sq, sq], e, dtype),
                _op_case("mul", MulArrays, [sq, sq], e, dtype),
                _op_case("mul_array_pyfloat", MulConstant, [sq], e, dtype, factor=2.5),
                _op_case("mul_array_jaxscalar", ScalarMul, [sq], e, dtype, scalar=1),
                _op_case("square", Square, [sq], e, dtype),
                _op_case("sum", Sum, [sq], e, dtype),
                _op_case("sum_3d", Sum, [(b, n, n)], e, dtype),
                _op_case("dot", Dot, [sq, sq], e, dtype),
                _op_case("dot_batched", Dot, [(b, n, n), (b, n, n)], e, dtype),
                _op_case("dot_3d_2d", Dot, [(b, n, n), sq], e, dtype),
                _op_case("dot_2d_3d", Dot, [sq, (b, n, n)], e, dtype),
                _op_case("dot_batch_broadcast1", Dot, [(1, n, n), (b, n, n)], e, dtype),
                _op_case("dot_matvec", Dot, [sq, (n,)], e, dtype),
                _op_case("dot_vecmat", Dot, [(n,), sq], e, dtype),
                _op_case("dot_vecvec", Dot, [(n,), (n,)], e, dtype),
                _op_case("transpose", Transpose, [sq], e, dtype),
                _op_case("transpose_3d", Transpose, [(b, n, n)], e, dtype),
                _op_case("transpose_axes", Transpose, [(b, n, n)], e, dtype, axes=(2, 0, 1)),
                # jask.numpy: the generic elementwise op (any jnp function, broadcast operands) and reductions
                _op_case("np_elementwise", Elementwise, [sq, sq], e, dtype, fn=_np_elementwise),
                _op_case("np_broadcast_row", Elementwise, [sq, (n,)], e, dtype, fn=jnp.add),
                _op_case("np_sum_axis", Sum, [sq], e, dtype, axis=1),
                _op_case("np_max_axis", Max, [sq], e, dtype, axis=0),
                _op_case("np_prod_axis", Prod, [sq], e, dtype, axis=1),
                _op_case("nn_logsumexp_axis", LogSumExp, [sq], e, dtype, axis=0),
                *_shape_cases(e, dtype),
                *_gather_and_fill_cases(e, dtype),
                _window_case("window_sum_many", Sum(axes=(0, 1)), [(e, e)], [dtype], (), 64, e, dtype, n_tiles=1),
                _window_case("window_dot_k8", Dot(), [(e, e), (e, e)], [dtype] * 2, (e, e), 8, e, dtype,
                             n_tiles=4),
                _window_case("window_add_gathered", Add(), [(e, e), (e, e)], [dtype] * 2, (e, e), 1, e,
                             dtype, n_tiles=4, direct=False),
                _joined_case(e, dtype),
            ]
            t, dt = (e, e), np.dtype(dtype)
            out += [
                _fused_case("fused_sub_square", [(Sub(), ((LEAF, 0), (LEAF, 1)), dt, t, "sub")],
                            (Square(), ((STEP, 0),)), 2, [t, t], t, 1, e, dtype),
                _fused_case("fused_sub_square_sum", [(Sub(), ((LEAF, 0), (LEAF, 1)), dt, t, "sub"),
                                                     (Square(), ((STEP, 0),), dt, t, "square")],
                            (Sum(axes=(0, 1)), ((STEP, 1),)), 2, [t, t], (), 9, e, dtype),
                _fused_case("fused_add_scalarmul_T", [(Add(), ((LEAF, 0), (LEAF, 1)), dt, t, "add"),
                                                      (ScalarMul(), ((STEP, 0), (LEAF, 2)), dt, t, "mul")],
                            (Transpose(None, 2), ((STEP, 1),)), 3, [t, t, ()], t, 1, e, dtype),
                _fused_case("fused_T_dot", [(Transpose(None, 2), ((LEAF, 0),), dt, t, "transpose")],
                            (Dot(), ((STEP, 0), (LEAF, 1))), 2, [t, t], t, 3, e, dtype),
            ]
    return out


# ---------------------------------------------------------------- command line

FLAGS = flags.FLAGS
flags.DEFINE_list("platforms", ["cuda", "tpu"], "Platforms to lower for (cuda, tpu).")
flags.DEFINE_bool("quick", False, f"Tile edges {QUICK_EDGES} only (CI).")
flags.DEFINE_string("only", "", "Lower only cases whose name contains this.")


def run_gate(platforms, edges, dtypes=DTYPES, only="", out=sys.stdout) -> dict:
    """Lower every case on every platform; print one line each and return the counts per status."""
    counts = {"ok": 0, "refused": 0, "FAIL": 0}
    failures = []
    for case in cases(edges, dtypes):
        if only and only not in case.name:
            continue
        for p in platforms:
            r = check(case, p)
            counts[r.status] += 1
            line = f"{r.status:8} {p:5} {case.name:24} {case.dtype:9} edge={case.edge:<5} {case.describe}"
            print(line + (f"  -- {r.message}" if r.message else ""), file=out, flush=True)
            if r.status == "FAIL":
                failures.append(line + f"\n    {r.message}")
    print(f"summary: {counts['ok']} ok, {counts['refused']} refused (xla fallback), {counts['FAIL']} failed",
          file=out)
    for f in failures:
        print("FAILED " + f, file=out)
    counts["failures"] = failures
    return counts


def main(argv):
    del argv
    for p in FLAGS.platforms:
        if p not in TARGET:
            raise app.UsageError(f"unknown platform {p!r}; choose from {sorted(TARGET)}")
    start = time.perf_counter()
    counts = run_gate(FLAGS.platforms, QUICK_EDGES if FLAGS.quick else EDGES, only=FLAGS.only)
    print(f"lowered in {time.perf_counter() - start:.1f}s")
    sys.exit(1 if counts["FAIL"] else 0)


if __name__ == "__main__":
    app.run(main)
