"""Sum: the seed's path for :func:`jask.ops.reductions.sum` (now with ``axis`` and ``keepdims``).

``jask.sum`` keeps the seed's rule and takes DiskArrays only (an in-memory array is refused by name);
``jask.numpy.sum`` hands one that is not a DiskArray to ``jnp.sum``.
"""
from jask.ops.reductions import Sum, sum as _numpy_sum  # noqa: F401

sum = _numpy_sum.__wrapped__  # noqa: A001 - the seed's name
