"""logsumexp pieces whose log is corrected by one Newton step, for accelerators whose float32 log is not IEEE.

On a TPU v5e (2026-12-07, ``tpu_tests/lse_probe.py``) float32 ``log`` is off by up to
~3900 ulp (6e-5 absolute near 1), ``log1p`` by ~4000 and ``logaddexp`` by ~900, while
``exp`` of arguments at or below 0 stays within a few ulp. ``softmax`` as
``exp(x - logsumexp(x))`` turns the log's absolute error into a relative error of every
output: 2e-5 to 7e-5 there against jax.nn.softmax's 7e-7 (which never takes a log).
A step of Newton's method on ``exp(y) = s`` moves ``y = log(s)`` by ``s * exp(-y) - 1``,
whose error is that of ``exp``: the refined logsumexp is as good as the chip's exp. On
IEEE hosts the step is below an ulp. It costs one ``exp`` per *output* element, not per
input element: the block's ``max`` and ``sum(exp(x - max))`` are computed as before.
"""
from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np


def _in_float32(fn):
    """``fn`` computed in float32 for float16/bfloat16 inputs, cast back: as jask's logsumexp computes them, and
    Mosaic TPU's ``isfinite`` takes float32 only (the lowering gate's ``nn_logsumexp_axis`` bfloat16 case)."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        dtype = np.result_type(*[a.dtype for a in args])
        if not (jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4):
            return fn(*args, **kwargs)
        return fn(*[a.astype(jnp.float32) for a in args], **kwargs).astype(dtype)
    return wrapped


def refined_log(s):
    """``log(s)`` with one Newton step; ``0``, ``inf`` and NaN give ``log``'s own ``-inf``, ``inf``, NaN."""
    y = jnp.log(s)
    finite = jnp.isfinite(y)
    y0 = jnp.where(finite, y, 0)
    return jnp.where(finite, y0 + (s * jnp.exp(-y0) - 1), y)


@_in_float32
def block_logsumexp(x, axis=None, keepdims=False):
    """``jax.nn.logsumexp(x, axis, keepdims=keepdims)`` with its log refined (same dtype and special values:
    a slice of ``-inf`` gives ``-inf``, a ``+inf`` gives ``inf``, NaN propagates)."""
    m = jnp.max(x, axis=axis, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0)
    out = refined_log(jnp.sum(jnp.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else jnp.squeeze(out, axis=axis)


@_in_float32
def logaddexp(a, b):
    """``jnp.logaddexp(a, b)`` refined: ``r`` moves by ``exp(a - r) + exp(b - r) - 1`` where it is finite."""
    r = jnp.logaddexp(a, b)
    finite = jnp.isfinite(r)
    r0 = jnp.where(finite, r, 0)
    return jnp.where(finite, r0 + (jnp.exp(a - r0) + jnp.exp(b - r0) - 1), r)
