"""The memory model shared by the planner's projection and the window schedule.

Each term is tiles held at once, charged at the tile size of the array it
belongs to (items counted as at least 4 bytes: partials accumulate in float32).
"""
from __future__ import annotations

import numpy as np

from jask.graph.nodes import Node
from jask.graph.tiling import grid
from jask.io.layout import ChunkLayout
from jask.plan.walk import leaves_and_ops

SLOTS_PER_LEAF = 4   # per stored input tile: raw chunk bytes, the assembled tile, its device copy, one read ahead
# per op computed as a tile of its own (a stage; a fused producer that folds several entries or that a
# window computes once for several consumers): a partial and an accumulator. A producer inlined in its
# consumer's program holds none: the program computes it in place (XLA fuses the chain), and the window
# schedule never charged it (charging it took a softmax gradient's tile below its chunks: 140 MiB at 64MB)
SLOTS_PER_OP = 2
SLOTS_FIXED = 2      # per output tile: the finished tile and its write buffer
# per stored input whose tiles cover parts of chunks that decode only whole (compressed, Zarr v2, object
# stores): the chunks kept decoded while their tiles are read (jask.io.decoded_chunks.CACHED_CHUNKS)
DECODED_CHUNK_SLOTS = 2
# output tiles of a stage past which the projection charges every node below, not each tile's reach: planning
# walks every tile's index maps (~0.1 ms each), at each tile edge it tries
MAX_REACH_TILES = 4096


def elements(shape, tile: int) -> int:
    """Elements of one full tile of an array of ``shape`` at edge ``tile``."""
    return int(np.prod([min(tile, d) for d in shape], dtype=np.int64))


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def tile_bytes(node: Node, tile: int) -> int:
    """Bytes of one full tile of ``node`` at this edge (items counted as at least 4 bytes: f32 accumulation)."""
    return elements(node.shape, tile) * max(node.dtype.itemsize, 4)


def decoded_chunk_bytes(node: Node, tile: int) -> int:
    """Bytes of the decoded chunks a stored leaf keeps beyond its tile slots: ``DECODED_CHUNK_SLOTS`` chunks
    when a read decodes whole chunks and a tile of this edge covers only part of one (0 otherwise).

    A tile of 2048 rows of a chunk of 16384 holds the whole 4 MiB chunk decoded, not its 512 KiB.
    Whole chunks are decoded where the reader takes zarr's route (:class:`jask.io.layout.ChunkLayout`'s
    ``"zarr"`` mode, the one :mod:`jask.io.decoded_chunks` serves) and for object stores; read from the
    store's Zarr metadata, not its bytes.
    """
    store = getattr(node, "store", None)
    array = getattr(store, "array", None)
    if array is None or not node.shape:
        return 0
    whole = "://" in str(getattr(store, "path", "")) or ChunkLayout(array).mode == "zarr"
    chunks = tuple(getattr(array, "chunks", node.shape))
    part = any(min(tile, d) < d and min(tile, d) % min(c, d) for c, d in zip(chunks, node.shape))
    return DECODED_CHUNK_SLOTS * int(np.prod(chunks, dtype=np.int64)) * array.dtype.itemsize if whole and part else 0


def group_bytes(group, fused_ids, tile: int, live, reach=None, inlined=frozenset()) -> int:
    """Projected bytes of one lockstep group: its members' terms, each distinct leaf charged once per tile of
    it that one entry holds (a fused strided slice puts every input tile of its output tile in its
    consumer's entry, and a window holds at least one entry whole).

    Members read a shared leaf's tile once per index (the executor's memo), and
    a member read by a later one is already held as that member's output tile.
    With ``reach`` (a :class:`jask.plan.walk.TileReach`) the terms are those of
    the output tile that reaches the most, not of every node below: a tile of a
    ``concatenate`` reads one piece, not all of them (up to ``MAX_REACH_TILES``
    output tiles; past that, and for a one-pass group, whose members differ in
    shape, every node below is charged). ``inlined``: ids of fused producers computed inside their
    consumer's program (:func:`jask.plan.fusion.entry_program`'s steps), charged no op slots.
    """
    bound = _charge(group, [leaves_and_ops(n, fused_ids, live) for n in group], tile, inlined)
    tiles = grid(group[0].shape, tile)
    if reach is None or len({n.shape for n in group}) > 1:
        return bound
    try:
        if np.prod(tiles, dtype=np.int64) > MAX_REACH_TILES:   # every node below, each leaf held as at the ends
            ends = [reach(n, idx) for n in group for idx in ((0,) * len(tiles), tuple(t - 1 for t in tiles))]
            held = {i: max(h.get(i, 1) for _, _, h in ends) for _, _, h in ends for i in h}
            return _charge(group, [(*leaves_and_ops(n, fused_ids, live), held) for n in group], tile, inlined)
        charged = {}                    # what a tile reaches -> its bytes: tiles reaching alike are charged once
        simple = all(reach.one_tile_each(n) for n in group)
        for idx in np.ndindex(*tiles):
            pulled = [reach(n, idx) for n in group]
            key = tuple((frozenset(map(id, leaves)), frozenset(map(id, ops)), frozenset(held.items()))
                        for leaves, ops, held in pulled)
            if key not in charged:
                charged[key] = _charge(group, pulled, tile, inlined)
                if simple and charged[key] >= bound:
                    return bound        # a tile reaches everything, one tile of each (most ops): look no further
    except Exception:   # noqa: BLE001 -- a user op's index_map: its error is raised naming the tile, at run time
        return bound
    return max(charged.values(), default=bound)


def _charge(group, pulled, tile: int, inlined=frozenset()) -> int:
    """The slot terms of ``group`` given each member's ``(leaves, ops)`` or ``(leaves, ops, held)`` pulled for
    one output tile (``held``: leaf id -> tiles of it one entry holds at once, 1 where absent; the ops in
    ``inlined`` run inside their consumer's program: no slots, as in the window schedule)."""
    members = {id(n) for n in group}
    leaves, held, op_bytes = {}, {}, 0
    for node_leaves, ops, *rest in pulled:
        leaves.update((id(n), n) for n in node_leaves if id(n) not in members)
        for i, count in (rest[0] if rest else {}).items():
            held[i] = max(held.get(i, 1), count)
        op_bytes += sum(tile_bytes(n, tile) for n in ops if id(n) not in inlined)
    return (sum(held.get(i, 1) * SLOTS_PER_LEAF * tile_bytes(n, tile) + decoded_chunk_bytes(n, tile)
                for i, n in leaves.items())
            + SLOTS_PER_OP * op_bytes
            + SLOTS_FIXED * sum(tile_bytes(n, tile) for n in group))


def projected_bytes(groups, fused_ids, tile: int, live, reach=None, inlined=frozenset()) -> int:
    """Projected peak bytes of executing ``groups`` of stages with tile edge ``tile``.

    Per stage, each term charged at the tile size of the array it belongs to:
    ``SLOTS_PER_LEAF`` tiles for each distinct leaf input read while pulling one
    output tile (raw chunk bytes, the assembled region, the device copy, one
    read ahead), ``SLOTS_PER_OP`` for each op on the pull path that is a tile of its own
    (partial and accumulator; not the ``inlined`` ones), and ``SLOTS_FIXED`` output tiles (the finished tile and its
    write). Stages of one group run in lockstep, so their needs add up, except
    that a leaf they share is held once; groups run one after another, so the
    plan's peak is the largest group (``reach``: charge what one tile reaches, see :func:`group_bytes`).
    """
    return max((group_bytes(group, fused_ids, tile, live, reach, inlined) for group in groups), default=0)
