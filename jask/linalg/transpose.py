"""Axis permutation."""
import numpy as np
import jax.numpy as jnp

from jask.graph.op import BlockParallelOp
from jask.hijax.make_op import make_op


def normalize_axes(axes, ndim):
    """Validate ``axes`` as a permutation of ``range(ndim)`` (negative axes allowed)."""
    if axes is None:
        return tuple(reversed(range(ndim)))
    try:
        axes = tuple(int(a) for a in axes)
    except TypeError:
        raise TypeError(f"transpose axes must be a sequence of ints, got {axes!r}") from None
    norm = tuple(a + ndim if a < 0 else a for a in axes)
    if len(norm) != ndim or sorted(norm) != list(range(ndim)):
        raise ValueError(f"transpose got axes {axes} for an array of ndim {ndim}; "
                         f"axes must be a permutation of {tuple(range(ndim))}")
    return norm


class Transpose(BlockParallelOp):
    """Permute axes; output tile ``out_idx`` is input tile ``out_idx`` un-permuted."""

    def __init__(self, axes=None, ndim=None):
        self.axes = normalize_axes(axes, ndim)
        self.inverse = tuple(int(i) for i in np.argsort(self.axes))

    @classmethod
    def from_inputs(cls, a, axes=None):
        return cls(axes=axes, ndim=a.ndim)

    def forward_block(self, a_block):
        return jnp.transpose(a_block, self.axes)

    def index_map(self, out_idx):
        return [(tuple(out_idx[i] for i in self.inverse),)]

    def combine(self, acc, partial):
        return acc + partial

    def backward_block(self, d_out_block, a_block):
        return (jnp.transpose(d_out_block, self.inverse),)

    def output_shape(self, a_shape):
        return tuple(a_shape[i] for i in self.axes)


transpose = make_op(Transpose, doc="Permute the axes of a disk-backed array (reverse them by default).")
