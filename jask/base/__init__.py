"""The op contract under the names the guide for adding an op uses (``from jask.base import BlockParallelOp``).

The code lives in :mod:`jask.graph.op`; ``make_op`` in :mod:`jask.hijax.make_op`
(also importable as ``jask.base.base_algo.make_op``).
"""
from jask.graph.op import BlockParallelOp, CustomOp, TiledInput

__all__ = ["BlockParallelOp", "CustomOp", "TiledInput"]
