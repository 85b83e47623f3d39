"""Checks of a user op's methods against the op contract, with errors that name the method.

A wrong ``index_map`` entry otherwise surfaces as a read error blamed on the
data (a block index past the edge reads a chunk file that is not there), and a
wrong ``backward_block`` result as an ``IndexError`` deep in a kernel.
"""
from __future__ import annotations

import itertools

import jax
import numpy as np

from jask.graph.tiling import block_at, grid


def check_index_map(name: str, op, tiled_inputs, out_shape, tile: int) -> None:
    """Call ``op.index_map`` at the first, middle and last output tiles and check every entry: one block index
    per input, each with one int per axis of that input, inside that input's grid."""
    out_grid = grid(out_shape, tile)        # (a size-0 output never gets here: make_op returns its empty result)
    tiles = [tuple(0 for _ in out_grid), tuple(g // 2 for g in out_grid), tuple(g - 1 for g in out_grid)]
    for out_idx in dict.fromkeys(tiles):    # in that order, each once
        entries = op.index_map(out_idx)
        for entry in itertools.islice(entries, 64):
            if not isinstance(entry, (tuple, list)) or len(entry) != len(tiled_inputs):
                raise ValueError(f"{name}.index_map({out_idx}) returned the entry {entry!r}: each entry is a tuple "
                                 f"of one block index per input ({len(tiled_inputs)} here)")
            for j, (block, t) in enumerate(zip(entry, tiled_inputs)):
                _check_block(name, out_idx, j, block, t.grid)


def check_forward_block(name: str, op, tiled_inputs, out_shape, tile: int) -> None:
    """Trace ``op.forward_block`` (no data) on the blocks of the first output tile's first entry: it must
    return one array of that output tile's shape. Otherwise a tuple fails deep in a kernel, and a wrong
    shape only once the tile's data was read."""
    out_idx = tuple(0 for _ in out_shape)
    entry = next(iter(op.index_map(out_idx)), None)
    if entry is None:
        return                                  # a tile without entries is zeros: nothing to trace
    structs = [jax.ShapeDtypeStruct(block_at(t.shape, block, tile), t.dtype) for t, block in zip(tiled_inputs, entry)]
    result = jax.eval_shape(op.forward_block, *structs)
    if not isinstance(result, jax.ShapeDtypeStruct):
        kind = f"a {type(result).__name__} of {len(result)}" if isinstance(result, (tuple, list)) \
            else type(result).__name__
        raise TypeError(f"{name}.forward_block must return one array (an op has one output), got {kind} for output "
                        f"tile {out_idx}")
    expected = block_at(out_shape, out_idx, tile)
    if tuple(result.shape) != expected:
        raise ValueError(f"{name}.forward_block returned a block of shape {tuple(result.shape)} for output tile "
                         f"{out_idx} from input blocks of shapes {[s.shape for s in structs]}; that output tile "
                         f"has shape {expected} (output {tuple(out_shape)} in tiles of edge {tile})")


def _check_block(name, out_idx, j, block, input_grid) -> None:
    try:
        idx = tuple(int(i) for i in block)
    except TypeError:
        idx = None
    if idx is None or len(idx) != len(input_grid) or any(not 0 <= i < g for i, g in zip(idx, input_grid)):
        raise ValueError(f"{name}.index_map({out_idx}) asks input {j} for block {block!r}, but that input has "
                         f"{len(input_grid)} axes and a grid of {input_grid} tiles (block indices count tiles "
                         "from 0 on each axis)")


def check_gradients(name: str, grads, input_blocks) -> None:
    """``backward_block``'s result: one gradient per input, each an array of that input's block shape."""
    n = len(input_blocks)
    if not isinstance(grads, (tuple, list)) or len(grads) != n:
        what = f"{len(grads)} values" if isinstance(grads, (tuple, list)) else f"a {type(grads).__name__}"
        raise TypeError(f"{name}.backward_block must return a tuple of one gradient per input ({n}), got {what}")
    for j, (g, b) in enumerate(zip(grads, input_blocks)):
        if g is None or np.shape(g) != np.shape(b):
            got = "None" if g is None else f"shape {np.shape(g)}"
            raise TypeError(f"{name}.backward_block's gradient for input {j} has {got}; it must have that "
                            f"input block's shape {np.shape(b)} (return zeros for an input without one)")
