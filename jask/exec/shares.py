"""How a pass's work is cut into shares for several devices or processes: its units, and where the cuts fall.

A *unit* is one output tile, or one entry of a reduction tile split into entries
(a single node's tile over many entries, or a one-pass group's members, which take
entry k together). Shares are contiguous, equal runs of units, so each device or
process reads neighbouring tiles, within one unit of the others.
"""
from __future__ import annotations

from jask.plan.fusion import entries_of


def member_index(node, idx, one_pass):
    """A member's output tile: its only one in a one-pass group (members differ in shape), else ``idx``."""
    return (0,) * node.ndim if one_pass else idx


def shared_tiles(plan, group, indices, share):
    """``(idx, per_node, (lo, hi))`` for each tile with units in share ``(d, n)``: entries ``lo:hi`` of a
    split tile, ``(0, 1)`` for a whole one."""
    d, n = share
    if not 0 <= d < n:
        raise ValueError(f"share {d} of {n} does not exist")
    tiles = []
    one_pass = plan.one_pass(group)
    for idx in indices:
        idx = tuple(idx)
        try:
            per_node = [(nd, entries_of(plan.prepared[id(nd)], nd, member_index(nd, idx, one_pass)))
                        for nd in group]
        except Exception as e:
            e.add_note(f"while scheduling tile {idx} of {' + '.join(plan.prepared[id(nd)].name for nd in group)}")
            raise
        units = len(per_node[0][1]) if (len(group) == 1 or one_pass) and len(per_node[0][1]) > 1 else 1
        if n == 1:
            yield idx, per_node, (0, units)
        else:
            tiles.append((idx, per_node, units))
    total = sum(t[2] for t in tiles)
    first, last, pos = total * d // n, total * (d + 1) // n, 0
    for idx, per_node, units in tiles:
        lo, hi = max(first - pos, 0), min(last - pos, units)
        pos += units
        if lo < hi:
            yield idx, per_node, (lo, hi)


def tile_units(plan, group, indices) -> list[int]:
    """The units of work (see :func:`jask.exec.schedule.windows`) of each tile at ``indices``: 1, or a split
    tile's entries."""
    return [hi for _, _, (_, hi) in shared_tiles(plan, group, indices, (0, 1))]


def cuts_a_tile(units, parts: int) -> bool:
    """Whether cutting a pass of tiles of these ``units`` into ``parts`` shares splits some output tile's
    entries between two."""
    total = sum(units)
    cuts = {total * p // parts for p in range(1, parts)}
    pos = 0
    for u in units:
        if any(pos < c < pos + u for c in cuts):
            return True
        pos += u
    return False
