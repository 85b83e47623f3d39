"""Aligned read buffers and the pool that recycles them across tiles and passes.

Reads land in page-aligned buffers (XLA on CPU then takes them without a
copy), and a fresh buffer costs a page fault per page, so buffers are reused
while a pass runs and a few stay for the next pass (:data:`shared_pool`).
"""
from __future__ import annotations

import math
import sys
import threading

import numpy as np

ALIGNMENT = 4096


def aligned_empty(shape, dtype, alignment: int = ALIGNMENT) -> np.ndarray:
    """An uninitialised C-order array whose data starts on an ``alignment``-byte boundary.

    NumPy places large arrays 16 bytes past a page boundary. XLA on CPU takes
    an input buffer without copying only when it is 64-byte aligned, so tiles
    read into aligned buffers reach the kernel with no copy at all.
    """
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start:start + nbytes].view(dtype).reshape(shape)


class BufferPool:
    """Aligned read buffers, handed out again once nothing but the pool refers to them.

    A fresh 16 MiB buffer costs thousands of page faults and the kernel zeroing
    every page, which halves read throughput from a warm page cache (under
    gVisor, on a TPU VM, fresh memory filled at 1 GB/s against 13 GB/s reads).
    A buffer is reused only when Python holds no other reference to it or to
    its memory (every NumPy view and every zero-copy JAX array keeps one), so a
    tile still in use is never overwritten. At most ``keep`` buffers of each
    shape are kept. A new shape keeps the buffers of at most
    :data:`MAX_SHAPES` - 1 other, most recently asked-for shapes, up to
    ``retain_bytes`` in all, and drops the rest: a pass alternating full and
    edge tiles reuses both, and what the pool holds follows the pass that is
    running. :meth:`trim` bounds what stays between passes.
    """

    MAX_SHAPES = 4   # shapes pooled at once: a 2-D grid's full, edge and corner tiles

    def __init__(self, keep: int = 4):
        self.keep = keep
        self.allocated = 0
        self.reused = 0
        self._free: dict[tuple, list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def get(self, shape, dtype, keep: int | None = None, retain_bytes: int = 0) -> np.ndarray:
        """A free buffer of this shape and dtype, or a new one; ``keep`` overrides the pool's own.

        Allocating keeps the other shapes' buffers only within ``retain_bytes``
        (and :data:`MAX_SHAPES`), counting those still in use.
        """
        keep = self.keep if keep is None else keep
        key = (tuple(shape), np.dtype(dtype))  # not .str: bfloat16's is '<V2', a different dtype
        with self._lock:
            bufs = self._free[key] = self._free.pop(key, [])   # most recently asked-for shape last
            for i in range(len(bufs)):
                # Free when held only by the list, ``b`` and getrefcount's argument, and its
                # memory's owner only by ``b.base`` and the argument.
                b = bufs[i]
                if sys.getrefcount(b) == 3 and sys.getrefcount(b.base) == 2:
                    self.reused += 1
                    bufs.append(bufs.pop(i))
                    return b
                del b
            del self._free[key]              # the others, newest first, within retain_bytes
            self._keep_newest(retain_bytes, self.MAX_SHAPES - 1)
            self._free[key] = bufs
            buf = aligned_empty(key[0], key[1])
            self.allocated += 1
            bufs.append(buf)
            if len(bufs) > keep:
                bufs.pop(0)
            return buf

    def trim(self, keep_bytes: int) -> None:
        """Keep at most ``keep_bytes`` of buffers (of the most recently asked-for shapes); drop the rest.

        Buffers still in use count too: dropped here, they are freed when their
        user lets go instead of returning to the pool.
        """
        with self._lock:
            self._keep_newest(keep_bytes, len(self._free))

    def _keep_newest(self, keep_bytes: int, shapes: int) -> None:
        """Keep the newest buffers of the ``shapes`` most recently asked-for shapes, ``keep_bytes`` in all."""
        kept_bytes = 0
        for n, key in enumerate(reversed(list(self._free))):
            newest_first = []
            for b in reversed(self._free[key]) if n < shapes else ():
                if kept_bytes + b.nbytes > keep_bytes:
                    break
                kept_bytes += b.nbytes
                newest_first.append(b)
            if newest_first:
                self._free[key] = newest_first[::-1]
            else:
                del self._free[key]


shared_pool = BufferPool(keep=6)   # read buffers kept across passes (Prefetcher trims it when it closes)
