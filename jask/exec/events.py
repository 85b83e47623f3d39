"""Counters of executed work: every layer below the API reports here, observers listen.

:class:`Stats` holds the counts; ``listeners`` are the Stats objects (a
``jask.profile()`` block) that each :func:`count` adds to. The executor never
knows who listens.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Stats:
    """Deterministic counters of executed work (bytes, tiles, kernel calls)."""

    tiles: int = 0
    windows: int = 0
    kernel_calls: int = 0              # dispatches: one per window (jask.exec.joined_window)
    window_programs: int = 0           # the programs those calls ran (a joined window's members each count)
    xla_fallback_calls: int = 0        # window programs a Pallas backend could not run here, run by xla
    bytes_read: int = 0
    bytes_written: int = 0
    arrays_written: int = 0
    io_seconds: float = 0.0
    compute_seconds: float = 0.0
    io_wait_seconds: float = 0.0
    plans: int = 0
    heap_trims: int = 0                # windows after which freed heap pages went back (jask.io.malloc.HeapWatch)
    peak_projected_bytes: int = 0     # the largest plan's projection of one tile
    largest_window_bytes: int = 0     # the largest window run, projected (windows grow to the limit: what a pass holds)
    devices: frozenset = frozenset()   # the devices kernels ran on
    # Per device of a multi-device pass (jask.config.update("devices", ...)): bytes and tiles read
    # from stored arrays for the windows each device computed, and those windows.
    bytes_by_device: dict = dataclasses.field(default_factory=dict)
    tiles_by_device: dict = dataclasses.field(default_factory=dict)
    windows_by_device: dict = dataclasses.field(default_factory=dict)

    def add(self, **counts) -> None:
        for k, v in counts.items():
            if k == "devices":
                self.devices = self.devices | v
            elif k == "largest_window_bytes":
                self.largest_window_bytes = max(self.largest_window_bytes, v)
            elif k.endswith("_by_device"):
                mine = getattr(self, k)
                for device, n in v.items():
                    mine[device] = mine.get(device, 0) + n
            else:
                setattr(self, k, getattr(self, k) + v)

    def saw_plan(self, p) -> None:
        self.plans += 1
        self.peak_projected_bytes = max(self.peak_projected_bytes, p.projected_bytes)


listeners: list[Stats] = []


def count(**counts) -> None:
    for s in listeners:
        s.add(**counts)


def count_wait(io_wait_seconds=0.0, **_):
    """Count only waiting time (for sinks whose writes are not disk I/O, like materialize)."""
    count(io_wait_seconds=io_wait_seconds)
