"""Full reduction to a JAX scalar."""
import itertools

import jax
import jax.numpy as jnp

from jask.base import BlockParallelOp
from jask.base.base_algo import make_op


class Sum(BlockParallelOp):
    """Sum of every element; the one output tile reads every input block."""

    def __init__(self, grid=()):
        self.grid = grid

    @classmethod
    def from_inputs(cls, a):
        return cls(grid=a.grid)

    def forward_block(self, a_block):
        return jnp.sum(a_block)

    def index_map(self, out_idx):
        return [(idx,) for idx in itertools.product(*map(range, self.grid))]

    def combine(self, acc, partial):
        return acc + partial

    def backward_block(self, d_out_block, a_block):
        return (jnp.broadcast_to(d_out_block, a_block.shape).astype(a_block.dtype),)

    def output_shape(self, a_shape):
        return ()

    def output_dtype(self, a_dtype):
        """As ``jnp.sum``: bool and small integers sum in int32."""
        return jax.eval_shape(jnp.sum, jax.ShapeDtypeStruct((), a_dtype)).dtype


sum = make_op(Sum, doc="Sum of all elements of a disk-backed array, as a JAX scalar.")  # noqa: A001
