"""Chunk files mapped read-only into memory (the ``read_mmap`` setting), and a count of live maps.

A tile read from a warm page cache through a map costs no copy: the kernel
hands over the cached pages (``MAP_POPULATE`` faults them all in at once,
where Linux has it), and XLA on CPU takes the page-aligned, read-only view
without copying it either. A map lives as long as something refers to its
memory (the tile, a view of it, a JAX array aliasing it) and is unmapped when
the last reference goes, so a mapped tile is held exactly as long as a read
buffer would be. :func:`live` counts the maps not yet unmapped.

From disk a map is slower than one large read (``sum`` of 2 GiB cold: 1.3
against 1.7 GB/s: the kernel faults a map in by small readahead windows), so
the reader maps a file only when its first, middle and last pages are
in the page cache (:func:`in_page_cache`: ``mincore`` on a probe map) and
reads it otherwise.

SIGBUS: if another program truncates a mapped file in place, touching the
lost pages kills the process. jask's writers and zarr-python never do that to
a committed chunk (they write a new file or folder and rename it over the old
one, which stays intact for whoever maps it); for other tools the reader maps
a file under a read lease (:mod:`jask.io.leases`), and the default
``read_mmap="auto"`` maps nothing without one.
"""
from __future__ import annotations

import ctypes
import mmap
import threading
import weakref

import numpy as np

POPULATE = getattr(mmap, "MAP_POPULATE", 0)   # Linux: fault every page in at map time
# ``read_mmap="auto"`` maps chunks of at least this many bytes: a map costs about 120-160 us whatever
# its size (probe, lease, map, unmap), a warm read about 70 us per MiB (1 MiB chunks: 164 us mapped
# against 76 us read; 16 MiB: 122 us against 1126 us; the probe is described in log.md)
AUTO_MIN_BYTES = 4 << 20

_lock = threading.Lock()
_live = {"maps": 0, "bytes": 0, "peak_bytes": 0}


def map_file(fd: int, nbytes: int) -> mmap.mmap:
    """Map the first ``nbytes`` of the open file ``fd`` read-only (the caller may close ``fd`` after)."""
    m = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | POPULATE, prot=mmap.PROT_READ)
    with _lock:
        _live["maps"] += 1
        _live["bytes"] += nbytes
        _live["peak_bytes"] = max(_live["peak_bytes"], _live["bytes"])
    weakref.finalize(m, _unmapped, nbytes)
    return m


def in_page_cache(fd: int, nbytes: int) -> bool:
    """Whether the first, middle and last pages of the file's first ``nbytes`` are in the page cache."""
    probe = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)   # no pages touched
    try:
        view = np.frombuffer(probe, np.uint8)
        page = mmap.PAGESIZE
        cached = all(_resident(view.ctypes.data + offset)
                     for offset in {0, nbytes // 2 // page * page, (nbytes - 1) // page * page})
        del view
    finally:
        probe.close()
    return cached


def _resident(address: int) -> bool:
    """Whether the page at ``address`` (page-aligned, mapped) is in memory; True where mincore is missing."""
    if _mincore is None:
        return True
    vec = ctypes.c_ubyte(0)
    if _mincore(ctypes.c_void_p(address), mmap.PAGESIZE, ctypes.byref(vec)) != 0:
        return True
    return bool(vec.value & 1)


def _libc_mincore():
    try:
        fn = ctypes.CDLL(None).mincore
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


_mincore = _libc_mincore()


def _unmapped(nbytes: int) -> None:
    with _lock:
        _live["maps"] -= 1
        _live["bytes"] -= nbytes


def live() -> dict:
    """``maps`` and ``bytes`` mapped now, and ``peak_bytes`` since the last :func:`reset_peak`."""
    with _lock:
        return dict(_live)


def reset_peak() -> None:
    with _lock:
        _live["peak_bytes"] = _live["bytes"]
