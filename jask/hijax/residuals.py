"""Residuals the backward pass would recompute from big inputs are stored by the forward pass instead.

A gradient's graph reuses the forward's intermediate nodes as residuals (an
op's inputs). The forward's loss pass computes them fused, tile by tile, and
keeps none, so the backward pass recomputes each from the stored arrays below
it. For ``jit(grad)`` of ``sum((X @ W1 @ W2 - Y) ** 2)`` that reread X for
``H = X @ W1`` (needed by W2's gradient), three passes over X in all. A
residual far smaller than what recomputing it reads (H is X's size / 16 for a
hidden width of 64) is stored by the loss pass that computes it anyway
(a deferred persist: :func:`jask.exec.driver.store_with_next_run`), and the backward pass reads it
back: two passes over X. A residual about as big as its inputs (``X - Y``) is
left to be recomputed: writing and rereading it would cost more than reading
the inputs again.

Only a residual that shares its op with a smaller array input is a candidate
(H beside W2): that input's gradient reduces over the residual's tiles, which
the backward plan runs as a pass of its own, so the residual would be
recomputed there from its big inputs. Where no such reduction needs it (the
residuals of a one-layer MSE, ``X @ w - y`` and its square), the backward
pass recomputes it inside its one read of X for free, and storing it only
cost time (a 256 MiB one-layer step: 0.21 s against 0.15 s).

An op's output is a candidate too when every input it is differentiated for is its biggest array
input and bigger than the output (A of ``A @ W`` or of a row sum, W constant): such an input's
gradient maps the cotangent back through the smaller inputs (``dA = g W^T``) and never reads it,
so nothing in the backward pass reads A, and recomputing the output there would read all of A
again (``grad`` of ``sum((A @ W) ** 2)`` for a 256 MiB A: A twice, against A once and the 2 MiB
``A @ W`` written and read back). It is kept even by a loss pass that computes small weights'
gradients: A's is never one of them. A differentiated input smaller than another (``w`` of
``X @ w``) has a gradient that reduces over the bigger one (``X^T g``) and reads it anyway: the
output is then left to be recomputed there.
"""
from __future__ import annotations

import numpy as np

from jask.graph.nodes import OpNode, StoredNode
from jask.hijax.array import DiskArrayType
from jask.hijax.sinks import PersistPrimitive
from jask.plan.walk import collect, nbytes

# A residual is kept when recomputing it would read at least this many times its own bytes.
KEEP_RATIO = 4


def recompute_bytes(node) -> int:
    """Bytes of the distinct stored arrays that computing ``node`` from scratch reads."""
    pending, _ = collect([node])
    stored = {id(i): i for op in pending for i in (x.resolved() for x in op.inputs) if isinstance(i, StoredNode)}
    return sum(nbytes(i) for i in stored.values())


def worth_keeping(node) -> bool:
    """Whether ``node`` is an uncomputed intermediate far smaller than what recomputing it reads."""
    n = node.resolved()
    return (isinstance(n, OpNode) and n.shape != () and nbytes(n) > 0
            and recompute_bytes(n) >= KEEP_RATIO * nbytes(n))


def _size(aval) -> int:
    return int(np.prod(aval.shape, dtype=np.int64))


def keep_output(out, in_avals, out_aval, nzs) -> object:
    """``out``, stored by the next run when :func:`worth_keeping`, if every input its op is differentiated
    for is its biggest array input and bigger than ``out`` (the module docstring: their gradients never
    read them, so the backward would read them only to recompute ``out``)."""
    sizes = [(_size(t), bool(nz)) for t, nz in zip(in_avals, nzs) if isinstance(t, DiskArrayType)]
    wanted = [n for n, nz in sizes if nz]
    if not wanted or min(wanted) < max(n for n, _ in sizes) or min(wanted) <= _size(out_aval):
        return out
    # needed by a big stored input's gradient, which a loss pass never computes: kept by a shared loss pass too
    (kept,) = PersistPrimitive([out_aval], defer=True, only=worth_keeping, optional=walked_through)(out)
    return kept


def walked_through(node) -> bool:
    """Whether every input ``node``'s op is differentiated for is computed, not stored: a loss pass walks
    through such inputs (:mod:`jask.hijax.unit_grads`), so a pass that shares the loss computes what their
    gradients lead to, and the residual is a saving only (the logits of a softmax cross-entropy)."""
    n = node.resolved()
    if not isinstance(n, OpNode):
        return True
    skip = {*getattr(n.spec.cls, "nondiff_inputs", ()), *getattr(n, "fixed_inputs", ())}
    return not any(isinstance(inp.resolved(), StoredNode) for i, inp in enumerate(n.inputs) if i not in skip)


def keep_small_residuals(args, in_avals) -> tuple:
    """``args`` with each DiskArray that shares the op with a smaller array input (the candidates, see
    the module docstring) routed through a deferred persist that stores those :func:`worth_keeping`."""
    arrays = [i for i, t in enumerate(in_avals) if isinstance(t, DiskArrayType)]
    at = [i for i in arrays if any(_size(in_avals[j]) < _size(in_avals[i]) for j in arrays if j != i)]
    if not at:
        return tuple(args)
    kept = PersistPrimitive([in_avals[i] for i in at], defer=True, only=worth_keeping)(*[args[i] for i in at])
    out = list(args)
    for i, k in zip(at, kept):
        out[i] = k
    return tuple(out)
