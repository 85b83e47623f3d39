"""Where tile math runs, and how much of that device's memory a window may take.

Inside ``jit`` jask's host work runs in ``io_callback``, which makes the host
CPU JAX's default device while the callback runs; code that launched kernels
there without naming a device computed on the CPU even on a GPU machine. So
every operand the executor hands a kernel is placed explicitly on its window's
device (one of :func:`compute_devices`, the first being :func:`compute_device`).
"""
from __future__ import annotations

import contextlib
import threading
import warnings

import jax
import numpy as np

from jask.config import config

DEVICE_SHARE = 0.5   # of the device's free memory a window may take by default (JAX and XLA need the rest)


def compute_device():
    """The first device kernels run on: ``jask.config.update("device", d)``, else the first of ``devices``,
    else the default backend's first device. Always ``compute_devices()[0]`` (a ``device`` that is
    not the first of a ``devices`` list is refused)."""
    if config.device is not None:
        return config.device
    if isinstance(config.devices, tuple):
        return config.devices[0]
    return jax.local_devices()[0]   # jax.devices()[0] in one process; this process's own in several


def compute_devices() -> list:
    """The devices a pass spreads its windows over (``jask.config.update("devices", [...])``).

    ``"all"``: every local device of the compute device's platform. Default: the same on an
    accelerator (a TPU VM's chips, a workstation's GPUs), unless ``device`` names one; on the
    CPU only :func:`compute_device`: forced host devices (``--xla_force_host_platform_device_count``)
    share the same cores, and 2-4 of them ran at 0.71-1.28x one on a 2-core machine.
    """
    if config.devices is None and (config.device is not None or compute_device().platform == "cpu"):
        return [compute_device()]
    if config.devices in (None, "all"):
        first = compute_device()
        return [first] + [d for d in jax.local_devices(backend=first.platform) if d != first]
    return list(config.devices)


def device_budget() -> int:
    """Bytes of device memory a window may take: the ``device_budget`` setting, else half of what is free.

    Devices without memory statistics (the host CPU) report no limit here; the
    host budget applies to them.
    """
    if config.device_budget is not None:
        return config.device_budget
    stats = _memory_stats(compute_device())
    if not stats or "bytes_limit" not in stats:
        return 1 << 62
    free = stats["bytes_limit"] - stats.get("bytes_in_use", 0)
    return max(1, int(free * DEVICE_SHARE))


def _memory_stats(device):
    try:
        return device.memory_stats()
    except Exception:   # not every PJRT client implements it
        return None


# ---------------------------------------------------------------- host callbacks on an accelerator

PROBE_SECONDS = 2.0
_warned: set = set()


def host_handle_device():
    """Where DiskArray handles live as arguments of a jitted program: the host CPU on accelerator machines.

    A jitted program runs on the device of its committed arguments. Handles
    committed to the host CPU put the user's outer program (scalar work and
    jask's ``io_callback``s) on the CPU, so the kernels the callbacks launch on
    the accelerator never wait for the program that is waiting for them: on a
    single GPU, work launched from a callback of a program running on that GPU
    deadlocks (measured on an H200: the README demo hung at step 0).
    ``None`` (uncommitted) when tile math runs on the CPU anyway.
    """
    if compute_device().platform == "cpu":
        return None
    return jax.local_devices(backend="cpu")[0]


def callback_can_use(device) -> bool:
    """Whether work launched now on ``device`` can finish (False inside a callback of a program on it).

    A jitted function that only closes over DiskArrays (no DiskArray argument)
    still runs on the default device. There a tiny jitted probe on ``device``
    cannot finish while the outer program waits for this callback, so after
    ``PROBE_SECONDS`` the caller computes on the host instead of hanging.
    """
    done = threading.Event()

    def probe():
        try:
            _probe(jax.device_put(np.float32(1), device)).block_until_ready()
        finally:
            done.set()

    threading.Thread(target=probe, daemon=True, name="jask-device-probe").start()
    return done.wait(PROBE_SECONDS)


_probe = jax.jit(lambda x: x + 1)


def warn_host_fallback(device) -> None:
    """Say once per device that a callback's tile math ran on the host CPU, and how to avoid it."""
    if device in _warned:
        return
    _warned.add(device)
    warnings.warn(
        f"jask: a jitted function's tile math ran on the host CPU instead of {device}: the function's "
        "compiled program runs on that device and waits for jask's host callback, so kernels launched "
        "there could not start. Pass at least one DiskArray as an argument of the jitted function (its "
        "program then runs on the host and the tile math on the device) instead of only closing over "
        "DiskArrays.", RuntimeWarning, stacklevel=3)


_active_callbacks = 0
_callback_lock = threading.Lock()


@contextlib.contextmanager
def inside_callback():
    """Mark host work run by a compiled program's ``io_callback`` (see :func:`in_callback`)."""
    global _active_callbacks
    with _callback_lock:
        _active_callbacks += 1
    try:
        yield
    finally:
        with _callback_lock:
            _active_callbacks -= 1


def in_callback() -> bool:
    """Whether some thread is running host work for a compiled program (its device may be held)."""
    return _active_callbacks > 0


def calling_on(device):
    """The context a jitted call on ``device`` runs in: ``device`` as JAX's default where arguments may be host
    arrays (a CPU device that is not already the default, as inside ``io_callback``), else nothing (entering
    ``jax.default_device`` costs ~30 us)."""
    if device.platform != "cpu" or jax.config.jax_default_device == device:
        return contextlib.nullcontext()
    return jax.default_device(device)
