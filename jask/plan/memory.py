"""The memory model shared by the planner's projection and the window schedule.

Each term is tiles held at once, charged at the tile size of the array it
belongs to (items counted as at least 4 bytes: partials accumulate in float32).
"""
from __future__ import annotations

import numpy as np

from jask.graph.nodes import Node
from jask.plan.walk import leaves_and_ops

SLOTS_PER_LEAF = 4   # per stored input tile: raw chunk bytes, the assembled tile, its device copy, one read ahead
SLOTS_PER_OP = 2     # per op on the pull path: a partial and an accumulator
SLOTS_FIXED = 2      # per output tile: the finished tile and its write buffer


def elements(shape, tile: int) -> int:
    """Elements of one full tile of an array of ``shape`` at edge ``tile``."""
    return int(np.prod([min(tile, d) for d in shape], dtype=np.int64))


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def tile_bytes(node: Node, tile: int) -> int:
    """Bytes of one full tile of ``node`` at this edge (items counted as at least 4 bytes: f32 accumulation)."""
    return elements(node.shape, tile) * max(node.dtype.itemsize, 4)


def group_bytes(group, fused_ids, tile: int, live) -> int:
    """Projected bytes of one lockstep group: its members' terms, each distinct leaf charged once.

    Members read a shared leaf's tile once per index (the executor's memo), and
    a member read by a later one is already held as that member's output tile.
    """
    members = {id(n) for n in group}
    leaves, op_bytes = {}, 0
    for node in group:
        node_leaves, ops = leaves_and_ops(node, fused_ids, live)
        leaves.update((id(n), n) for n in node_leaves if id(n) not in members)
        op_bytes += sum(tile_bytes(n, tile) for n in ops)
    return (SLOTS_PER_LEAF * sum(tile_bytes(n, tile) for n in leaves.values())
            + SLOTS_PER_OP * op_bytes
            + SLOTS_FIXED * sum(tile_bytes(n, tile) for n in group))


def projected_bytes(groups, fused_ids, tile: int, live) -> int:
    """Projected peak bytes of executing ``groups`` of stages with tile edge ``tile``.

    Per stage, each term charged at the tile size of the array it belongs to:
    ``SLOTS_PER_LEAF`` tiles for each distinct leaf input read while pulling one
    output tile (raw chunk bytes, the assembled region, the device copy, one
    read ahead), ``SLOTS_PER_OP`` for each op on the pull path (partial and
    accumulator), and ``SLOTS_FIXED`` output tiles (the finished tile and its
    write). Stages of one group run in lockstep, so their needs add up, except
    that a leaf they share is held once; groups run one after another, so the
    plan's peak is the largest group.
    """
    return max((group_bytes(group, fused_ids, tile, live) for group in groups), default=0)
