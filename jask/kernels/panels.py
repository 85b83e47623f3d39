"""A window of matrix-product tiles that fills a rectangle, as ONE large product of panels.

XLA:CPU multiplies many 256^3 blocks at about half the rate of one 2048^2
product (2026-12-05, 2 cores: a window of 64 output tiles, K = 8, as 512 block
products 0.6-0.75x ``jnp.matmul``; its blocks concatenated into one product
0.9x). When a window's program is a plain ``a @ b`` with ``+`` as its combine
(``legality.classify`` says ``matmul``), every tile sums all K entries, and its
output tiles fill R block rows by C block columns, the window is

    [A row panel of each block row] (R*bm, K*bk)  @  [B column panel of each column] (K*bk, C*bn)

and each output tile is one slice of that product. The panels cost a copy of
the window's inputs, repaid only when each panel is shared by several tiles:
on a window of one block row the copies cost more than they save (6-7 tiles,
K = 8: 2.8-4.0x jnp's time against 2.5-2.6x), so a rectangle must be at least
:data:`MIN_SIDE` tiles on both sides. Out of core, windows are such rectangles where
:mod:`jask.exec.bands` orders a product's tiles in bands of block rows. Sums run in a different order than the
per-block fold: results agree to float rounding, not bit for bit.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from jask.kernels.legality import classify
from jask.kernels.window import widen_dtype

MIN_SIDE = 2   # block rows and block columns a window needs before its blocks are multiplied as panels
# The panels and their product are copies the block-by-block fold does not make: a window takes the
# panel path only while they stay under this, so memory grows by at most a small constant over the
# planner's projection (CPU windows stop at 16 MiB of input; the 2048^2 benchmark window needs 48 MiB).
MAX_PANEL_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class PanelPlan:
    """Which stacked tiles make each panel, and where each output tile lies in the product."""

    a_rows: tuple[tuple[int, ...], ...]    # per block row: rows of leaf 0's tiles along K
    b_rows: tuple[tuple[int, ...], ...]    # per block column: rows of leaf 1's tiles along K
    tile_at: tuple[tuple[int, int], ...]   # per output tile: (block row, block column)
    acc_dtype: np.dtype                    # the product's dtype: float32 for bf16/f16 blocks, as the block fold


def panel_plan(op, spec, table: np.ndarray, valid: np.ndarray) -> PanelPlan | None:
    """The panels of a window whose tiles fill a rectangle of plain products, or None (multiply block by block)."""
    if spec.k < 2 or not valid.all() or len(spec.leaf_blocks) != 2 or any(len(b) != 2 for b in spec.leaf_blocks):
        return None
    a_lists = [tuple(int(r) for r in table[i, :, 0]) for i in range(spec.n_tiles)]
    b_lists = [tuple(int(r) for r in table[i, :, 1]) for i in range(spec.n_tiles)]
    a_rows, b_rows = tuple(dict.fromkeys(a_lists)), tuple(dict.fromkeys(b_lists))
    tile_at = tuple((a_rows.index(a), b_rows.index(b)) for a, b in zip(a_lists, b_lists))
    if min(len(a_rows), len(b_rows)) < MIN_SIDE or len(set(tile_at)) != spec.n_tiles \
            or spec.n_tiles != len(a_rows) * len(b_rows):
        return None
    (bm, bk), (_, bn) = spec.leaf_blocks
    acc = widen_dtype(np.result_type(*spec.leaf_dtypes))
    copies = (len(a_rows) * bm * spec.k * bk * spec.leaf_dtypes[0].itemsize
              + spec.k * bk * len(b_rows) * bn * spec.leaf_dtypes[1].itemsize
              + len(a_rows) * bm * len(b_rows) * bn * acc.itemsize)
    if copies > MAX_PANEL_BYTES:
        return None
    if classify(op, spec, acc)[0] != "matmul":
        return None
    return PanelPlan(a_rows, b_rows, tile_at, acc)


def multiply_panels(plan: PanelPlan, a_tiles, b_tiles, out_block) -> list:
    """Each output tile of the window, from one product of its panels (in the caller's matmul
    precision), accumulated in ``plan.acc_dtype``."""
    a = jnp.concatenate([jnp.concatenate([a_tiles[r] for r in rows], axis=1) for rows in plan.a_rows], axis=0)
    b = jnp.concatenate([jnp.concatenate([b_tiles[r] for r in rows], axis=0) for rows in plan.b_rows], axis=1)
    product = jnp.matmul(a, b, preferred_element_type=plan.acc_dtype)
    bm, bn = out_block
    return [product[r * bm:(r + 1) * bm, c * bn:(c + 1) * bn] for r, c in plan.tile_at]
