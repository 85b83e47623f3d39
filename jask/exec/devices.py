"""Where tile math runs, and how much of that device's memory a window may take.

Inside ``jit`` jask's host work runs in ``io_callback``, which makes the host
CPU JAX's default device while the callback runs; code that launched kernels
there without naming a device computed on the CPU even on a GPU machine. So
every operand the executor hands a kernel is placed on :func:`compute_device`
explicitly.
"""
from __future__ import annotations

import jax

DEVICE_SHARE = 0.5   # of the device's free memory a window may take by default (JAX and XLA need the rest)


def compute_device():
    """The device kernels run on: ``jask.config.update("device", d)``, else the default backend's first."""
    from jask.config import config
    if config.device is not None:
        return config.device
    return jax.devices()[0]


def device_budget() -> int:
    """Bytes of device memory a window may take: the ``device_budget`` setting, else half of what is free.

    Devices without memory statistics (the host CPU) report no limit here; the
    host budget applies to them.
    """
    from jask.config import config
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
