"""The op contracts: :class:`BlockParallelOp` (five per-tile methods) and :class:`CustomOp`."""
from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class TiledInput:
    """What ``from_inputs`` sees of one input: full shape, dtype and the tiling chosen for this call.

    Attributes
    ----------
    shape : tuple of int
        Full shape of the input.
    dtype : numpy.dtype
    block_shape : tuple of int
        Tile shape (edge tiles may be smaller: ragged edges are not padded).
    grid : tuple of int
        Tiles per dimension, ``ceil(shape / block_shape)``.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    block_shape: tuple[int, ...]

    @property
    def grid(self) -> tuple[int, ...]:
        return tuple(math.ceil(d / b) for d, b in zip(self.shape, self.block_shape))

    @property
    def ndim(self) -> int:
        return len(self.shape)


class _Op:
    """What every op has: an output shape, an output dtype, and a constructor from its inputs.

    ``scalar_operands``: when True, ``make_op`` also accepts 0-d JAX/NumPy values
    (traced or not) as inputs; their block index is ``()`` and their gradient, a
    reduction over every tile, comes back as a JAX scalar.
    ``nondiff_inputs``: input positions that never get a gradient (reference
    values such as a reduction's own result, read only by ``backward_block``).
    Inputs and outputs that are not floating point never carry gradients, as in JAX.
    """

    scalar_operands = False
    nondiff_inputs: tuple[int, ...] = ()

    def output_shape(self, *input_shapes):
        raise NotImplementedError(f"{type(self).__name__} must implement output_shape")

    def output_dtype(self, *input_dtypes):
        """Result dtype; by default all inputs must share one dtype, which the output keeps."""
        return input_dtypes[0]

    @classmethod
    def from_inputs(cls, *inputs, **kwargs):
        """Build the op for these inputs (``TiledInput``s); keyword arguments of the public function land here."""
        return cls(**kwargs)


class BlockParallelOp(_Op):
    """An op defined one tile at a time; see ``adding-a-new-op`` in the docs.

    Subclasses write ``forward_block``, ``index_map``, ``combine``,
    ``backward_block`` and ``output_shape``; ``make_op`` turns the class into a
    public function that works eagerly, under ``jax.jit`` and under ``jax.grad``.

    ``index_map(out_idx)`` returns a list of entries; each entry is a tuple with
    one block index (a tuple) per input. The output tile is
    ``combine(... combine(forward_block(*blocks_0), forward_block(*blocks_1)) ...)``.
    """

    def forward_block(self, *input_blocks):
        raise NotImplementedError(f"{type(self).__name__} must implement forward_block")

    def index_map(self, out_idx):
        raise NotImplementedError(f"{type(self).__name__} must implement index_map")

    def combine(self, acc, partial):
        return acc + partial

    def backward_block(self, d_out_block, *input_blocks):
        raise NotImplementedError(f"{type(self).__name__} must implement backward_block")


class CustomOp(_Op):
    """An op that is not block-parallel (FFT, sort): write ``forward`` and ``backward`` directly.

    ``forward(self, algo, *inputs)`` writes every output tile with
    ``algo.write(idx, block)``, reading inputs with ``algo.read(x, idx)``
    (``algo`` is a :class:`jask.exec.custom.OOCAlgorithm`).
    ``backward(self, algo, inputs, d_out)`` writes gradient tiles with
    ``algo.write(idx, block, wrt=i)``; it is run once per input whose gradient
    is needed. ``output_shape`` is required as for BlockParallelOp. A CustomOp's
    output is always stored, never fused. See the Roadmap in ``log.md``.
    """

    def forward(self, algo, *inputs):
        raise NotImplementedError(f"{type(self).__name__} must implement forward")

    def backward(self, algo, inputs, d_out):
        raise NotImplementedError(f"{type(self).__name__} must implement backward")
