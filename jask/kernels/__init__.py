"""Tile kernels: the one seam where per-tile math runs.

The executor hands a prepared op and the stream of its input blocks to
:meth:`TileBackend.output_tile`; a backend decides how the op's
``forward_block``/``combine`` run. ``xla`` jits each method once per op
instance (the fast path on CPU). Pallas backends plug in here.
"""
from __future__ import annotations

import os

from jask.kernels.xla import XlaBackend

_BACKENDS = {"xla": XlaBackend()}


def backend_name() -> str:
    """The backend the current settings select (``auto`` resolves per platform)."""
    from jask.config import config
    name = config.backend
    if name == "auto":
        return "xla"
    return name


def get_backend():
    """The active :class:`TileBackend`."""
    name = backend_name()
    if name not in _BACKENDS:
        raise NotImplementedError(
            f"backend {name!r} is not available in this build; available: {sorted(_BACKENDS)}")
    return _BACKENDS[name]
