"""Reshapes whose regrouped axes do not fit in one tile: each output tile gathers from the input tiles it spans.

A row-major reshape splits into groups of axes (see :mod:`jask.ops.shape`).
Within a group, an output element's position along the group's output axes
gives its offset in the group (mixed radix), and that offset gives its
position along the group's input axes. So each output tile lists, as its
entries, every input tile its elements come from (planned on the host from
the offsets where its runs start and where an input tile edge can fall, not
from each element), and each entry takes the elements that fall
in its tile, zeros elsewhere; ``combine`` sums them. Where a tile starts is
read from int32 iotas of row numbers, one per input and output axis (the
trick of :mod:`jask.ops.indexing`). The gradient is ``jax.vjp`` of the same
gather. No array is held whole: a window holds the output tiles it computes
and the input tiles they read, within the budget like any op; on xla an
entry's index arithmetic fuses into its gather, so no index array is held.
"""
from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jask.graph.op import BlockParallelOp
from jask.hijax.make_op import make_op
from jask.ops.operands import INT32_LIMIT, iota


class Regroup(BlockParallelOp):
    """Row-major reshape by gathering; inputs ``(x, *row iotas of x's axes, *row iotas of the output's axes)``.

    The iotas are int32, so they get no gradient.
    """

    def __init__(self, in_shape, out_shape, groups, in_block=(), out_block=()):
        self.in_shape, self.out_shape, self.groups = tuple(in_shape), tuple(out_shape), tuple(groups)
        self.in_block, self.out_block = tuple(in_block), tuple(out_block)
        self._tiles_read = {}     # (group, output tile) -> input tiles: the planner and executor ask often

    @classmethod
    def from_inputs(cls, x, *iotas, out_shape, groups):
        outs = iotas[x.ndim:]
        return cls(x.shape, out_shape, groups, x.block_shape, tuple(o.block_shape[k] for k, o in enumerate(outs)))

    def _group_tiles(self, gin, gout, out_idx):
        """Input tile coordinates along ``gin`` that output tile ``out_idx`` reads (unique rows), computed
        once per output tile: the planner, schedule and explain all ask."""
        key = (tuple(gin), tuple(out_idx[k] for k in gout))
        if key not in self._tiles_read:
            self._tiles_read[key] = self._enumerate_tiles(gin, gout, out_idx)
        return self._tiles_read[key]

    def _enumerate_tiles(self, gin, gout, out_idx):
        """The input tiles of one output tile, from a few offsets, not all of its elements.

        The tile's offsets in the group are runs (along its last output axis), and an input
        tile coordinate changes only at a multiple of ``_step(gin)``; so each run's first
        offset and the multiples inside it meet every input tile. Every offset as an int64
        (the planner's first tile edges give 16M-element tiles) took 640 MiB and 10-20 s
        to plan an 8192^2 reshape.
        """
        starts, ends = self._runs(gout, out_idx)
        step = self._step(gin)
        inside = (ends - 1) // step - starts // step               # multiples of step in (start, end)
        first = np.repeat((starts // step + 1) * step, inside)
        at = np.arange(first.size, dtype=np.int64) - np.repeat(np.cumsum(inside) - inside, inside)
        flat = np.concatenate([starts, first + step * at])
        coords = []
        for k in reversed(gin):
            coords.append((flat % self.in_shape[k]) // self.in_block[k])
            flat = flat // self.in_shape[k]
        grid_in = tuple(-(-self.in_shape[k] // self.in_block[k]) for k in gin)
        codes = np.unique(np.ravel_multi_index(coords[::-1], grid_in))   # one int per tile: a 1-D sort
        return np.stack(np.unravel_index(codes, grid_in), axis=-1)

    def _runs(self, gout, out_idx):
        """``(starts, ends)``: the output tile's offsets in its group as runs of consecutive offsets."""
        starts = np.zeros(1, np.int64)
        for k in gout:
            lo = out_idx[k] * self.out_block[k]
            hi = min(lo + self.out_block[k], self.out_shape[k])
            rows = np.arange(lo, hi, dtype=np.int64) if k != gout[-1] else np.array([lo], np.int64)
            starts = (starts[:, None] * self.out_shape[k] + rows).reshape(-1)
        ends = starts + (hi - lo)
        joined = np.concatenate([[False], starts[1:] == ends[:-1]])   # a run that goes on where one ended
        return starts[~joined], ends[~np.concatenate([joined[1:], [False]])]

    def _step(self, gin):
        """An offset step at whose multiples alone an input tile coordinate of the group can change:
        axis k's coordinate changes where its row crosses a tile edge or wraps, at multiples of
        ``stride * gcd(size, block)``; an axis of one tile never changes."""
        step, stride = 0, 1
        for k in reversed(gin):
            if self.in_block[k] < self.in_shape[k]:
                step = math.gcd(step, stride * math.gcd(self.in_shape[k], self.in_block[k]))
            stride *= self.in_shape[k]
        return step or stride

    def index_map(self, out_idx):
        nin, nout = len(self.in_shape), len(self.out_shape)
        per_group = [(gin, self._group_tiles(gin, gout, out_idx)) for gin, gout in self.groups]
        out_iotas = tuple(tuple(out_idx[k] if a == k else 0 for a in range(nout)) for k in range(nout))
        entries = []
        for combo in itertools.product(*[tiles for _, tiles in per_group]):
            idx = [0] * nin
            for (gin, _), row in zip(per_group, combo):
                for k, c in zip(gin, row):
                    idx[k] = int(c)
            in_iotas = tuple(tuple(idx[k] if a == k else 0 for a in range(nin)) for k in range(nin))
            entries.append((tuple(idx),) + in_iotas + out_iotas)
        return entries

    def input_tiles_of(self, entries):
        """The input tiles an output tile's ``entries`` (its index map) read, in order. Output tiles of one list
        take a few rows of each of the same tiles, so the window schedule runs them entry by entry together
        and reads each tile once for all of them (:func:`jask.exec.schedule._reading_together`), not once per
        output tile."""
        return tuple(entry[0] for entry in entries)

    def forward_block(self, x, *iotas):
        nin, nout = len(self.in_shape), len(self.out_shape)
        starts = [i.reshape(-1)[0] for i in iotas[:nin]]
        rows = [o.reshape([-1 if a == k else 1 for a in range(nout)]) for k, o in enumerate(iotas[nin:])]
        tile = tuple(int(o.size) for o in iotas[nin:])
        local, valid = [jnp.zeros((), jnp.int32)] * nin, jnp.ones((), bool)
        # Offsets in the group are never negative, so lax's rem and div give jnp's % and //; an element outside
        # this tile is masked by ``valid``, so the gather only needs in-bounds indices, which its "clip" mode
        # makes (natively: no wrap of negatives, no clip of its own). Less HLO than jnp's forms, same values.
        for gin, gout in self.groups:
            flat = jnp.zeros((), jnp.int32)
            for k in gout:
                flat = flat * self.out_shape[k] + rows[k]
            for k in reversed(gin):
                size = np.int32(self.in_shape[k])
                offset = lax.rem(flat, size) - starts[k]
                flat = lax.div(flat, size)
                valid = valid & (offset >= 0) & (offset < x.shape[k])
                local[k] = offset
        taken = x.at[tuple(jnp.broadcast_to(v, tile) for v in local)].get(mode="clip", wrap_negative_indices=False)
        return jnp.where(jnp.broadcast_to(valid, tile), taken, jnp.zeros((), x.dtype))

    def combine(self, acc, partial):
        return acc + partial

    def backward_block(self, d_out_block, x, *iotas):
        _, vjp = jax.vjp(lambda x: self.forward_block(x, *iotas), x)
        (dx,) = vjp(d_out_block.astype(x.dtype))
        return (dx,) + tuple(jnp.zeros_like(i) for i in iotas)

    def output_shape(self, *shapes):
        return self.out_shape

    def output_dtype(self, x_dtype, *_):
        return x_dtype


_regroup = make_op(Regroup, name="reshape")


def regroup(a, in_shape, out_shape, groups):
    """``a`` reshaped to ``out_shape`` by gathering (any row-major reshape); ``groups`` from ``shape._groups``."""
    for gin, gout in groups:
        if math.prod(out_shape[k] for k in gout) > INT32_LIMIT:
            raise NotImplementedError(
                f"reshape from {tuple(in_shape)} to {tuple(out_shape)} regroups "
                f"{math.prod(out_shape[k] for k in gout)} elements at once, more than int32 offsets reach; "
                "reshape in steps that regroup fewer elements")
    iotas = [iota(n, k, len(in_shape), "reshape") for k, n in enumerate(in_shape)]
    iotas += [iota(n, k, len(out_shape), "reshape") for k, n in enumerate(out_shape)]
    return _regroup(a, *iotas, out_shape=tuple(out_shape), groups=tuple(groups))
