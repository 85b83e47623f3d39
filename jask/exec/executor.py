"""The executor: runs one plan's stages window by window, reading ahead and writing behind.

One schedule (:func:`jask.exec.schedule.spread`) drives both the prefetcher,
which reads the next window's tiles while the current one computes, and the
window runner (:mod:`jask.exec.run_windows`), which makes one kernel call per
program shape.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import time

import jax
import numpy as np

from jask import kernels
from jask.config import config
from jask.exec.custom import OOCAlgorithm
from jask.exec.devices import callback_can_use, compute_devices, device_budget, in_callback, warn_host_fallback
from jask.exec.events import count, count_wait
from jask.exec.partials import Partials
from jask.exec.progress import progress
from jask.exec.run_windows import WindowRunner, kernels_cache
from jask.exec.schedule import spread, window_input_bytes
from jask.graph.nodes import Node, OpNode, ScalarNode, StoredNode, ZerosNode
from jask.graph.op import CustomOp
from jask.graph.tiling import block_at, grid, region
from jask.io.malloc import HeapWatch
from jask.io.prefetch import Prefetcher
from jask.io.reader import reader_for
from jask.io.writer import WriteBehind
from jask.plan.planner import Plan


PREFETCH_DEPTH = 2         # input tiles read ahead of the kernel (counted in SLOTS_PER_LEAF)


WRITE_DEPTH = 2            # output tiles queued behind the computation (counted in SLOTS_FIXED)

# Read buffers kept between passes, as a share of the budget (1/4): the next pass over the same tiles
# reuses them instead of faulting in fresh pages (see jask.io.buffers.BufferPool).
RETAINED_READ_BUFFERS_SHARE = 4


class Executor:
    """Runs one plan: each stage window by window (:mod:`jask.exec.schedule`), writing finished tiles.

    With several ``devices`` each pass is spread over them (:func:`jask.exec.schedule.spread`):
    each device computes a contiguous share of the windows; custom ops run on the first.
    """

    def __init__(self, p: Plan, devices=None):
        self.plan = p
        self.tile = p.tile
        self.backend = kernels.get_backend()
        self.backend.check_settings("+".join(p.prepared[id(n)].name for n in p.fused + p.stages))
        self.devices = pass_devices(p, devices or compute_devices())
        self.device = self.devices[0]
        # the host fallback inside a callback (see run) computes with the host's backend
        self.backend = kernels.backend_for(self.backend, self.device.platform)
        # On an accelerator the reader threads start each tile's host-to-device copy (asynchronous),
        # so the next window's transfer overlaps this window's kernel; the host keeps NumPy tiles
        # (their buffers are recycled, so they are never handed to a CPU device without a copy).
        self.place_on_reader = self.device.platform != "cpu"

    def read(self, node: StoredNode, idx):
        """One stored tile, read now (for custom ops and copies; passes read through the prefetcher)."""
        t0 = time.perf_counter()
        block = reader_for(node.store).read(region(idx, node.shape, self.tile))
        count(bytes_read=block.nbytes, io_seconds=time.perf_counter() - t0,
              bytes_by_device={self.device: block.nbytes}, tiles_by_device={self.device: 1})
        return block

    def tile_of(self, node: Node, idx):
        """One tile of ``node``: read, a constant, or computed as a window of its own."""
        node = self.plan.stored_aside.get(id(node.resolved()), node.resolved())
        if isinstance(node, StoredNode):
            return self.read(node, idx)
        if isinstance(node, ScalarNode):
            return node.value
        if isinstance(node, ZerosNode):
            return np.zeros(block_at(node.shape, idx, self.tile), node.dtype)
        ((_, _, tile),) = self.run_windows([node], [tuple(idx)])
        return tile

    def compute(self, nodes: list[OpNode], sinks, processes=(0, 1), exchange=None, tiles=None) -> None:
        """Compute a lockstep group (usually one node), window by window, writing each finished tile.

        ``processes=(i, n)``: compute only process i's share of n (a multi-host run);
        ``exchange(tiles)`` turns that share's tiles into the ones to write. ``tiles``: compute
        only these output tiles (a process's whole chunk or shard files, :mod:`jask.exec.block_shares`).
        """
        op = self.plan.prepared[id(nodes[0])].op
        if isinstance(op, CustomOp):
            if tuple(processes) != (0, 1) or exchange is not None or tiles is not None:
                raise ValueError(f"{self.plan.prepared[id(nodes[0])].name} is a custom op: it runs whole in "
                                 f"every process, it cannot compute a share {tuple(processes)}")
            algo = OOCAlgorithm(self, nodes[0], sinks[0])
            op.forward(algo, *nodes[0].inputs)
            algo.check_complete()
            return
        indices = [tuple(i) for i in tiles] if tiles is not None else \
            list(itertools.product(*map(range, grid(nodes[0].shape, self.tile))))
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
            # tiles to exchange stay in the accumulator dtype: folded across processes, then cast once
            tiles = self.run_windows(nodes, indices, processes, cast=exchange is None)
            for node, idx, tile in (tiles if exchange is None else exchange(tiles)):
                writer_of[id(node)].put(region(idx, node.shape, self.tile), tile, key=idx)
                count(tiles=1)
                bar.update(1, tile.nbytes)

    def run_windows(self, group, indices, processes=(0, 1), cast=True):
        """Yield ``(node, idx, tile)`` for every tile of ``group`` at ``indices``, computed window by window.

        One schedule (:func:`jask.exec.schedule.spread`) drives the reads and
        the kernel calls; the prefetcher reads the next window's tiles while the
        current window computes. Each window runs on its share's device; reads
        are counted for that device. ``processes=(i, p)``: only process i's share of p.
        ``cast=False``: tiles stay in the dtype they were computed in (partials in the accumulator
        dtype, for a fold across processes).
        """
        n = len(self.devices)
        sched = spread(self.plan, group, indices, window_limit(self.plan, n), window_input_bytes(self.device), n,
                       processes[0] * n, processes[1] * n)
        requests, place = self._placed_reads(sched)
        per_window = [[region_bytes(store, reg) for _, (store, reg) in w.reads] for _, w in sched]
        depth = prefetch_depth([b for sizes in per_window for b in sizes], max(map(sum, per_window), default=0))
        ids = {id(nd) for nd in group}
        runners = [WindowRunner(self.backend, d, ids, count) for d in self.devices]
        partials = Partials(sched, self.devices, lambda nd: kernels_cache.combine(self.plan.prepared[id(nd)].op))
        reading_for = [self.device]
        heap = HeapWatch(config.memory_budget)

        def count_read(**counts):
            dev = reading_for[0]
            count(**counts, bytes_by_device={dev: counts.get("bytes_read", 0)}, tiles_by_device={dev: 1})

        with Prefetcher(requests, depth=depth, count=count_read, place=place,
                        retain_bytes=config.memory_budget // RETAINED_READ_BUFFERS_SHARE,
                        host_consumer=all(d.platform == "cpu" for d in self.devices)) as stream:
            def take(key):
                got, block = next(stream)
                if got != key:
                    raise RuntimeError(f"read-ahead out of step: expected tile {key.tile}, got {got.tile}")
                return block

            for share, w in sched:
                reading_for[0] = self.devices[share]
                count(windows=1, windows_by_device={self.devices[share]: 1}, largest_window_bytes=w.projected)
                t0 = time.perf_counter()
                try:
                    finished = runners[share].run(w, take)
                except Exception as e:
                    names = ", ".join(f"{self.plan.prepared[id(nd)].name} tile {i}" for nd, i in w.done[:3])
                    e.add_note(f"while computing a window of {len(w.done)} tiles ({names}"
                               f"{', ...' if len(w.done) > 3 else ''}) on {self.devices[share]}")
                    raise
                count(compute_seconds=time.perf_counter() - t0, heap_trims=int(heap.after_window()))
                for node, idx, tile in partials.finished(share, finished):
                    yield node, idx, self._checked(node, idx, tile, cast)

    def _placed_reads(self, sched):
        """The pass's read requests, and what the reader threads apply to each tile read (or None).

        Each read goes to its window's device. The prefetcher calls ``place`` on
        the reader thread that took the request from the iterator, so the
        generator notes the device for that thread as it hands the request out.
        """
        if not self.place_on_reader:
            return [r for _, w in sched for r in w.reads], None
        target = threading.local()

        def requests():
            for share, w in sched:
                for r in w.reads:
                    target.device = self.devices[share]
                    yield r

        return requests(), on_reader_thread(lambda x: jax.device_put(x, target.device))

    def _checked(self, node, idx, tile, cast=True):
        """A finished tile in the node's dtype (unless not ``cast``) and shape (zeros for a tile with no entries)."""
        expected = block_at(node.shape, idx, self.tile)
        if tile is None:
            return np.zeros(expected, node.dtype)
        if cast:
            tile = tile.astype(node.dtype, copy=False) if isinstance(tile, np.ndarray) else tile.astype(node.dtype)
        if tuple(tile.shape) != expected:
            raise ValueError(f"{self.plan.prepared[id(node)].name}.forward_block produced a tile of "
                             f"shape {tuple(tile.shape)} for output tile {tuple(idx)}, expected {expected}")
        return tile


def on_reader_thread(place):
    """``place`` as run on a reader thread with the caller's 64-bit mode: ``jax.enable_x64`` is
    thread-local, and without it an int64 tile placed there arrives as int32 (2**40 became 0 on a TPU)."""
    x64 = bool(jax.config.jax_enable_x64)

    def placed(x):
        with jax.enable_x64(x64):
            return place(x)
    return placed


def usable_devices():
    """The compute devices, less those a callback of a program holding them cannot use (host CPU if none)."""
    devices = compute_devices()
    if devices[0].platform == "cpu" or not in_callback():
        return devices
    usable = [d for d in devices if callback_can_use(d)]
    if usable:
        return usable
    warn_host_fallback(devices[0])
    return [jax.local_devices(backend="cpu")[0]]   # this process's own host CPU


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


def pass_devices(p: Plan, devices) -> list:
    """The first of ``devices`` a plan's passes spread over: as many as each fit a window of the plan's
    projection in ``1/n`` of the host budget, at least one.

    The planner sizes tiles to the whole budget; n devices each keep windows of at
    least one projected tile in flight, so more than ``budget // projected`` of them
    would hold more than the budget together.
    """
    devices = list(devices)
    return devices[:max(1, min(len(devices), config.memory_budget // max(1, p.projected_bytes)))]


def window_limit(p: Plan, n_devices: int = 1) -> int:
    """Bytes one window may hold: the host budget, or the device's when that is smaller.

    With several devices each keeps its own windows in flight, so each takes
    ``1/n`` of the host budget (the device budget is per device already).
    Never below the plan's projection of one tile, so a plan that fits runs; with
    ``n`` from :func:`pass_devices` that floor never takes n devices over the budget.
    """
    return max(p.projected_bytes, min(config.memory_budget // n_devices, device_budget()))
