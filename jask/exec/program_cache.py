"""Compiled window programs kept for reuse, bounded by the bytes they hold rather than by count.

An XLA:CPU window program holds 1.7-12 MiB of host memory (its code is unrolled
over the window's entries: 40 distinct sums at tile 256 held 1.7 MiB each, chains
of 8 ops at tile 64 11 MiB each; about 90% of it came back once they were dropped), so
the old bound of 512 programs could hold several GiB that no budget saw. Each
program is charged the growth of the process's resident memory across its first
call, which is where JAX compiles it (at least :data:`MIN_PROGRAM_BYTES`; the
typical :data:`DEFAULT_PROGRAM_BYTES` where the system cannot tell), and the
least recently used programs are dropped once the total passes
:func:`limit_bytes`: the ``program_cache`` setting, or a quarter of the memory
budget but at least :data:`MIN_LIMIT_BYTES`. The bound is on top of the tile
budget, not inside it, and the floor is deliberate: the bench's ``jit(grad)``
step at a 64 MB budget runs 7 programs charged 89 MiB in all, and with a 64 MiB
bound it compiled some of them again every step (0.57 -> 1.0 s per step).
"""
from __future__ import annotations

import collections

from jask.config import config
from jask.io import memstat

MIN_PROGRAM_BYTES = 256 * 2**10
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

    def put(self, key, value, nbytes: int = MIN_PROGRAM_BYTES) -> None:
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


class Charged:
    """A compiled program that charges its cache entry, at its first call, the resident memory
    that call added (JAX compiles it there; the outputs it allocates count too, erring high)."""

    def __init__(self, fn, cache: ProgramCache, key):
        self.fn, self._cache, self._key = fn, cache, key

    def __call__(self, *args):
        if self._cache is None:
            return self.fn(*args)
        cache, self._cache = self._cache, None
        before = memstat.status_bytes("VmRSS")
        out = self.fn(*args)
        after = memstat.status_bytes("VmRSS")
        grown = DEFAULT_PROGRAM_BYTES if before is None or after is None else after - before
        cache.charge(self._key, max(grown, MIN_PROGRAM_BYTES))
        return out
