"""The planner: tile edge, fused and materialized nodes, lockstep groups, projected memory.

Planning happens before any byte is written:

1. Collect the graph below the roots and count each node's consumers (:mod:`jask.plan.walk`).
2. Pick one tile edge ``T`` for the whole plan (every axis of every array is cut
   into blocks of ``min(T, dim)``), so index maps of producers and consumers
   always agree, even across transposes and contractions.
3. Decide which intermediate nodes are *fused* (recomputed tile by tile inside
   their consumer) and which are *materialized* to scratch: a node is fused
   when it has exactly one consumer and that consumer reads each of its tiles
   at most once (elementwise chains, a dot feeding an elementwise epilogue or a
   sum). Anything else is computed once and stored.
4. Project peak memory (:func:`jask.plan.memory.projected_bytes`) and shrink
   ``T`` until it fits the budget, or refuse with an error saying what would fit.

The planner reads no store and knows no backend: the one figure it needs from
execution, the bytes a plan would read, is passed in (``planned_reads``).
"""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from jask.config import config
from jask.graph.nodes import Node, OpNode, ZerosNode
from jask.graph.op import CustomOp
from jask.graph.tiling import grid, tiled
from jask.plan.dedup import merge_equal_nodes
from jask.plan.fusion import entries_of, entry_program, live_positions
from jask.plan.one_pass import PlanView, entry_count, pass_reductions, shares_a_pass
from jask.plan.memory import SLOTS_FIXED, SLOTS_PER_LEAF, elements, group_bytes, human_bytes, projected_bytes, tile_bytes
from jask.plan.tiling import MAX_TILE_ELEMENTS, MIN_TILE_EDGE, first_tile
from jask.plan.walk import TileReach, collect, leaves_and_ops, nbytes


LOCKSTEP_MIN_TILE_BYTES = 1 << 20  # the planner halves the tile for a lockstep join down to this size
# Longest chain of ops fused into one tile program: a longer chain is cut into stages. Building the
# program recurses once per fused op (a 329-op rebinding loop hit Python's recursion limit), and
# one program per 64 ops keeps each compile small.
MAX_FUSED_CHAIN = 64


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
    shared_ids: frozenset = frozenset()   # fused nodes a window computes once for several consumers
    pass_ids: frozenset = frozenset()     # roots that may share a pass (jask.plan.one_pass.pass_reductions)
    # node id -> StoredNode: a root computed by an earlier group whose copy is not yet its result (update_all's
    # stores, committed after the run); later groups of the run read it there
    stored_aside: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self.fused_ids = {id(n) for n in self.fused}

    def one_pass(self, group) -> bool:
        """Whether ``group`` is reductions sharing a pass entry by entry (:mod:`jask.plan.one_pass`; the
        planner never puts a pass reduction in a lockstep group)."""
        return len(group) > 1 and all(id(n) in self.pass_ids for n in group)

    def joins_a_pass(self, node, loss) -> bool:
        """Whether ``node`` could share the scalar ``loss``'s one-pass group: every tile of it has as many
        entries as the loss (:func:`jask.plan.one_pass.entry_count`)."""
        count = lambda n: (entry_count(n.resolved(), self.prepared[id(n.resolved())], self.tile)  # noqa: E731
                           if id(n.resolved()) in self.prepared else 0)
        k = count(node)
        return k > 0 and k == count(loss)

    def describe(self, largest_window: int = 0) -> str:
        """The plan in a few lines; its peak is its largest window's projected bytes where given (windows grow
        to the budget: a pass holds that, more than one tile's ``projected_bytes``)."""
        peak = max(self.projected_bytes, largest_window)
        lines = [f"plan: tile edge {self.tile}, projected peak {human_bytes(peak)} of budget {human_bytes(self.budget)}"]
        for group in self.groups:
            for k, n in enumerate(group):
                inner = [self.prepared[id(f)].name for f in leaves_and_ops(n, self.fused_ids, self.live)[1][1:]]
                extra = f" (fused: {', '.join(inner)})" if inner else ""
                lead = "  " if k == 0 else "  + in the same pass: " if self.one_pass(group) else "  + in lockstep: "
                lines.append(f"{lead}{self.prepared[id(n)].name} -> {n.shape} {n.dtype}, "
                             f"grid {grid(n.shape, self.tile)}{extra}")
        return "\n".join(lines)


def plan(roots, planned_reads, stored_later=()) -> Plan:
    """Plan the computation of ``roots``; raises ``ValueError`` if it cannot fit the budget.

    The tile edge is the largest that fits the budget, except that when a
    lockstep join (shared reads, no store-and-read-back) was refused for want
    of memory, half the edge is taken if that plan reads fewer bytes
    (``planned_reads(plan)``), down to tiles of ``LOCKSTEP_MIN_TILE_BYTES``.
    Equal nodes are computed once (:mod:`jask.plan.dedup`).
    """
    order, _ = collect(roots)
    every = list(order) + [i.resolved() for n in order for i in n.inputs] + [r.resolved() for r in roots]
    tile = config.tile or first_tile([n.shape for n in every])
    while not config.tile and tile > MIN_TILE_EDGE and any(
            elements(n.shape, tile) > MAX_TILE_ELEMENTS for n in every):
        tile //= 2
    prepared = {id(n): _prepare(n, tile) for n in order}
    replaced = merge_equal_nodes(order, prepared, lambda n: live_positions(n, prepared[id(n)].op),
                                 {id(r.resolved()) for r in roots}, {id(n.resolved()) for n in stored_later})
    if replaced:
        roots = list({id(r): r for r in (replaced.get(id(r.resolved()), r) for r in roots)}.values())
    order, _ = collect(roots)
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
        reads = planned_reads(p) if reads is None else reads
        smaller_reads = planned_reads(smaller) if smaller is not None else reads
        if smaller_reads >= reads:
            break
        p, tile, reads = smaller, tile // 2, smaller_reads
    return p


def _plan_at(roots, order, tile, one_pass=True):
    """The plan at one tile edge: ``(plan or None if over budget, projected bytes, stage names,
    whether a lockstep join was refused for the budget)``.

    One-tile reductions among the roots share a pass when they can (:func:`_lockstep_groups`); the
    chains feeding them are then fused even with several consumers. Where they cannot all join one
    group, the plan is made again without that, so nothing is recomputed for a pass not shared.
    """
    root_ids = {id(r.resolved()) for r in roots}
    copied = [r.resolved() for r in roots if not isinstance(r.resolved(), OpNode) and r.shape != ()]
    prepared = {id(n): _prepare(n, tile) for n in order}
    live = lambda n: live_positions(n, prepared[id(n)].op)
    live_order, edges = collect(roots, live)
    co = pass_reductions(roots, prepared, tile) if config.fusion and one_pass else set()
    below_co = _feeding_only(co, live_order, edges, root_ids)
    fused_ids, chain = set(), {}
    for n in live_order:  # producers come before consumers
        chain[id(n)] = 1 + max((chain[id(i.resolved())] for i in n.inputs if id(i.resolved()) in fused_ids),
                               default=0)
        if (config.fusion and id(n) not in root_ids and chain[id(n)] < MAX_FUSED_CHAIN
                and _should_fuse(n, edges[id(n)], prepared, fused_ids, tile, live, id(n) in below_co)):
            fused_ids.add(id(n))
    fused = [n for n in live_order if id(n) in fused_ids]
    stages = [n for n in live_order if id(n) not in fused_ids]
    # fused for a shared pass with several consumers: computed once per window, not inlined in each
    shared = frozenset(id(n) for n in fused if id(n) in below_co and _read_twice(edges[id(n)], prepared, tile)
                       and _reads_much_more_than_it_makes(n, prepared[id(n)], tile))
    inlined = _inlined(fused, shared, prepared, tile)
    reach = TileReach(fused_ids, live, lambda n, block: entries_of(prepared[id(n)], n, block))
    groups, refused = _lockstep_groups(stages, prepared, fused_ids, tile, live, config.memory_budget,
                                       in_step=config.fusion, one_pass=co, reach=reach, inlined=inlined)
    if co and not any(co <= {id(m) for m in g} for g in groups):
        p, need, names, also_refused = _plan_at(roots, order, tile, one_pass=False)
        return p, need, names, refused or also_refused
    need = max(projected_bytes(groups, fused_ids, tile, live, reach, inlined),
               max(((SLOTS_PER_LEAF + SLOTS_FIXED) * tile_bytes(r, tile) for r in copied), default=0))
    names = ", ".join(prepared[id(n)].name for n in stages)
    if need > config.memory_budget:
        return None, need, names, refused
    p = Plan(tile, list(roots), stages, fused, prepared, need, config.memory_budget, live, groups, shared,
             frozenset(co))
    return p, need, names, refused


def _inlined(fused, shared, prepared, tile) -> frozenset:
    """Ids of the fused producers computed inside their consumer's program (one entry per tile, not shared:
    :func:`jask.plan.fusion.entry_program`'s steps), which hold no tile of their own (no op slots)."""
    return frozenset(id(n) for n in fused if id(n) not in shared and _one_entry_per_tile(n, prepared[id(n)], tile))


def _read_twice(uses, prepared, tile) -> bool:
    """Whether a node's tile is read more than once in a window: by several consumers, or by one at
    several of its tiles (a member of several tiles reads it at entry k of each)."""
    return len(uses) > 1 or _reads_a_tile_twice(uses[0][0], prepared, uses[0][1], tile)


def _reads_much_more_than_it_makes(node, prep, tile) -> bool:
    """A node whose tile is costly to recompute (a product over wide tiles): its inputs' tiles take over
    4x its own. A cheaper shared node is recomputed inside each consumer's program instead (one call less)."""
    return _input_tiles_bytes(node, prep, tile) > 4 * tile_bytes(node, tile)


def _input_tiles_bytes(node, prep, tile) -> int:
    """Bytes of one tile of each array input ``node`` reads (scalars aside): what one entry holds."""
    return sum(tile_bytes(node.inputs[p].resolved(), tile) for p in live_positions(node, prep.op)
               if node.inputs[p].resolved().shape != ())


def _feeding_only(targets, live_order, edges, root_ids) -> set:
    """Ids of the non-root nodes whose every consumer is in ``targets`` or is itself such a node."""
    below = set()
    for n in reversed(live_order):    # consumers before producers
        uses = edges[id(n)]
        if (id(n) not in targets and id(n) not in root_ids and uses
                and all(id(c) in targets or id(c) in below for c, _ in uses)):
            below.add(id(n))
    return below


def _lockstep_groups(stages, prepared, fused_ids, tile, live, budget, in_step: bool = True,
                     one_pass=frozenset(), reach=None, inlined=frozenset()) -> tuple[list[list[OpNode]], bool]:
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

    Consecutive ``one_pass`` stages (roots reducing to a few tiles each, see
    :func:`jask.plan.one_pass.pass_reductions`) with as many entries each, that read a leaf
    in common and none of each other, join one group too: the schedule then
    takes entry k of every member into the same window, so a loss and the
    gradients of small weights below it read X once together.
    """
    groups: list[list[OpNode]] = []
    joinable = refused = False
    for node in stages:
        if id(node) in one_pass:
            simple = False
            joins = (bool(groups) and all(id(m) in one_pass for m in groups[-1])
                     and shares_a_pass(node, groups[-1], prepared, fused_ids, tile, live))
        else:
            simple = (node.shape != () and not isinstance(prepared[id(node)].op, CustomOp)
                      and _one_entry_per_tile(node, prepared[id(node)], tile))
            joins = (simple and joinable and groups[-1][0].shape == node.shape
                     and _reads_members_in_step(node, groups[-1], prepared, fused_ids, tile, live, in_step))
        if joins:
            if group_bytes(groups[-1] + [node], fused_ids, tile, live, reach, inlined) <= budget:
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
    if not any(id(n) in member_ids for n in leaves_and_ops(node, fused_ids, live)[0]):
        return True
    if not allowed:
        return False
    view = PlanView(tile, prepared, fused_ids)
    prep = prepared[id(node)]
    for idx in itertools.product(*map(range, grid(node.shape, tile))):
        for entry in entries_of(prep, node, idx):
            for leaf in entry_program(view, node, entry).leaves:
                if id(leaf.node) in member_ids and leaf.kind == "tile" and leaf.block != idx:
                    return False
    return True


def _tiles_read(consumer: OpNode, prep: Prepared, position: int, tile: int) -> list:
    """Every block index the consumer reads at one input position, over all its output tiles."""
    return [entry[position]
            for out_idx in np.ndindex(*grid(consumer.shape, tile))
            for entry in entries_of(prep, consumer, out_idx)]


def _one_entry_per_tile(node: OpNode, prep: Prepared, tile: int) -> bool:
    return len(entries_of(prep, node, (0,) * node.ndim)) == 1


def _should_fuse(node, edges, prepared, fused_ids, tile, live, feeds_one_pass=False) -> bool:
    """Fuse (recompute per consumer tile) or materialize? The planner's one cost rule.

    A node is fused only if each consumer reads each of its tiles at most once.
    With a single consumer that is always cheaper than storing it. With ``c``
    consumers, recomputing reads the node's leaves ``c`` times (``c * L`` array
    sizes, where ``L`` is leaf bytes over the node's bytes), while storing costs
    ``L`` (one read of the leaves) + 1 (the write) + ``c`` (reading it back).
    Recompute only chains of one-entry-per-tile ops (elementwise work), never a
    contraction, whose per-tile reads are far larger than ``L`` suggests.
    ``feeds_one_pass``: every consumer leads only to reductions that share a
    pass (:func:`_lockstep_groups`): a window holds entry k of all of them, so
    the node's tiles there are those of one block row, computed once per window
    when costly (``Plan.shared_ids``), and such a chain is fused (also a product
    over several entries, or a node a member of several tiles reads at entry k
    of each of its tiles) unless a consumer reads a tile of it at two entries,
    or its entries outgrow a window (all of them are held in the window's entry).
    """
    if isinstance(prepared[id(node)].op, CustomOp):
        return False
    for consumer, p in edges:
        if (isinstance(prepared[id(consumer)].op, CustomOp)
                or _reads_a_tile_twice(consumer, prepared, p, tile, same_entry_ok=feeds_one_pass)):
            return False
    if _entries_outgrow_a_window(node, prepared[id(node)], tile):
        return False        # for a shared pass too: its window would hold every entry (a row block of X)
    if feeds_one_pass:
        return True
    if len(edges) == 1:
        return True
    leaves, ops = leaves_and_ops(node, fused_ids, live)
    if not all(_one_entry_per_tile(n, prepared[id(n)], tile) for n in ops):
        return False
    ratio = sum(0 if isinstance(leaf, ZerosNode) else nbytes(leaf) for leaf in leaves) / max(nbytes(node), 1)
    c = len(edges)
    return c * ratio <= ratio + 1 + c


def _entries_outgrow_a_window(node, prep, tile) -> bool:
    """A reduction or product whose entries for one tile, all inputs resident, take over half the budget.

    Alone, its windows stream the entries and fold partials across windows; fused into a consumer (``mean``:
    a sum, then a scale), one window must hold every entry of a consumer tile: ``mean(x, axis=0)`` of 256 MiB
    held all of it. Stored instead, it costs a write and a read of its (reduced) output."""
    entries = len(entries_of(prep, node, (0,) * node.ndim))
    return entries > 1 and entries * _input_tiles_bytes(node, prep, tile) > config.memory_budget // 2


def _reads_a_tile_twice(consumer, prepared, position, tile, same_entry_ok=False) -> bool:
    """Whether ``consumer`` reads some tile at input ``position`` more than once over its output tiles;
    with ``same_entry_ok``, at more than one entry index k (a one-pass window holds entry k of every
    tile, where the tile is computed once)."""
    prep = prepared[id(consumer)]
    if not same_entry_ok:
        seen = _tiles_read(consumer, prep, position, tile)
        return len(seen) != len(set(seen))
    first_k = {}
    for out_idx in np.ndindex(*grid(consumer.shape, tile)):
        for k, entry in enumerate(entries_of(prep, consumer, out_idx)):
            if first_k.setdefault(entry[position], k) != k:
                return True
    return False


def _prepare(node: OpNode, tile: int) -> Prepared:
    return Prepared(node.spec.build([tiled(i.resolved(), tile) for i in node.inputs]), node.spec.name)
