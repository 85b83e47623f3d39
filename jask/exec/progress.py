"""Progress of a pass: a one-line bar on stderr, drawn only when asked for and on a terminal.

With ``jask.config.update("progress", True)``, long passes draw a one-line
progress bar on stderr when stderr is a terminal; in pipes and tests they stay
silent.
"""
from __future__ import annotations

import os
import sys
import time

from jask.config import config


def progress_enabled(stream=None) -> bool:
    """Whether to draw progress: ``config.progress`` is on and the stream is a terminal."""
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
        rate = f" {fmt_bytes(self.bytes / max(elapsed, 1e-9))}/s" if self.bytes else ""
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


def fmt_bytes(n) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"
