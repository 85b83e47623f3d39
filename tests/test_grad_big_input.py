"""The gradient of a loss with respect to a big stored input, ``sum((A @ W) ** 2)`` for A.

Its gradient ``2 (A W) W^T`` is as big as A, and never reads A: the loss pass stores
``A @ W`` (A's size / 64 here, jask/hijax/residuals.py ``keep_output``) and the backward
reads it instead of A, so A is read once. W is not differentiated, so the loss pass computes
no unit gradient for it (jask/hijax/unit_grads.py). W's own gradient needs a whole row block
of A per window when the loss pass computes it; where the row block outgrows half the budget
the product is computed in a pass of its own (jask/plan/planner.py ``_should_fuse``).
A's tiles are counted at the reader; every gradient is checked against ``jax.grad`` of the
jnp loss on the same data.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jask
from disk_data import store_arrays, tile_reads
from jask.exec import executor
from jask.hijax import unit_grads
from jask.plan.memory import SLOTS_PER_LEAF

N, K, TILE = 512, 8, 64


@pytest.fixture
def data(tmp_path):
    rng = np.random.default_rng(5)
    arrays = {"A": rng.standard_normal((N, N)), "W": rng.standard_normal((N, K)) * 0.1}
    arrays = {k: a.astype(np.float32) for k, a in arrays.items()}
    return arrays, store_arrays(tmp_path, arrays, TILE), str(tmp_path / "A.zarr")


def _loss(a, w):
    return jask.sum(jask.square(a @ w))


def _want(arrays, argnums):
    return jax.grad(lambda a, w: jnp.sum(jnp.square(a @ w)), argnums=argnums)(arrays["A"], arrays["W"])


def _check(got, want):
    """Float32 sums of 512 terms: entries near 0 are off by their terms' rounding, not their own."""
    want = np.asarray(want)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-4, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("jit", [False, True])
def test_a_big_inputs_gradient_reads_it_once(data, jit):
    arrays, d, a_path = data
    grad = jax.grad(_loss)
    grad = jax.jit(grad) if jit else grad
    got, reads = tile_reads(lambda: np.asarray(grad(d["A"], d["W"])), a_path)
    assert reads == (N // TILE) ** 2, reads / (N // TILE) ** 2     # the loss pass alone: was twice
    _check(got, _want(arrays, 0))


def test_a_constant_input_gets_no_unit_gradient(data, monkeypatch):
    """Only what ``jax.grad`` differentiates gets a unit gradient in the loss pass."""
    arrays, d, _ = data
    extras = []
    sharing = unit_grads.run_sharing_pass

    def spy(root, more):
        extras.append(len(more))
        return sharing(root, more)
    monkeypatch.setattr(unit_grads, "run_sharing_pass", spy)
    np.asarray(jax.grad(_loss)(d["A"], d["W"]))
    got_w = np.asarray(jax.grad(_loss, argnums=1)(d["A"], d["W"]))
    assert extras == [0, 1]     # A's gradient alone: none (W is constant); W's: W's
    _check(got_w, _want(arrays, 1))


def test_a_shared_loss_pass_keeps_what_the_big_gradient_needs(data):
    """A small bias b gets its gradient in the loss pass, which drops the residuals kept for small
    weights; ``A @ W``, which A's gradient needs, is kept there all the same: A is read once."""
    arrays, d, a_path = data
    b = np.random.default_rng(6).standard_normal((1, K)).astype(np.float32)
    grad = jax.grad(lambda a, b: jask.sum(jask.square(a @ d["W"] + b)), argnums=(0, 1))
    got, reads = tile_reads(lambda: [np.asarray(g) for g in grad(d["A"], jask.from_numpy(b))], a_path)
    assert reads == (N // TILE) ** 2, reads / (N // TILE) ** 2
    want = jax.grad(lambda a, b: jnp.sum(jnp.square(a @ arrays["W"] + b)), argnums=(0, 1))(arrays["A"], b)
    for g, w in zip(got, want):
        _check(g, w)


def test_both_gradients_are_right(data):
    arrays, d, _ = data
    got = jax.grad(_loss, argnums=(0, 1))(d["A"], d["W"])
    for g, w in zip(got, _want(arrays, (0, 1))):
        _check(g, w)


def test_a_row_block_over_half_the_budget_is_not_one_window(data, monkeypatch):
    """W's gradient in the loss pass: a window would hold a whole row block of A (8 tiles, ~144 KiB);
    at a budget below twice that, ``A @ W`` takes a pass of its own and no window outgrows the budget."""
    arrays, d, _ = data
    jask.set_memory_budget(256 * 1024)
    inputs = []
    spread = executor.spread

    def spy(*args, **kwargs):
        out = spread(*args, **kwargs)
        inputs.extend(sum(executor.region_bytes(store, reg) for _, (store, reg) in w.reads) for _, w in out)
        return out
    monkeypatch.setattr(executor, "spread", spy)
    got = np.asarray(jax.grad(_loss, argnums=1)(d["A"], d["W"]))
    assert SLOTS_PER_LEAF * max(inputs) <= 256 * 1024, max(inputs)
    _check(got, _want(arrays, 1))
