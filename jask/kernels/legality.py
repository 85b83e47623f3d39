"""Which window programs a Pallas platform can run, and with which inner blocks.

A window program (:mod:`jask.kernels.window`) computes ``n_tiles`` output
tiles. Whole tiles are often too big for one Pallas block (a 1024x1024 float32
tile is 4 MiB: Mosaic TPU budgets VMEM, Triton holds a block in registers), so
a program is first *classified* from the jaxprs of ``forward_block`` and
``combine``:

* ``pointwise``: every array leaf block and the output block have one shape and
  both jaxprs are elementwise (scalar leaves may broadcast). Any inner block of
  the tile computes the same inner block of the output.
* ``matmul``: ``forward_block(a, b)`` is one plain 2-D ``dot_general``
  (``a @ b``) and ``combine`` is ``+``: inner blocks of rows, columns and of the
  contraction accumulate into the output block.
* ``general``: anything else (reductions, transposes, batched products, fused
  chains that mix them) runs with whole-tile blocks.

:func:`plan` then picks inner blocks legal on the target, or raises
:class:`WindowNotLegal` (the executor runs that window with the ``xla``
program instead). Rules, per target:

* ``tpu`` (Mosaic; interpret mode uses the same plans): the last two dims of a
  block are multiples of (8, 128) (16 rows for 2-byte dtypes) or the full dims;
  double-buffered blocks plus in-kernel temporaries fit ``Limits.vmem_budget``.
* ``gpu`` (Triton, chosen over Mosaic GPU: Mosaic GPU stages every block in
  shared memory (~227 KB on Hopper) and wants 128-byte copies, while Triton
  loads what the kernel indexes into registers and lets the fold over entries
  be an in-kernel loop): every loaded block is a power of two elements,
  inner blocks divide the tile exactly (Triton does not mask out-of-bounds
  blocks), dot operands are at least 16x16, whole-tile blocks at most
  ``Limits.triton_whole_elems`` elements.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

ELEMENTWISE = frozenset("""
    abs acos acosh add and asin asinh atan atan2 atanh cbrt ceil clamp convert_element_type copy copy_p cos
    cosh div eq erf erf_inv erfc exp exp2 expm1 floor ge gt imag integer_pow is_finite le lgamma digamma log
    log1p logistic lt max min mul ne neg nextafter not or pow real reduce_precision rem round rsqrt
    select_n sign sin sinh sqrt square stop_gradient sub tan tanh xor
""".split())
_CALLS = ("jaxpr", "call_jaxpr", "fun_jaxpr")   # params holding a sub-jaxpr (pjit, custom_jvp_call, ...)


class WindowNotLegal(Exception):
    """This Pallas platform cannot run this window program; run the ``xla`` program for it instead."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource budgets per block, by platform (bytes or elements)."""

    vmem_budget: int = 16 << 20        # TPU: double-buffered blocks + temporaries
    vmem_limit: int = 32 << 20         # TPU: scoped VMEM the kernel may use (compiler setting)
    # TPU matmul: inner (bm, bn) at most this and bk at most tpu_matmul_k, halving (bm, bn) until the blocks
    # fit tpu_matmul_vmem (a matmul has no other temporaries, so it may use more of vmem_limit). On a v5e,
    # n=8192 in 1024^2 tiles: (1024, 1024, 512) 0.88x jnp bf16 and 1.02x float32 against (512, 512, 512)
    # 0.76x and 1.00x (tpu_tests/matmul_probe.py, 2026-12-06); bk = 1024 lost 10% in float32.
    tpu_matmul_edge: int = 1024
    tpu_matmul_k: int = 512
    tpu_matmul_vmem: int = 26 << 20
    tpu_pointwise_bytes: int = 1 << 20  # TPU: one operand's inner block in a pointwise program
    tpu_smem_bytes: int = 512 << 10    # TPU: the scalar-prefetched table and mask, scalar stacks (SMEM: 1 MiB on v4+)
    triton_pointwise_elems: int = 4096  # GPU: one operand's inner block in a pointwise program
    triton_whole_elems: int = 16384    # GPU: one whole-tile block (general programs)
    triton_matmul: tuple = (64, 64, 32)  # GPU: (bm, bn, bk) at most
    triton_min_dot: int = 16           # GPU: tt.dot operands are at least 16 in every dim


LIMITS = Limits()


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one window program is blocked.

    ``inner``: pointwise: the inner block of the tile (tpu: per dim of the
    tile; gpu: of the flattened tile); matmul: ``(bm, bn, bk)``; general: ``()``.
    """

    kind: str
    inner: tuple = ()


# ---------------------------------------------------------------- classifying a program

def _prims(jaxpr) -> list[str]:
    """Primitive names of a jaxpr, call primitives (pjit, custom_jvp) replaced by their bodies."""
    out = []
    for eqn in jaxpr.eqns:
        sub = next((eqn.params[k] for k in _CALLS if k in eqn.params), None)
        if sub is not None:
            out += _prims(getattr(sub, "jaxpr", sub))
        elif eqn.primitive.name == "broadcast_in_dim" and not eqn.invars[0].aval.shape:
            out.append("scalar_broadcast")
        else:
            out.append(eqn.primitive.name)
    return out


def _dots(jaxpr) -> list:
    """``(lhs shape, rhs shape, dimension_numbers)`` of every ``dot_general`` in a jaxpr (sub-jaxprs too)."""
    out = []
    for eqn in jaxpr.eqns:
        sub = next((eqn.params[k] for k in _CALLS if k in eqn.params), None)
        if sub is not None:
            out += _dots(getattr(sub, "jaxpr", sub))
        elif eqn.primitive.name == "dot_general":
            out.append((eqn.invars[0].aval.shape, eqn.invars[1].aval.shape, eqn.params["dimension_numbers"]))
    return out


def _elementwise(jaxpr) -> bool:
    return all(p in ELEMENTWISE or p == "scalar_broadcast" for p in _prims(jaxpr))


def _plain_matmul(jaxpr) -> bool:
    """One ``dot_general`` of the two inputs, ``a @ b`` with no batch dims (maybe inside one pjit)."""
    eqns, invars = jaxpr.eqns, jaxpr.invars
    if len(eqns) == 1 and eqns[0].primitive.name in ("pjit", "jit") and list(eqns[0].invars) == list(invars):
        inner = eqns[0].params["jaxpr"].jaxpr
        eqns, invars = inner.eqns, inner.invars
    if len(eqns) != 1 or eqns[0].primitive.name != "dot_general":
        return False
    e = eqns[0]
    return list(e.invars) == list(invars) and e.params["dimension_numbers"] == (((1,), (0,)), ((), ()))


def classify(op, spec, acc_dtype) -> tuple[str, list]:
    """``pointwise``, ``matmul`` or ``general`` (see the module docstring), and the program's dots."""
    import jax
    fwd = jax.make_jaxpr(op.forward_block)(*spec.leaf_structs).jaxpr
    acc = jax.ShapeDtypeStruct(spec.out_block, acc_dtype)
    comb = jax.make_jaxpr(op.combine)(acc, acc).jaxpr
    arrays = [b for b in spec.leaf_blocks if b]
    if (len(spec.leaf_blocks) == 2 and len(arrays) == 2 and all(len(b) == 2 for b in arrays)
            and _plain_matmul(fwd) and _prims(comb) == ["add"]):
        return "matmul", _dots(fwd)
    if spec.out_block and arrays and all(b == spec.out_block for b in arrays) \
            and _elementwise(fwd) and _elementwise(comb):
        return "pointwise", []
    return "general", _dots(fwd)


# ---------------------------------------------------------------- TPU (Mosaic) and interpret mode

def sublane(itemsize: int) -> int:
    """Rows of a TPU vreg tile for a dtype: 8 for 32-bit, 16 for 16-bit, 32 for 8-bit."""
    return 8 * max(1, 4 // itemsize)


def tpu_block_problem(shape, block, itemsize: int) -> str | None:
    """Why ``block`` (of an array whose trailing dims are ``shape``) breaks Mosaic's tiling rule."""
    for axis, unit in ((-1, 128), (-2, sublane(itemsize))):
        if len(block) >= -axis and block[axis] % unit and block[axis] != shape[axis]:
            return (f"TPU blocks need the last two dims to be multiples of ({sublane(itemsize)}, 128) or "
                    f"the full dims; dim {len(block) + axis} is {block[axis]} of {shape[axis]}")
    return None


def _shrink(size: int, unit: int, cap: int) -> int:
    """The largest multiple of ``unit`` at most ``cap`` (``size`` itself if it is at most ``cap``)."""
    if size <= cap:
        return size
    return min(size, max(unit, cap // unit * unit))


def _tpu_bytes(spec, acc_itemsize, in_blocks, out_block) -> int:
    """Double-buffered inputs and output, plus two output-sized temporaries (partial, combined)."""
    ins = sum(math.prod(b) * np.dtype(d).itemsize for b, d in zip(in_blocks, spec.leaf_dtypes) if b)
    return 2 * ins + 4 * math.prod(out_block or (1,)) * acc_itemsize


def tpu_plan(kind, spec, acc_dtype, limits: Limits = LIMITS, dots=()) -> Plan:
    acc_size = np.dtype(acc_dtype).itemsize
    sizes = [np.dtype(d).itemsize for d in spec.leaf_dtypes]
    if kind == "pointwise":
        shape = spec.out_block
        widest = max([s for s, b in zip(sizes, spec.leaf_blocks) if b] + [acc_size])
        block = list(shape)
        for axis in range(len(shape)):            # shrink the leading dims first, the minor dim last
            rest = math.prod(block) // block[axis]
            unit = 128 if axis == len(shape) - 1 else sublane(min(sizes)) if axis == len(shape) - 2 else 1
            cap = max(1, limits.tpu_pointwise_bytes // (rest * widest))
            block[axis] = _shrink(shape[axis], unit, cap)
        block = tuple(block)
        if _tpu_bytes(spec, acc_size, [block if b else () for b in spec.leaf_blocks], block) > limits.vmem_budget:
            raise WindowNotLegal(f"pointwise blocks {block} exceed the TPU VMEM budget")
        return Plan("pointwise", block)
    if kind == "matmul":
        (tm, tk), (_, tn) = spec.leaf_blocks
        edge, k_edge = limits.tpu_matmul_edge, min(limits.tpu_matmul_k, limits.tpu_matmul_edge)
        bk = next((d for d in range(k_edge // 128 * 128, 0, -128) if tk % d == 0), tk) if tk > k_edge else tk
        while True:
            bm = _shrink(tm, sublane(min(sizes)), edge)
            bn = _shrink(tn, 128, edge)
            if _tpu_bytes(spec, acc_size, [(bm, bk), (bk, bn)], (bm, bn)) <= limits.tpu_matmul_vmem:
                return Plan("matmul", (bm, bn, bk))
            if edge <= 128:
                raise WindowNotLegal(f"matmul blocks (bm, bn, bk) = {(bm, bn, bk)} exceed the TPU VMEM budget "
                                     f"(contraction {tk} has no 128-multiple divisor <= {k_edge})")
            edge //= 2
    for lhs, rhs, _ in dots:
        if len(lhs) == 1 and len(rhs) == 1:
            raise WindowNotLegal(f"Mosaic TPU has no vector-vector dot ({lhs} . {rhs})")
    need = _tpu_bytes(spec, acc_size, spec.leaf_blocks, spec.out_block)
    if need > limits.vmem_budget:
        raise WindowNotLegal(f"whole-tile blocks {list(spec.leaf_blocks)} -> {spec.out_block} need "
                             f"{need >> 20} MiB of VMEM (> {limits.vmem_budget >> 20} MiB) and this "
                             "program cannot be split into inner blocks")
    return Plan("general")


# ---------------------------------------------------------------- GPU (Triton)

def pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def _pow2_divisor(n: int, cap: int) -> int:
    """The largest power of two dividing ``n`` and at most ``cap``."""
    d = n & -n
    while d > cap:
        d //= 2
    return d


def gpu_plan(kind, spec, acc_dtype, limits: Limits = LIMITS, dots=()) -> Plan:
    if kind == "pointwise":
        size = math.prod(spec.out_block)
        inner = _pow2_divisor(size, limits.triton_pointwise_elems)
        if inner < min(128, size):
            raise WindowNotLegal(f"pointwise tile {spec.out_block} ({size} elements) has no power-of-two "
                                 f"inner block of at least 128 elements dividing it (Triton)")
        return Plan("pointwise", (inner,))
    if kind == "matmul":
        (tm, tk), (_, tn) = spec.leaf_blocks
        cm, cn, ck = limits.triton_matmul
        bm, bn, bk = _pow2_divisor(tm, cm), _pow2_divisor(tn, cn), _pow2_divisor(tk, ck)
        if min(bm, bn, bk) < limits.triton_min_dot:
            raise WindowNotLegal(f"matmul tile ({tm}, {tk}) @ ({tk}, {tn}) has no power-of-two inner "
                                 f"blocks >= {limits.triton_min_dot} dividing it (Triton dot)")
        return Plan("matmul", (bm, bn, bk))
    for lhs, rhs, dims in dots:
        if len(lhs) != 2 or len(rhs) != 2 or dims[1] != ((), ()) or min(*lhs, *rhs) < limits.triton_min_dot:
            raise WindowNotLegal(f"Triton dots are 2-D, unbatched and at least {limits.triton_min_dot} in "
                                 f"every dim; this program has {lhs} x {rhs} ({dims})")
    for b in [*spec.leaf_blocks, spec.out_block]:
        n = math.prod(b)
        if not pow2(n) or n > limits.triton_whole_elems:
            raise WindowNotLegal(f"whole-tile block {b} is not a power of two of at most "
                                 f"{limits.triton_whole_elems} elements (Triton) and this program cannot "
                                 "be split into inner blocks")
    return Plan("general")


# Primitives Pallas cannot lower on a target (jax 0.10.2). Found by the lowering gate: jask.numpy.prod,
# and the row gather of jask.numpy slicing and concatenate. Found compiling on a TPU v5e (2026-12-05,
# "Unimplemented primitive in Pallas TPU lowering"): the inverse-trig and hyperbolic ufuncs, expm1, cbrt;
# jax.export accepts them, Mosaic's compile does not. Their programs run as xla there.
_TPU_ONLY = {"expm1", "sinh", "cosh", "atan", "asin", "acos", "asinh", "acosh", "atanh", "cbrt"}
UNLOWERABLE = {"tpu": frozenset({"reduce_prod", "gather"} | _TPU_ONLY), "gpu": frozenset({"reduce_prod", "gather"})}
# Dtypes a TPU v5e could not run in a Pallas program: float16 ("Invalid vector type for load"),
# 64-bit ones (2026-12-06: XLA's pass that rewrites X64 element types has no rule for a pallas_call), and
# 8-bit integers (2026-12-06, seventh session: "Reductions over int8 not implemented", "Only vector<i16>
# and vector<i32> are supported, but got 'i8'", at the first call of a max and of an elementwise program).
# Also as a value made inside a program: a cast to them failed Mosaic's compile (`tpu.pack_subelements`), for
# narrow integers of `astype` (2026-12-06) and for the float16 of a fused `x.astype(float16).astype(float32)`
# summed (2026-12-08, nineteenth session); both ran as xla after a warning, right.
UNLOADABLE_DTYPES = {"tpu": frozenset({"float16", "int64", "uint64", "float64", "complex128", "int8", "uint8"}),
                     "gpu": frozenset()}
# A bool result of one element (the full reduction of any/all, out block ()): on a TPU v5e (2026-12-07,
# fifteenth session) Mosaic refused its window program ("Only 32-bit scalar vector.extracts supported"),
# and the joined window holding it; bool results along an axis (out blocks (4,), (4, 1)) compiled and ran.
SCALAR_REFUSED_DTYPES = {"tpu": frozenset({"bool"}), "gpu": frozenset()}


def _all_eqns(jaxpr):
    """The equations of ``jaxpr`` and of every jaxpr nested in their parameters."""
    for eqn in jaxpr.eqns:
        yield eqn
        for v in eqn.params.values():
            for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _all_eqns(inner)


def _all_prims(jaxpr) -> set:
    return {eqn.primitive.name for eqn in _all_eqns(jaxpr)}


def _integer_dot(jaxpr) -> bool:
    """A ``dot_general`` of integer operands: Mosaic TPU refused int32 ones on a v5e ("Bad lhs type")."""
    import jax.numpy as jnp   # its issubdtype knows bfloat16 is a float (NumPy's does not)
    return any(eqn.primitive.name == "dot_general"
               and not jnp.issubdtype(eqn.invars[0].aval.dtype, jnp.inexact) for eqn in _all_eqns(jaxpr))


def unlowerable(op, spec, acc_dtype, target: str) -> str | None:
    """What of ``op``'s program Pallas cannot lower on ``target`` (None if all can): the first such
    primitive (or ``"integer dot_general"``), else a result dtype it cannot reduce to one element, as
    ``"<dtype> scalars"``, else a dtype it cannot load, as ``"<dtype> vectors"``."""
    import jax
    fwd = jax.make_jaxpr(op.forward_block)(*spec.leaf_structs).jaxpr
    acc = jax.ShapeDtypeStruct(spec.out_block, acc_dtype)
    comb = jax.make_jaxpr(op.combine)(acc, acc).jaxpr
    bad = sorted((_all_prims(fwd) | _all_prims(comb)) & UNLOWERABLE.get(target, frozenset()))
    if bad:
        return bad[0]
    if target == "tpu" and _integer_dot(fwd):
        return "integer dot_general"
    if spec.out_block == () and str(acc_dtype) in SCALAR_REFUSED_DTYPES.get(target, frozenset()):
        return f"{acc_dtype} scalars"
    dtypes = {str(x.dtype) for x in spec.leaf_structs} | {str(acc_dtype)}
    dtypes |= {str(v.aval.dtype) for v in fwd.outvars if hasattr(v, "aval")}
    dtypes |= {str(v.aval.dtype) for eqn in _all_eqns(fwd) for v in eqn.outvars}   # a value made inside
    unloadable = sorted(dtypes & UNLOADABLE_DTYPES.get(target, frozenset()))
    return f"{unloadable[0]} vectors" if unloadable else None


def plan(op, spec, acc_dtype, target: str, limits: Limits = LIMITS) -> Plan:
    """The blocking of ``op``'s window program on ``target`` (``tpu`` or ``gpu``), or WindowNotLegal."""
    prim = unlowerable(op, spec, acc_dtype, target)
    if prim is not None:
        raise WindowNotLegal(f"Pallas has no {target} lowering for {prim}")
    if target == "tpu":
        smem = 4 * (spec.n_tiles * spec.k * (len(spec.leaf_blocks) + 1)
                    + sum(m for m, b in zip(spec.stack_rows, spec.leaf_blocks) if not b))
        if smem > limits.tpu_smem_bytes:
            raise WindowNotLegal(f"the window's index table and scalar operands take {smem} bytes of TPU scalar "
                                 f"memory (> {limits.tpu_smem_bytes}): {spec.n_tiles} tiles x {spec.k} entries")
    kind, dots = classify(op, spec, acc_dtype)
    return (gpu_plan if target == "gpu" else tpu_plan)(kind, spec, acc_dtype, limits, dots)


def max_tile_edge(target: str, dtypes, n_leaves: int, limits: Limits = LIMITS) -> int | None:
    """The largest power-of-two tile edge at which a *general* (whole-tile) 2-D program is legal.

    ``tpu``: ``n_leaves`` double-buffered input tiles of the widest dtype plus
    the float32-or-wider output tile and its temporaries within the VMEM budget
    (512 for two float32 leaves). ``gpu``: ``triton_whole_elems`` elements per
    tile (128). ``interpret``: None (no limit). Pointwise and plain matmul
    programs stay legal at larger tiles (they split into inner blocks).
    """
    if target == "interpret":
        return None
    if target == "gpu":
        return 1 << (int(math.isqrt(limits.triton_whole_elems)).bit_length() - 1)
    item = max(np.dtype(d).itemsize for d in dtypes)
    acc = max(4, item)
    per_elem = 2 * n_leaves * item + 4 * acc
    edge = int(math.isqrt(limits.vmem_budget // per_elem))
    return 1 << (edge.bit_length() - 1)
