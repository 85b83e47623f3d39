"""Tile geometry: every axis of every array cut into blocks of ``min(tile, dim)``."""
from __future__ import annotations

import math

from jask.graph.nodes import Node
from jask.graph.op import TiledInput


def block_shape(shape, tile: int) -> tuple[int, ...]:
    return tuple(min(tile, d) for d in shape)


def grid(shape, tile: int) -> tuple[int, ...]:
    """Tiles per axis (0 along an axis of length 0: a size-0 array has no tiles)."""
    return tuple(math.ceil(d / b) if d else 0 for d, b in zip(shape, block_shape(shape, tile)))


def region(idx, shape, tile: int) -> tuple[slice, ...]:
    return tuple(slice(i * tile, min((i + 1) * tile, d)) for i, d in zip(idx, shape))


def tiled(node: Node, tile: int) -> TiledInput:
    return TiledInput(node.shape, node.dtype, block_shape(node.shape, tile))


def block_at(shape, idx, tile) -> tuple[int, ...]:
    return tuple(s.stop - s.start for s in region(idx, shape, tile))
