"""The live settings the io layer reads (``scratch_dir``, ``allow_tmpfs``, ``durability``, ``read_mmap``...).

``jask.config`` hands its settings object in through :func:`use_settings`, so
this layer never imports the config module; each read is afresh, so a change
takes effect at the next call. A module of its own, imported by everyone and
importing no one, so that ``durable`` (low) and ``scratch`` (high) can both
read settings without an import cycle.
"""
from __future__ import annotations

import os
import types

_settings = types.SimpleNamespace(scratch_dir=os.environ.get("JASK_SCRATCH_DIR") or None, allow_tmpfs=False,
                                  durability=os.environ.get("JASK_DURABILITY") or "process")


def use_settings(settings) -> None:
    """Read every io setting from ``settings`` from now on."""
    global _settings
    _settings = settings


def current():
    """The settings object in use (read its attributes afresh at each call)."""
    return _settings


def setting(name: str, default=None):
    """One live setting, or ``default`` when not set."""
    return getattr(_settings, name, default)
