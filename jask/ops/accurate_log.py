"""logsumexp pieces whose log is corrected by one Newton step, for accelerators whose float32 log and exp are not IEEE.

On a TPU v5e (2026-12-07, ``tpu_tests/lse_probe.py``) float32 ``log`` is off by up to
~3900 ulp (6e-5 absolute near 1), ``log1p`` by ~4000 and ``logaddexp`` by ~900.
``softmax`` as ``exp(x - logsumexp(x))`` turns the log's absolute error into a relative error of every
output: 2e-5 to 7e-5 there against jax.nn.softmax's 7e-7 (which never takes a log).
A step of Newton's method on ``exp(y) = s`` moves ``y = log(s)`` by ``s * exp(-y) - 1``,
whose error is that of ``exp``. The chip's ``exp`` is off too, by 16 ulp on average and 58 at most on
[-1, 0] (``tpu_tests/fold_probe.py``), in the same direction often enough that every ``logaddexp`` fold
added it again: 32 folded blocks left logsumexp 4e-5 off (1.5e-6 on the host). The corrections
therefore use :func:`exp_poly`, an exp made of multiplies and adds (within 2 ulp wherever those
are IEEE). It costs a few dozen flops per *output* element and fold, not per input element: the
block's ``sum(exp(x - max))`` keeps the chip's exp, whose error is bounded, not accumulated.
"""
from __future__ import annotations

import functools
import math

import jax
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


_LOG2E = 1.4426950408889634
_LN2_HI = 0.693359375               # few mantissa bits: k * _LN2_HI is exact for every k used here
_LN2_LO = -2.1219444005469057e-4    # ln 2 - _LN2_HI
_TAYLOR = tuple(1.0 / math.factorial(n) for n in range(7, -1, -1))   # 1/7!, ..., 1/1!, 1/0!


def exp_poly(z):
    """float32 ``exp(z)`` from multiplies and adds: ``2**k * p(r)`` with ``z = k ln2 + r``, ``|r| <= ln2 / 2``,
    ``p`` the degree-7 Taylor polynomial (truncation below 0.1 ulp). Underflow gives 0 (no subnormals), overflow
    inf, NaN stays NaN. Within 2 ulp of float64's exp on a host (``tests/test_logsumexp_pass.py``)."""
    z = jnp.asarray(z, jnp.float32)
    zc = jnp.clip(z, -87.33654, 88.72283)
    k = jnp.floor(zc * _LOG2E + 0.5)
    r = (zc - k * _LN2_HI) - k * _LN2_LO
    p = jnp.zeros_like(r)
    for c in _TAYLOR:
        p = p * r + c
    half = jnp.floor(k * 0.5)                       # 2**k as two powers of two: k reaches 128 near the top
    out = p * _pow2(half) * _pow2(k - half)
    out = jnp.where(z > 88.72284, jnp.inf, jnp.where(z < -87.33654, 0.0, out))
    return jnp.where(jnp.isnan(z), z, out)


def _pow2(k):
    """``2.0 ** k`` for integral float32 ``k`` in [-126, 127], from its exponent bits."""
    return jax.lax.bitcast_convert_type(jnp.left_shift(k.astype(jnp.int32) + 127, 23), jnp.float32)


def refined_log(s):
    """``log(s)`` with one Newton step; ``0``, ``inf`` and NaN give ``log``'s own ``-inf``, ``inf``, NaN."""
    y = jnp.log(s)
    finite = jnp.isfinite(y)
    y0 = jnp.where(finite, y, 0)
    return jnp.where(finite, y0 + (s * exp_poly(-y0) - 1), y)


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
    return jnp.where(finite, r0 + (exp_poly(a - r0) + exp_poly(b - r0) - 1), r)
