"""How often a gradient reads X: once with the small weights' gradients in the loss pass
(jask/hijax/unit_grads.py), twice with small residuals stored by the loss pass (jask/hijax/residuals.py).

``jit(grad)`` of ``sum((X @ W1 @ W2 - Y) ** 2) / N``: by default the loss pass
also computes W1's and W2's gradients for a unit cotangent, and the backward
scales them: X is read once. Without that (``one_pass`` off below, as in a
multi-process run), the loss pass reads X once and stores ``H = X @ W1`` (X's
size / 8 here) and the other small intermediates; the backward pass reads X
once more (W1's gradient) and H instead of X for W2's. Before residuals were
kept, X was read three times. X tiles are counted at the reader
(``before_tile_read``), so the count cannot drift with timing. Gradients are
checked against ``jax.grad`` of the same jnp loss.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jask
from disk_data import store_arrays, tile_reads
from jask.hijax import residuals, unit_grads

N, F, H = 512, 64, 8
TILE = 64


@pytest.fixture
def data(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {"X": rng.standard_normal((N, F)), "Y": rng.standard_normal((N, 1)),
              "W1": rng.standard_normal((F, H)) * 0.1, "W2": rng.standard_normal((H, 1)) * 0.1}
    arrays = {k: v.astype(np.float32) for k, v in arrays.items()}
    return arrays, store_arrays(tmp_path, arrays, TILE), str(tmp_path / "X.zarr")


def _loss(W1, W2, X, Y):
    return jask.sum(jask.square(X @ W1 @ W2 - Y)) / X.shape[0]


def _reference(arrays):
    def loss(W1, W2):
        return jnp.sum(jnp.square(arrays["X"] @ W1 @ W2 - arrays["Y"])) / N
    return jax.value_and_grad(loss, argnums=(0, 1))(arrays["W1"], arrays["W2"])


def _one_pass_off(monkeypatch):
    """No stored input counts as small: the loss pass computes no unit gradient."""
    monkeypatch.setattr(unit_grads, "SMALL_SHARE", float("inf"))


@pytest.mark.parametrize("mode,passes", [("one_pass", 1), ("kept", 2), ("recomputed", 3)])
def test_how_often_a_two_layer_gradient_reads_x(data, mode, passes, monkeypatch):
    arrays, d, x_path = data
    if mode != "one_pass":
        _one_pass_off(monkeypatch)
    if mode == "recomputed":
        monkeypatch.setattr(residuals, "KEEP_RATIO", float("inf"))
    step = jax.jit(jax.value_and_grad(_loss, argnums=(0, 1)))

    def run():
        loss, (g1, g2) = step(d["W1"], d["W2"], d["X"], d["Y"])
        return float(loss), np.asarray(g1), np.asarray(g2)

    (loss, g1, g2), reads = tile_reads(run, x_path)
    x_tiles = (N // TILE) * (F // TILE)
    assert reads == passes * x_tiles, reads / x_tiles
    want_loss, (want_g1, want_g2) = _reference(arrays)
    np.testing.assert_allclose(loss, float(want_loss), rtol=1e-5)
    np.testing.assert_allclose(g1, np.asarray(want_g1), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(g2, np.asarray(want_g2), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("mode,passes", [("one_pass", 1), ("kept", 2)])
def test_eager_gradients_read_x_as_often(data, mode, passes, monkeypatch):
    arrays, d, x_path = data
    if mode != "one_pass":
        _one_pass_off(monkeypatch)
    grad = jax.grad(_loss, argnums=(0, 1))
    (g1, g2), reads = tile_reads(lambda: [np.asarray(g) for g in grad(d["W1"], d["W2"], d["X"], d["Y"])], x_path)
    assert reads == passes * (N // TILE) * (F // TILE)
    _, (want_g1, want_g2) = _reference(arrays)
    np.testing.assert_allclose(g1, np.asarray(want_g1), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(g2, np.asarray(want_g2), rtol=1e-4, atol=1e-6)


def test_which_residuals_are_worth_keeping(data):
    _, d, _ = data
    h = d["X"] @ d["W1"]                     # X's size / 8: recomputing it reads 8x its bytes and more
    diff = d["X"] - d["X"] * 2.0             # as big as what it is computed from
    assert residuals.worth_keeping(h._node)
    assert not residuals.worth_keeping(diff._node)
    assert not residuals.worth_keeping(d["X"]._node)        # stored already
    assert residuals.recompute_bytes(h._node) == (N * F + F * H) * 4


@pytest.mark.parametrize("mode,passes", [("one_pass", 1), ("kept", 2)])
def test_a_one_layer_gradient_keeps_nothing(data, mode, passes, monkeypatch):
    """``sum((X @ w - y) ** 2)``: the loss pass stores no residual (the backward pass would recompute
    ``X @ w`` inside its one read of X, and storing it only cost time); with w's gradient in the loss
    pass X is read once, else twice."""
    arrays, d, x_path = data
    if mode != "one_pass":
        _one_pass_off(monkeypatch)
    w = jask.from_numpy(arrays["W1"][:, :1])
    step = jax.jit(jax.value_and_grad(lambda w, X, Y: jask.sum(jask.square(X @ w - Y)) / X.shape[0]))
    with jask.profile() as stats:
        (loss, g), reads = tile_reads(lambda: (lambda out: (float(out[0]), np.asarray(out[1])))(
            step(w, d["X"], d["Y"])), x_path)
    assert stats.arrays_written == 0 and stats.bytes_written <= F * 4    # at most w's gradient, stored
    assert reads == passes * (N // TILE) * (F // TILE)
    want_loss, want_g = jax.value_and_grad(lambda w: jnp.sum(jnp.square(arrays["X"] @ w - arrays["Y"])) / N)(
        arrays["W1"][:, :1])
    np.testing.assert_allclose(loss, float(want_loss), rtol=1e-5)
    np.testing.assert_allclose(g, np.asarray(want_g), rtol=1e-4, atol=1e-6)
