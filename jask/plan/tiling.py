"""The tile edge: the first guess for a plan, and the one jask writes new arrays' chunks with."""
from __future__ import annotations

import math

import numpy as np

from jask.config import config
from jask.graph.tiling import block_shape
from jask.plan.memory import SLOTS_FIXED, SLOTS_PER_LEAF, SLOTS_PER_OP


MAX_TILE_ELEMENTS = 2**24  # 64 MiB of float32: bigger tiles stop paying off


MIN_TILE_EDGE = 8


def elements(shape, tile: int) -> int:
    return int(np.prod(block_shape(shape, tile), dtype=np.int64))


def first_tile(shapes) -> int:
    """Smallest power-of-two edge that makes every array a single tile (the planner shrinks from here)."""
    biggest = max((max(s, default=1) for s in shapes), default=1)
    return 2 ** math.ceil(math.log2(max(biggest, 1)))


def default_tile(shape, itemsize: int, n_inputs: int = 2) -> int:
    """Tile edge an elementwise op over ``n_inputs`` arrays of this shape would get under the budget.

    Used for the chunks of arrays jask writes, so storage chunks and tiles line up.
    """
    if config.tile is not None:
        return config.tile
    slots = SLOTS_PER_LEAF * n_inputs + SLOTS_PER_OP + SLOTS_FIXED
    edge = first_tile([shape])
    while edge > MIN_TILE_EDGE and (elements(shape, edge) > MAX_TILE_ELEMENTS
                                    or slots * elements(shape, edge) * max(itemsize, 4) > config.memory_budget):
        edge //= 2
    return edge
