"""Writing finished tiles behind the computation, and streaming tiles into shards.

* :class:`WriteBehind` hands ``(region, tile)`` writes to one background
  thread, at most ``depth`` of them queued or being written, so the next tile
  computes while the last one is written. :meth:`WriteBehind.close` waits for
  the queue and re-raises the first failure, naming the store and the tile;
  :meth:`WriteBehind.abort` drops what is queued. It writes into anything with
  a ``write(region, tile)`` method (a :class:`jask.io.store.PendingStore` or an
  executor sink), so the commit-on-complete rename stays where it is.
* :class:`ChunkFileWriter` writes each finished uncompressed chunk straight
  from the tile's memory to its file (zarr-python first copies it into a new
  bytes object).
* :class:`ShardWriter` appends each finished inner chunk of a sharded,
  uncompressed array to its shard file in arrival order and writes the shard
  index once the shard's last chunk is in. zarr-python rewrites a whole shard
  for every partial write (read, decode, re-encode, write: quadratic in the
  chunks per shard); appending keeps the write cost at one pass and holds no
  shard in memory. Compressed shards go through :class:`BufferedShardWriter`,
  which keeps each shard in memory until it is complete and writes it once.
"""
from __future__ import annotations

import math
import os
import threading
import time

import numpy as np

from jask.io.layout import MAX_UINT64, ChunkLayout, covering, describe_region


class TileWriteError(RuntimeError):
    """Writing one tile failed; ``path`` and ``region`` say which. The cause is ``__cause__``."""

    def __init__(self, message, path=None, region=None):
        super().__init__(message)
        self.path, self.region = path, region


class TileWriteOSError(TileWriteError, OSError):
    """Writing one tile failed with an ``OSError`` (disk full, I/O error); ``errno`` is the cause's."""


def _target_path(target):
    for obj in (target, getattr(target, "pending", None)):
        for name in ("final_path", "path"):
            if obj is not None and isinstance(getattr(obj, name, None), str):
                return getattr(obj, name)
    return None


class WriteBehind:
    """Writes tiles on a background thread while the caller computes the next ones.

    Parameters
    ----------
    target : object with ``write(region, tile)``, or a callable ``(region, tile)``
        Where tiles go, e.g. a :class:`jask.io.store.PendingStore` or a sink.
    depth : int
        Most tiles held at once: queued or being written. :meth:`put` blocks
        while ``depth`` are held. ``max_held`` records the most ever held.
    count : callable, optional
        Called on the caller's thread as ``count(bytes_written=..., io_seconds=...,
        io_wait_seconds=...)``, e.g. ``executor._count``; ``io_wait_seconds`` is
        time :meth:`put` and :meth:`close` spent waiting for the writer.

    Tiles may be JAX arrays still being computed; the writer thread converts
    them with ``np.asarray``, so the caller does not wait for the kernel.
    """

    def __init__(self, target, depth: int = 2, count=None):
        if int(depth) < 1:
            raise ValueError(f"WriteBehind depth must be at least 1, got {depth!r}")
        self._write = target if callable(target) and not hasattr(target, "write") else target.write
        self.path = _target_path(target)
        self.depth = int(depth)
        self.count = count
        self.max_held = 0
        self.writes = 0
        self.wait_seconds = 0.0
        self._queue: list = []
        self._held = 0
        self._error = None
        self._closed = False
        self._done = {"bytes_written": 0, "io_seconds": 0.0}
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._work, name="jask-write", daemon=True)
        self._thread.start()

    def _work(self):
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return
                region, tile, key = self._queue.pop(0)
            t0 = time.perf_counter()
            try:
                arr = np.asarray(tile)
                del tile
                self._write(region, arr)
                err = None
            except BaseException as e:
                err = (e, region, key)
            seconds = time.perf_counter() - t0
            with self._cv:
                self._held -= 1
                if err is None:
                    self.writes += 1
                    self._done["bytes_written"] += arr.nbytes
                    self._done["io_seconds"] += seconds
                elif self._error is None:
                    self._error = err
                    self._held -= len(self._queue)
                    self._queue.clear()
                self._cv.notify_all()
                if self._error is not None:
                    return

    def put(self, region, tile, key=None) -> None:
        """Queue ``tile`` for ``region``; blocks while ``depth`` tiles are held.

        Raises the writer's error, if a previous write failed.
        """
        t0 = time.perf_counter()
        with self._cv:
            if self._closed:
                raise RuntimeError("WriteBehind.put after close() or abort()")
            while self._held >= self.depth and self._error is None:
                self._cv.wait()
            self._raise_if_failed()
            self._queue.append((tuple(region), tile, key))
            self._held += 1
            self.max_held = max(self.max_held, self._held)
            self._cv.notify_all()
        self._report(time.perf_counter() - t0)

    def close(self) -> None:
        """Write everything queued, stop the thread, and raise the first write error."""
        t0 = time.perf_counter()
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join()
        self._report(time.perf_counter() - t0)
        with self._cv:
            self._raise_if_failed()

    def abort(self) -> None:
        """Drop queued tiles and stop the thread (a write under way finishes first)."""
        with self._cv:
            self._held -= len(self._queue)
            self._queue.clear()
            self._closed = True
            self._cv.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _raise_if_failed(self):
        if self._error is not None:
            e, region, key = self._error
            where = f"tile {key!r} " if key is not None else ""
            where += f"(region {describe_region(region)})"
            if self.path:
                where += f" of {self.path}"
            cls = TileWriteOSError if isinstance(e, OSError) else TileWriteError
            err = cls(f"writing {where} failed: {type(e).__name__}: {e}", path=self.path, region=region)
            if isinstance(e, OSError):
                err.errno = e.errno   # (not strerror/filename: OSError.__str__ would drop the message)
            raise err from e

    def _report(self, waited: float):
        with self._cv:
            done, self._done = self._done, {"bytes_written": 0, "io_seconds": 0.0}
        self.wait_seconds += waited
        if self.count is not None:
            self.count(io_wait_seconds=waited, **done)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *rest):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False


# ---------------------------------------------------------------- shards

def make_chunk_writer(array, root: str, on_written=None):
    """The fastest writer for a new zarr ``array`` stored in folder ``root``, or None to let zarr write.

    Uncompressed chunks are written straight from the tile's memory
    (:class:`ChunkFileWriter`, :class:`ShardWriter`); compressed shards are
    assembled in memory (:class:`BufferedShardWriter`); other layouts go
    through zarr-python. ``on_written(fd)``, if given, is called on each file
    descriptor the raw writers wrote to, before closing it (durability
    ``"power"`` starts the file's writeback there).
    """
    layout = ChunkLayout(array)
    if layout.mode == "shard" and layout.index_at_end:     # (an index first, kept by update_: zarr places it)
        return ShardWriter(array, root, layout, on_written)
    if layout.mode == "chunk":
        return ChunkFileWriter(array, root, layout, on_written)
    if getattr(array, "shards", None) is not None:
        return BufferedShardWriter(array)
    return None


def _write_all(fd, data: memoryview) -> None:
    done = 0
    while done < len(data):
        done += os.write(fd, data[done:])


def _valid_extent(coords, edge, shape):
    """Per axis, how much of block ``coords`` (of edge ``edge``) lies inside ``shape``."""
    return tuple(min(n, d - c * n) for c, n, d in zip(coords, edge, shape))


class _Pieces:
    """Collects parts of blocks until every in-bounds element of a block is written."""

    def __init__(self, edge, shape, dtype, fill):
        self.edge, self.shape, self.dtype, self.fill = edge, shape, dtype, fill
        self.partial: dict = {}

    def add(self, region, block):
        """Yield ``(coords, full_block)`` for each block of ``edge`` that ``region`` completes."""
        for coords in covering(region, self.edge):
            start = tuple(c * n for c, n in zip(coords, self.edge))
            valid = _valid_extent(coords, self.edge, self.shape)
            inner = tuple(slice(max(s.start, b) - b, min(s.stop, b + v) - b)
                          for s, b, v in zip(region, start, valid))
            src = block[tuple(slice(b + i.start - s.start, b + i.stop - s.start)
                              for s, b, i in zip(region, start, inner))]
            whole = all(i.start == 0 and i.stop == v for i, v in zip(inner, valid))
            if whole and valid == tuple(self.edge) and coords not in self.partial:
                yield coords, np.ascontiguousarray(src, self.dtype)
                continue
            buf, left = self.partial.get(coords, (None, math.prod(valid)))
            if buf is None:
                buf = np.full(self.edge, self.fill, self.dtype)
            buf[inner] = src
            left -= math.prod(i.stop - i.start for i in inner)  # rewriting a part counts again; fine for
            if left <= 0:                                        # the executor, which writes each tile once
                self.partial.pop(coords, None)
                yield coords, buf
            else:
                self.partial[coords] = (buf, left)

    def leftovers(self):
        items, self.partial = list(self.partial.items()), {}
        return [(coords, buf) for coords, (buf, _) in items]


class ChunkFileWriter:
    """Writes each finished uncompressed chunk straight from the tile's memory to its chunk file.

    zarr-python copies each chunk into a new bytes object before writing it;
    this skips that copy. Edge chunks are padded with the fill value, as Zarr
    stores them.
    """

    def __init__(self, array, root, layout, on_written=None):
        self.root, self.lay, self.on_written = root, layout, on_written
        self.pieces = _Pieces(layout.chunk, layout.shape, layout.dtype,
                              np.asarray(array.fill_value, layout.dtype))
        self._dirs: set = set()

    def write(self, region, block):
        for coords, chunk in self.pieces.add(region, block):
            self._store(coords, chunk)

    def _store(self, coords, chunk):
        path = os.path.join(self.root, self.lay.encode_key(coords))
        folder = os.path.dirname(path)
        if folder not in self._dirs:
            os.makedirs(folder, exist_ok=True)
            self._dirs.add(folder)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, memoryview(np.ascontiguousarray(chunk)).cast("B"))
            if self.on_written is not None:
                self.on_written(fd)
        finally:
            os.close(fd)

    def finish(self):
        for coords, chunk in self.pieces.leftovers():
            self._store(coords, chunk)


class ShardWriter:
    """Appends uncompressed inner chunks to their shard files; writes each index when the shard is full.

    Inner chunks land in the shard file in the order they are written (the
    executor's tile order, which is the order the next pass reads them), and
    the index at the end of the file (``index_location="end"``) records where
    each one is. Memory held: one index per unfinished shard, and a partial
    chunk only when tiles do not line up with the inner chunks.
    """

    def __init__(self, array, root, layout, on_written=None):
        self.array, self.root, self.lay, self.on_written = array, root, layout, on_written
        self.fill = np.asarray(array.fill_value, layout.dtype)
        self.pieces = _Pieces(layout.chunk, layout.shape, layout.dtype, self.fill)
        self.open: dict = {}        # shard coords -> [index array, bytes written, chunks left]
        self.finished: set = set()

    def write(self, region, block):
        for coords, chunk in self.pieces.add(region, block):
            self._append(coords, chunk)

    def _append(self, coords, chunk):
        lay = self.lay
        shard = tuple(c // p for c, p in zip(coords, lay.per_shard))
        local = tuple(c % p for c, p in zip(coords, lay.per_shard))
        if shard in self.finished:
            # The shard's index is already on disk: let zarr rewrite it (never happens in one pass).
            reg = tuple(slice(c * n, c * n + v) for c, n, v in
                        zip(coords, lay.chunk, _valid_extent(coords, lay.chunk, lay.shape)))
            self.array[reg] = chunk[tuple(slice(0, r.stop - r.start) for r in reg)]
            return
        state = self.open.get(shard)
        if state is None:
            shard_valid = _valid_extent(shard, lay.outer, lay.shape)
            n_chunks = math.prod(-(-v // c) for v, c in zip(shard_valid, lay.chunk))
            index = np.full(lay.per_shard + (2,), MAX_UINT64, "<u8")
            state = self.open[shard] = [index, 0, n_chunks]
        index = state[0]
        if index[local][0] == MAX_UINT64:
            state[2] -= 1
        data = memoryview(np.ascontiguousarray(chunk)).cast("B")
        self._append_bytes(shard, data)
        index[local] = (state[1], len(data))
        state[1] += len(data)
        if state[2] == 0:
            self._close_shard(shard)

    def _append_bytes(self, shard, data):
        path = os.path.join(self.root, self.lay.encode_key(shard))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            _write_all(fd, data)
            if self.on_written is not None:
                self.on_written(fd)
        finally:
            os.close(fd)

    def _close_shard(self, shard):
        index = self.open.pop(shard)[0]
        body = index.tobytes()
        if self.lay.index_crc:
            import google_crc32c
            body += google_crc32c.value(body).to_bytes(4, "little")
        self._append_bytes(shard, memoryview(body))
        self.finished.add(shard)

    def finish(self):
        """Write chunks still partial and the index of every shard not yet closed."""
        for coords, chunk in self.pieces.leftovers():
            self._append(coords, chunk)
        for shard in list(self.open):
            self._close_shard(shard)


class BufferedShardWriter:
    """Keeps each shard in memory until all its elements are written, then writes it whole via zarr."""

    def __init__(self, array):
        self.array = array
        shards = tuple(array.shards)
        self.pieces = _Pieces(shards, tuple(array.shape), np.dtype(array.dtype),
                              np.asarray(array.fill_value, array.dtype))

    def write(self, region, block):
        for coords, shard in self.pieces.add(region, block):
            self._store(coords, shard)

    def _store(self, coords, shard):
        edge = self.pieces.edge
        valid = _valid_extent(coords, edge, self.pieces.shape)
        reg = tuple(slice(c * n, c * n + v) for c, n, v in zip(coords, edge, valid))
        self.array[reg] = shard[tuple(slice(0, v) for v in valid)]

    def finish(self):
        for coords, shard in self.pieces.leftovers():
            self._store(coords, shard)
