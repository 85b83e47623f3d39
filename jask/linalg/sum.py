"""Sum: the seed's path for :func:`jask.ops.reductions.sum` (now with ``axis`` and ``keepdims``)."""
from jask.ops.reductions import Sum, sum  # noqa: A004, F401
