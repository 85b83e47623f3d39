"""The ``xla`` backend: each op method jitted once, tiles folded on the host."""
from __future__ import annotations

import jax
import jax.numpy as jnp


class TileKernel:
    """Compiled per-tile functions of one op instance."""

    def __init__(self, op):
        self.op = op
        self.forward = jax.jit(op.forward_block)
        self.combine = jax.jit(op.combine)


class XlaBackend:
    """Runs ``forward_block`` per entry and folds partials with ``combine``.

    Only the accumulator and one entry's blocks are alive at a time: JAX
    dispatches asynchronously, so before starting entry k+1 we wait for the
    accumulator of entry k-1, keeping at most two entries in flight. Low
    precision partials are accumulated in float32 and cast back once.
    """

    name = "xla"

    def compile(self, op) -> TileKernel:
        return TileKernel(op)

    def output_tile(self, kernel: TileKernel, entries, fetch, out_dtype):
        acc = previous = None
        for entry in entries:
            if previous is not None:
                previous.block_until_ready()
            partial = kernel.forward(*fetch(entry))
            if jnp.dtype(partial.dtype).itemsize < 4 and jnp.issubdtype(partial.dtype, jnp.floating):
                partial = partial.astype(jnp.float32)
            previous, acc = acc, (partial if acc is None else kernel.combine(acc, partial))
        return None if acc is None else jnp.asarray(acc).astype(out_dtype)
