"""Gradients as lazy ops: the backward node of each op input is itself a tiled op.

For a :class:`~jask.graph.op.BlockParallelOp`, :class:`GradOp` inverts the
forward ``index_map`` for one input (tabulated on the host once per tiling)
and runs the forward op's ``backward_block`` per entry; contributions to one
input tile are folded by ``combine`` inside the tile loop, never by
read-modify-write on disk. :class:`CustomGradOp` runs a CustomOp's ``backward``.
"""
from __future__ import annotations

from collections import defaultdict

import jax
import numpy as np

from jask.graph.nodes import OpNode, OpSpec
from jask.graph.op import BlockParallelOp, CustomOp
from jask.hijax import compat
from jask.hijax.contract_checks import check_gradients


def gradient_node(spec: OpSpec, wrt: int, nodes) -> OpNode:
    """The lazy gradient of input ``wrt`` of the op application ``spec(*nodes[1:])`` for cotangent ``nodes[0]``."""
    grad_cls = CustomGradOp if issubclass(spec.cls, CustomOp) else GradOp
    return OpNode(OpSpec(grad_cls, (("forward", spec), ("wrt", wrt)), name=f"grad[{spec.name}]"),
                  nodes, nodes[1 + wrt].shape, nodes[1 + wrt].dtype)


def cotangent_sum_node(a, b) -> OpNode:
    """The lazy sum of two cotangents of one value."""
    return OpNode(OpSpec(CotangentSum, name="add"), (a, b), a.shape, a.dtype)


class CotangentSum(BlockParallelOp):
    """Two cotangents of one value summed: JAX's tangent sum (``DiskArrayType.vspace_add``) and the walk of
    :mod:`jask.hijax.unit_grads`. ``jask.add``'s five methods again, as a class of its own: the walk must tell
    such a sum from a user's, and this layer may not import the ops (``jask/linalg/add.py`` stays the seed's
    example)."""

    def forward_block(self, a_block, b_block):
        return a_block + b_block

    def index_map(self, out_idx):
        return [(out_idx, out_idx)]

    def combine(self, acc, partial):
        return acc + partial

    def backward_block(self, d_out_block, a_block, b_block):
        return (d_out_block, d_out_block)

    def output_shape(self, a_shape, b_shape):
        return a_shape


class GradOp(BlockParallelOp):
    """Gradient of a forward op with respect to input ``wrt``, itself a block-parallel op.

    Inputs are ``(d_out, *forward_inputs)``. ``index_map`` is the forward map
    inverted for input ``wrt`` (tabulated once per tiling); each entry carries
    the output tile and the forward entry that read this input tile.
    """

    def __init__(self, forward_op, wrt, table, unused_inputs=frozenset()):
        self.forward_op, self.wrt, self.table = forward_op, wrt, table
        self.unused_inputs = unused_inputs

    @classmethod
    def from_inputs(cls, d_out, *inputs, forward, wrt):
        op = forward.build(list(inputs))
        table = defaultdict(list)
        out_grid = d_out.grid
        for out_idx in np.ndindex(*out_grid):
            for entry in op.index_map(out_idx):
                blocks = tuple(tuple(int(i) for i in b) for b in entry)
                table[blocks[wrt]].append((tuple(out_idx), *blocks))
        specs = [jax.ShapeDtypeStruct(t.block_shape, t.dtype) for t in (d_out, *inputs)]
        unused = compat.unused_arguments(lambda d, *xs: _gradients(op, d, xs)[wrt], specs)
        return cls(op, wrt, dict(table), unused)

    def forward_block(self, d_out_block, *input_blocks):
        grads = _gradients(self.forward_op, d_out_block, input_blocks)
        return grads[self.wrt].astype(input_blocks[self.wrt].dtype)

    def index_map(self, in_idx):
        return self.table.get(tuple(in_idx), [])

    def combine(self, acc, partial):
        return acc + partial

    def backward_block(self, d_out_block, *input_blocks):
        raise NotImplementedError("second-order gradients are not supported")

    def output_shape(self, d_shape, *input_shapes):
        return input_shapes[self.wrt]

    def output_dtype(self, *dtypes):
        return dtypes[1 + self.wrt]


def _gradients(op, d_out_block, input_blocks):
    """``op.backward_block``'s gradients, checked against the contract (one per input, of its block's shape)."""
    grads = op.backward_block(d_out_block, *input_blocks)
    check_gradients(type(op).__name__, grads, input_blocks)
    return grads


class CustomGradOp(CustomOp):
    """Gradient of a CustomOp for input ``wrt``: runs its ``backward`` and keeps that input's tiles."""

    def __init__(self, forward_op, wrt):
        self.forward_op, self.wrt = forward_op, wrt

    @classmethod
    def from_inputs(cls, d_out, *inputs, forward, wrt):
        return cls(forward.build(list(inputs)), wrt)

    def forward(self, algo, d_out, *inputs):
        self.forward_op.backward(_OneGradient(algo, self.wrt), inputs, d_out)

    def output_shape(self, d_shape, *input_shapes):
        return input_shapes[self.wrt]

    def output_dtype(self, *dtypes):
        return dtypes[1 + self.wrt]


class _OneGradient:
    """The algo a CustomOp's ``backward`` sees: ``write(idx, block, wrt=i)`` keeps only input ``wrt``."""

    def __init__(self, algo, wrt):
        self._algo, self._wrt = algo, wrt

    def __getattr__(self, name):
        return getattr(self._algo, name)

    def write(self, idx, block, wrt=0):
        if wrt == self._wrt:
            self._algo.write(idx, block)
