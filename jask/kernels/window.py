"""What every backend's window program computes: the contract between the executor and a kernel.

A *window* is a set of output tiles of one op (or fused program) that the
executor computes with ONE kernel call. The executor gathers the distinct
input tiles the window needs into one stack per leaf position and describes
which stacked tile each (output tile, entry) takes in an index table::

    stacks[j]     (m_j, *leaf_block_j)      distinct tiles of leaf position j
    table         int32 (n_tiles, K, L)     row of stacks[j] for output tile i, entry k
    valid         bool  (n_tiles, K)        entry k exists for tile i (rows are padded to K)

and the program returns ``(n_tiles, *out_block)`` in the accumulator dtype:

    out[i] = combine(... combine(f(entry 0), f(entry 1)) ..., f(entry K_i - 1))
    f(entry k) = widen(op.forward_block(*[stacks[j][table[i, k, j]] for j in range(L)]))

with ``widen`` lifting bfloat16/float16 partials to float32. Entry 0 of every
tile is valid. A scalar leaf has block shape ``()`` (its stack is ``(m_j,)``).
When ``spec.direct`` is set, ``K == 1`` and every column of the table is
``arange(n_tiles)``: stack row i belongs to output tile i, and a backend may
skip the gather. Every tile of a window has the same block shapes (ragged edge
tiles form windows of their own), so nothing is padded.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from jask.kernels.registry import settings


@dataclasses.dataclass(frozen=True)
class WindowSpec:
    """Static shape of one window program (a compiled program is cached per spec and op)."""

    leaf_blocks: tuple[tuple[int, ...], ...]   # block shape per leaf position (() for a scalar leaf)
    leaf_dtypes: tuple[np.dtype, ...]          # numpy dtype per leaf position (not .str: bfloat16 is "<V2")
    stack_rows: tuple[int, ...]                # m_j: rows of each stack
    n_tiles: int
    k: int
    out_block: tuple[int, ...]                 # one output tile's shape (() for a scalar output)
    direct: bool = False

    @property
    def leaf_structs(self):
        """``jax.ShapeDtypeStruct``s of one entry's leaf blocks (what ``forward_block`` receives)."""
        import jax
        return [jax.ShapeDtypeStruct(b, np.dtype(d)) for b, d in zip(self.leaf_blocks, self.leaf_dtypes)]

    def operand_structs(self):
        """``jax.ShapeDtypeStruct``s of a window program's arguments: stacks, table, valid."""
        import jax
        stacks = [jax.ShapeDtypeStruct((m, *b), np.dtype(d))
                  for m, b, d in zip(self.stack_rows, self.leaf_blocks, self.leaf_dtypes)]
        table = jax.ShapeDtypeStruct((self.n_tiles, self.k, len(self.leaf_blocks)), np.int32)
        valid = jax.ShapeDtypeStruct((self.n_tiles, self.k), np.bool_)
        return stacks, table, valid


def widen_dtype(dtype) -> np.dtype:
    """float32 for low-precision floats (bf16, f16): partials are accumulated at least in float32."""
    import jax.numpy as jnp
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4:
        return jnp.dtype(jnp.float32)
    return dtype


def contraction_precision(dtypes) -> str:
    """The matmul precision for a program over operands of ``dtypes``: ``config.precision`` (default
    ``highest``), or ``default`` when every floating operand is low-precision (bf16, f16).

    ``highest`` because Hopper GPUs and TPUs otherwise multiply float32 in
    TF32/bfloat16 passes, about 1e-3 relative away from the CPU's result. A
    bf16 product is one exact pass anyway, and Mosaic TPU refuses an fp32
    contract precision on bf16 vectors (seen on a v5e), so low-precision
    programs keep the default.
    """
    import jax.numpy as jnp
    floats = [jnp.dtype(d) for d in dtypes if jnp.issubdtype(jnp.dtype(d), jnp.floating)]
    if floats and all(d.itemsize < 4 for d in floats):
        return "default"
    return settings().precision


def fold_partial(op, acc, part, present=None):
    """``op.combine(acc, part)`` in ``acc``'s dtype; where ``present`` is False (``acc`` a placeholder for a
    partial not computed yet), ``part`` alone."""
    import jax.numpy as jnp
    folded = jnp.asarray(op.combine(acc, part)).astype(acc.dtype)
    return folded if present is None else jnp.where(present, folded, part.astype(acc.dtype))


def split_tile_args(flat, spec, carried=(), maybe=()):
    """The arguments of a program over separate tiles (:func:`jask.kernels.xla.window_tiles_program`'s
    layout: each leaf position's tiles, then the ``carried`` accumulators, then the ``maybe`` flags) as
    ``(rows, incoming, present)``: each leaf position's tiles, and the accumulator and its present flag
    by output tile."""
    bounds = np.cumsum([0] + list(spec.stack_rows))
    rows = [flat[bounds[j]:bounds[j + 1]] for j in range(len(spec.stack_rows))]
    incoming = dict(zip(carried, flat[bounds[-1]:bounds[-1] + len(carried)]))
    present = dict(zip(maybe, flat[-1])) if maybe else {}
    return rows, incoming, present


def fold_carried(op, outs, incoming, present) -> list:
    """Each output tile's result with its carried accumulator (``incoming``, see :func:`split_tile_args`)
    folded in."""
    return [out if i not in incoming else fold_partial(op, incoming[i], out, present.get(i))
            for i, out in enumerate(outs)]


def stacked_tiles_program(run, op, spec, table, valid, carried=(), maybe=()):
    """A stacked window program ``run(stacks, table, valid)`` (a Pallas kernel) as a program over separate
    tiles, with the argument layout of :func:`jask.kernels.xla.window_tiles_program` (see
    :func:`split_tile_args`). The tiles are stacked inside the program (on a device, a copy in its
    memory instead of one on the host) and the table and valid mask are constants. Returns one result
    per output tile, carried partials folded in."""
    import jax.numpy as jnp

    def program(*flat):
        rows, incoming, present = split_tile_args(flat, spec, carried, maybe)
        out = run([jnp.stack(tiles) for tiles in rows], jnp.asarray(table), jnp.asarray(valid))
        return fold_carried(op, [out[i] for i in range(spec.n_tiles)], incoming, present)

    return program
