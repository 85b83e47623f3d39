"""The order of a contraction's output tiles: bands of block rows, column by column, so windows fill rectangles.

A window reads each stored tile it needs once. In row-major order a window of a
matrix product holds tiles of one block row: it shares their row panel of A and
reads a column panel of B for every tile, so each B tile is read once per
output tile of its column. Taken in bands of R block rows, column by column,
a window holds an R x C rectangle of output tiles: R row panels and C column
panels for R*C tiles, and the window's products fill a rectangle, which the
xla program multiplies as one product of panels (:mod:`jask.kernels.panels`).

R is the band whose R x C rectangles, as big as a window holds (its projected
bytes and its input), read the fewest input bytes per output tile; bands are of
equal height. Where one output tile's panels already fill a window (the
planner's tile edge sized to the budget), or tiles share no panel, the order
stays row-major: there is nothing to share.
"""
from __future__ import annotations

from jask.graph.tiling import grid
from jask.plan.fusion import entries_of

MIN_ROWS = 2   # block rows a band needs (``python -m jask.bench.kernels --bands=off`` sets infinity: row-major)


def band_rows(plan, node, limit_bytes: int, input_bytes: int, cost) -> int:
    """Block rows per band for ``node``'s tiles (1: row-major), for windows of at most ``limit_bytes``
    projected and ``input_bytes`` read.

    ``cost(idx, entries, seen)`` is ``(projected, input)`` bytes that scheduling ``entries`` of tile
    ``idx`` adds to a window that already reads the tiles in ``seen`` (it adds its own), as the
    schedule charges them. The band is the one whose rectangles read the fewest input bytes per
    output tile.
    """
    if node.ndim != 2:
        return 1
    rows, cols = grid(node.shape, plan.tile)
    if rows < 2 or cols < 2:
        return 1
    prep = plan.prepared[id(node)]
    try:
        entries = {(0, 0): entries_of(prep, node, (0, 0))}
        if len(entries[(0, 0)]) < 2:
            return 1
        entries.update({idx: entries_of(prep, node, idx) for idx in ((0, 1), (1, 0))})
    except Exception:   # noqa: BLE001 -- a bad index_map: the schedule meets it in order and names the tile
        return 1

    def after_first(idx):
        seen: set = set()
        first = cost((0, 0), entries[(0, 0)], seen)
        return first, cost(idx, entries[idx], seen)

    (p0, i0), (p_right, col_panel) = after_first((0, 1))   # a neighbour in the row adds its column panel
    _, (p_down, row_panel) = after_first((1, 0))           # a neighbour in the column adds its row panel
    if not 0 < row_panel < i0 or not 0 < col_panel < i0:
        return 1                                           # the tiles share no panel
    per_tile = max(p_right + p_down - p0, 0)               # a tile's own charge (its partials, its output)
    best, band = None, 1
    for r in range(1, rows + 1):
        by_input = (input_bytes - r * row_panel) // col_panel
        by_limit = (limit_bytes - r * (p_down - per_tile)) // max(p_right - per_tile + r * per_tile, 1)
        c = min(cols, by_input, by_limit)
        if c < 1:
            break
        read = (r * row_panel + c * col_panel) / (r * c)   # input bytes per output tile
        if best is None or read < best:
            best, band = read, r
    if band < MIN_ROWS:
        return 1
    return -(-rows // -(-rows // band))                    # bands of equal height


def band_order(indices, rows: int) -> list:
    """``indices`` (2-D tile indices) in bands of ``rows`` block rows, each band column by column."""
    return sorted((tuple(i) for i in indices), key=lambda ij: (ij[0] // rows, ij[1], ij[0]))
