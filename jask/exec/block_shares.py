"""Process shares cut on output chunk or shard boundaries, so each file has one writer.

In a ``jax.distributed`` run the processes of a pass write into one staging
store. A chunk file, or a shard file (whose inner chunks are appended and whose
index comes last, :class:`jask.io.writer.ShardWriter`), must be written whole
by one process: two writers would overwrite or interleave each other's bytes.
The plain split of a pass (:func:`jask.exec.schedule.windows` ``share``) cuts
anywhere between tiles, which is safe only for chunks of one tile.

Here the output tiles are grouped into *pieces*: along each axis a cut between
two tiles is allowed only where it is also a boundary of every output's file
blocks (a shard, else a chunk), so a piece is a shard (or chunk) of whole
tiles, a tile of whole chunks, or, for odd sizes, the smallest run of tiles
that holds whole blocks. Pieces (C order over the piece grid) are dealt in
contiguous runs, one per process, the cut chosen to make the largest run (in
units of work) as small as it can be. Each process then computes exactly its
pieces' tiles, in C order.
"""
from __future__ import annotations

import itertools


def axis_runs(dim: int, tile: int, blocks) -> list[range]:
    """Tile indices along one axis of length ``dim``, in runs no file block of edge in ``blocks`` crosses."""
    n = -(-dim // tile)
    starts = [0] + [i for i in range(1, n) if all((i * tile) % b == 0 for b in blocks)]
    return [range(a, b) for a, b in zip(starts, starts[1:] + [n])]


def pieces(shape, tile: int, block_shapes) -> list[list[tuple]]:
    """The tiles of each piece (C order over the pieces, and within each), for outputs of these file
    block shapes (a shard's, else a chunk's)."""
    runs = [axis_runs(d, tile, [b[a] for b in block_shapes]) for a, d in enumerate(shape)]
    return [list(itertools.product(*piece)) for piece in itertools.product(*runs)]


def min_max_cuts(weights, parts: int) -> list[int]:
    """``parts + 1`` positions cutting ``weights`` into contiguous runs, the largest run's sum as small as it can be.

    Among such cuts, each is the one nearest its even share (``total * p / parts``)
    when those nearest cuts reach that smallest largest run; else the greedy one.
    """
    prefix = list(itertools.accumulate(weights, initial=0))
    total = prefix[-1]

    def runs_needed(cap):
        count, start = 1, 0
        for i in range(1, len(prefix)):
            if prefix[i] - prefix[start] > cap:
                count, start = count + 1, i - 1
        return count

    lo, hi = max(weights, default=0), total
    while lo < hi:                                   # the smallest cap that `parts` runs can keep to
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if runs_needed(mid) <= parts else (mid + 1, hi)
    nearest = [0] + [min(range(len(prefix)), key=lambda i: (abs(prefix[i] * parts - total * p), i))
                     for p in range(1, parts)] + [len(weights)]
    if all(a <= b and prefix[b] - prefix[a] <= lo for a, b in zip(nearest, nearest[1:])):
        return nearest
    cuts, start = [0], 0
    for i in range(1, len(prefix)):
        if prefix[i] - prefix[start] > lo:
            cuts.append(i - 1)
            start = i - 1
    return cuts + [len(weights)] * (parts + 1 - len(cuts))


def process_tiles(shape, tile: int, block_shapes, units, index: int, count: int):
    """The output tiles process ``index`` of ``count`` computes, whole files of every output each; None when
    the outputs' files make fewer than two pieces (nothing to share so).

    ``units`` holds each tile's units of work in C order (:func:`jask.exec.shares.tile_units`).
    """
    found = pieces(shape, tile, block_shapes)
    if len(found) < 2:
        return None
    grid = [-(-d // tile) for d in shape]
    unit_of = dict(zip(itertools.product(*map(range, grid)), units))
    weights = [sum(unit_of[t] for t in piece) for piece in found]
    cuts = min_max_cuts(weights, count)
    mine = [t for piece in found[cuts[index]:cuts[index + 1]] for t in piece]
    return sorted(mine)
