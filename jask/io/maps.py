"""Chunk files mapped read-only into memory (the ``read_mmap`` setting), and a count of live maps.

A tile read from a warm page cache through a map costs no copy: the kernel
hands over the cached pages (``MAP_POPULATE`` faults them all in at once,
where Linux has it), and XLA on CPU takes the page-aligned, read-only view
without copying it either. A map lives as long as something refers to its
memory (the tile, a view of it, a JAX array aliasing it) and is unmapped when
the last reference goes, so a mapped tile is held exactly as long as a read
buffer would be. :func:`live` counts the maps not yet unmapped.

SIGBUS: if another program truncates a mapped file in place, touching the
lost pages kills the process. jask's writers and zarr-python never do that to
a committed chunk (they write a new file or folder and rename it over the old
one, which stays intact for whoever maps it), hence ``read_mmap`` is safe for
stores only such tools write, and opt-in.
"""
from __future__ import annotations

import mmap
import threading
import weakref

POPULATE = getattr(mmap, "MAP_POPULATE", 0)   # Linux: fault every page in at map time

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
