"""Op contracts and the machinery that makes ops work under jit and grad."""
from jask.base.op import BlockParallelOp, CustomOp, TiledInput

__all__ = ["BlockParallelOp", "CustomOp", "TiledInput"]
