"""The schedule of a pass: its windows, each one kernel call per program shape, in order.

A *window* is a run of output tiles (and, for a reduction, of one tile's
entries) computed together. Building one is pure host work on the plan, done
before any byte moves, and its result drives both the reader and the kernels:

* ``reads``: the stored tiles the window needs, each once, in the order the
  prefetcher reads them (the executor takes them in the same order);
* ``calls``: kernel calls in dependency order. Entries of one node whose
  fused programs have the same shape (the same ops, wiring and leaf block shapes) share one call
  (:mod:`jask.kernels.window`), so a window of equal tiles is ONE kernel call; ragged edge tiles, a tile
  met twice on a diagonal, and fused multi-entry producers (a ``dot`` under an epilogue, computed for
  the tiles its consumer needs) get calls of their own;
* ``done``: the stage tiles whose last entry falls in this window.

A window grows until its projected bytes (``SLOTS_PER_LEAF`` per distinct
stored tile read, ``SLOTS_PER_OP`` per computed intermediate tile,
``SLOTS_FIXED`` per output tile: the planner's own terms) would pass the
limit, or its input would pass ``WINDOW_INPUT_BYTES``, or its entries
``MAX_WINDOW_ENTRIES``: one window is at most what the planner projected for
one tile when the tile already fills the budget, and small tiles share a call.
A reduction tile that does not fit whole in what is left of a window starts
the next one: a window straddling two tiles has an index table of its own,
compiled into a program of its own (each compile leaves memory resident).
Tiles of a lockstep group move together: a member may read an
earlier member's tile of the same index from memory.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np

from jask.exec.bands import band_order, band_rows
from jask.exec.kept_reads import keep_reads
from jask.exec.shares import shared_tiles
from jask.plan.fusion import entries_of, entry_program
from jask.graph.nodes import OpNode, StoredNode, ZerosNode
from jask.graph.tiling import block_at, grid, region
from jask.io.reader import TileKey
from jask.kernels.window import WindowSpec
from jask.plan.memory import SLOTS_FIXED, SLOTS_PER_LEAF, SLOTS_PER_OP

# A window stops growing once it reads this much: a call's dispatch is then small next to moving
# its data, and more tiles per call only hold more memory and delay the first kernel. Dispatch
# costs tens of microseconds on the CPU but ~0.3 ms on an H200, whose memory moves 16 MiB in
# ~4 us: accelerators take far bigger windows. CPU, 2 GiB sum of 16 MiB tiles (2026-12-04): one
# tile per window 12-14 GB/s, two 11-12.6 GB/s, stacked into 256 MB windows 2.4 GB/s.
WINDOW_INPUT_BYTES = {"cpu": 16 << 20, "accelerator": 256 << 20}
# At most this many entries per window: the xla program is unrolled over them (one compile per
# window shape), so this bounds its size and compile time.
MAX_WINDOW_ENTRIES = 256


def _bytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * max(np.dtype(dtype).itemsize, 4)


@dataclasses.dataclass
class Call:
    """One kernel call: ``program`` over ``spec``-shaped stacks of the values named in ``rows``.

    ``rows[j]`` lists the value keys of leaf position j's distinct tiles (the
    stack rows); ``tiles`` the output tile of each result row. A nested
    producer's tiles are complete after its calls; a stage tile's partials may
    continue in the next window (the runner carries them).
    """

    node: OpNode
    program: object            # EntryProgram of the first entry (all entries share its shape)
    spec: WindowSpec
    rows: list
    table: np.ndarray
    valid: np.ndarray
    tiles: list


@dataclasses.dataclass
class Window:
    reads: list                # (TileKey, (store, region)) in read order
    read_keys: list            # the value key of each read
    calls: list
    done: list                 # (node, tile index) of stage tiles finished here, in order
    constants: dict            # value key -> (kind, node, block) for zeros, placeholders, scalars
    projected: int = 0         # its projected bytes (the slot terms): what the pass holds, not one tile's share
    kept: list = dataclasses.field(default_factory=list)   # value keys an earlier window read for it, and of its
    keep: list = dataclasses.field(default_factory=list)   # reads a later window takes (jask.exec.kept_reads)


class _Draft:
    """A window being filled: entries grouped by program shape, values it needs, projected bytes."""

    def __init__(self, plan, stage_ids):
        self.plan, self.tile = plan, plan.tile
        self.stage_ids = stage_ids
        self.programs: dict = {}          # (node id, entry) -> its program, for this window only
        self.groups: dict = {}            # group key -> dict(node, program, entries: [(tile, [rows keys])])
        self.order: list = []             # group keys, first appearance
        self.produced: dict = {}          # value key -> group key that produces it
        self.reads: dict = {}             # value key -> read request (insertion ordered)
        self.constants: dict = {}
        self.done: list = []
        self.bytes = 0                    # projected bytes (the planner's slot terms)
        self.inputs = 0                   # bytes of the distinct stored tiles read
        self.entries = 0

    def program(self, node, entry):
        """``entry_program`` of one entry, built once per window: costing and adding an entry both need it,
        and building it was most of scheduling's ~40 us per entry. Kept for one window only: a
        pass-wide memo held every entry's program at once (+15-20 MB in an Adam step at tile 256)."""
        key = (id(node), entry)
        got = self.programs.get(key)
        if got is None:
            got = self.programs[key] = entry_program(self.plan, node, entry)
        return got

    # -- costs, without changing the draft
    def cost(self, node, idx, entries, seen=None) -> tuple[int, int]:
        """``(projected bytes, input bytes)`` that scheduling these entries would add to the window
        (``seen``: value keys already costed for other nodes' entries going in with these)."""
        seen, total = set() if seen is None else seen, [0, 0]
        stages = self.stage_ids     # any other op not fused is an earlier group's stage: read, once stored

        def walk(n, block, ents):
            for e in ents:
                for lf in self.program(n, e).leaves:
                    key = ("tile", id(lf.node.resolved()), lf.block)
                    if lf.kind != "tile" or key in seen or key in self.reads or key in self.produced:
                        continue
                    seen.add(key)
                    inner = lf.node.resolved()
                    size = _bytes(block_at(inner.shape, lf.block, self.tile), inner.dtype)
                    if isinstance(inner, OpNode) and id(inner) in self.plan.fused_ids:
                        total[0] += SLOTS_PER_OP * size
                        walk(inner, lf.block, entries_of(self.plan.prepared[id(inner)], inner, lf.block))
                    elif isinstance(inner, StoredNode) or isinstance(inner, OpNode) and id(inner) not in stages:
                        total[0] += SLOTS_PER_LEAF * size
                        total[1] += size

        walk(node, idx, entries)
        out = _bytes(block_at(node.shape, idx, self.tile), node.dtype)
        return total[0] + SLOTS_FIXED * out + SLOTS_PER_OP * out * (len(entries) > 0), total[1]

    def full(self, cost, limit_bytes, batch_bytes, entries=1) -> bool:
        """Whether adding work of this ``cost`` (and ``entries``) would take a non-empty window past a limit."""
        return self.entries > 0 and (self.bytes + cost[0] > limit_bytes or self.inputs + cost[1] > batch_bytes
                                     or self.entries + entries > MAX_WINDOW_ENTRIES)

    def take(self, cost) -> None:
        self.bytes += cost[0]
        self.inputs += cost[1]

    # -- adding work
    def add(self, node, idx, entries, depth=0) -> str:
        """Schedule ``entries`` of ``node``'s tile ``idx``; returns the group key of the last one."""
        gkey = None
        for e in entries:
            program = self.program(node, e)
            keys, sig = [], []
            for lf in program.leaves:
                inner = lf.node.resolved()
                if lf.kind == "scalar":
                    key = ("scalar", id(inner))
                    self.constants[key] = ("scalar", inner, ())
                    sig.append(((), inner.dtype))
                elif lf.kind == "placeholder" or isinstance(inner, ZerosNode):
                    shape = block_at(inner.shape, lf.block, self.tile)
                    key = ("zeros", shape, inner.dtype)
                    self.constants[key] = ("zeros", inner, shape)
                    sig.append((shape, inner.dtype))
                else:
                    key = ("tile", id(inner), lf.block)
                    self._need(key, inner, lf.block, depth)
                    sig.append((block_at(inner.shape, lf.block, self.tile), inner.dtype))
                keys.append(key)
            gkey = (id(node), program.key(), tuple(sig))
            group = self.groups.get(gkey)
            if group is None:
                group = self.groups[gkey] = dict(node=node, program=program, sig=tuple(sig), tiles={})
                self.order.append(gkey)
            group["tiles"].setdefault(tuple(idx), []).append(keys)
            self.entries += 1
        return gkey

    def _need(self, key, inner, block, depth):
        if key in self.reads or key in self.produced:
            return
        if isinstance(inner, StoredNode):
            self.reads[key] = (TileKey(id(inner), tuple(block)), (inner.store, region(block, inner.shape, self.tile)))
        elif isinstance(inner, OpNode) and id(inner) in self.plan.fused_ids:
            ents = entries_of(self.plan.prepared[id(inner)], inner, block)
            self.produced[key] = self.add(inner, block, ents, depth + 1) if ents else None
            if not ents:
                self.constants[key] = ("zeros", inner, block_at(inner.shape, block, self.tile))
        elif isinstance(inner, OpNode) and id(inner) in self.stage_ids:
            pass   # an earlier lockstep member's tile of this index: produced in this window
        else:
            # A stage of an earlier group, scheduled at plan time (to count bytes) before it is
            # stored: it will be read like a store of its shape and dtype by then.
            aside = self.plan.stored_aside.get(id(inner))
            source = inner if aside is None else aside.store
            self.reads[key] = (TileKey(id(inner), tuple(block)), (source, region(block, inner.shape, self.tile)))

    def seal(self) -> Window:
        calls = [self._call(self.groups[g]) for g in self._dependency_order()]
        reads = list(self.reads.values())
        return Window(reads, list(self.reads), calls, list(self.done), dict(self.constants), self.bytes)

    def _call(self, group) -> Call:
        tiles = list(group["tiles"])
        k = max(len(v) for v in group["tiles"].values())
        n_leaves = len(group["sig"])
        rows = [[] for _ in range(n_leaves)]
        where = [dict() for _ in range(n_leaves)]
        table = np.zeros((len(tiles), k, n_leaves), np.int32)
        valid = np.zeros((len(tiles), k), np.bool_)
        for i, t in enumerate(tiles):
            for kk, keys in enumerate(group["tiles"][t]):
                valid[i, kk] = True
                for j, key in enumerate(keys):
                    if key not in where[j]:
                        where[j][key] = len(rows[j])
                        rows[j].append(key)
                    table[i, kk, j] = where[j][key]
            table[i, len(group["tiles"][t]):] = table[i, 0]
        direct = k == 1 and all(len(r) == len(tiles) for r in rows) and all(
            (table[:, 0, j] == np.arange(len(tiles))).all() for j in range(n_leaves))
        node = group["node"]
        out_block = block_at(node.shape, tiles[0], self.tile)
        spec = WindowSpec(tuple(s for s, _ in group["sig"]), tuple(d for _, d in group["sig"]),
                          tuple(len(r) for r in rows), len(tiles), k, out_block, direct)
        return Call(node, group["program"], spec, rows, table, valid, tiles)

    def _dependency_order(self) -> list:
        """Groups in an order where every value a call stacks was produced by an earlier call."""
        producer = {}
        for g in self.order:
            for t in self.groups[g]["tiles"]:
                producer[("tile", id(self.groups[g]["node"]), t)] = g
        needs = defaultdict(set)
        for g in self.order:
            for entries in self.groups[g]["tiles"].values():
                for keys in entries:
                    needs[g].update(producer[k] for k in keys if k in producer and producer[k] != g)
        out, placed = [], set()
        while len(out) < len(self.order):
            ready = [g for g in self.order if g not in placed and needs[g] <= placed]
            if not ready:
                raise RuntimeError("schedule: circular dependency between kernel calls of one window")
            out.append(ready[0])
            placed.add(ready[0])
        return out


def window_input_bytes(device) -> int:
    """The input bytes at which a window stops growing on ``device`` (see ``WINDOW_INPUT_BYTES``)."""
    return WINDOW_INPUT_BYTES["cpu" if device.platform == "cpu" else "accelerator"]


def windows(plan, group, indices, limit_bytes: int, batch_bytes: int = WINDOW_INPUT_BYTES["cpu"],
            share: tuple[int, int] = (0, 1)):
    """Yield the :class:`Window`\\ s that compute ``indices`` of a lockstep ``group`` (usually one node).

    Output tiles come in the order given (a contraction's in bands of block rows where windows can hold
    rectangles of its tiles, :mod:`jask.exec.bands`; a regrouping reshape's tiles that read the same input
    tiles in runs, entry by entry, :func:`_reading_together`; neither in shares); a single node's tile with
    many entries (a reduction) may be split across windows, its partials folded by the executor. A window
    also stops growing once it reads ``batch_bytes`` of input: past that, one call's dispatch is small next
    to its data, and more tiles per call only hold more memory (see ``WINDOW_INPUT_BYTES``).

    ``share=(d, n)`` schedules only the d-th of n contiguous, equal runs of the
    pass's *units* (an output tile, or one entry of a reduction tile split into
    entries), so n devices or processes each take a block of neighbouring tiles
    (sequential reads) within one unit of each other. A reduction tile cut by a
    share boundary is listed as done by each share that holds some of its
    entries: each holds a partial, combined by whoever runs the shares.
    """
    stage_ids = {id(n) for n in group}
    draft = _Draft(plan, stage_ids)
    one_pass = plan.one_pass(group)
    indices = [tuple(i) for i in indices]
    rows = 1 if share != (0, 1) or one_pass or len(group) != 1 or len(indices) < 4 else band_rows(
        plan, group[0], limit_bytes, batch_bytes, lambda idx, ents, seen: _tile_cost(
            draft, [(group[0], idx, ents)], 0, len(ents), seen))
    tiles = shared_tiles(plan, group, band_order(indices, rows) if rows > 1 else indices, share)
    read_key = getattr(plan.prepared[id(group[0])].op, "input_tiles_of", None)
    if share == (0, 1) and len(group) == 1 and read_key is not None:
        units = _reading_together(plan, [(group[0], i, per_node[0][1]) for i, per_node, _ in tiles], read_key,
                                  limit_bytes, batch_bytes)
    else:    # a tile's nodes, or a one-pass group's members
        units = (((_pass_members(plan, group) if one_pass else [(n, idx, ents) for n, ents in per_node]), span)
                 for idx, per_node, span in tiles)
    for at, (lo, hi) in units:          # (node, tile, entries) scheduled together; entries lo:hi of each
        if one_pass or (len(group) == 1 and len(at[0][2]) > 1):
            # a reduction tile split into entries (or tiles reading the same input tiles, entry k together);
            # members of a one-pass group take entry k together
            if not one_pass and not _fits_whole(draft, at, lo, hi, limit_bytes, batch_bytes):
                # a tile starts a window it fits in whole: rectangles stay whole in bands, and elsewhere windows
                # never straddle two tiles, whose distinct tables would each compile a program (see DESIGN.md)
                yield draft.seal()
                draft = _Draft(plan, stage_ids)
            for k in range(lo, hi):
                cost = _tile_cost(draft, at, k, k + 1)
                if draft.full(cost, limit_bytes, batch_bytes, len(at)):
                    yield draft.seal()
                    draft = _Draft(plan, stage_ids)
                    cost = _tile_cost(draft, at, k, k + 1)
                draft.take(cost)
                for n, i, ents in at:
                    draft.add(n, i, [ents[k]])
            draft.done.extend((n, i) for n, i, _ in at)
            continue
        idx = at[0][1]
        costs = [draft.cost(n, idx, ents) for n, _, ents in at]
        cost = (sum(c[0] for c in costs), sum(c[1] for c in costs))
        if draft.full(cost, limit_bytes, batch_bytes, sum(len(ents) for _, _, ents in at)):
            yield draft.seal()
            draft = _Draft(plan, stage_ids)
            costs = [draft.cost(n, idx, ents) for n, _, ents in at]
            cost = (sum(c[0] for c in costs), sum(c[1] for c in costs))
        draft.take(cost)
        for n, _, ents in at:
            if ents:
                draft.add(n, idx, ents)
            else:
                draft.constants[("tile", id(n), idx)] = ("zeros", n, block_at(n.shape, idx, plan.tile))
            draft.done.append((n, idx))
    if draft.entries or draft.done:
        yield draft.seal()


def _reading_together(plan, tiles, read_key, limit_bytes, batch_bytes):
    """Output tiles whose entries read the same input tiles (``read_key(entries)``), in runs taken entry by entry.

    A regrouping reshape's output tile takes a few rows of each input tile it reads: in tile order each
    input tile was read once per output tile (``reshape`` of 8192^2 to (65536, 1024): 8 times). A window
    takes entry k of every tile of a run, so each input tile is read once per run. Runs are as long as an
    empty window holds with one entry of each, and of equal length (one compiled program).
    """
    together = {}
    for n, idx, ents in tiles:
        together.setdefault(read_key(ents) if len(ents) > 1 else ("alone", idx), []).append((n, idx, ents))
    for at in together.values():
        draft, seen = _Draft(plan, set()), set()       # how many tiles an empty window holds, one entry each
        for n, i, ents in (at if len(at[0][2]) > 1 else ()):     # whole tiles go one by one, as before
            cost = draft.cost(n, i, ents[:1], seen)
            if draft.full(cost, limit_bytes, batch_bytes):
                break
            draft.take(cost)
            draft.entries += 1
        size = -(-len(at) // -(-len(at) // max(draft.entries, 1)))
        for s in range(0, len(at), size):
            yield at[s:s + size], (0, max(len(at[0][2]), 1))


def _pass_members(plan, group):
    """``(node, tile, entries)`` of every output tile of a one-pass group's members (they differ in shape)."""
    return [(n, i, entries_of(plan.prepared[id(n)], n, i)) for n in group
            for i in np.ndindex(*grid(n.shape, plan.tile))]


def _tile_cost(draft, at, lo, hi, seen=None):
    """The cost of entries ``lo:hi`` of every ``(node, tile, entries)`` in ``at``, each entry charged on its own,
    shared reads counted once (``seen``: the value keys already counted, added to)."""
    seen = set() if seen is None else seen
    costs = [draft.cost(n, i, [ents[k]], seen) for k in range(lo, hi) for n, i, ents in at]
    return sum(c[0] for c in costs), sum(c[1] for c in costs)


def _fits_whole(draft, at, lo, hi, limit_bytes, batch_bytes) -> bool:
    """Whether entries ``lo:hi`` fit in the window being filled (trivially when it is empty), costed entry by
    entry: a tile of thousands of entries stops at the first one past the limit, so only entries a window
    could hold have their programs built."""
    if not draft.entries:
        return True
    seen, total = set(), (0, 0)
    for k in range(lo, hi):
        cost = _tile_cost(draft, at, k, k + 1, seen)
        total = (total[0] + cost[0], total[1] + cost[1])
        if draft.full(total, limit_bytes, batch_bytes, (k + 1 - lo) * len(at)):
            return False
    return True


def spread(plan, group, indices, limit_bytes: int, batch_bytes: int, n: int, first: int = 0,
           total: int | None = None) -> list:
    """``[(share, Window)]`` of shares ``first .. first + n - 1`` of ``total`` (default ``n``), in run order.

    ``share`` counts from 0 for the first of them. Each share is a contiguous
    block of the pass (:func:`windows` with ``share``), so each device reads
    neighbouring tiles; the shares' windows interleave round-robin (share 0's
    first window, share 1's first, ...), so every device has work in flight
    while the host reads for the next. Processes of a multi-host run each take
    ``n`` consecutive shares of ``n x processes``.
    """
    total, indices = n if total is None else total, [tuple(i) for i in indices]
    shares = [keep_reads(list(windows(plan, group, indices, limit_bytes, batch_bytes, (first + d, total))),
                         limit_bytes) for d in range(n)]
    return [(d, shares[d][r]) for r in range(max(map(len, shares))) for d in range(n) if r < len(shares[d])]
