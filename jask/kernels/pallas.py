"""Pallas backends: ``pallas`` (TPU Mosaic, GPU Triton) and ``pallas-interpret`` (CPU).

:class:`PallasBackend` compiles a window (the contract of :mod:`jask.kernels.window`)
into one ``pl.pallas_call`` (the program is :mod:`jask.kernels.pallas_window`; which
blocks a platform accepts is :mod:`jask.kernels.legality`). This file also holds
the platform facts the backend and the TPU tests share: where ``pallas`` compiles,
and which block shapes Mosaic and Triton accept.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jask.kernels import legality
from jask.kernels.pallas_window import window_program
from jask.kernels.registry import ANY_PLATFORM, current_platform, register, settings


# ---------------------------------------------------------------- platform facts

def _pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def block_shape_problem(shape, block, dtype, platform: str) -> str | None:
    """Why ``block`` is not a legal Pallas block of an array of ``shape`` on ``platform`` (None if legal).

    TPU (Mosaic): the last two block dims are multiples of (8, 128) or equal the
    array's dims. GPU Triton: every block dim is a power of two. Mosaic GPU
    (``platform="mosaic_gpu"``): the minor block dim spans a multiple of 16 bytes.
    """
    shape, block = tuple(shape), tuple(block)
    if platform == "tpu":
        for axis, unit in ((-1, 128), (-2, 8)):
            if len(block) >= -axis and block[axis] % unit and block[axis] != shape[axis]:
                return (f"TPU blocks need the last two dims to be multiples of (8, 128) or the full "
                        f"array dims; dim {len(block) + axis} is {block[axis]} of {shape[axis]}")
    elif platform == "gpu":
        bad = [b for b in block if not _pow2(b)]
        if bad:
            return f"Triton blocks need power-of-two dims; got {bad}"
    elif platform == "mosaic_gpu":
        if block and (block[-1] * jnp.dtype(dtype).itemsize) % 16:
            return (f"Mosaic GPU blocks need the minor dim to span a multiple of 16 bytes; "
                    f"{block[-1]} x {jnp.dtype(dtype).itemsize} bytes does not")
    return None


def check_block_shape(name, shape, block, dtype, platform) -> None:
    problem = block_shape_problem(shape, block, dtype, platform)
    if problem:
        raise ValueError(f"{name}: block shape {tuple(block)} is illegal for an array of shape "
                         f"{tuple(shape)} on {platform}: {problem}")


def legal_block_shape(shape, dtype, platform: str, tile: int) -> tuple[int, ...]:
    """The block of edge about ``tile`` that ``platform`` accepts for an array of ``shape``."""
    shape = tuple(shape)
    block = [min(tile, d) for d in shape]
    if platform == "tpu":
        for axis, unit in ((-1, 128), (-2, 8)):
            if len(block) >= -axis and block[axis] != shape[axis]:
                block[axis] = min(max(unit, block[axis] // unit * unit), shape[axis])
    elif platform == "gpu":
        block = [2 ** int(math.log2(b)) for b in block]
    elif platform == "mosaic_gpu" and block:
        unit = max(1, 16 // jnp.dtype(dtype).itemsize)
        if block[-1] != shape[-1] or block[-1] % unit:
            block[-1] = max(unit, block[-1] // unit * unit)
    return tuple(block)



# ---------------------------------------------------------------- the backends

class PallasBackend:
    """``pallas`` (compiled for the local TPU or GPU) or ``pallas-interpret`` (CPU, for CI)."""

    def __init__(self, interpret: bool):
        self.interpret = interpret
        self.name = "pallas-interpret" if interpret else "pallas"   # the interpret twin runs on CPU, for CI
        self.platforms = (ANY_PLATFORM,) if interpret else ("tpu", "gpu")
        self.separate_tiles = False   # one pallas_call over stacked tiles and the index table

    def platform(self) -> str:
        if self.interpret:
            return "interpret"
        p = current_platform()
        if p not in ("tpu", "gpu"):
            raise RuntimeError(
                f"jask backend 'pallas' compiles for TPU (Mosaic) or GPU (Triton), but JAX's default "
                f"platform is {p!r}; use backend 'xla' (or 'auto') here, or 'pallas-interpret' to "
                "check the Pallas lowering on CPU")
        return p

    def check_settings(self, label: str = "jask") -> None:
        """Refuse, before any tile is read, settings this backend cannot honour here (``label``: the ops)."""
        tile = settings().tile
        if self.platform() == "gpu" and tile is not None and not _pow2(tile):
            raise ValueError(f"{label}: tile {tile} set with jask.config.update('tile', ...) "
                             "is illegal for Pallas on GPU (Triton needs power-of-two blocks); "
                             "choose a power of two")

    def target(self) -> str:
        """Whose rules window programs follow: ``tpu`` (also in interpret mode) or ``gpu``."""
        return "tpu" if self.interpret else self.platform()

    def compile_window(self, op, spec):
        """The jitted window program ``(stacks, table, valid) -> (n_tiles, *out_block)`` of ``op``.

        One ``pallas_call`` per call (see :mod:`jask.kernels.pallas_window`).
        Raises :class:`~jask.kernels.legality.WindowNotLegal` when this
        platform cannot run the window: run the ``xla`` program for it.
        """
        return jax.jit(window_program(op, spec, self.target(), self.interpret))

    def max_tile_edge(self, dtypes, n_leaves: int) -> int | None:
        """Largest power-of-two tile edge at which any window program is legal here (None: no limit).

        ``pallas-interpret``: None. TPU: whole tiles within the VMEM budget (512
        for two float32 leaves). GPU (Triton): 128. Pointwise and plain 2-D
        matmul programs are legal at any larger tile (split into inner blocks);
        see :func:`jask.kernels.legality.max_tile_edge`.
        """
        return legality.max_tile_edge("interpret" if self.interpret else self.target(), dtypes, n_leaves)


# ``auto`` picks Pallas on a TPU only: on GPU, xla measured as fast or faster (see xla.py); interpret
# mode is never picked (far too slow for real work).
register(PallasBackend(interpret=False), auto_for=("tpu",))
register(PallasBackend(interpret=True))
