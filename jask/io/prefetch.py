"""Reading tiles ahead of the computation.

:class:`Prefetcher` walks an ordered list of read requests on background
threads, at most ``depth`` of them in flight or finished but not yet taken, and
hands the results to the consumer strictly in order. A failed read stops the
other threads and is raised in the consumer as
:class:`~jask.io.reader.TileReadError`, which names the store and the tile.
"""
from __future__ import annotations

import threading
import time

from jask.io import decoded_chunks, maps
from jask.io.layout import describe_region
from jask.io.buffers import shared_pool
from jask.io.settings import setting
from jask.io.reader import CorruptChunkError, MissingChunkError, TileKey, TileReadError, reader_for


class Prefetcher:
    """Reads requests ahead on background threads and yields them in order.

    Parameters
    ----------
    requests : iterable
        Ordered ``(key, read)`` pairs. ``read`` is a zero-argument callable
        returning the value, or a ``(store, region)`` pair read with
        :func:`reader_for` into a recycled aligned buffer (or, under the
        ``read_mmap`` setting, mapped read-only when it is one whole chunk:
        it then holds its mapped pages where it would hold a buffer). ``key`` is yielded
        back with the value and names the tile in error messages: a tile index,
        or a :class:`TileKey` when several arrays share tile indices.
    depth : int
        Most requests held at once: being read, or read and not yet taken by
        the consumer. The value last yielded to the consumer is not counted.
        ``depth=2`` is double buffering.
    threads : int, optional
        Reader threads (default ``min(depth, 2)``).
    place : callable, optional
        Applied to each value on the reader thread, e.g. ``jax.device_put``.
    host_consumer : bool
        Whether the tiles are used on the host (CPU compute): only then does
        ``read_mmap="auto"`` map chunks (on a TPU v5e a mapped tile's copy to
        the chip ran slower than a read's).
    retain_bytes : int, optional
        Free read buffers left in the process's shared pool when the prefetcher
        closes, for the next pass to reuse (default 0: all dropped).
    count : callable, optional
        Called on the consumer's thread as ``count(bytes_read=..., io_seconds=...,
        io_wait_seconds=...)`` for each value taken, e.g. ``executor._count``.

    Iterating yields ``(key, value)``. ``max_held`` is the most requests ever
    held at once (never above ``depth``); ``reads`` counts reads started.
    Use it as a context manager, or call :meth:`close`, so threads stop when
    the consumer leaves early.
    """

    def __init__(self, requests, depth: int = 2, threads: int | None = None, place=None, count=None,
                 retain_bytes: int = 0, host_consumer: bool = True):
        if int(depth) < 1:
            raise ValueError(f"Prefetcher depth must be at least 1, got {depth!r}")
        self.depth = int(depth)
        self.place = place
        self.host_consumer = bool(host_consumer)
        self.count = count
        self.max_held = 0
        self.held = 0
        self.reads = 0
        self.wait_seconds = 0.0
        self.pool = shared_pool
        self.keep = 2 * self.depth + 2
        self.retain_bytes = int(retain_bytes)
        self._allocated_before = shared_pool.allocated
        self._requests = iter(requests)
        self._cv = threading.Condition()
        self._slots = threading.Semaphore(self.depth)
        self._results: dict[int, tuple] = {}
        self._next_in = 0          # sequence number of the next request to start
        self._next_out = 0         # sequence number the consumer takes next
        self._end: int | None = None   # sequence number one past the last request
        self._stop = False
        self._closed = False
        decoded_chunks.pass_opened()   # a tile inside a bigger compressed chunk: keep the chunk for the next
        self._pass_open = True         # tiles of it (until close())
        n = max(1, min(self.depth, 2) if threads is None else int(threads))
        self._threads = [threading.Thread(target=self._work, name=f"jask-read-{i}", daemon=True)
                         for i in range(n)]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------ workers

    def _work(self):
        while True:
            self._slots.acquire()
            with self._cv:
                if self._stop or self._end is not None:
                    self._slots.release()
                    return
                seq = self._next_in
                try:
                    key, read = next(self._requests)
                except StopIteration:
                    self._end = seq
                    self._cv.notify_all()
                    self._slots.release()
                    return
                except BaseException as e:  # the request list itself failed
                    self._end = seq + 1
                    self._results[seq] = ("error", None, e, None, 0.0)
                    self._stop = True
                    self._cv.notify_all()
                    self._slots.release()
                    return
                self._next_in += 1
                self.held += 1
                self.reads += 1
                self.max_held = max(self.max_held, self.held)
            t0 = time.perf_counter()
            try:
                value = self._read(read)
                if self.place is not None:
                    value = self.place(value)
                result = ("ok", key, value, read, time.perf_counter() - t0)
            except BaseException as e:
                result = ("error", key, e, read, time.perf_counter() - t0)
            with self._cv:
                self._results[seq] = result
                if result[0] == "error":
                    self._stop = True   # no new reads once one failed
                self._cv.notify_all()
            # the consumer owns the tile now: a reference kept here while this thread waits for a slot
            # would hold one more buffer (or map) than ``depth`` says
            value = result = None

    def _read(self, read):
        if callable(read):
            return read()
        store, region = read
        reader = reader_for(store)
        mode = setting("read_mmap", False)
        if mode == "auto" and not self.host_consumer:
            mode = False       # copied to an accelerator: a map measured slower there than a read (DESIGN.md)
        if mode and hasattr(reader, "map_chunk"):
            auto = mode == "auto"   # leased maps of large chunks only (small ones read faster)
            mapped = reader.map_chunk(region, lease_only=auto, min_bytes=maps.AUTO_MIN_BYTES if auto else 0)
            if mapped is not None:
                return mapped
        out = self.pool.get(tuple(s.stop - s.start for s in region), reader.dtype, keep=self.keep,
                            retain_bytes=self.retain_bytes)
        return reader.read(region, out=out)

    # ------------------------------------------------------------ consumer

    def __iter__(self):
        return self

    def __next__(self):
        t0 = time.perf_counter()
        with self._cv:
            while self._next_out not in self._results:
                if self._closed or (self._end is not None and self._next_out >= self._end):
                    raise StopIteration
                self._cv.wait()
            status, key, value, read, seconds = self._results.pop(self._next_out)
            self._next_out += 1
            self.held -= 1
        self._slots.release()
        waited = time.perf_counter() - t0
        self.wait_seconds += waited
        if status == "error":
            self.close()
            raise _read_error(key, value, read) from value
        if self.count is not None:
            self.count(bytes_read=int(getattr(value, "nbytes", 0)), io_seconds=seconds,
                       io_wait_seconds=waited)
        return key, value

    def close(self) -> None:
        """Stop the reader threads (a read already under way finishes first) and drop held values."""
        with self._cv:
            self._stop = self._closed = True
            self._results.clear()
            self._cv.notify_all()
        for _ in self._threads:
            self._slots.release()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join()
        with self._cv:
            self._results.clear()
            self.held = 0
            was_open, self._pass_open = self._pass_open, False
        if was_open:
            decoded_chunks.pass_closed()
        self.pool.trim(self.retain_bytes)

    @property
    def buffers_allocated(self) -> int:
        """Read buffers allocated since this prefetcher started (the pool is shared: approximate if
        another pass reads at the same time)."""
        return self.pool.allocated - self._allocated_before

    @property
    def alive_threads(self) -> int:
        return sum(t.is_alive() for t in self._threads)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        if hasattr(self, "_threads") and not self._stop:
            with self._cv:
                self._stop = True
                self._cv.notify_all()
            for _ in self._threads:
                self._slots.release()
        if getattr(self, "_pass_open", False):   # never closed: its kept chunks go all the same
            self._pass_open = False
            decoded_chunks.pass_closed()


def _read_error(key, err, read) -> TileReadError:
    """A :class:`TileReadError` naming the store, tile and region of a failed read."""
    path = region = None
    if read is not None and not callable(read):
        store, region = read
        path = getattr(store, "path", None)
    path = path or getattr(err, "path", None)
    tile = key.tile if isinstance(key, TileKey) else key
    where = f"tile {tile!r}" if key is not None else "the list of tiles to read"
    if region is not None:
        where += f" (region {describe_region(region)})"
    if path is not None:
        where += f" of {path}"
    cls = (MissingChunkError if isinstance(err, FileNotFoundError)
           else CorruptChunkError if isinstance(err, CorruptChunkError) else TileReadError)
    return cls(f"reading {where} failed: {type(err).__name__}: {err}", path=path, tile=tile, region=region)
