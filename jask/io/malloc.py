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
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

M_ARENA_MAX = -8   # mallopt parameter number, from glibc's malloc.h
DEFAULT_ARENAS = 2


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
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None  # not glibc (musl, macOS): nothing to tune
    return arenas if mallopt(M_ARENA_MAX, arenas) == 1 else None
