"""Compiled window programs kept for reuse, bounded by the bytes they hold rather than by count.

An XLA:CPU window program holds 1-12 MiB of host memory (its code is unrolled
over the window's entries), so the old bound of 512 programs could hold several
GiB that no budget saw. Each program is charged an estimate from the size of its
lowered StableHLO text, made at its first call (``fn.lower(*args)``, whose work
the call then reuses): :data:`PROGRAM_BASE_BYTES` plus :data:`BYTES_PER_HLO_CHAR`
per character, fitted on seven window programs (tile 32-512, chains of 0-8 ops)
against the memory each returned when dropped: 1.0-9.1 MiB, the estimate within
~30%. Resident-memory growth across the compile was tried first and dropped: in
a long-running process the allocator reuses freed memory, so a compile often
grew it by nothing. Where a program cannot be lowered so (not a ``jax.jit``
function), it is charged :data:`DEFAULT_PROGRAM_BYTES`.

The least recently used programs are dropped once the total passes
:func:`limit_bytes`: the ``program_cache`` setting, or a quarter of the memory
budget but at least :data:`MIN_LIMIT_BYTES`. The bound is on top of the tile
budget, not inside it, and the floor is deliberate: every step of a training
loop reuses all of its programs, and one dropped is compiled again at 50-200 ms
(the bench's ``jit(grad)`` step at a 64 MB budget went from 0.57 to 1.0 s when a
64 MiB bound dropped some of them each step).
"""
from __future__ import annotations

import collections

from jask.config import config

PROGRAM_BASE_BYTES = 900 * 2**10
BYTES_PER_HLO_CHAR = 45
DEFAULT_PROGRAM_BYTES = 2 * 2**20
MIN_LIMIT_BYTES = 256 * 2**20
BUDGET_SHARE = 4


def limit_bytes() -> int:
    """Bytes the cache may hold: the ``program_cache`` setting, else max(budget / 4, 256 MiB)."""
    if config.program_cache is not None:
        return config.program_cache
    return max(config.memory_budget // BUDGET_SHARE, MIN_LIMIT_BYTES)


class ProgramCache:
    """Least recently used entries, each charged its bytes; ``evictions`` counts the dropped ones."""

    def __init__(self):
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._bytes: dict = {}
        self.nbytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key):
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key, value, nbytes: int = PROGRAM_BASE_BYTES) -> None:
        self._drop(key)
        self._entries[key] = value
        self._bytes[key] = nbytes
        self.nbytes += nbytes
        self._trim()

    def charge(self, key, nbytes: int) -> None:
        """Set ``key``'s bytes (measured at its first call), then drop old entries past the limit."""
        if key in self._entries:
            self._entries.move_to_end(key)          # it has just run: the most recently used
            self.nbytes += nbytes - self._bytes[key]
            self._bytes[key] = nbytes
            self._trim()

    def clear(self) -> None:
        for key in list(self._entries):
            self._drop(key)

    def _drop(self, key) -> None:
        if key in self._entries:
            del self._entries[key]
            self.nbytes -= self._bytes.pop(key)

    def _trim(self) -> None:
        limit = limit_bytes()
        while self.nbytes > limit and len(self._entries) > 1:   # the newest stays: it is about to run
            self._drop(next(iter(self._entries)))
            self.evictions += 1


def estimated_bytes(fn, args) -> int:
    """Host bytes the compiled ``fn`` will hold for these arguments (see the module docstring)."""
    lower = getattr(fn, "lower", None)
    if lower is None:
        return DEFAULT_PROGRAM_BYTES
    try:
        text = lower(*args).as_text()
    except Exception:   # noqa: BLE001 -- the call right after raises it where it belongs
        return DEFAULT_PROGRAM_BYTES
    return PROGRAM_BASE_BYTES + BYTES_PER_HLO_CHAR * len(text)


class Charged:
    """A compiled program that charges its cache entry its :func:`estimated_bytes` at its first call."""

    def __init__(self, fn, cache: ProgramCache, key):
        self.fn, self._cache, self._key = fn, cache, key

    def __call__(self, *args):
        if self._cache is not None:
            cache, self._cache = self._cache, None
            cache.charge(self._key, estimated_bytes(self.fn, args))
        return self.fn(*args)
