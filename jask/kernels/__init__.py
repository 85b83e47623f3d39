"""Tile kernels: the one seam where per-tile math runs.

The executor hands a backend a *window*: stacked tiles, an index table and the
op (a fused program, :mod:`jask.plan.fusion`), and gets back every output
tile's result from ONE call (the contract is :mod:`jask.kernels.window`;
``backend.compile_window(op, spec)`` compiles it once per window shape).
``backend.check_settings(label)`` refuses settings the backend cannot honour
before any tile is read. The protocol and the registry are
:mod:`jask.kernels.registry`; each backend registers itself in its own file:

* ``xla``: one jitted program per window, a vmap over tiles of a fold over
  entries (:mod:`jask.kernels.xla`). The fast path on CPU and GPU.
* ``pallas``: one ``pl.pallas_call`` per window, compiled for the local TPU
  (Mosaic) or GPU (Triton) (:mod:`jask.kernels.pallas`); a window a platform
  cannot run raises ``WindowNotLegal`` and runs as the xla program.
* ``pallas-interpret``: the same Pallas programs in interpret mode, on CPU. It
  proves every program in CI and is far too slow for real work.

``auto`` (the default) picks the backend registered for the platform:
``pallas`` on TPU and ``xla`` on GPU and CPU; it never picks interpret mode.
"""
from __future__ import annotations

import importlib
import pkgutil

from jask.kernels.registry import (Backend, auto_backend, backend_for, backend_name, current_platform,
                                   get_backend, names, register, unregister)

__all__ = ["Backend", "auto_backend", "backend_for", "backend_name", "current_platform", "get_backend", "names",
           "register", "unregister"]

# Import every module of this folder, so that a new backend's file registers itself with no other
# edit. Dynamic on purpose: a static list here would be a second place that names backends.
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
