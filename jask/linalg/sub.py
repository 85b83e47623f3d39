"""Elementwise difference."""
from jask.graph.op import BlockParallelOp
from jask.hijax.make_op import make_op
from jask.linalg._checks import same_shape


class Sub(BlockParallelOp):
    """a - b elementwise."""

    def forward_block(self, a_block, b_block):
        return a_block - b_block

    def index_map(self, out_idx):
        return [(out_idx, out_idx)]

    def combine(self, acc, partial):
        return acc + partial

    def backward_block(self, d_out_block, a_block, b_block):
        return (d_out_block, -d_out_block)

    def output_shape(self, a_shape, b_shape):
        return same_shape("sub", a_shape, b_shape)


sub = make_op(Sub, doc="Elementwise difference a - b of two disk-backed arrays of equal shape and dtype.")
