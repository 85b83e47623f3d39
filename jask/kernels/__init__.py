"""Tile kernels: the one seam where per-tile math runs.

The executor hands a compiled kernel and the stream of one output tile's
entries to ``backend.output_tile``; a backend decides how the op's
``forward_block``/``combine`` run. The executor's kernels are fused programs
(:mod:`jask.base.fusion`): a consumer with its fused producers inlined, so a
chain of ops is one kernel launch per entry; ``kernel_of(entry)`` picks each
entry's kernel when an entry's program shape differs (a ragged edge, a tile
met twice on a diagonal).

* ``xla``: each method jitted once per op instance, entries folded on the host
  (:mod:`jask.kernels.xla`). The fast path on CPU.
* ``pallas``: ``pl.pallas_call`` compiled for the local TPU (Mosaic) or GPU
  (Triton) (:mod:`jask.kernels.pallas`).
* ``pallas-interpret``: the same Pallas programs in interpret mode, on CPU. It
  proves every lowering in CI and is far too slow for real work.

``auto`` (the default) picks ``pallas`` on TPU and GPU and ``xla`` on CPU; it
never picks interpret mode.
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
    """``pallas`` where JAX's default platform is a TPU or GPU, else ``xla``."""
    from jask.kernels.pallas import current_platform
    return "pallas" if current_platform() in ("tpu", "gpu") else "xla"


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


def tile_jaxpr(op, *blocks, backend: str | None = None):
    """The jaxpr of ``op``'s per-tile program on a backend, for one entry of input ``blocks``.

    Under ``pallas``/``pallas-interpret`` it holds a ``pallas_call``; under
    ``xla`` it is the jitted ``forward_block``.
    """
    import jax
    b = get_backend(backend)
    kernel = b.compile(op)
    if isinstance(b, PallasBackend):
        return kernel.jaxpr(*blocks)
    return jax.make_jaxpr(kernel.first)(*blocks)
