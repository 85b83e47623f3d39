"""The ``xla`` backend: one jitted step per op, tiles folded on the host."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def _widen(x):
    """Accumulate low-precision floats (bf16, f16) in float32."""
    if jnp.issubdtype(x.dtype, jnp.floating) and jnp.dtype(x.dtype).itemsize < 4:
        return x.astype(jnp.float32)
    return x


class TileKernel:
    """Compiled per-tile functions of one op instance: the first partial, and partial-plus-fold."""

    def __init__(self, op):
        self.op = op
        self.first = jax.jit(lambda *blocks: _widen(op.forward_block(*blocks)))
        self.step = jax.jit(lambda acc, *blocks: op.combine(acc, _widen(op.forward_block(*blocks))))


class XlaBackend:
    """Runs ``forward_block`` per entry and folds partials with ``combine``, fused in one call.

    Only the accumulator and one entry's blocks are alive at a time: JAX
    dispatches asynchronously, so before starting entry k+1 we wait for the
    accumulator of entry k-1, keeping at most two entries in flight.
    """

    name = "xla"

    def compile(self, op) -> TileKernel:
        return TileKernel(op)

    def output_tile(self, kernel: TileKernel, entries, fetch, out_dtype, kernel_of=None):
        acc = previous = None
        for entry in entries:
            if previous is not None:
                previous.block_until_ready()
            blocks = fetch(entry)
            k = kernel if kernel_of is None else kernel_of(entry)
            previous, acc = acc, (k.first(*blocks) if acc is None else k.step(acc, *blocks))
        return None if acc is None else jnp.asarray(acc).astype(out_dtype)
