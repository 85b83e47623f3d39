"""Tile kernels: the one seam where per-tile math runs.

The executor hands a backend a *window*: stacked tiles, an index table and the
op (a fused program, :mod:`jask.plan.fusion`), and gets back every output
tile's result from ONE call (the contract is :mod:`jask.kernels.window`;
``backend.compile_window(op, spec)`` compiles it once per window shape).
``backend.check_settings(label)`` refuses settings the backend cannot honour
before any tile is read.

* ``xla``: one jitted program per window, a vmap over tiles of a fold over
  entries (:mod:`jask.kernels.xla`). The fast path on CPU and GPU.
* ``pallas``: one ``pl.pallas_call`` per window, compiled for the local TPU
  (Mosaic) or GPU (Triton) (:mod:`jask.kernels.pallas_window`); a window a
  platform cannot run raises ``WindowNotLegal`` and runs as the xla program.

* ``pallas-interpret``: the same Pallas programs in interpret mode, on CPU. It
  proves every program in CI and is far too slow for real work.

``auto`` (the default) picks ``pallas`` on TPU and ``xla`` on GPU and CPU (see
:func:`auto_backend` for the measurement); it never picks interpret mode.
"""
from __future__ import annotations

from jask.kernels.pallas import PallasBackend
from jask.kernels.xla import XlaBackend

_BACKENDS = {
    "xla": XlaBackend(),
    "pallas": PallasBackend(interpret=False),
    "pallas-interpret": PallasBackend(interpret=True),
}


def auto_backend() -> str:
    """``pallas`` on a TPU, else ``xla``.

    On an H200 (2026-12-04, ``python -m jask.bench.kernels --n=8192 --block=1024``,
    window programs) ``xla`` was as fast or faster than Pallas (Triton) for
    every op measured: float32 dot 0.86x jnp against 0.73x, bfloat16 dot 0.45x
    against 0.16x, add 1.05x against 0.96x; and some windows Pallas cannot run
    on a GPU fall back to xla anyway. Pallas on TPU is not yet measured.
    """
    from jask.kernels.pallas import current_platform
    return "pallas" if current_platform() == "tpu" else "xla"


def backend_name() -> str:
    """The backend the current settings select (``auto`` resolves per platform)."""
    from jask.config import config
    name = config.backend
    if name == "auto":
        return auto_backend()
    return name


def get_backend(name: str | None = None):
    """The active backend, or the one called ``name``."""
    name = name or backend_name()
    if name not in _BACKENDS:
        raise NotImplementedError(
            f"backend {name!r} is not available in this build; available: {sorted(_BACKENDS)}")
    return _BACKENDS[name]
