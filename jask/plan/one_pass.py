"""One-pass groups: reductions that share one pass over what they read, entry k of each in one window.

A loss and its small weights' unit gradients (``jask.hijax.unit_grads``) each reduce over the row
blocks of X. The planner joins such roots into one group (``planner._lockstep_groups``) when this
module says they can share a pass; the schedule then takes entry k of every member's every output
tile into the same window (``jask.exec.schedule``), so X is read once for all of them. Where X is a
single row block the loss has one entry, and so do its weights' gradients: one window computes them all.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from jask.graph.op import CustomOp
from jask.graph.nodes import OpNode
from jask.graph.tiling import grid
from jask.plan.fusion import entries_of, entry_program
from jask.plan.walk import leaves_and_ops

# A member of several output tiles (a weight of several tiles' gradient) takes entry k of every tile into
# the window of the loss's entry k: at most this many tiles.
MAX_PASS_TILES = 16


@dataclasses.dataclass(frozen=True)
class PlanView:
    """What :func:`entry_program` needs of a plan, before the plan exists."""

    tile: int
    prepared: dict
    fused_ids: set
    shared_ids: frozenset = frozenset()


def pass_reductions(roots, prepared, tile) -> set:
    """Ids of the roots that reduce to few output tiles, each over as many entries (a loss, a small weight's
    gradient), when there are two or more: they may share one pass over what they read.

    Roots of one entry per tile count only beside a scalar root of one entry (a loss over an X of a
    single tile): its small weights' gradients then come from the same window instead of a second
    read of X. Without a scalar loss such roots are ordinary tile ops (lockstep groups join them)."""
    counts = {}
    for n in (r.resolved() for r in roots):
        if isinstance(n, OpNode) and id(n) in prepared and not isinstance(prepared[id(n)].op, CustomOp):
            k = entry_count(n, prepared[id(n)], tile)
            if k:
                counts[id(n)] = (k, n.shape == ())
    single = any(k == 1 and scalar for k, scalar in counts.values())
    found = {i for i, (k, _) in counts.items() if k > 1 or (single and k == 1)}
    return found if len(found) > 1 else set()


def entry_count(node, prep, tile) -> int:
    """The entry count of every output tile when they all have the same and there are at most
    ``MAX_PASS_TILES`` tiles, else 0.

    An ``index_map`` that raises gives 0 here: its error is raised where the tile is computed, which
    names the tile."""
    tiles = list(np.ndindex(*grid(node.shape, tile)))
    if len(tiles) > MAX_PASS_TILES:
        return 0
    try:
        k = len(entries_of(prep, node, tiles[0]))
        return k if all(len(entries_of(prep, node, idx)) == k for idx in tiles[1:]) else 0
    except Exception:   # noqa: BLE001 -- a user op's index_map; the pass raises it with the tile named
        return 0


def shares_a_pass(node, members, prepared, fused_ids, tile, live) -> bool:
    """Whether ``node`` can take its entries together with the pass reductions ``members``: as many
    entries, a leaf in common, no member's output among what it reads, and members of several tiles
    anchored (:func:`anchored`)."""
    count = lambda n: len(entries_of(prepared[id(n)], n, (0,) * n.ndim))
    leaves = {id(x) for x in leaves_and_ops(node, fused_ids, live)[0]}
    theirs = {id(x) for m in members for x in leaves_and_ops(m, fused_ids, live)[0]}
    return (count(node) == count(members[0]) and bool(leaves & theirs)
            and not leaves & {id(m) for m in members} and anchored([*members, node], prepared, fused_ids, tile))


def anchored(group, prepared, fused_ids, tile) -> bool:
    """Members of several output tiles need a one-tile member whose entry 0 reads every leaf tile that
    entry 0 of all their tiles reads (a loss reads the row block of X each tile of W1's gradient reads a
    tile of). A window takes entry k of every member's every tile, so it then holds little more than
    the one-tile members' entry k (what the plan's projection charges), whatever the tile count."""
    wide = [n for n in group if any(g > 1 for g in grid(n.shape, tile))]
    narrow = [n for n in group if all(g == 1 for g in grid(n.shape, tile))]
    if not wide:
        return True
    view = PlanView(tile, prepared, fused_ids)

    def reads(node, entry):   # stored tiles, through nested producers (a product over several entries)
        out = set()
        for leaf in entry_program(view, node, entry).leaves:
            if leaf.kind == "tile" and id(leaf.node) in fused_ids:
                for e in entries_of(prepared[id(leaf.node)], leaf.node, tuple(leaf.block)):
                    out |= reads(leaf.node, e)
            elif leaf.kind == "tile":
                out.add((id(leaf.node), tuple(leaf.block)))
        return out

    def first_reads(nodes):
        return set().union(*(reads(n, entries_of(prepared[id(n)], n, idx)[0])
                             for n in nodes for idx in np.ndindex(*grid(n.shape, tile))))
    return bool(narrow) and first_reads(wide) <= first_reads(narrow)
