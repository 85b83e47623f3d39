"""Planner and executor for the lazy tile graph.

A sink calls :func:`run` with one or more root nodes. Planning happens before
any byte is written:

1. Collect the graph below the roots and count each node's consumers.
2. Pick one tile edge ``T`` for the whole plan (every axis of every array is cut
   into blocks of ``min(T, dim)``), so index maps of producers and consumers
   always agree, even across transposes and contractions.
3. Decide which intermediate nodes are *fused* (recomputed tile by tile inside
   their consumer) and which are *materialized* to scratch: a node is fused
   when it has exactly one consumer and that consumer reads each of its tiles
   at most once (elementwise chains, a dot feeding an elementwise epilogue or a
   sum). Anything else is computed once and stored.
4. Project peak memory (:func:`projected_bytes`) and shrink ``T`` until it fits
   the budget, or refuse with an error saying what would fit.

Execution walks each materialized node's output tiles in order. A tile is
*pulled*: the op's ``index_map`` names the entries; each entry becomes a fused
program (:mod:`jask.base.fusion`) whose leaves are stored tiles (or tiles of
multi-entry producers, pulled recursively) and whose steps are the fused
single-entry producers, and the backend (:mod:`jask.kernels`) runs one compiled
kernel per entry and folds the entries with ``combine``.
Only the blocks of one entry per node on the current path, plus one
accumulator per node, are alive at any time.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import math
import threading
import time
import weakref
from collections import defaultdict

import jax
import numpy as np

from jask import kernels
from jask.base.fusion import entries_of, entry_program, live_positions
from jask.base.graph import Node, OpNode, ScalarNode, StoredNode, ZerosNode
from jask.base.op import CustomOp, TiledInput
from jask.exec.devices import callback_can_use, compute_device, device_budget, warn_host_fallback
from jask.exec.run_windows import WindowRunner
from jask.exec.schedule import window_input_bytes, windows
from jask.io import malloc
from jask.io.reader import Prefetcher, reader_for
from jask.io.writer import WriteBehind
from jask.plan.memory import SLOTS_FIXED, SLOTS_PER_LEAF, SLOTS_PER_OP

MAX_TILE_ELEMENTS = 2**24  # 64 MiB of float32: bigger tiles stop paying off
MIN_TILE_EDGE = 8
LOCKSTEP_MIN_TILE_BYTES = 1 << 20  # the planner halves the tile for a lockstep join down to this size
RELEASE_AFTER_BYTES = 16 << 20     # after a run projected at this or more, return freed memory (run())
PREFETCH_DEPTH = 2         # input tiles read ahead of the kernel (counted in SLOTS_PER_LEAF)
WRITE_DEPTH = 2            # output tiles queued behind the computation (counted in SLOTS_FIXED)


# ---------------------------------------------------------------- tiling

def block_shape(shape, tile: int) -> tuple[int, ...]:
    return tuple(min(tile, d) for d in shape)


def grid(shape, tile: int) -> tuple[int, ...]:
    return tuple(math.ceil(d / b) for d, b in zip(shape, block_shape(shape, tile)))


def region(idx, shape, tile: int) -> tuple[slice, ...]:
    return tuple(slice(i * tile, min((i + 1) * tile, d)) for i, d in zip(idx, shape))


def tiled(node: Node, tile: int) -> TiledInput:
    return TiledInput(node.shape, node.dtype, block_shape(node.shape, tile))


def _elements(shape, tile: int) -> int:
    return int(np.prod(block_shape(shape, tile), dtype=np.int64))


def first_tile(shapes) -> int:
    """Smallest power-of-two edge that makes every array a single tile (the planner shrinks from here)."""
    biggest = max((max(s, default=1) for s in shapes), default=1)
    return 2 ** math.ceil(math.log2(max(biggest, 1)))


def default_tile(shape, itemsize: int, n_inputs: int = 2) -> int:
    """Tile edge an elementwise op over ``n_inputs`` arrays of this shape would get under the budget.

    Used for the chunks of arrays jask writes, so storage chunks and tiles line up.
    """
    from jask.config import config
    if config.tile is not None:
        return config.tile
    slots = SLOTS_PER_LEAF * n_inputs + SLOTS_PER_OP + SLOTS_FIXED
    edge = first_tile([shape])
    while edge > MIN_TILE_EDGE and (_elements(shape, edge) > MAX_TILE_ELEMENTS
                                    or slots * _elements(shape, edge) * max(itemsize, 4) > config.memory_budget):
        edge //= 2
    return edge


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


# ---------------------------------------------------------------- statistics

@dataclasses.dataclass
class Stats:
    """Deterministic counters of executed work (bytes, tiles, kernel calls)."""

    tiles: int = 0
    windows: int = 0
    kernel_calls: int = 0
    xla_fallback_calls: int = 0        # window programs a Pallas backend could not run here, run by xla
    bytes_read: int = 0
    bytes_written: int = 0
    arrays_written: int = 0
    io_seconds: float = 0.0
    compute_seconds: float = 0.0
    io_wait_seconds: float = 0.0
    plans: int = 0
    peak_projected_bytes: int = 0
    devices: frozenset = frozenset()   # the devices kernels ran on

    def add(self, **counts) -> None:
        for k, v in counts.items():
            setattr(self, k, getattr(self, k) | v if k == "devices" else getattr(self, k) + v)

    def saw_plan(self, p: "Plan") -> None:
        self.plans += 1
        self.peak_projected_bytes = max(self.peak_projected_bytes, p.projected_bytes)


_listeners: list[Stats] = []


def _count(**counts) -> None:
    for s in _listeners:
        s.add(**counts)


# ---------------------------------------------------------------- planning

@dataclasses.dataclass
class Prepared:
    """One op instance built for a plan's tiling (kernels are compiled per fused program)."""

    op: object
    name: str


@dataclasses.dataclass
class Plan:
    """What will run: tile edge, materialized nodes in order, fused nodes, projected memory."""

    tile: int
    roots: list[Node]
    stages: list[OpNode]
    fused: list[OpNode]
    prepared: dict[int, Prepared]
    projected_bytes: int
    budget: int
    live: object = None
    groups: list = dataclasses.field(default_factory=list)

    def __post_init__(self):
        self.fused_ids = {id(n) for n in self.fused}

    def describe(self) -> str:
        lines = [f"plan: tile edge {self.tile}, projected peak {human_bytes(self.projected_bytes)} "
                 f"of budget {human_bytes(self.budget)}"]
        for group in self.groups:
            for k, n in enumerate(group):
                inner = [self.prepared[id(f)].name for f in _leaves_and_ops(n, self.fused_ids, self.live)[1][1:]]
                extra = f" (fused: {', '.join(inner)})" if inner else ""
                lead = "  " if k == 0 else "  + in lockstep: "
                lines.append(f"{lead}{self.prepared[id(n)].name} -> {n.shape} {n.dtype}, "
                             f"grid {grid(n.shape, self.tile)}{extra}")
        return "\n".join(lines)


def _collect(roots, live=None):
    """Post-order list of pending OpNodes below ``roots`` and, per node, the (consumer, position) edges.

    ``live(node)`` gives the input positions to follow (default: all).
    """
    order, edges, seen = [], defaultdict(list), set()
    stack = [(r.resolved(), False) for r in roots]
    while stack:
        node, expanded = stack.pop()
        if not isinstance(node, OpNode) or node.result is not None:
            continue
        if expanded:
            if id(node) not in seen:
                seen.add(id(node))
                order.append(node)
            continue
        if id(node) in seen:
            continue
        stack.append((node, True))
        positions = live(node) if live else range(len(node.inputs))
        for p in positions:
            inp = node.inputs[p].resolved()
            edges[id(inp)].append((node, p))
            if isinstance(inp, OpNode) and inp.result is None and id(inp) not in seen:
                stack.append((inp, False))
    return order, edges


def _leaves_and_ops(node: OpNode, fused_ids, live):
    """Distinct leaf inputs and op nodes evaluated while pulling one tile of ``node``."""
    leaves, ops, stack, seen = [], [node], [node], {id(node)}
    while stack:
        current = stack.pop()
        for p in live(current):
            inp = current.inputs[p].resolved()
            if id(inp) in seen:
                continue
            seen.add(id(inp))
            if isinstance(inp, OpNode) and id(inp) in fused_ids:
                ops.append(inp)
                stack.append(inp)
            elif not isinstance(inp, ScalarNode):
                leaves.append(inp)
    return leaves, ops


def tile_bytes(node: Node, tile: int) -> int:
    """Bytes of one full tile of ``node`` at this edge (items counted as at least 4 bytes: f32 accumulation)."""
    return _elements(node.shape, tile) * max(node.dtype.itemsize, 4)


def _group_bytes(group, fused_ids, tile: int, live) -> int:
    """Projected bytes of one lockstep group: its members' terms, each distinct leaf charged once.

    Members read a shared leaf's tile once per index (the executor's memo), and
    a member read by a later one is already held as that member's output tile.
    """
    members = {id(n) for n in group}
    leaves, op_bytes = {}, 0
    for node in group:
        node_leaves, ops = _leaves_and_ops(node, fused_ids, live)
        leaves.update((id(n), n) for n in node_leaves if id(n) not in members)
        op_bytes += sum(tile_bytes(n, tile) for n in ops)
    return (SLOTS_PER_LEAF * sum(tile_bytes(n, tile) for n in leaves.values())
            + SLOTS_PER_OP * op_bytes
            + SLOTS_FIXED * sum(tile_bytes(n, tile) for n in group))


def projected_bytes(groups, fused_ids, tile: int, live) -> int:
    """Projected peak bytes of executing ``groups`` of stages with tile edge ``tile``.

    Per stage, each term charged at the tile size of the array it belongs to:
    ``SLOTS_PER_LEAF`` tiles for each distinct leaf input read while pulling one
    output tile (raw chunk bytes, the assembled region, the device copy, one
    read ahead), ``SLOTS_PER_OP`` for each op on the pull path (partial and
    accumulator), and ``SLOTS_FIXED`` output tiles (the finished tile and its
    write). Stages of one group run in lockstep, so their needs add up, except
    that a leaf they share is held once; groups run one after another, so the
    plan's peak is the largest group.
    """
    return max((_group_bytes(group, fused_ids, tile, live) for group in groups), default=0)


def _lockstep_groups(stages, prepared, fused_ids, tile, live, budget,
                     in_step: bool = True) -> tuple[list[list[OpNode]], bool]:
    """Split stages into groups computed tile by tile together, sharing reads.

    Consecutive stages join one group when they have the same shape and each
    output tile is a single entry (elementwise-like). A stage may read an
    earlier member's output if it reads it only at its own tile index: that
    tile was just computed for the same index and is taken from memory, not
    stored and read back (only with ``in_step``, which is off when fusion is
    off: each op of a chain is then its own pass). Gradients ``da`` and ``db``
    of ``a - b`` then read their shared inputs once per tile instead of once
    per gradient, and an optimizer's moments and the parameters computed from
    them take one pass. A stage joins only while the group's projected memory
    stays within ``budget``: sharing reads is never worth a refused plan (the
    planner may take a smaller tile for it: :func:`plan`). Returns the groups
    and whether a join was refused only for the budget.
    """
    groups: list[list[OpNode]] = []
    joinable = refused = False
    for node in stages:
        simple = (node.shape != () and not isinstance(prepared[id(node)].op, CustomOp)
                  and _one_entry_per_tile(node, prepared[id(node)], tile))
        if (simple and joinable and groups[-1][0].shape == node.shape
                and _reads_members_in_step(node, groups[-1], prepared, fused_ids, tile, live, in_step)):
            if _group_bytes(groups[-1] + [node], fused_ids, tile, live) <= budget:
                groups[-1].append(node)
                continue
            refused = True
        groups.append([node])
        joinable = simple
    return groups, refused


def _reads_members_in_step(node, members, prepared, fused_ids, tile, live, allowed=True) -> bool:
    """Whether ``node`` reads the members' outputs, if at all, only at its own output tile index
    (and not at all unless ``allowed``)."""
    member_ids = {id(m) for m in members}
    if not any(id(n) in member_ids for n in _leaves_and_ops(node, fused_ids, live)[0]):
        return True
    if not allowed:
        return False
    view = _PlanView(tile, prepared, fused_ids)
    prep = prepared[id(node)]
    for idx in itertools.product(*map(range, grid(node.shape, tile))):
        for entry in entries_of(prep, node, idx):
            for leaf in entry_program(view, node, entry).leaves:
                if id(leaf.node) in member_ids and leaf.kind == "tile" and leaf.block != idx:
                    return False
    return True


@dataclasses.dataclass(frozen=True)
class _PlanView:
    """What :func:`entry_program` needs of a plan, before the plan exists."""

    tile: int
    prepared: dict
    fused_ids: set


def _tiles_read(consumer: OpNode, prep: Prepared, position: int, tile: int) -> list:
    """Every block index the consumer reads at one input position, over all its output tiles."""
    return [entry[position]
            for out_idx in np.ndindex(*grid(consumer.shape, tile))
            for entry in entries_of(prep, consumer, out_idx)]


def _one_entry_per_tile(node: OpNode, prep: Prepared, tile: int) -> bool:
    return len(entries_of(prep, node, (0,) * node.ndim)) == 1


def _should_fuse(node, edges, prepared, fused_ids, tile, live) -> bool:
    """Fuse (recompute per consumer tile) or materialize? The planner's one cost rule.

    A node is fused only if each consumer reads each of its tiles at most once.
    With a single consumer that is always cheaper than storing it. With ``c``
    consumers, recomputing reads the node's leaves ``c`` times (``c * L`` array
    sizes, where ``L`` is leaf bytes over the node's bytes), while storing costs
    ``L`` (one read of the leaves) + 1 (the write) + ``c`` (reading it back).
    Recompute only chains of one-entry-per-tile ops (elementwise work), never a
    contraction, whose per-tile reads are far larger than ``L`` suggests.
    """
    if isinstance(prepared[id(node)].op, CustomOp):
        return False
    for consumer, p in edges:
        if isinstance(prepared[id(consumer)].op, CustomOp):
            return False
        seen = _tiles_read(consumer, prepared[id(consumer)], p, tile)
        if len(seen) != len(set(seen)):
            return False
    if len(edges) == 1:
        return True
    leaves, ops = _leaves_and_ops(node, fused_ids, live)
    if not all(_one_entry_per_tile(n, prepared[id(n)], tile) for n in ops):
        return False
    ratio = sum(0 if isinstance(leaf, ZerosNode) else _nbytes(leaf) for leaf in leaves) / max(_nbytes(node), 1)
    c = len(edges)
    return c * ratio <= ratio + 1 + c


def _nbytes(node: Node) -> int:
    return int(np.prod(node.shape, dtype=np.int64)) * node.dtype.itemsize


def _prepare(node: OpNode, tile: int, backend, cache) -> Prepared:
    key = (node.spec, tuple(tiled(i.resolved(), tile) for i in node.inputs), backend.name)
    if key not in cache:
        cache[key] = Prepared(node.spec.build(list(key[1])), node.spec.name)
        while len(cache) > _CACHE_SIZE:
            cache.pop(next(iter(cache)))
    return cache[key]


_CACHE_SIZE = 256
_prepared_cache: dict = {}


def plan(roots) -> Plan:
    """Plan the computation of ``roots``; raises ``ValueError`` if it cannot fit the budget.

    The tile edge is the largest that fits the budget, except that when a
    lockstep join (shared reads, no store-and-read-back) was refused for want
    of memory, half the edge is taken if that plan reads fewer bytes, down to
    tiles of ``LOCKSTEP_MIN_TILE_BYTES``.
    """
    from jask.config import config
    order, _ = _collect(roots)
    every = list(order) + [i.resolved() for n in order for i in n.inputs] + [r.resolved() for r in roots]
    tile = config.tile or first_tile([n.shape for n in every])
    while not config.tile and tile > MIN_TILE_EDGE and any(
            _elements(n.shape, tile) > MAX_TILE_ELEMENTS for n in every):
        tile //= 2
    while True:
        p, need, names, refused = _plan_at(roots, order, tile)
        if p is not None:
            break
        if config.tile is not None or tile <= MIN_TILE_EDGE:
            if config.tile is not None:
                raise ValueError(
                    f"memory budget of {config.memory_budget} bytes is too small for {names} with the forced "
                    f"tile edge {tile}: it needs {need} bytes; use a smaller tile "
                    f"(jask.config.update('tile', ...)) or a budget of at least {need} bytes")
            raise ValueError(
                f"memory budget of {config.memory_budget} bytes is too small for {names}: the smallest plan "
                f"(tile edge {tile}) needs {need} bytes; raise it with jask.set_memory_budget({need})")
        tile //= 2
    reads = None
    while refused and not config.tile and tile // 2 >= MIN_TILE_EDGE and max(
            (tile_bytes(n, tile // 2) for n in p.stages), default=0) >= LOCKSTEP_MIN_TILE_BYTES:
        smaller, _, _, refused = _plan_at(roots, order, tile // 2)
        reads = _planned_io(p)[0] if reads is None else reads
        smaller_reads = _planned_io(smaller)[0] if smaller is not None else reads
        if smaller_reads >= reads:
            break
        p, tile, reads = smaller, tile // 2, smaller_reads
    return p


def _plan_at(roots, order, tile):
    """The plan at one tile edge: ``(plan or None if over budget, projected bytes, stage names,
    whether a lockstep join was refused for the budget)``."""
    from jask.config import config
    root_ids = {id(r.resolved()) for r in roots}
    copied = [r.resolved() for r in roots if not isinstance(r.resolved(), OpNode) and r.shape != ()]
    backend = kernels.get_backend()
    prepared = {id(n): _prepare(n, tile, backend, _prepared_cache) for n in order}
    live = lambda n: live_positions(n, prepared[id(n)].op)
    live_order, edges = _collect(roots, live)
    fused_ids = set()
    for n in live_order:  # producers come before consumers
        if (config.fusion and id(n) not in root_ids
                and _should_fuse(n, edges[id(n)], prepared, fused_ids, tile, live)):
            fused_ids.add(id(n))
    fused = [n for n in live_order if id(n) in fused_ids]
    stages = [n for n in live_order if id(n) not in fused_ids]
    groups, refused = _lockstep_groups(stages, prepared, fused_ids, tile, live, config.memory_budget,
                                       in_step=config.fusion)
    need = max(projected_bytes(groups, fused_ids, tile, live),
               max(((SLOTS_PER_LEAF + SLOTS_FIXED) * tile_bytes(r, tile) for r in copied), default=0))
    names = ", ".join(prepared[id(n)].name for n in stages)
    if need > config.memory_budget:
        return None, need, names, refused
    p = Plan(tile, list(roots), stages, fused, prepared, need, config.memory_budget, live, groups)
    return p, need, names, refused


# ---------------------------------------------------------------- execution

class Executor:
    """Runs one plan: each stage window by window (:mod:`jask.exec.schedule`), writing finished tiles."""

    def __init__(self, p: Plan, device=None):
        self.plan = p
        self.tile = p.tile
        self.backend = kernels.get_backend()
        self.backend.check_settings("+".join(p.prepared[id(n)].name for n in p.fused + p.stages))
        self.device = device or compute_device()
        if self.device.platform == "cpu" and self.backend.name == "pallas":
            self.backend = kernels.get_backend("xla")   # the host fallback inside a callback (see run)
        # On an accelerator the reader threads start each tile's host-to-device copy (asynchronous),
        # so the next window's transfer overlaps this window's kernel; the host keeps NumPy tiles.
        self.place = None if self.device.platform == "cpu" else (lambda x: jax.device_put(x, self.device))

    def read(self, node: StoredNode, idx):
        """One stored tile, read now (for custom ops and copies; passes read through the prefetcher)."""
        t0 = time.perf_counter()
        block = reader_for(node.store).read(region(idx, node.shape, self.tile))
        _count(bytes_read=block.nbytes, io_seconds=time.perf_counter() - t0)
        return block

    def tile_of(self, node: Node, idx):
        """One tile of ``node``: read, a constant, or computed as a window of its own."""
        node = node.resolved()
        if isinstance(node, StoredNode):
            return self.read(node, idx)
        if isinstance(node, ScalarNode):
            return node.value
        if isinstance(node, ZerosNode):
            return np.zeros(_block_at(node.shape, idx, self.tile), node.dtype)
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
        from jask.profile import progress
        indices = list(itertools.product(*map(range, grid(nodes[0].shape, self.tile))))
        names = " + ".join(self.plan.prepared[id(n)].name for n in nodes)
        writer_of = {}
        with contextlib.ExitStack() as stack:
            bar = progress(len(indices) * len(nodes), names)
            stack.callback(bar.close)
            for node, sink in zip(nodes, sinks):
                writer_of[id(node)] = stack.enter_context(
                    WriteBehind(sink, depth=WRITE_DEPTH, count=_count if sink.counts_io else _count_wait))
            for node, idx, tile in self.run_windows(nodes, indices):
                writer_of[id(node)].put(region(idx, node.shape, self.tile), tile, key=idx)
                _count(tiles=1)
                bar.update(1, tile.nbytes)

    def run_windows(self, group, indices):
        """Yield ``(node, idx, tile)`` for every tile of ``group`` at ``indices``, computed window by window.

        One schedule (:func:`jask.exec.schedule.windows`) drives the reads and
        the kernel calls; the prefetcher reads the next window's tiles while the
        current window computes.
        """
        sched = list(windows(self.plan, group, indices, window_limit(self.plan), window_input_bytes(self.device)))
        requests = [r for w in sched for r in w.reads]
        per_window = [[_region_bytes(store, reg) for _, (store, reg) in w.reads] for w in sched]
        depth = prefetch_depth([b for sizes in per_window for b in sizes], max(map(sum, per_window), default=0))
        runner = WindowRunner(self.backend, self.device, {id(n) for n in group}, _count)
        with Prefetcher(requests, depth=depth, count=_count, place=self.place) as stream:
            def take(key):
                got, block = next(stream)
                if got != key:
                    raise RuntimeError(f"read-ahead out of step: expected tile {key.tile}, got {got.tile}")
                return block

            for w in sched:
                _count(windows=1)
                t0 = time.perf_counter()
                try:
                    finished = runner.run(w, take)
                except Exception as e:
                    names = ", ".join(f"{self.plan.prepared[id(n)].name} tile {i}" for n, i in w.done[:3])
                    e.add_note(f"while computing a window of {len(w.done)} tiles ({names}"
                               f"{', ...' if len(w.done) > 3 else ''})")
                    raise
                _count(compute_seconds=time.perf_counter() - t0)
                for node, idx, tile in finished:
                    expected = _block_at(node.shape, idx, self.tile)
                    if tile is None:
                        tile = np.zeros(expected, node.dtype)
                    tile = tile.astype(node.dtype, copy=False) if isinstance(tile, np.ndarray) \
                        else tile.astype(node.dtype)
                    if tuple(tile.shape) != expected:
                        raise ValueError(f"{self.plan.prepared[id(node)].name}.forward_block produced a tile of "
                                         f"shape {tuple(tile.shape)} for output tile {tuple(idx)}, "
                                         f"expected {expected}")
                    yield node, idx, tile


def _count_wait(io_wait_seconds=0.0, **_):
    """Count only waiting time (for sinks whose writes are not disk I/O, like materialize)."""
    _count(io_wait_seconds=io_wait_seconds)


class OOCAlgorithm:
    """The toolkit a :class:`CustomOp` gets: tile geometry, tile reads, output tile writes.

    Inputs are passed to ``forward`` as opaque graph nodes; read them with
    :meth:`read`. Every output tile must be written exactly once.
    """

    def __init__(self, ex: Executor, node: OpNode, sink):
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
        expected = _block_at(self._node.shape, idx, self.tile)
        block = np.asarray(block, self._node.dtype)
        if block.shape != expected:
            raise ValueError(f"{self._ex.plan.prepared[id(self._node)].name}: output tile {idx} has shape "
                             f"{block.shape}, expected {expected}")
        self._sink.write(region(idx, self._node.shape, self.tile), block)
        self._written.add(idx)
        _count(tiles=1, bytes_written=block.nbytes if self._sink.counts_io else 0)

    def check_complete(self) -> None:
        missing = [i for i in self.tiles(None) if i not in self._written]
        if missing:
            name = self._ex.plan.prepared[id(self._node)].name
            raise ValueError(f"{name}.forward left {len(missing)} output tiles unwritten, e.g. {missing[0]}")


def _block_at(shape, idx, tile) -> tuple[int, ...]:
    return tuple(s.stop - s.start for s in region(idx, shape, tile))


# ---------------------------------------------------------------- sinks

class ScratchSink:
    """Writes a node to a fresh scratch store; by default the node then stands for it.

    ``chunks``/``shards`` choose the layout (``rechunk``); ``adopt=False`` leaves
    the node as it was and just returns the stored copy.
    """

    counts_io = True

    def __init__(self, node: OpNode, tile: int, chunks=None, shards=None, adopt: bool = True):
        from jask.io import scratch
        from jask.io.store import PendingStore
        self.node, self.adopt = node, adopt
        self.pending = PendingStore(scratch.new_path(), node.shape, node.dtype,
                                    chunks or block_shape(node.shape, tile), shards=shards)

    def write(self, reg, tile):
        self.pending.write(reg, tile)

    def finish(self):
        stored = StoredNode(self.pending.commit(owned=True))
        _count(arrays_written=1)
        if self.adopt and isinstance(self.node, OpNode):
            self.node.set_result(stored)
        return stored

    def abort(self):
        self.pending.abort()


class PathSink:
    """Writes a node to a user path, committed atomically (optionally replacing what is there)."""

    counts_io = True

    def __init__(self, node, tile, path, overwrite=False, writable=False, chunks=None, compressors=None,
                 shards=None):
        from jask.io.store import PendingStore
        self.overwrite, self.writable = overwrite, writable
        self.pending = PendingStore(path, node.shape, node.dtype, chunks or block_shape(node.shape, tile),
                                    compressors=compressors, shards=shards)

    def write(self, reg, tile):
        self.pending.write(reg, tile)

    def finish(self):
        _count(arrays_written=1)
        return self.pending.commit(owned=False, replace=self.overwrite, writable=self.writable)

    def abort(self):
        self.pending.abort()


class MemorySink:
    """Fills a NumPy array (``materialize``: the one place a whole array is meant to exist)."""

    counts_io = False

    def __init__(self, node, tile):
        self.out = np.empty(node.shape, node.dtype)

    def write(self, reg, tile):
        self.out[reg] = tile

    def finish(self):
        return self.out

    def abort(self):
        pass


def explain(*arrays) -> str:
    """The plan a sink would run for these arrays: tile edge, stages, fused ops, projected memory."""
    from jask.base.array import DiskArray
    nodes = []
    for x in arrays:
        if not isinstance(x, DiskArray) or x._node is None:
            raise TypeError("explain expects concrete DiskArrays (call it outside jit)")
        nodes.append(x._node)
    p = plan(nodes)
    read, written, n_windows = _planned_io(p)
    return (p.describe() + f"\n  {n_windows} window{'s' * (n_windows != 1)} of at most "
            f"{human_bytes(window_limit(p))} on {compute_device()} ({kernels.backend_name()} kernels); "
            f"reads {human_bytes(read)}, writes {human_bytes(written)}")


def _usable_device():
    """The compute device, or the host CPU inside a callback of a program that holds the accelerator."""
    from jask.base.runtime import in_callback
    device = compute_device()
    if device.platform == "cpu" or not in_callback() or callback_can_use(device):
        return device
    warn_host_fallback(device)
    return jax.devices("cpu")[0]


def _region_bytes(store, reg) -> int:
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
    from jask.config import config
    return max(p.projected_bytes, min(config.memory_budget, device_budget()))


def _planned_io(p: Plan) -> tuple[int, int, int]:
    """Bytes the plan reads from stored arrays and writes for its stages, and its windows (from its schedule)."""
    read = written = n_windows = 0
    limit, batch = window_limit(p), window_input_bytes(compute_device())
    for group in p.groups:
        if isinstance(p.prepared[id(group[0])].op, CustomOp):
            continue
        indices = itertools.product(*map(range, grid(group[0].shape, p.tile)))
        for w in windows(p, group, indices, limit, batch):
            n_windows += 1
            read += sum(_region_bytes(store, reg) for _, (store, reg) in w.reads)
        written += sum(_nbytes(n) for n in group if n.shape != ())
    return read, written, n_windows


_deferred: list = []          # weak references to nodes the next run stores too (store_with_next_run)
_deferred_lock = threading.Lock()


def store_with_next_run(nodes) -> None:
    """Have the next :func:`run`, whatever it computes, also store ``nodes`` to scratch, in its plan.

    For values needed later that the next computation reads anyway (an
    optimizer's moments, read again by the parameter update): stored in the
    same pass instead of one of their own. A node dropped meanwhile is skipped.
    """
    with _deferred_lock:
        _deferred.extend(weakref.ref(n) for n in nodes)


def _take_deferred(roots) -> list[OpNode]:
    taken = set(id(r.resolved()) for r in roots)
    out = []
    with _deferred_lock:
        refs = _deferred[:]
        _deferred.clear()
    for ref in refs:
        n = ref()
        if isinstance(n, OpNode) and n.result is None and n.shape != () and id(n) not in taken:
            taken.add(id(n))
            out.append(n)
    return out


def run(roots, make_sinks=None):
    """Compute ``roots``; returns one result per root.

    Scalar roots (shape ``()``) return a NumPy scalar. Other roots are written by
    the sink ``make_sinks(root, tile)`` returns (default: scratch, after which the
    root node stands for its stored result). Nodes passed to
    :func:`store_with_next_run` are stored in the same plan.
    """
    roots = list(roots)
    extra = _take_deferred(roots)
    p = None
    try:
        p = plan(roots + extra)
        # Inside jit this runs in io_callback, whose default device is the host CPU: name ours.
        device = _usable_device()
        with jax.default_device(device):
            return _run(p, roots, make_sinks, device)
    except BaseException:
        store_with_next_run([n for n in extra if n.result is None])   # still wanted
        raise
    finally:
        if p is not None and p.projected_bytes >= RELEASE_AFTER_BYTES:
            # Reference cycles a run leaves (plan closures and what they reach) held ~190 MB
            # after a 4096^2 dot until the collector ran; the young generations take ~1 ms.
            # Then freed tiles in the middle of the heap go back to the system.
            gc.collect(1)
            malloc.release_free_memory()


def _run(p: Plan, roots, make_sinks, device=None):
    for listener in _listeners:
        listener.saw_plan(p)
    ex = Executor(p, device)
    root_ids = {id(r.resolved()): i for i, r in enumerate(roots)}
    results = [None] * len(roots)
    for i, r in enumerate(roots):
        rr = r.resolved()
        if not isinstance(rr, OpNode):
            if rr.shape == ():
                results[i] = np.asarray(ex.tile_of(rr, ()))
            elif make_sinks is not None:
                results[i] = _copy(ex, rr, make_sinks(r, p.tile))
            else:
                results[i] = rr
    for group in p.groups:
        node = group[0]
        i = root_ids.get(id(node))
        if node.shape == () and i is not None:
            try:
                ((_, _, value),) = ex.run_windows(group, [()])
                results[i] = np.asarray(value)
                _count(tiles=1)
            except Exception as e:
                e.add_note(f"while computing {p.prepared[id(node)].name} {node.dtype} scalar")
                raise
            continue
        sinks = [make_sinks(n, p.tile) if (id(n) in root_ids and make_sinks is not None)
                 else ScratchSink(n, p.tile) for n in group]
        try:
            ex.compute(group, sinks)
        except BaseException:
            for sink in sinks:
                sink.abort()
            raise
        for k, (n, sink) in enumerate(zip(group, sinks)):
            try:
                out = sink.finish()
            except BaseException:
                # the rest never reach their paths; ones already committed stay (each is atomic alone)
                for rest in sinks[k + 1:]:
                    rest.abort()
                raise
            if id(n) in root_ids:
                results[root_ids[id(n)]] = out
    return results


def _copy(ex: Executor, node: Node, sink):
    """Stream an already stored (or zero) node into a sink, tile by tile."""
    try:
        for idx in itertools.product(*map(range, grid(node.shape, ex.tile))):
            sink.write(region(idx, node.shape, ex.tile), np.asarray(ex.tile_of(node, idx)))
            _count(tiles=1)
    except BaseException:
        sink.abort()
        raise
    return sink.finish()
