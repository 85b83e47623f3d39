"""Elementwise square."""
from jask.graph.op import BlockParallelOp
from jask.hijax.make_op import make_op


class Square(BlockParallelOp):
    """a * a elementwise."""

    def forward_block(self, a_block):
        return a_block * a_block

    def index_map(self, out_idx):
        return [(out_idx,)]

    def combine(self, acc, partial):
        return acc + partial

    def backward_block(self, d_out_block, a_block):
        return (2 * a_block * d_out_block,)

    def output_shape(self, a_shape):
        return a_shape


square = make_op(Square, doc="Elementwise square of a disk-backed array.")
