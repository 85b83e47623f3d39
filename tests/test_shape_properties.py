"""Property tests for the shape ops: random shapes, tilings and arguments against NumPy, values and gradients.

Each example draws an array (rank 1-3, dims from {1, 2, 3, 5, 7, 8, 11, 13}: ragged against every tile), a
forced tile edge from {1, 2, 3, 4, 8}, a mode (eager or under ``jax.jit``) and one shape op with random
arguments: ``reshape`` to a random factorization (tile by tile or rechunking), ``transpose`` by a random
permutation, ``concatenate`` with a second array along a random axis, basic indexing (slices with random
start/stop/step, negative steps, ints, ``None``), an integer-array or boolean index along a random axis, and
``broadcast_to`` a random broadcast-compatible shape. The ops move data only, so the value must equal
NumPy's exactly, and the gradient of ``sum(op(x) * W)`` must equal NumPy's scatter of ``W`` back (sums of
repeated indices within float32 rounding). The ``xla`` backend runs every op; ``pallas-interpret`` a few.
Profiles are tests/conftest.py's (``ci``: 8 xla and 2 pallas-interpret examples, the same every run;
``long``: 10x, new ones each run).
"""
from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st

import jask
import jask.numpy as knp

DIMS = (1, 2, 3, 5, 7, 8, 11, 13)
TILES = (1, 2, 3, 4, 8)
EXAMPLES = max(8, settings().max_examples * 4 // 25)     # ci: 8 (each compiles its kernels: ~3 s); long: 80


def _factorizations(n, rank):
    """Every way to write ``n`` as an ordered product of ``rank`` positive factors."""
    if rank == 1:
        return [(n,)]
    return [(d,) + rest for d in range(1, n + 1) if n % d == 0 for rest in _factorizations(n // d, rank - 1)]


@st.composite
def arrays(draw, max_rank=3):
    shape = tuple(draw(st.lists(st.sampled_from(DIMS), min_size=1, max_size=max_rank)))
    seed = draw(st.integers(0, 2**16))
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@st.composite
def cases(draw):
    """``(x, fn, extra arrays)``: ``fn(x, *extra)`` works alike on jask.numpy and NumPy (``xp`` passed in)."""
    x = draw(arrays())
    kind = draw(st.sampled_from(["reshape", "transpose", "concatenate", "slice", "take", "mask", "broadcast"]))
    nd = x.ndim
    if kind == "reshape":
        shape = draw(st.sampled_from(_factorizations(x.size, draw(st.integers(1, 3)))))
        return kind, x, (lambda xp, a: xp.reshape(a, shape)), ()
    if kind == "transpose":
        perm = tuple(draw(st.permutations(range(nd))))
        return kind, x, (lambda xp, a: xp.transpose(a, perm)), ()
    if kind == "concatenate":
        axis = draw(st.integers(0, nd - 1))
        other_shape = list(x.shape)
        other_shape[axis] = draw(st.sampled_from(DIMS))
        other = np.random.default_rng(1).standard_normal(other_shape).astype(np.float32)
        return kind, x, (lambda xp, a, b: xp.concatenate([b, a, b], axis=axis)), (other,)
    if kind == "slice":
        key = []
        for n in x.shape:
            if draw(st.booleans()) and n > 1:
                key.append(draw(st.integers(-n, n - 1)))
            else:
                start, stop = draw(st.integers(-n - 1, n + 1)), draw(st.integers(-n - 1, n + 1))
                key.append(slice(start, stop, draw(st.sampled_from([1, 2, 3, -1, -2]))))
        if draw(st.booleans()):
            key.insert(draw(st.integers(0, len(key))), None)
        key = tuple(key)
        assume_nonscalar = any(isinstance(k, slice) or k is None for k in key)
        if not assume_nonscalar:
            key = key[:-1] + (slice(None),)
        return kind, x, (lambda xp, a: a[key]), ()
    axis = draw(st.integers(0, nd - 1))
    n = x.shape[axis]
    if kind == "take":
        idx = np.array(draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=12)))
        key = (slice(None),) * axis + (idx,)
        return kind, x, (lambda xp, a: a[key]), ()
    if kind == "mask":
        mask = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
        key = (slice(None),) * axis + (mask,)
        return kind, x, (lambda xp, a: a[key]), ()
    lead = tuple(draw(st.lists(st.sampled_from(DIMS), max_size=2)))
    target = lead + tuple(d if d != 1 else draw(st.sampled_from(DIMS)) for d in x.shape)
    return kind, x, (lambda xp, a: xp.broadcast_to(a, target)), ()


# Tile edge 1 only for arrays of at most this many elements: every element is a tile, each regrouping entry
# traces and compiles a program of its own, and a reshape of (13, 11, 2) took 63 s of the suite's time alone
MAX_ELEMENTS_AT_TILE_1 = 32


def _check(case, tile, mode, backend):
    kind, x, fn, extra = case
    assume(tile > 1 or x.size <= MAX_ELEMENTS_AT_TILE_1)
    jask.config.update("tile", tile)
    jask.config.update("backend", backend)
    note(f"{kind} of {x.shape}, tile {tile}, {mode}, {backend}")
    want = fn(np, x, *extra)
    if want.size == 0:
        return                                     # empty results: tests/test_empty.py
    wrap = jax.jit if mode == "jit" else (lambda f: f)
    args = [jask.from_numpy(a) for a in (x,) + extra]
    got = wrap(lambda *a: fn(knp, *a))(*args)
    assert isinstance(got, jask.DiskArray) and got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(got), want)
    W = np.random.default_rng(2).standard_normal(want.shape).astype(np.float32)
    w = jask.from_numpy(W)
    grad = wrap(jax.grad(lambda a: knp.sum(fn(knp, a, *args[1:]) * w)))(args[0])
    ref = jax.grad(lambda a: jax.numpy.sum(fn(jax.numpy, a, *extra) * W))(x)
    np.testing.assert_allclose(np.asarray(grad), ref, rtol=1e-6, atol=1e-6 * math.sqrt(want.size))


MODES = st.sampled_from(["eager", "jit"])


@pytest.mark.slow
@settings(max_examples=EXAMPLES)
@given(case=cases(), tile=st.sampled_from(TILES), mode=MODES)
def test_shape_ops_xla(case, tile, mode):
    _check(case, tile, mode, "xla")


@pytest.mark.slow
@settings(max_examples=max(2, EXAMPLES // 4))
@given(case=cases(), tile=st.sampled_from((2, 4)), mode=MODES)
def test_shape_ops_pallas_interpret(case, tile, mode):
    _check(case, tile, mode, "pallas-interpret")
