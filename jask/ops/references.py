"""A reduction's stop-gradient reference to itself, and the reduction computed like it.

``max``, ``min`` and ``logsumexp`` take their own value, detached, as an input their gradient reads. Under
``jax.grad`` the forward keeps that reference for the backward, and computes the result too: computed with
keepdims as the reference is, the two are one application, which the planner computes once
(:mod:`jask.plan.dedup`); a result without keepdims is then a squeeze of it (a free reshape).
"""
from __future__ import annotations

from jask.hijax.array import type_of
from jask.ops import elementwise as ew


def detached(op, a, axis):
    """The reduction with keepdims, as a constant reference (no gradient of its own)."""
    return ew.stop_gradient(op(a, axis=axis, keepdims=True))


def like_its_reference(reduce, a, axes, keepdims):
    """``reduce(keepdims)`` over the normalized ``axes``, computed with keepdims and squeezed after unless
    ``keepdims``. A full reduction to a scalar is computed as asked (it runs at once, as a scalar)."""
    if keepdims or len(axes) == type_of(a).ndim:
        return reduce(keepdims)
    from jask.ops.shape import squeeze      # jask.ops.shape imports jask.ops.reductions, which imports this
    return squeeze(reduce(True), axes)
