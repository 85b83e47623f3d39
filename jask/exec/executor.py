"""The executor: runs one plan's stages window by window, reading ahead and writing behind.

One schedule (:func:`jask.exec.schedule.windows`) drives both the prefetcher,
which reads the next window's tiles while the current one computes, and the
window runner (:mod:`jask.exec.run_windows`), which makes one kernel call per
program shape.
"""
from __future__ import annotations

import contextlib
import itertools
import time

import jax
import numpy as np

from jask import kernels
from jask.config import config
from jask.exec.custom import OOCAlgorithm
from jask.exec.devices import callback_can_use, compute_device, device_budget, in_callback, warn_host_fallback
from jask.exec.events import count, count_wait
from jask.exec.progress import progress
from jask.exec.run_windows import WindowRunner
from jask.exec.schedule import window_input_bytes, windows
from jask.graph.nodes import Node, OpNode, ScalarNode, StoredNode, ZerosNode
from jask.graph.op import CustomOp
from jask.graph.tiling import block_at, grid, region
from jask.io.prefetch import Prefetcher
from jask.io.reader import reader_for
from jask.io.writer import WriteBehind
from jask.plan.planner import Plan


PREFETCH_DEPTH = 2         # input tiles read ahead of the kernel (counted in SLOTS_PER_LEAF)


WRITE_DEPTH = 2            # output tiles queued behind the computation (counted in SLOTS_FIXED)

# Read buffers kept between passes, as a share of the budget (1/4): the next pass over the same tiles
# reuses them instead of faulting in fresh pages (see jask.io.reader.BufferPool).
RETAINED_READ_BUFFERS_SHARE = 4


class Executor:
    """Runs one plan: each stage window by window (:mod:`jask.exec.schedule`), writing finished tiles."""

    def __init__(self, p: Plan, device=None):
        self.plan = p
        self.tile = p.tile
        self.backend = kernels.get_backend()
        self.backend.check_settings("+".join(p.prepared[id(n)].name for n in p.fused + p.stages))
        self.device = device or compute_device()
        # the host fallback inside a callback (see run) computes with the host's backend
        self.backend = kernels.backend_for(self.backend, self.device.platform)
        # On an accelerator the reader threads start each tile's host-to-device copy (asynchronous),
        # so the next window's transfer overlaps this window's kernel; the host keeps NumPy tiles.
        self.place = None if self.device.platform == "cpu" else (lambda x: jax.device_put(x, self.device))

    def read(self, node: StoredNode, idx):
        """One stored tile, read now (for custom ops and copies; passes read through the prefetcher)."""
        t0 = time.perf_counter()
        block = reader_for(node.store).read(region(idx, node.shape, self.tile))
        count(bytes_read=block.nbytes, io_seconds=time.perf_counter() - t0)
        return block

    def tile_of(self, node: Node, idx):
        """One tile of ``node``: read, a constant, or computed as a window of its own."""
        node = node.resolved()
        if isinstance(node, StoredNode):
            return self.read(node, idx)
        if isinstance(node, ScalarNode):
            return node.value
        if isinstance(node, ZerosNode):
            return np.zeros(block_at(node.shape, idx, self.tile), node.dtype)
        ((_, _, tile),) = self.run_windows([node], [tuple(idx)])
        return tile

    def compute(self, nodes: list[OpNode], sinks) -> None:
        """Compute a lockstep group (usually one node), window by window, writing each finished tile."""
        op = self.plan.prepared[id(nodes[0])].op
        if isinstance(op, CustomOp):
            algo = OOCAlgorithm(self, nodes[0], sinks[0])
            op.forward(algo, *nodes[0].inputs)
            algo.check_complete()
            return
        indices = list(itertools.product(*map(range, grid(nodes[0].shape, self.tile))))
        if all(getattr(s, "done", None) is not None for s in sinks):   # resuming: skip tiles on disk
            indices = [i for i in indices
                       if not all(s.done(region(i, n.shape, self.tile)) for n, s in zip(nodes, sinks))]
        names = " + ".join(self.plan.prepared[id(n)].name for n in nodes)
        writer_of = {}
        with contextlib.ExitStack() as stack:
            bar = progress(len(indices) * len(nodes), names)
            stack.callback(bar.close)
            for node, sink in zip(nodes, sinks):
                writer_of[id(node)] = stack.enter_context(
                    WriteBehind(sink, depth=WRITE_DEPTH, count=count if sink.counts_io else count_wait))
            for node, idx, tile in self.run_windows(nodes, indices):
                writer_of[id(node)].put(region(idx, node.shape, self.tile), tile, key=idx)
                count(tiles=1)
                bar.update(1, tile.nbytes)

    def run_windows(self, group, indices):
        """Yield ``(node, idx, tile)`` for every tile of ``group`` at ``indices``, computed window by window.

        One schedule (:func:`jask.exec.schedule.windows`) drives the reads and
        the kernel calls; the prefetcher reads the next window's tiles while the
        current window computes.
        """
        sched = list(windows(self.plan, group, indices, window_limit(self.plan), window_input_bytes(self.device)))
        requests = [r for w in sched for r in w.reads]
        per_window = [[region_bytes(store, reg) for _, (store, reg) in w.reads] for w in sched]
        depth = prefetch_depth([b for sizes in per_window for b in sizes], max(map(sum, per_window), default=0))
        runner = WindowRunner(self.backend, self.device, {id(n) for n in group}, count)
        with Prefetcher(requests, depth=depth, count=count, place=self.place,
                        retain_bytes=config.memory_budget // RETAINED_READ_BUFFERS_SHARE) as stream:
            def take(key):
                got, block = next(stream)
                if got != key:
                    raise RuntimeError(f"read-ahead out of step: expected tile {key.tile}, got {got.tile}")
                return block

            for w in sched:
                count(windows=1)
                t0 = time.perf_counter()
                try:
                    finished = runner.run(w, take)
                except Exception as e:
                    names = ", ".join(f"{self.plan.prepared[id(n)].name} tile {i}" for n, i in w.done[:3])
                    e.add_note(f"while computing a window of {len(w.done)} tiles ({names}"
                               f"{', ...' if len(w.done) > 3 else ''})")
                    raise
                count(compute_seconds=time.perf_counter() - t0)
                for node, idx, tile in finished:
                    expected = block_at(node.shape, idx, self.tile)
                    if tile is None:
                        tile = np.zeros(expected, node.dtype)
                    tile = tile.astype(node.dtype, copy=False) if isinstance(tile, np.ndarray) \
                        else tile.astype(node.dtype)
                    if tuple(tile.shape) != expected:
                        raise ValueError(f"{self.plan.prepared[id(node)].name}.forward_block produced a tile of "
                                         f"shape {tuple(tile.shape)} for output tile {tuple(idx)}, "
                                         f"expected {expected}")
                    yield node, idx, tile


def usable_device():
    """The compute device, or the host CPU inside a callback of a program that holds the accelerator."""
    device = compute_device()
    if device.platform == "cpu" or not in_callback() or callback_can_use(device):
        return device
    warn_host_fallback(device)
    return jax.devices("cpu")[0]


def region_bytes(store, reg) -> int:
    return int(np.prod([r.stop - r.start for r in reg], dtype=np.int64)) * store.dtype.itemsize


def prefetch_depth(sizes, window_bytes: int) -> int:
    """Reads the prefetcher may hold: as many as fit one window's bytes wherever they start.

    The depth counts reads, and reads differ in size (a window of many small
    tiles next to one of large ones), so the count that is safe everywhere is
    the smallest, over every starting read, of how many consecutive reads fit
    in the largest window's input bytes; never below ``PREFETCH_DEPTH``.
    """
    best, total, j = None, 0, 0
    for i in range(len(sizes)):
        j = max(j, i)
        while j < len(sizes) and total + sizes[j] <= window_bytes:
            total += sizes[j]
            j += 1
        if j < len(sizes):                 # a run cut by the budget, not by the end of the pass
            best = j - i if best is None else min(best, j - i)
        total -= sizes[i] if j > i else 0
    return max(PREFETCH_DEPTH, len(sizes) if best is None else best)


def window_limit(p: Plan) -> int:
    """Bytes one window may hold: the host budget, or the device's when that is smaller.

    Never below the plan's projection of one tile, so a plan that fits runs.
    """
    return max(p.projected_bytes, min(config.memory_budget, device_budget()))
