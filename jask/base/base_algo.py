"""``make_op`` under the path the guide for adding an op uses; it lives in :mod:`jask.hijax.make_op`.

The architecture notes the guide points to are that module's docstring (values as int32 handles under
``jit``, lazy ops, gradients as lazy ``GradOp`` nodes, lifetimes). Two routes the guide describes
otherwise: a traced 0-d operand (``a * scalar``) needs no hand-written primitive any more: a
``BlockParallelOp`` with ``scalar_operands = True`` takes 0-d JAX values as inputs and gets their
gradients (a reduction over every tile) from ``make_op`` (``jask/linalg/mul.py`` is built so); and a
``CustomOp``'s gradients are lazy DiskArrays like any op's (its output has at least one axis, and one output).
"""
from jask.hijax.make_op import make_op

__all__ = ["make_op"]
