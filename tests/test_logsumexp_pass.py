"""logsumexp in one pass, softmax in two; reduction windows that never straddle two output tiles; explain's
projected peak is the largest window's (what a pass holds), not one tile's."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jask
import jask.nn
from jask.exec import driver
from jask.exec.schedule import windows


HOST = jax.devices("cpu")[0]


def _host(fn, *args, **kwargs):
    """jax's reference computed on the host CPU (IEEE arithmetic), whatever device jask computes on: a TPU's
    float32 log is off by up to ~4000 ulp (jask/ops/accurate_log.py), and jax.nn's log_softmax with it."""
    with jax.default_device(HOST):
        return np.asarray(fn(*[jnp.asarray(a) for a in args], **kwargs))


def _arr(shape, seed=0, scale=4.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("axis, keepdims", [(0, False), (1, True), (None, False), ((0, 1), True)])
def test_logsumexp_reads_its_input_once(small_tiles, axis, keepdims):
    """Each block's logsumexp folded by logaddexp: one pass (a max pass and a sum pass read it twice)."""
    x = _arr((18, 13))
    a = jask.from_numpy(x)
    jask.set_memory_budget(4096)                    # windows of a few tiles: the whole input fits no window
    with jask.profile() as p:
        got = np.asarray(jask.nn.logsumexp(a, axis=axis, keepdims=keepdims))
    assert p.bytes_read == x.nbytes
    np.testing.assert_allclose(got, _host(jax.nn.logsumexp, x, axis=axis, keepdims=keepdims), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis", [0, 1])
def test_softmax_reads_its_input_twice(small_tiles, axis):
    """The logsumexp pass, then exp(x - it) written: two passes over x (it was three), plus the small result."""
    x = _arr((128, 8), 1)
    a = jask.from_numpy(x)
    jask.set_memory_budget(2048)
    with jask.profile() as p:
        got = jask.persist(jask.nn.softmax(a, axis=axis))
    assert 2 * x.nbytes <= p.bytes_read <= 2 * x.nbytes + x.nbytes // 2
    np.testing.assert_allclose(np.asarray(got), _host(jax.nn.softmax, x, axis=axis), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(jask.nn.log_softmax(a, axis=axis)), _host(jax.nn.log_softmax, x, axis=axis),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_logsumexp_at_infinities_and_in_other_dtypes(small_tiles):
    """All -inf slices give -inf, +inf gives inf, NaN propagates (as jax.nn.logsumexp); float16 and bfloat16
    keep their dtype (computed in float32), integers give float32."""
    x = _arr((9, 10), 2)
    x[0, :] = -np.inf
    x[1, 3] = np.inf
    x[2, 7] = np.nan
    x[5:, 0] = -np.inf
    for axis in (0, 1):
        np.testing.assert_allclose(np.asarray(jask.nn.logsumexp(jask.from_numpy(x), axis=axis)),
                                   _host(jax.nn.logsumexp, x, axis=axis), rtol=1e-5, atol=1e-5)
    for dtype, tol in ((np.float16, 2e-3), (jnp.bfloat16, 2e-2), (np.int32, 1e-5)):
        z = _arr((9, 10), 3).astype(dtype)
        got = jask.nn.logsumexp(jask.from_numpy(z), axis=0)
        want = _host(jax.nn.logsumexp, z, axis=0)
        assert got.dtype == want.dtype
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=tol, atol=tol)


@pytest.mark.parametrize("axis", [0, 1, None])
def test_gradients_match_jax(small_tiles, axis):
    x, w = _arr((10, 9), 4), _arr((10, 9), 5, 1.0)
    a, wa = jask.from_numpy(x), jask.from_numpy(w)
    lse_w = w.sum(axis=axis) if axis is not None else 1.0
    got = jax.grad(lambda v: jask.sum(jask.nn.logsumexp(v, axis=axis) * jask.from_numpy(np.asarray(lse_w))))(a) \
        if axis is not None else jax.grad(lambda v: jask.nn.logsumexp(v))(a)
    want = _host(jax.grad(lambda v: jnp.sum(jax.nn.logsumexp(v, axis=axis) * lse_w)), x)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-6)
    if axis is not None:
        got = jax.jit(jax.grad(lambda v: jask.sum(jask.nn.softmax(v, axis=axis) * wa)))(a)
        want = _host(jax.grad(lambda v: jnp.sum(jax.nn.softmax(v, axis=axis) * w)), x)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-6)


def _windows_of(node, limit):
    p = driver.make_plan([node])
    (group,) = p.groups
    indices = list(np.ndindex(*[len(range(0, d, p.tile)) for d in group[0].shape]))
    return list(windows(p, group, indices, limit, batch_bytes=1 << 30))


def test_reduction_windows_never_straddle_two_output_tiles(small_tiles):
    """A window holds one tile's run of entries or whole tiles: straddling windows have distinct index
    tables, each compiling a program of its own (a softmax at budget 32MB compiled 41 programs, now 8, and
    held ~100 MiB more RSS in a fresh process)."""
    a = jask.from_numpy(_arr((32, 12), 6))          # tile 4: 8 entries for each of the 3 output tiles
    node = a.sum(axis=0)._node
    tables = set()
    for limit in range(1500, 6000, 250):            # from ~2 entries per window to two whole tiles
        for w in _windows_of(node, limit):
            per_tile = [(t, int(c.valid[i].sum())) for c in w.calls for i, t in enumerate(c.tiles)]
            assert len(per_tile) == 1 or all(n == 8 for _, n in per_tile), (limit, per_tile)
            if limit == 2250:
                tables |= {(c.table.tobytes(), c.valid.tobytes()) for c in w.calls}
    assert len(tables) == 2                         # 3 + 3 + 2 entries: two programs


def test_explain_projects_the_largest_window(small_tiles):
    """Windows grow to their limit: the pass holds the largest window's projected bytes, more than the plan's
    projection of one tile, and explain reports that."""
    x = _arr((256, 8), 7)
    a = jask.from_numpy(x)
    jask.set_memory_budget(16 << 10)
    s = a.sum(axis=0)
    p = driver.make_plan([s._node])
    largest = max(w.projected for w in _windows_of(s._node, driver.window_limit(p)))
    assert largest > 2 * p.projected_bytes
    text = jask.explain(s)
    assert re.search(rf"projected peak {largest / 1024:.1f} KiB", text), text
    assert re.search(rf"\d+ windows of at most {largest / 1024:.1f} KiB", text), text
    np.testing.assert_allclose(np.asarray(s), x.sum(axis=0), rtol=1e-5)


class _ChipLikeLog:
    """jax.numpy with log and logaddexp off by up to 6e-5 absolute, as a TPU v5e's float32 ones are."""

    def __getattr__(self, name):
        return getattr(jnp, name)

    @staticmethod
    def log(s):
        return jnp.log(s) + 6e-5 * jnp.cos(7.0 * s)

    @staticmethod
    def logaddexp(a, b):
        return jnp.logaddexp(a, b) - 5e-5 * jnp.sin(3.0 * a)


def test_refined_logs_undo_an_inexact_log(monkeypatch):
    """One Newton step makes logsumexp and its logaddexp fold as exact as exp, though the log is off by 6e-5:
    softmax as exp(x - logsumexp) would turn that into 6e-5 relative errors (jask/ops/accurate_log.py).
    Special values stay jax's."""
    from jask.ops import accurate_log
    special = jnp.asarray([[-np.inf, np.inf, np.nan, -np.inf, 1.0], [-np.inf, 1.0, 1.0, 2.0, np.inf]], jnp.float32)
    np.testing.assert_array_equal(np.asarray(accurate_log.block_logsumexp(special, axis=0)),
                                  np.asarray(jax.nn.logsumexp(special, axis=0)))
    np.testing.assert_array_equal(np.asarray(accurate_log.logaddexp(special[0], special[1])),
                                  np.asarray(jnp.logaddexp(special[0], special[1])))
    monkeypatch.setattr(accurate_log, "jnp", _ChipLikeLog())
    x = _arr((64, 24), 8).astype(np.float64)
    lse = np.log(np.exp(x - x.max(0)).sum(0)) + x.max(0)
    assert np.abs(np.asarray(_ChipLikeLog.log(jnp.asarray(np.exp(x[0]), jnp.float32))) - x[0]).max() > 3e-5
    got = np.asarray(accurate_log.block_logsumexp(jnp.asarray(x, jnp.float32), axis=0))
    np.testing.assert_allclose(got, lse, rtol=1e-6)
    halves = [accurate_log.block_logsumexp(jnp.asarray(x[s], jnp.float32), axis=0) for s in (slice(0, 40), slice(40, None))]
    np.testing.assert_allclose(np.asarray(accurate_log.logaddexp(*halves)), lse, rtol=1e-6)


def test_exp_poly_is_within_an_ulp_or_two():
    from jask.ops import accurate_log
    for lo, hi in ((-87.3, 88.7), (-1.0, 0.0), (-1e-3, 1e-3)):
        v = np.linspace(lo, hi, 1 << 18, dtype=np.float32)
        want = np.exp(v.astype(np.float64))
        ulp = np.spacing(want.astype(np.float32)).astype(np.float64)
        assert (np.abs(np.asarray(jax.jit(accurate_log.exp_poly)(v), np.float64) - want) / ulp).max() < 2.0
    special = np.asarray(accurate_log.exp_poly(jnp.asarray([np.nan, np.inf, -np.inf, 89.0, -88.0, 0.0], jnp.float32)))
    np.testing.assert_array_equal(special, [np.nan, np.inf, 0.0, np.inf, 0.0, 1.0])


class _ChipLikeExp(_ChipLikeLog):
    """jax.numpy with exp 1.5e-6 (25 ulp) high, as a TPU v5e's is on average near 0 (tpu_tests/fold_probe.py)."""

    @staticmethod
    def exp(x):
        return jnp.exp(x) * np.float32(1 + 1.5e-6)


def test_folds_do_not_add_up_an_inexact_exp(monkeypatch):
    """32 blocks folded one by one, as a logsumexp over 32 tiles is: each fold's correction used the chip's exp,
    and its error came back at every fold (4e-5 off on a TPU v5e, 1.5e-6 on a host). exp_poly's does not."""
    from jask.ops import accurate_log
    monkeypatch.setattr(accurate_log, "jnp", _ChipLikeExp())
    x = _arr((128, 8), 1).astype(np.float64)
    lse = np.log(np.exp(x - x.max(0)).sum(0)) + x.max(0)
    blocks = [accurate_log.block_logsumexp(jnp.asarray(x[i:i + 4], jnp.float32), axis=0) for i in range(0, 128, 4)]
    acc = blocks[0]
    for b in blocks[1:]:
        acc = accurate_log.logaddexp(acc, b)
    assert np.abs(np.asarray(acc, np.float64) - lse).max() < 6e-6
