"""Profiling and progress for executions.

``with jask.profile() as p:`` records everything executed inside the block:
tiles read and produced, bytes read and written, seconds spent in I/O (summed over the reader
and writer threads, so it can exceed wall time when they overlap compute),
seconds the computation *waited* for I/O, seconds in kernels, wall time and
the peak resident memory of the process during the block, split into the
runtime's baseline and what the block added. ``print(p)`` gives a short
summary.

With ``jask.config.update("progress", True)``, long passes draw a one-line
progress bar on stderr when stderr is a terminal; in pipes and tests they stay
silent.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import threading
import time

import jax
import jax.numpy as jnp

from jask.config import config
from jask.exec import driver, events
from jask.exec.progress import fmt_bytes
from jask.hijax.array import DiskArray
from jask.io.malloc import release_free_memory
from jask.io.memstat import lifetime_peak_rss, reset_peak_rss, status_bytes
from jask.io.scratch import scratch_location


@dataclasses.dataclass
class Profile(events.Stats):
    """:class:`jask.exec.events.Stats` plus wall time, I/O wait, tiles read and memory.

    Counters, named so they cannot be misread:

    - ``output_tiles``: tiles the executed plans produced (a ``sum`` over an
      8-tile grid produces 1; the inherited ``tiles`` is the same number);
    - ``input_tiles_read``: tiles read from stored arrays (8 for that ``sum``);
    - ``bytes_read`` / ``bytes_written``: bytes moved from and to Zarr stores;
    - ``bytes_by_device`` / ``tiles_by_device`` / ``windows_by_device``: per
      device of a pass spread over several (``jask.config.update("devices",
      ...)``), the bytes and tiles read for the windows it computed, and those
      windows (host copies and custom ops count for the first device);
    - ``largest_window_bytes``: the largest window run, as the schedule projected it (what a pass holds
      at once; within the budget), beside ``peak_projected_bytes``, the plan's projection of one tile.

    Memory. ``peak_rss_bytes`` is the high-water mark of the process's resident
    memory during the block (Linux resets it on entry through
    ``/proc/self/clear_refs``); where it cannot be reset it is the process's
    lifetime peak and ``peak_rss_is_lifetime`` is True. It splits as
    ``rss_at_entry_bytes`` + ``working_set_bytes`` (growth during the block:
    jask's tiles, read-ahead and write buffers, plus anything else the block
    allocated, such as XLA compiling a new jitted function). When
    :func:`runtime_baseline` was measured at start-up (the demo and benchmarks
    do), the entry figure splits further into ``runtime_baseline_bytes``
    (Python, JAX and XLA before jask did any work) + ``held_at_entry_bytes``;
    otherwise ``runtime_baseline_bytes`` is 0. The budget bounds jask's tiles,
    not the runtime.
    """

    wall_seconds: float = 0.0
    input_tiles_read: int = 0
    peak_rss_bytes: int = 0
    rss_at_entry_bytes: int = 0
    runtime_baseline_bytes: int = 0
    memory_budget_bytes: int = 0
    peak_rss_is_lifetime: bool = False

    def add(self, **counts) -> None:
        if "bytes_read" in counts:      # the executor reports each tile read as one count
            self.input_tiles_read += 1
        super().add(**counts)

    @property
    def output_tiles(self) -> int:
        return self.tiles

    @property
    def held_at_entry_bytes(self) -> int:
        if not self.runtime_baseline_bytes:
            return 0
        return max(self.rss_at_entry_bytes - self.runtime_baseline_bytes, 0)

    @property
    def working_set_bytes(self) -> int:
        return max(self.peak_rss_bytes - self.rss_at_entry_bytes, 0)

    def device_lines(self) -> list[str]:
        """``cpu:0 read 4.0 MiB (12 tiles, 3 windows)``, one line per device, when several computed."""
        if len(self.windows_by_device) < 2:
            return []
        return [f"{d} read {fmt_bytes(self.bytes_by_device.get(d, 0))} "
                f"({_plural(self.tiles_by_device.get(d, 0), 'tile')}, {_plural(n, 'window')})"
                for d, n in sorted(self.windows_by_device.items(), key=lambda kv: str(kv[0]))]

    def memory_line(self) -> str:
        """``peak RSS 310 MiB = runtime baseline 250 MiB + jask 60 MiB (budget 61 MiB)``."""
        if self.peak_rss_is_lifetime:
            if self.peak_rss_bytes <= runtime_startup_peak():
                return (f"peak RSS {fmt_bytes(self.peak_rss_bytes)} over the process's lifetime, reached while "
                        f"the runtime started ({fmt_bytes(self.runtime_baseline_bytes)} resident after start-up); "
                        f"this platform cannot measure the block alone (budget "
                        f"{fmt_bytes(self.memory_budget_bytes)})")
            split = (f" = runtime baseline {fmt_bytes(self.runtime_baseline_bytes)} + "
                     f"{fmt_bytes(max(self.peak_rss_bytes - self.runtime_baseline_bytes, 0))} since"
                     if self.runtime_baseline_bytes else "")
            return (f"peak RSS {fmt_bytes(self.peak_rss_bytes)}{split} (process lifetime: this platform "
                    f"cannot measure the block alone; budget {fmt_bytes(self.memory_budget_bytes)})")
        if self.runtime_baseline_bytes:
            baseline = min(self.runtime_baseline_bytes, self.rss_at_entry_bytes)
            parts = [f"runtime baseline {fmt_bytes(baseline)}"]
            if self.held_at_entry_bytes >= 2**20:
                parts.append(f"held at entry {fmt_bytes(self.held_at_entry_bytes)}")
        else:
            parts = [f"{fmt_bytes(self.rss_at_entry_bytes)} at entry"]
        parts.append(f"this block {fmt_bytes(self.working_set_bytes)}")
        return (f"peak RSS {fmt_bytes(self.peak_rss_bytes)} = " + " + ".join(parts)
                + f" (jask budget {fmt_bytes(self.memory_budget_bytes)})")

    def __str__(self) -> str:
        wall = max(self.wall_seconds, 1e-9)
        parts = [f"{_plural(self.input_tiles_read, 'input tile')} read ({fmt_bytes(self.bytes_read)})",
                 f"{_plural(self.output_tiles, 'output tile')}",
                 f"wrote {fmt_bytes(self.bytes_written)}", f"in {self.wall_seconds:.3g} s"]
        moved = self.bytes_read + self.bytes_written
        if moved:
            parts[-1] += f" ({fmt_bytes(moved / wall)}/s)"
        devices = ", ".join(sorted(str(d) for d in self.devices)) or "none"
        fallback = f", {self.xla_fallback_calls} run by xla" if self.xla_fallback_calls else ""
        programs = (f" ({_plural(self.window_programs, 'program')}{fallback})"
                    if self.window_programs != self.kernel_calls or fallback else "")
        lines = [", ".join(parts),
                 f"{_plural(self.windows, 'window')}, {_plural(self.kernel_calls, 'kernel call')}{programs} "
                 f"on {devices}",
                 *self.device_lines(),
                 f"I/O {self.io_seconds:.3g} s (waited {self.io_wait_seconds:.3g} s, "
                 f"{100 * self.io_wait_seconds / wall:.0f}% of wall), compute {self.compute_seconds:.3g} s",
                 self.memory_line()]
        return "jask profile: " + "\n              ".join(lines)


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


# ---------------------------------------------------------------- runtime baseline

_baseline: int | None = None
_startup_peak = 0


def runtime_baseline() -> int:
    """Resident memory of the runtime alone (Python, JAX, XLA, the backend), in bytes; measured once.

    The first call starts JAX's default backend, compiles and runs one tiny
    jitted function (XLA's compiler is itself ~50 MiB), returns freed memory
    to the system and reads the RSS; later calls return that number. Call it
    at start-up, before jask does any work (the demo and the benchmarks do):
    from then on :func:`profile` reports the runtime's share of peak RSS apart
    from jask's. 0 where RSS cannot be read.
    """
    global _baseline, _startup_peak
    if _baseline is None:
        jax.jit(lambda v: v + 1)(jnp.zeros(4, jnp.float32)).block_until_ready()
        gc.collect()
        release_free_memory()
        _baseline = status_bytes("VmRSS:") or 0
        _startup_peak = status_bytes("VmHWM:") or 0
    return _baseline


def runtime_startup_peak() -> int:
    """The peak RSS when :func:`runtime_baseline` was measured (0 before): what starting the runtime took.

    Opening a TPU takes ~13 GiB of resident memory for a moment and gives it
    back (measured on a TPU v5e: 13.5 GiB peak, 475 MiB resident after). Where
    the peak cannot be reset (gVisor), a lifetime peak at or below this figure
    says nothing about jask, and reports say so instead of charging it to jask.
    """
    return _startup_peak


# ---------------------------------------------------------------- explain

def explain(*arrays) -> str:
    """The plan a sink would run for these lazy DiskArrays, and where its scratch stores would go.

    Shows the tile edge, stages, fused ops, projected memory, bytes to read and
    write (:func:`jask.exec.driver.explain`) and the scratch folder. Works on
    any DiskArray outside ``jit``; a result that has already been computed (a
    ``jax.Array``, such as what ``jask.sum`` returns) is refused with a message
    saying what to explain instead.
    """
    for x in arrays:
        if isinstance(x, jax.core.Tracer) or (isinstance(x, DiskArray) and x._node is None):
            raise TypeError("jask.explain got a traced value (inside jit or grad), which has no plan "
                            "yet; call jask.explain outside jit, on the same expression")
        if not isinstance(x, DiskArray):
            kind = "jax.Array" if isinstance(x, jax.Array) else type(x).__name__
            what = (f"an already computed {kind} of shape {tuple(getattr(x, 'shape', ()))}"
                    if hasattr(x, "shape") else f"a {type(x).__name__}")
            raise TypeError(
                f"jask.explain expects lazy DiskArrays, got {what}. Ops with a scalar result "
                "(jask.sum) run as soon as they are called, so nothing is left to plan: explain the "
                "array they reduce (jask.explain(jask.square(x)) for jask.sum(jask.square(x))), "
                "or measure the call with `with jask.profile() as p:`")
    where, why = scratch_location()
    shown = where if "://" in where else os.path.abspath(where)     # a store URL as given
    return driver.explain([x._node for x in arrays]) + f"\n  scratch {shown} ({why})"


# ---------------------------------------------------------------- peak memory

_active: list[Profile] = []
_peaks: dict[int, int] = {}    # id(profile) -> highest VmHWM seen before a nested reset
_lock = threading.Lock()


@contextlib.contextmanager
def profile():
    """Record the work executed inside the block; yields a :class:`Profile`.

    Example::

        with jask.profile() as p:
            jask.sum(x)
        print(p)
    """
    p = Profile(runtime_baseline_bytes=_baseline or 0, memory_budget_bytes=config.memory_budget)
    with _lock:
        p.rss_at_entry_bytes = status_bytes("VmRSS:") or 0
        hwm = status_bytes("VmHWM:")
        for outer in _active:       # a reset below must not lose an enclosing block's peak
            _peaks[id(outer)] = max(_peaks.get(id(outer), 0), hwm or 0)
        resettable = hwm is not None and reset_peak_rss()
        _active.append(p)
    events.listeners.append(p)
    t0 = time.perf_counter()
    try:
        yield p
    finally:
        p.wall_seconds = time.perf_counter() - t0
        events.listeners.remove(p)
        with _lock:
            _active.remove(p)
            seen = _peaks.pop(id(p), 0)
            if resettable:
                p.peak_rss_bytes = max(seen, status_bytes("VmHWM:") or 0)
            else:
                p.peak_rss_bytes = lifetime_peak_rss()
                p.peak_rss_is_lifetime = True


