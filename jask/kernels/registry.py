"""The backend protocol and the registry every backend adds itself to.

A backend is one file in ``jask/kernels/`` that defines a class satisfying
:class:`Backend` and calls :func:`register` at import; ``jask.kernels`` imports
every module of the folder, so nothing else names it.
``auto``, :func:`get_backend`, ``jask.config.update("backend", ...)`` and the
error messages read the registry.

Settings (``backend``, ``tile``, ``precision``) reach this layer through
:func:`use_settings`, called by ``jask.config``: the kernels never import it.
"""
from __future__ import annotations

import types
from typing import Protocol

import jax

ANY_PLATFORM = "*"        # ``auto_for`` entry: picked on any platform no other backend claims

_backends: dict = {}      # name -> backend
_auto: dict = {}          # platform (or ANY_PLATFORM) -> backend name
_settings = types.SimpleNamespace(backend="auto", tile=None, precision="highest")


class Backend(Protocol):
    """What the executor calls on a backend."""

    name: str          # what ``jask.config.update("backend", name)`` selects
    interpret: bool    # programs run in interpret mode (CI): a failed compile is a bug, never a fallback
    platforms: tuple   # platforms it compiles for (ANY_PLATFORM: all); elsewhere the platform's auto one runs
    separate_tiles: bool   # the executor runs its windows as xla's separate-tiles program (no stacking copy)

    def check_settings(self, label: str = "jask") -> None:
        """Refuse, before any tile is read, settings this backend cannot honour here (``label``: the ops)."""

    def compile_window(self, op, spec):
        """The jitted window program ``run(stacks, table, valid) -> (n_tiles, *out_block)`` of ``op``
        (:mod:`jask.kernels.window`); raises ``WindowNotLegal`` for a window the platform cannot run."""


def register(backend: Backend, auto_for: tuple[str, ...] = ()) -> Backend:
    """Make ``backend`` selectable by its name; ``auto`` picks it on the platforms in ``auto_for``."""
    _backends[backend.name] = backend
    for platform in auto_for:
        _auto[platform] = backend.name
    return backend


def unregister(name: str) -> None:
    """Forget the backend ``name`` (tests that register a fake one)."""
    _backends.pop(name, None)
    for platform in [p for p, n in _auto.items() if n == name]:
        del _auto[platform]


def names() -> list[str]:
    """Every registered backend's name, sorted (``auto`` is not one: it picks one of these)."""
    return sorted(_backends)


def use_settings(settings) -> None:
    """Read ``backend``, ``tile`` and ``precision`` from ``settings`` (``jask.config``) at every call."""
    global _settings
    _settings = settings


def settings():
    """The settings object given to :func:`use_settings`."""
    return _settings


def current_platform() -> str:
    """``tpu``, ``gpu`` or ``cpu``: JAX's default platform, where a compiled backend would run."""
    p = jax.default_backend()
    return "gpu" if p in ("gpu", "cuda", "rocm") else p


def auto_backend(platform: str | None = None) -> str:
    """The backend registered ``auto_for`` ``platform`` (default: JAX's; see each backend's file for why)."""
    platform = platform or current_platform()
    name = _auto.get(platform) or _auto.get(ANY_PLATFORM)
    if name is None:
        raise NotImplementedError(f"no backend is registered for platform {platform!r}; available: {names()}")
    return name


def backend_for(backend: Backend, platform: str) -> Backend:
    """``backend``, or the platform's auto backend where ``backend`` cannot compile for ``platform``
    (tile math falling back to the host CPU inside a callback while ``pallas`` is selected)."""
    if ANY_PLATFORM in backend.platforms or platform in backend.platforms:
        return backend
    return get_backend(auto_backend(platform))


def backend_name() -> str:
    """The backend the current settings select (``auto`` resolves per platform)."""
    name = _settings.backend
    return auto_backend() if name == "auto" else name


def get_backend(name: str | None = None) -> Backend:
    """The active backend, or the one called ``name``."""
    name = name or backend_name()
    if name not in _backends:
        raise NotImplementedError(f"backend {name!r} is not available in this build; available: {names()}")
    return _backends[name]
