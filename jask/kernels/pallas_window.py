"""The Pallas window program: one ``pallas_call`` computes every output tile of a window.

:func:`window_program` returns ``run(stacks, table, valid) -> (n_tiles, *out_block)``
(the contract of :mod:`jask.kernels.window`): one ``pallas_call``, blocked as
:func:`jask.kernels.legality.plan` says.

``tpu`` (Mosaic, and interpret mode on CPU) folds entries along grid axes::

    grid (n_tiles, *inner parallel blocks, K, *inner contraction blocks)
    semantics  parallel ...                  arbitrary ...
    the output block is constant along the trailing axes: written at the first
    step, folded with ``combine`` where ``valid`` after.

The index table and ``valid`` are scalar-prefetched into SMEM and each leaf's
index map reads its stack row there, so the pipeline copies tiles straight from
the stacks (an earlier version gathered ``(n_tiles, K, *block)`` copies first:
on a v5e that made an n=8192 dot 0.35x jnp in bf16 and 0.59x in float32; now
0.89x and 1.02x, ``python -m jask.bench.kernels``).

``gpu`` (Triton) has no scalar prefetch: XLA first gathers each leaf's stack by
the table (unless ``spec.direct``), and grid programs run in parallel, so the
fold over entries (and over inner contraction blocks) is an in-kernel loop::

    grid (n_tiles, *inner blocks); each program loops k over K.

Scalar leaves (block ``()``) are read per (tile, entry) from scalar memory
(TPU: the whole stack, indexed through the table) or a small block (GPU).
1-D blocks gain a unit dim on TPU so the (8, 128) rule applies to full dims.
float32 contractions run at the precision ``jask.config`` names (``highest``
by default).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jask.kernels import legality
from jask.kernels.window import WindowSpec, contraction_precision, widen_dtype


def _tpu_params(semantics, limits):
    from jax.experimental.pallas import tpu as pltpu
    cls = getattr(pltpu, "CompilerParams", None) or getattr(pltpu, "TPUCompilerParams")
    return cls(dimension_semantics=tuple(semantics), vmem_limit_bytes=limits.vmem_limit)


def _triton_params():
    from jax.experimental.pallas import triton as pltriton
    return pltriton.CompilerParams(num_warps=4, num_stages=2)


def _as_acc(x, dtype, shape):
    x = jnp.asarray(x).astype(dtype)
    return jnp.broadcast_to(x, shape) if x.ndim == 0 else x.reshape(shape)


def window_program(op, spec: WindowSpec, target: str, interpret: bool, limits=legality.LIMITS):
    """``run(stacks, table, valid)`` for ``op`` on ``target`` (``tpu`` or ``gpu``); WindowNotLegal if it cannot.

    ``interpret`` runs the same kernel in Pallas interpret mode (CPU).
    """
    acc_dtype = widen_dtype(jax.eval_shape(op.forward_block, *spec.leaf_structs).dtype)
    prec = contraction_precision(spec.leaf_dtypes)
    with jax.default_matmul_precision(prec):
        plan = legality.plan(op, spec, acc_dtype, target, limits)
    name = getattr(op, "label", type(op).__name__.lower())

    def run(stacks, table, valid):
        with jax.default_matmul_precision(prec):
            if target == "gpu":
                operands = [_leaf_operand(s, table[:, :, j], spec.direct) for j, s in enumerate(stacks)]
                return _gpu_call(op, spec, plan, acc_dtype, operands, valid, interpret, limits, name)
            return _tpu_call(op, spec, plan, acc_dtype, stacks, table, valid, interpret, limits, name)

    return run


def _low_dot(eqn) -> bool:
    dtype = jnp.dtype(eqn.outvars[0].aval.dtype)
    return eqn.primitive.name == "dot_general" and jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4


def _wide_dots(fn):
    """``fn`` with each low-precision ``dot_general`` accumulating in float32 and rounded once after.

    The value XLA computes for a bf16 product; Mosaic TPU refuses matmuls whose
    accumulator is not 32-bit. Programs without such dots run unchanged.
    """
    def run(*args):
        closed = jax.make_jaxpr(fn)(*args)
        if not any(_low_dot(e) for e in closed.jaxpr.eqns):
            return fn(*args)
        out = _eval(closed.jaxpr, closed.consts, jax.tree.leaves(args))
        return jax.tree.unflatten(jax.tree.structure(jax.eval_shape(fn, *args)), out)
    return run


def _eval(jaxpr, consts, args):
    env = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    read = lambda v: v.val if type(v).__name__ == "Literal" else env[v]  # noqa: E731
    for eqn in jaxpr.eqns:
        vals = [read(v) for v in eqn.invars]
        if _low_dot(eqn):
            wide = eqn.primitive.bind(*vals, **{**eqn.params, "preferred_element_type": jnp.float32})
            outs = [wide.astype(eqn.outvars[0].aval.dtype)]
        else:
            bind = eqn.primitive.get_bind_params(eqn.params)
            subfuns, bind = bind if isinstance(bind, tuple) else ((), bind)
            outs = eqn.primitive.bind(*subfuns, *vals, **bind)
            outs = outs if eqn.primitive.multiple_results else [outs]
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]


def _forward(op, plan, shape):
    """``op.forward_block`` as the kernel calls it: on ``shape`` blocks (pointwise), dots widened."""
    if plan.kind == "pointwise" and hasattr(op, "reblocked"):
        op = op.reblocked(shape)
    return _wide_dots(op.forward_block)


def _leaf_operand(stack, column, direct):
    """``(n_tiles, K, *block)``: the stack row each (tile, entry) takes (no copy when direct)."""
    if direct:
        return stack[:, None]
    return jnp.take(stack, column, axis=0)


# ---------------------------------------------------------------- TPU and interpret: fold along the grid

def _tpu_blocks(spec, plan):
    """How ``plan`` cuts a window: parallel and contraction grid extents, each leaf's block and index
    map ``(parallel ids, contraction ids) -> block index``, and the output's block and index map."""
    out_block = spec.out_block
    if plan.kind == "pointwise":
        inner = plan.inner
        par, red = tuple(pl.cdiv(s, b) for s, b in zip(out_block, inner)), ()
        in_blocks = [inner if b else () for b in spec.leaf_blocks]
        in_index = [lambda p, r: p] * len(spec.leaf_blocks)
        out_tile, out_index = inner, (lambda p: p)
    elif plan.kind == "matmul":
        bm, bn, bk = plan.inner
        (tm, tk), (_, tn) = spec.leaf_blocks
        par, red = (pl.cdiv(tm, bm), pl.cdiv(tn, bn)), (tk // bk,)
        in_blocks = [(bm, bk), (bk, bn)]
        in_index = [lambda p, r: (p[0], r[0]), lambda p, r: (r[0], p[1])]
        out_tile, out_index = (bm, bn), (lambda p: p)
    else:
        par, red = (), ()
        in_blocks = list(spec.leaf_blocks)
        in_index = [lambda p, r, nd=len(b): (0,) * nd for b in spec.leaf_blocks]
        out_tile, out_index = out_block, (lambda p, nd=len(out_block): (0,) * nd)
    return par, red, in_blocks, in_index, out_tile, out_index


def _tpu_call(op, spec, plan, acc_dtype, stacks, table, valid, interpret, limits, name):
    """The TPU program: the index table and valid mask are scalar-prefetched into SMEM, and each
    leaf's BlockSpec index map looks its stack row up there, so tiles go from the stacks straight
    into VMEM (no gathered copy of every (tile, entry) in device memory)."""
    from jax.experimental.pallas import tpu as pltpu
    n, k_len, n_leaves = spec.n_tiles, spec.k, len(spec.leaf_blocks)
    out_block = spec.out_block
    par, red, in_blocks, in_index, out_tile, out_index = _tpu_blocks(spec, plan)
    unit = lambda b: (1, *b) if len(b) == 1 else b  # noqa: E731 - 1-D blocks as (1, c) for the TPU rule
    np_ = len(par)

    def split(g):  # grid ids -> (i, parallel ids, k, contraction ids)
        return g[0], g[1:1 + np_], g[1 + np_], g[2 + np_:]

    def row(t_ref, i, k, j):  # the stack row leaf j takes for tile i, entry k
        return t_ref[(i * k_len + k) * n_leaves + j]

    in_specs, args, scalar = [], [], []
    for j, (x, blk, index) in enumerate(zip(stacks, in_blocks, in_index)):
        if not blk:  # a scalar leaf: its whole stack in scalar memory, indexed in the kernel
            in_specs.append(pl.BlockSpec(memory_space=pltpu.SMEM))
            args.append(x.reshape(-1))
            scalar.append(True)
            continue
        x = x.reshape(x.shape[0], *unit(x.shape[1:]))
        pad = len(unit(blk)) - len(blk)

        def imap(*g, j=j, index=index, pad=pad):
            *g, t_ref, _ = g
            i, p, k, r = split(tuple(g))
            return (row(t_ref, i, k, j), *(0,) * pad, *index(p, r))

        in_specs.append(pl.BlockSpec((None, *unit(blk)), imap))
        args.append(x)
        scalar.append(False)
    store = unit(out_tile) if out_tile else (1, 1)
    out_full = unit(out_block) if out_block else (1, 1)
    pad_out = len(store) - len(out_tile)

    def kernel(t_ref, v_ref, *refs):
        in_refs, o_ref = refs[:len(stacks)], refs[-1]
        g = tuple(pl.program_id(a) for a in range(2 + np_ + len(red)))
        i, p, k, r = split(g)
        vals = [ref[row(t_ref, i, k, j)] if s else ref[...].reshape(b)
                for j, (ref, s, b) in enumerate(zip(in_refs, scalar, in_blocks))]
        if plan.kind == "matmul":
            part = lax.dot_general(vals[0], vals[1], (((1,), (0,)), ((), ())),
                                   preferred_element_type=acc_dtype)
        else:
            part = _forward(op, plan, out_tile)(*vals)
        part = _as_acc(part, acc_dtype, store)
        first = k == 0
        for a in r:
            first = jnp.logical_and(first, a == 0)

        @pl.when(first)
        def _init():
            o_ref[...] = part

        @pl.when(jnp.logical_and(jnp.logical_not(first), v_ref[i * k_len + k] != 0))
        def _fold():
            o_ref[...] = _as_acc(op.combine(o_ref[...].reshape(out_tile), part.reshape(out_tile)),
                                 acc_dtype, store)

    def omap(*g):
        i, p, _, _ = split(tuple(g[:-2]))
        return (i, *(0,) * pad_out, *out_index(p)) if out_tile else (i, 0, 0)

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2, grid=(n, *par, k_len, *red), in_specs=in_specs,
        out_specs=pl.BlockSpec((None, *store), omap))
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((n, *out_full), acc_dtype),
        grid_spec=grid_spec,
        compiler_params=_tpu_params(["parallel"] * (1 + np_) + ["arbitrary"] * (1 + len(red)), limits),
        interpret=interpret,
        name=f"jask_window_{name}",
    )(table.reshape(-1), valid.astype(jnp.int32).reshape(-1), *args)
    return out.reshape(n, *out_block)


# ---------------------------------------------------------------- GPU (Triton): fold in the kernel

def _gpu_call(op, spec, plan, acc_dtype, operands, valid, interpret, limits, name):
    n, k_len, out_block = spec.n_tiles, spec.k, spec.out_block
    if plan.kind == "pointwise":
        (inner,) = plan.inner
        size = math.prod(out_block)
        args = [x.reshape(n, x.shape[1], size) if b else x for x, b in zip(operands, spec.leaf_blocks)]
        grid, out_shape = (n, size // inner), (n, size)
        in_specs = [pl.BlockSpec((None, x.shape[1], inner), lambda i, p: (i, 0, p)) if b else
                    pl.BlockSpec((None, x.shape[1]), lambda i, p: (i, 0))
                    for x, b in zip(args, spec.leaf_blocks)]
        out_spec = pl.BlockSpec((None, inner), lambda i, p: (i, p))
    elif plan.kind == "matmul":
        bm, bn, bk = plan.inner
        (tm, tk), (_, tn) = spec.leaf_blocks
        args = list(operands)
        grid, out_shape = (n, tm // bm, tn // bn), (n, tm, tn)
        in_specs = [pl.BlockSpec((None, args[0].shape[1], bm, tk), lambda i, a, b: (i, 0, a, 0)),
                    pl.BlockSpec((None, args[1].shape[1], tk, bn), lambda i, a, b: (i, 0, 0, b))]
        out_spec = pl.BlockSpec((None, bm, bn), lambda i, a, b: (i, a, b))
    else:
        args = list(operands)
        grid, out_shape = (n,), (n, *(out_block or (1,)))
        in_specs = [pl.BlockSpec((None, *x.shape[1:]), lambda i, nd=x.ndim - 1: (i, *(0,) * nd)) for x in args]
        out_spec = pl.BlockSpec((None, *out_shape[1:]), lambda i, nd=len(out_shape) - 1: (i, *(0,) * nd))
    if k_len > 1:
        args.append(valid.astype(jnp.int32))
        in_specs.append(pl.BlockSpec((None, k_len), lambda i, *_: (i, 0)))
    store = out_spec.block_shape[1:]
    n_ops = len(operands)

    def entry(in_refs, k):
        """One entry's partial, in the accumulator dtype and the stored block's shape."""
        if plan.kind == "matmul":
            def step(kk, acc):
                a = in_refs[0][k, :, pl.ds(kk * bk, bk)]
                b = in_refs[1][k, pl.ds(kk * bk, bk), :]
                return acc + lax.dot_general(a, b, (((1,), (0,)), ((), ())),
                                             preferred_element_type=acc_dtype)
            return lax.fori_loop(0, tk // bk, step, jnp.zeros((bm, bn), acc_dtype))
        vals = [ref[k] for ref in in_refs]
        return _as_acc(_forward(op, plan, store)(*vals), acc_dtype, store)

    def kernel(*refs):
        in_refs, o_ref = refs[:n_ops], refs[-1]
        acc = entry(in_refs, 0)
        if k_len > 1:
            def fold(k, acc):
                new = _as_acc(op.combine(acc, entry(in_refs, k)), acc_dtype, store)
                return jnp.where(refs[n_ops][k] != 0, new, acc)
            acc = lax.fori_loop(1, k_len, fold, acc)
        o_ref[...] = acc

    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(out_shape, acc_dtype),
        grid=grid,
        in_specs=in_specs,
        out_specs=out_spec,
        compiler_params=None if interpret else _triton_params(),
        interpret=interpret,
        name=f"jask_window_{name}",
    )(*args)
    return out.reshape(n, *out_block)

