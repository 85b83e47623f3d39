"""Matrix product with ``@`` semantics: 2-D, batched N-D (broadcast batch dims) and vectors."""
import jax
import jax.numpy as jnp

from jask.graph.op import BlockParallelOp
from jask.hijax.make_op import make_op


def matmul_shape(a_shape, b_shape):
    """Output shape of ``a @ b`` (NumPy rules), with an error naming both shapes."""
    if not a_shape or not b_shape:
        raise ValueError(f"dot needs arrays of at least 1 dimension, got shapes {a_shape}, {b_shape}")
    k_a = a_shape[-1]
    k_b = b_shape[0] if len(b_shape) == 1 else b_shape[-2]
    if k_a != k_b:
        raise ValueError(f"dot got incompatible shapes {a_shape}, {b_shape}: "
                         f"contraction sizes {k_a} and {k_b} differ")
    batch_a, batch_b = a_shape[:-2], b_shape[:-2]
    n = max(len(batch_a), len(batch_b))
    pa, pb = (1,) * (n - len(batch_a)) + batch_a, (1,) * (n - len(batch_b)) + batch_b
    batch = []
    for x, y in zip(pa, pb):
        if x != y and 1 not in (x, y):
            raise ValueError(f"dot got incompatible batch dimensions in shapes {a_shape}, {b_shape}")
        batch.append(max(x, y))
    rows = (a_shape[-2],) if len(a_shape) >= 2 else ()
    cols = (b_shape[-1],) if len(b_shape) >= 2 else ()
    return tuple(batch) + rows + cols


class Dot(BlockParallelOp):
    """``a @ b``: output tile (batch..., i, j) sums the products over the K contraction blocks."""

    empty_value = 0     # a contraction over an empty axis is all zeros, as in jnp

    def __init__(self, a_shape=(), b_shape=(), k_blocks=1):
        self.a_shape, self.b_shape, self.k_blocks = a_shape, b_shape, k_blocks

    @classmethod
    def from_inputs(cls, a, b):
        return cls(a.shape, b.shape, a.grid[-1] if a.ndim else 1)

    def forward_block(self, a_block, b_block):
        return jnp.matmul(a_block, b_block)

    def index_map(self, out_idx):
        out_idx = tuple(out_idx)
        a_nd, b_nd = len(self.a_shape), len(self.b_shape)
        n_batch = len(out_idx) - (a_nd >= 2) - (b_nd >= 2)
        batch, rest = out_idx[:n_batch], out_idx[n_batch:]
        i = rest[0] if a_nd >= 2 else None
        j = rest[-1] if b_nd >= 2 else None

        def batch_of(shape):
            own = shape[:-2]
            mine = batch[n_batch - len(own):] if own else ()
            return tuple(0 if d == 1 else t for d, t in zip(own, mine))

        entries = []
        for k in range(self.k_blocks):
            a_idx = batch_of(self.a_shape) + ((i, k) if a_nd >= 2 else (k,))
            b_idx = batch_of(self.b_shape) + ((k, j) if b_nd >= 2 else (k,))
            entries.append((a_idx, b_idx))
        return entries

    def combine(self, acc, partial):
        return acc + partial

    def backward_block(self, d_out_block, a_block, b_block):
        _, vjp = jax.vjp(jnp.matmul, a_block, b_block)
        return vjp(d_out_block.astype(a_block.dtype))

    def output_shape(self, a_shape, b_shape):
        return matmul_shape(a_shape, b_shape)


dot = make_op(Dot, doc="Matrix product ``a @ b`` of disk-backed arrays (NumPy matmul semantics).")
