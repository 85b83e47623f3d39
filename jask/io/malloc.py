"""Keep glibc's allocator from growing RSS run after run.

Tiles of several MiB are allocated on the read-ahead and write-behind threads
and freed on others. glibc gives each thread its own arena and, once a freed
block has raised its dynamic mmap threshold, serves such sizes from those
arenas, which then fragment: in ten elementwise passes over 3 x 128 MiB in one
process (budget 256 MB) peak RSS growth went 208 -> 416 MB with the default
allocator and stayed at 162-175 MB with two arenas, which also ran a little
faster (see ``log.md``). So jask limits glibc to two arenas at import, unless
``MALLOC_ARENA_MAX`` is already set (the user's choice wins) or
``JASK_MALLOC_ARENAS=0`` asks to leave the allocator alone. Nothing happens
off glibc.

Tiles freed in the middle of the heap stay resident until a block above them
is freed too, so RSS after a pass can sit hundreds of MB above what the next
pass needs (a 4096^2 dot at a 256 MB budget: 477 MB after the first pass,
215 MB after ``malloc_trim``). :func:`release_free_memory` returns those pages
after every executor run; ``JASK_MALLOC_TRIM=0`` turns that off. Within a pass, :class:`HeapWatch` does
the same after each window once the process has grown past the budget: tiles of a few MiB allocated and freed
window after window (XLA's buffers, on several threads) left a 64 MB pass 40-50 MB above its windows.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

from jask.io.memstat import resident_bytes

M_ARENA_MAX = -8   # mallopt parameter number, from glibc's malloc.h
DEFAULT_ARENAS = 2


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def limit_arenas() -> int | None:
    """Cap glibc malloc arenas; returns the cap set, or None when nothing was changed."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return None
    try:
        arenas = int(os.environ.get("JASK_MALLOC_ARENAS", DEFAULT_ARENAS))
    except ValueError:
        raise ValueError(f"JASK_MALLOC_ARENAS must be an integer (0 = leave malloc alone), "
                         f"got {os.environ['JASK_MALLOC_ARENAS']!r}") from None
    if arenas <= 0:
        return None
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return None  # not glibc (musl, macOS): nothing to tune
    return arenas if mallopt(M_ARENA_MAX, arenas) == 1 else None


_trim = None


def release_free_memory() -> bool:
    """Give freed heap pages back to the system (glibc ``malloc_trim``); returns whether it ran."""
    global _trim
    if _trim is None:
        enabled = os.environ.get("JASK_MALLOC_TRIM", "1") != "0"
        _trim = (getattr(_libc(), "malloc_trim", None) if enabled else None) or False
    if not _trim:
        return False
    _trim(0)
    return True


class HeapWatch:
    """Returns freed heap pages after a window whenever the process holds more than ``limit`` bytes above what
    it held when the pass began (``Stats.heap_trims`` counts them). Below the limit it only reads
    ``/proc/self/statm``: trimming costs page faults when the pages are used again (4-12% more time in 64 MB
    passes that outgrew it)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.base = resident_bytes()

    def after_window(self) -> bool:
        """Trim if the pass has grown past its limit; returns whether it did."""
        if self.base is None:
            return False
        now = resident_bytes()
        return now is not None and now - self.base > self.limit and release_free_memory()
