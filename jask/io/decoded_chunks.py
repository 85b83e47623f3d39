"""Decoded chunks kept while a pass reads the tiles inside them: one decode per chunk, not one per tile.

A compressed chunk decodes only whole: zarr 3.1 reads and decodes the whole
chunk for any region inside it (its partial decode covers uncompressed inner
chunks of shards only), and so does TensorStore with its cache off. A tile
smaller than its chunk (a plan's edge of 2048 rows over chunks of 16384) then
decoded the whole chunk once per tile: ``T + 0.0`` over a 256 MiB tall array
in zstd chunks of (16384, 64) at a forced edge of 2048 made 512 decodes instead
of 64 and took 3-5x the time of its natural edge.

:class:`DecodedChunks` keeps at most :data:`CACHED_CHUNKS` decoded chunks of one
store while a pass reads (a :class:`jask.io.prefetch.Prefetcher` is open, see
:func:`pass_opened`), copies each tile's part out of them, and drops a chunk
once every element of it has been served (the last tile of it read), the
least recently used one when a new chunk needs the room, and all of them when
the last open pass ends. Reads outside a pass, and parts of a region that
cover whole chunks, decode straight into the tile as before. The planner
charges the kept chunks (``jask.plan.memory.DECODED_CHUNK_SLOTS``). A loop that
returns to several chunks in turn (shuffled :func:`jask.batches`) keeps more
for its duration (:meth:`DecodedChunks.holding`), charged by itself.
"""
from __future__ import annotations

import contextlib
import math
import threading
import weakref
from collections import OrderedDict

from jask.io.buffers import aligned_empty
from jask.io.layout import covering

# Chunks one store keeps decoded: the one whose tiles are being served and the next, which the
# other reader thread decodes meanwhile (tiles are read in order by two threads).
CACHED_CHUNKS = 2

_lock = threading.RLock()     # re-entered when a cache freed by the garbage collector uncounts its chunks
_open_passes = 0
_caches: weakref.WeakSet = weakref.WeakSet()
_live = {"chunks": 0, "bytes": 0, "peak_bytes": 0, "decodes": 0}


def pass_opened() -> None:
    """A pass starts reading: chunks decoded from now on are kept for its next tiles."""
    global _open_passes
    with _lock:
        _open_passes += 1


def pass_closed() -> None:
    """A pass stopped reading; when it was the last one, every kept chunk is dropped."""
    global _open_passes
    with _lock:
        _open_passes -= 1
        last = _open_passes == 0
        caches = list(_caches) if last else []
    for cache in caches:
        cache.clear()


def live() -> dict:
    """Chunks kept decoded now in this process (``chunks``, ``bytes``), the most bytes ever kept at once
    (``peak_bytes``), and chunks decoded into a cache so far (``decodes``)."""
    with _lock:
        return dict(_live)


def reset_peak() -> None:
    """Start ``peak_bytes`` of :func:`live` afresh from the bytes kept now (tests)."""
    with _lock:
        _live["peak_bytes"] = _live["bytes"]


def _count(chunks: int, nbytes: int) -> None:
    with _lock:
        _live["chunks"] += chunks
        _live["bytes"] += nbytes
        _live["peak_bytes"] = max(_live["peak_bytes"], _live["bytes"])


class _Entry:
    """One chunk: decoded by the first thread that needs it, while the others wait for it."""

    def __init__(self, size: int):
        self.size = size            # elements: the entry goes once this many have been served
        self.served = 0
        self.data = None            # the decoded chunk; stays None when its decode failed
        self.counted = False        # in live() (only while kept)
        self.ready = threading.Event()


class DecodedChunks:
    """The decoded chunks one store keeps for the tiles still to be read from them. Thread-safe."""

    def __init__(self, shape, chunk):
        self.shape, self.chunk = tuple(shape), tuple(chunk)
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self._holds: list[int] = []     # chunk counts asked for by the loops now holding this cache
        with _lock:
            _caches.add(self)

    @contextlib.contextmanager
    def holding(self, chunks: int):
        """Keep up to ``chunks`` decoded chunks (not :data:`CACHED_CHUNKS`) while inside: for a reader that
        returns to each of several chunks in turn, as shuffled batches interleaving chunks do."""
        with self._lock:
            self._holds.append(int(chunks))
        try:
            yield
        finally:
            with self._lock:
                self._holds.remove(int(chunks))

    def wanted(self, region) -> bool:
        """Whether ``region`` is read through kept chunks: a pass is open and it covers part of a chunk."""
        return _open_passes > 0 and any(
            s.start % n or (s.stop % n and s.stop != d) for s, n, d in zip(region, self.chunk, self.shape))

    def read(self, region, out, decode) -> None:
        """Fill ``out`` with ``region``; ``decode(region, dest)`` fills ``dest`` from the store.

        Outside a pass, or for a region of whole chunks, that is one ``decode``. Otherwise chunk by
        chunk: a chunk wholly inside ``region`` is decoded straight into ``out``; a part of one is
        copied out of the kept chunk, decoded first if it is not kept yet.
        """
        if not self.wanted(region):
            decode(region, out)
            return
        for coords in covering(region, self.chunk):
            whole = tuple(slice(c * n, min((c + 1) * n, d)) for c, n, d in zip(coords, self.chunk, self.shape))
            part = tuple(slice(max(s.start, w.start), min(s.stop, w.stop)) for s, w in zip(region, whole))
            dest = out[tuple(slice(p.start - s.start, p.stop - s.start) for p, s in zip(part, region))]
            if part == whole:
                decode(whole, dest)
                continue
            entry = self._decoded(coords, whole, dest.dtype, decode)
            if entry is None:          # every kept chunk is still being decoded: read the part as before
                decode(part, dest)
                continue
            dest[...] = entry.data[tuple(slice(p.start - w.start, p.stop - w.start) for p, w in zip(part, whole))]
            self._served(coords, entry, dest.size)

    def _decoded(self, coords, whole, dtype, decode):
        """The kept entry of chunk ``coords`` with its data, decoded here if no thread has; None when there
        is no room (all kept chunks are being decoded) or another thread's decode of it failed."""
        with self._lock:
            entry = self._entries.get(coords)
            mine = entry is None
            if mine:
                if not self._make_room():
                    return None
                entry = self._entries[coords] = _Entry(math.prod(s.stop - s.start for s in whole))
            else:
                self._entries.move_to_end(coords)
        if not mine:
            entry.ready.wait()
            return entry if entry.data is not None else None
        try:
            data = aligned_empty(tuple(s.stop - s.start for s in whole), dtype)
            decode(whole, data)
            entry.data = data
        except BaseException:
            with self._lock:
                if self._entries.get(coords) is entry:
                    del self._entries[coords]
            raise
        finally:
            entry.ready.set()
        with self._lock:       # counted only while kept (clear() may have dropped it meanwhile)
            if self._entries.get(coords) is entry:
                _count(1, data.nbytes)
                entry.counted = True
        with _lock:
            _live["decodes"] += 1
        return entry

    def _make_room(self) -> bool:
        """Drop the least recently used decoded chunk while the cache is full (lock held); False if
        every kept chunk is still being decoded."""
        while len(self._entries) >= max([CACHED_CHUNKS, *self._holds]):
            oldest = next((k for k, e in self._entries.items() if e.ready.is_set()), None)
            if oldest is None:
                return False
            self._drop(oldest)
        return True

    def _served(self, coords, entry, n: int) -> None:
        with self._lock:
            entry.served += n
            if entry.served >= entry.size and self._entries.get(coords) is entry:
                self._drop(coords)

    def _drop(self, coords) -> None:
        entry = self._entries.pop(coords)
        if entry.counted:
            _count(-1, -entry.data.nbytes)

    def __del__(self):          # its store is gone: what it kept leaves the count of live()
        self.clear()

    def clear(self) -> None:
        """Drop every kept chunk (a chunk being decoded is dropped too; its tiles read it all the same)."""
        with self._lock:
            for coords in list(self._entries):
                self._drop(coords)
