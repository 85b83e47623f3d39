"""Where a pass's finished tiles go: a scratch store, a user path, or a NumPy array."""
from __future__ import annotations

import sys

import numpy as np

from jask.exec.events import count
from jask.graph.nodes import OpNode, StoredNode
from jask.graph.tiling import block_shape
from jask.io import resumable_scratch, scratch
from jask.io.remote import new_pending


def stored_chunks(shape, tile: int) -> tuple[int, ...]:
    """The chunk shape a store of ``shape`` gets: its tile, and 1 along an empty axis (zarr refuses 0)."""
    return tuple(max(1, c) for c in block_shape(shape, tile))


class ScratchSink:
    """Writes a node to a fresh scratch store; by default the node then stands for it.

    ``chunks``/``shards`` choose the layout (``rechunk``); ``adopt=False`` leaves
    the node as it was and just returns the stored copy. ``path`` with
    ``resume=True`` writes a resumable store there instead (``persist(...,
    resume=True)``, :mod:`jask.io.resumable_scratch`): tiles a killed process
    already journaled are skipped.
    """

    counts_io = True

    def __init__(self, node: OpNode, tile: int, chunks=None, shards=None, adopt: bool = True,
                 path=None, resume=False):
        self.node, self.adopt = node, adopt
        self.pending = new_pending(path or scratch.new_path(), node.shape, node.dtype,
                                   chunks or stored_chunks(node.shape, tile), shards=shards,
                                   storage_options=scratch.storage_options(), what="scratch", resume=resume)
        self.done = self.pending.done if resume else None
        if resume:
            resumable_scratch.mark_owner(self.pending.tmp_path)

    def write(self, reg, tile):
        self.pending.write(reg, tile)

    def finish(self):
        stored = StoredNode(self.pending.commit(owned=True))
        count(arrays_written=1)
        if self.adopt and isinstance(self.node, OpNode):
            self.node.set_result(stored)
        return stored

    def abort(self):
        self.pending.abort()


class PathSink:
    """Writes a node to a user path or store URL, committed atomically (optionally replacing what is there).

    ``defer_commit=True``: ``finish`` returns the complete pending store uncommitted (``update_all``).
    ``like``: the zarr array being replaced (``update_``), whose metadata the new one keeps.
    """

    counts_io = True

    def __init__(self, node, tile, path, overwrite=False, writable=False, chunks=None, compressors=None,
                 shards=None, storage_options=None, resume=False, defer_commit=False, attributes=None, like=None,
                 call="to_zarr"):
        self.overwrite, self.writable, self.defer_commit, self.resume = overwrite, writable, defer_commit, resume
        self.pending = new_pending(path, node.shape, node.dtype, chunks or stored_chunks(node.shape, tile),
                                   compressors=compressors, shards=shards, storage_options=storage_options,
                                   what=call, resume=resume, attributes=attributes, like=like)
        # resume=True: the executor skips tiles a killed earlier write already put on disk
        self.done = self.pending.done if resume else None

    def write(self, reg, tile):
        self.pending.write(reg, tile)

    def finish(self):
        count(arrays_written=1)
        if self.defer_commit:               # update_all commits the set (jask.io.groups)
            return self.pending
        return self.pending.commit(owned=False, replace=self.overwrite, writable=self.writable)

    def abort(self):
        """Remove the new folder; with ``resume=True`` keep what it has done for the next ``resume=True``
        write, and say so in a note on the exception being handled (the executor aborts in its handler)."""
        if not (self.resume and hasattr(self.pending, "release")):
            self.pending.abort()
            return
        kept = self.pending.release()         # None: nothing to keep, removed
        err = sys.exception()
        if kept is not None and err is not None:
            folder, done, total = kept
            err.add_note(f"{done} of {total} chunks of the resumable write to {self.pending.final_path} are kept "
                         f"in {folder}: the same call with resume=True continues it, computing only the rest "
                         "(a write without resume=True removes them)")


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


def store_numpy(a: np.ndarray, chunks, tag: str = "input", dtype=None) -> StoredNode:
    """Copy an in-memory array into a new scratch store, chunk by chunk (cast to ``dtype`` if given)."""
    dtype = a.dtype if dtype is None else np.dtype(dtype)
    pending = new_pending(scratch.new_path(tag), a.shape, dtype, chunks,
                          storage_options=scratch.storage_options(), what="scratch")
    try:
        for idx in np.ndindex(*[-(-d // c) for d, c in zip(a.shape, chunks)]):
            reg = tuple(slice(i * c, min((i + 1) * c, d)) for i, c, d in zip(idx, chunks, a.shape))
            pending.write(reg, a[reg].astype(dtype, copy=False))
    except BaseException:
        pending.abort()
        raise
    return StoredNode(pending.commit(owned=True))
