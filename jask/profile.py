"""Profiling and progress for executions.

``with jask.profile() as p:`` records everything executed inside the block:
tiles, bytes read and written, seconds spent in I/O (summed over the reader
and writer threads, so it can exceed wall time when they overlap compute),
seconds the computation *waited* for I/O, seconds in kernels, wall time and
the peak resident memory of the process during the block. ``print(p)`` gives
a short summary.

With ``jask.config.update("progress", True)``, long passes draw a one-line
progress bar on stderr when stderr is a terminal; in pipes and tests they stay
silent.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import sys
import threading
import time

from jask.base import executor


@dataclasses.dataclass
class Profile(executor.Stats):
    """:class:`jask.base.executor.Stats` plus wall time, I/O wait and peak memory.

    ``peak_rss_bytes`` is the high-water mark of the process's resident memory
    during the block (Linux resets it on entry through ``/proc/self/clear_refs``);
    where it cannot be reset it is the process's lifetime peak and
    ``peak_rss_is_lifetime`` is True.
    """

    io_wait_seconds: float = 0.0
    wall_seconds: float = 0.0
    peak_rss_bytes: int = 0
    rss_at_entry_bytes: int = 0
    peak_rss_is_lifetime: bool = False

    def __str__(self) -> str:
        wall = max(self.wall_seconds, 1e-9)
        parts = [f"{self.tiles} tiles", f"read {_fmt_bytes(self.bytes_read)}",
                 f"wrote {_fmt_bytes(self.bytes_written)}", f"in {self.wall_seconds:.3g} s"]
        moved = self.bytes_read + self.bytes_written
        if moved:
            parts[-1] += f" ({_fmt_bytes(moved / wall)}/s)"
        lines = [", ".join(parts),
                 f"I/O {self.io_seconds:.3g} s (waited {self.io_wait_seconds:.3g} s, "
                 f"{100 * self.io_wait_seconds / wall:.0f}% of wall), compute {self.compute_seconds:.3g} s, "
                 f"peak RSS {_fmt_bytes(self.peak_rss_bytes)}"
                 + (" (process lifetime)" if self.peak_rss_is_lifetime else
                    f" (+{_fmt_bytes(self.peak_rss_bytes - self.rss_at_entry_bytes)} over entry)")]
        return "jask profile: " + "\n              ".join(lines)


def _fmt_bytes(n) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"


# ---------------------------------------------------------------- peak memory

_active: list[Profile] = []
_peaks: dict[int, int] = {}    # id(profile) -> highest VmHWM seen before a nested reset
_lock = threading.Lock()


def _status_bytes(field: str) -> int | None:
    """A size field of /proc/self/status (e.g. ``VmRSS:``) in bytes, or None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _vm_hwm() -> int | None:
    """The process's peak resident set size in bytes since the last reset (Linux), or None."""
    return _status_bytes("VmHWM:")


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _lifetime_peak() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


@contextlib.contextmanager
def profile():
    """Record the work executed inside the block; yields a :class:`Profile`.

    Example::

        with jask.profile() as p:
            jask.sum(x)
        print(p)
    """
    p = Profile()
    with _lock:
        p.rss_at_entry_bytes = _status_bytes("VmRSS:") or 0
        hwm = _vm_hwm()
        for outer in _active:       # a reset below must not lose an enclosing block's peak
            _peaks[id(outer)] = max(_peaks.get(id(outer), 0), hwm or 0)
        resettable = hwm is not None and _reset_hwm()
        _active.append(p)
    executor._listeners.append(p)
    t0 = time.perf_counter()
    try:
        yield p
    finally:
        p.wall_seconds = time.perf_counter() - t0
        executor._listeners.remove(p)
        with _lock:
            _active.remove(p)
            seen = _peaks.pop(id(p), 0)
            if resettable:
                p.peak_rss_bytes = max(seen, _vm_hwm() or 0)
            else:
                p.peak_rss_bytes = _lifetime_peak()
                p.peak_rss_is_lifetime = True


# ---------------------------------------------------------------- progress

def progress_enabled(stream=None) -> bool:
    """Whether to draw progress: ``config.progress`` is on and the stream is a terminal."""
    from jask.config import config
    stream = sys.stderr if stream is None else stream
    if not config.progress or os.environ.get("PYTEST_CURRENT_TEST"):
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Progress:
    """A one-line progress bar (tiles done of ``total``), redrawn at most ten times a second.

    Build it with :func:`progress`, which returns a silent one when progress is off.
    """

    def __init__(self, total: int, label: str = "", stream=None):
        self.total, self.label = max(int(total), 1), label
        self.stream = sys.stderr if stream is None else stream
        self.done = 0
        self.bytes = 0
        self._t0 = self._drawn = time.perf_counter()

    def update(self, tiles: int = 1, nbytes: int = 0) -> None:
        self.done += tiles
        self.bytes += nbytes
        now = time.perf_counter()
        if now - self._drawn >= 0.1 or self.done >= self.total:
            self._drawn = now
            self._draw(now)

    def _draw(self, now):
        frac = min(self.done / self.total, 1.0)
        elapsed = now - self._t0
        bar = "#" * int(frac * 30)
        rate = f" {_fmt_bytes(self.bytes / max(elapsed, 1e-9))}/s" if self.bytes else ""
        eta = f" eta {elapsed * (1 - frac) / frac:.0f}s" if 0 < frac < 1 else ""
        self.stream.write(f"\r{self.label} [{bar:<30}] {self.done}/{self.total}{rate}{eta} ")
        self.stream.flush()

    def close(self) -> None:
        self._draw(time.perf_counter())
        self.stream.write("\n")
        self.stream.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class _Silent:
    def update(self, tiles: int = 1, nbytes: int = 0) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def progress(total: int, label: str = "", stream=None):
    """A :class:`Progress` bar when :func:`progress_enabled`, else an object that does nothing."""
    return Progress(total, label, stream) if progress_enabled(stream) else _Silent()
