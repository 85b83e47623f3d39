"""This process's resident memory from the kernel: current, peak since a reset, lifetime peak.

``jask.profile()`` and the benchmarks both measure memory this way; where
``/proc`` is missing (macOS) or the peak cannot be reset (gVisor) the callers
say so instead of guessing.
"""
from __future__ import annotations

import os
import resource
import sys

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def status_bytes(field: str) -> int | None:
    """A size field of /proc/self/status (``VmRSS:``, ``VmHWM:``) in bytes, or None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def resident_bytes() -> int | None:
    """This process's resident memory now, in bytes, from ``/proc/self/statm`` (one short read, cheaper than
    ``status_bytes("VmRSS:")``: the executor asks after every window), or None off Linux."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (``VmHWM``) to the current RSS; False where it cannot be."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def lifetime_peak_rss() -> int:
    """The process's peak RSS since it started, in bytes (``getrusage``; never reset)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
