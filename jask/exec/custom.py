"""Driving a :class:`~jask.graph.op.CustomOp`: the toolkit its ``forward`` gets."""
from __future__ import annotations

import itertools

import numpy as np

from jask.exec.events import count
from jask.graph.nodes import OpNode
from jask.graph.tiling import block_at, grid, region


class OOCAlgorithm:
    """The toolkit a :class:`CustomOp` gets: tile geometry, tile reads, output tile writes.

    Inputs are passed to ``forward`` as opaque graph nodes; read them with
    :meth:`read`. Every output tile must be written exactly once.
    """

    def __init__(self, ex, node: OpNode, sink):
        self._ex, self._node, self._sink = ex, node, sink
        self._written: set = set()

    tile = property(lambda self: self._ex.tile)

    def grid(self, x) -> tuple[int, ...]:
        return grid(x.shape, self.tile)

    def tiles(self, x):
        """Block indices of ``x`` (an input, or ``None`` for the output), in row-major order."""
        shape = self._node.shape if x is None else x.shape
        return itertools.product(*map(range, grid(shape, self.tile)))

    def read(self, x, idx):
        """One block of input ``x``."""
        return self._ex.tile_of(x, tuple(idx))

    def write(self, idx, block) -> None:
        """Write output tile ``idx``."""
        idx = tuple(int(i) for i in idx)
        expected = block_at(self._node.shape, idx, self.tile)
        block = np.asarray(block, self._node.dtype)
        if block.shape != expected:
            raise ValueError(f"{self._ex.plan.prepared[id(self._node)].name}: output tile {idx} has shape "
                             f"{block.shape}, expected {expected}")
        self._sink.write(region(idx, self._node.shape, self.tile), block)
        self._written.add(idx)
        count(tiles=1, bytes_written=block.nbytes if self._sink.counts_io else 0)

    def check_complete(self) -> None:
        missing = [i for i in self.tiles(None) if i not in self._written]
        if missing:
            name = self._ex.plan.prepared[id(self._node)].name
            raise ValueError(f"{name}.forward left {len(missing)} output tiles unwritten, e.g. {missing[0]}")
