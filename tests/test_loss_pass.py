"""Small weights' gradients computed in the loss's own pass over X (jask/hijax/unit_grads.py).

X tiles are counted at the reader (``before_tile_read``), so the counts cannot
drift with timing; every value is checked against ``jax`` on the same NumPy data.
Where a gradient cannot be answered from the loss pass (a big input's gradient)
it takes the ordinary lazy path, and the results must still be right; an
intermediate used twice sums its uses' unit cotangents in the pass. A weight of several tiles joins the loss pass when the loss's entry
k reads every tile that entry k of its gradient's tiles reads.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jask
import jask.numpy as knp
from disk_data import store_arrays, tile_reads
from jask.hijax import unit_grads

N, F, TILE = 512, 64, 64


@pytest.fixture
def data(tmp_path):
    rng = np.random.default_rng(3)
    arrays = {"X": rng.standard_normal((N, F)), "y": rng.standard_normal((N, 1)),
              "w": rng.standard_normal((F, 1)) * 0.1, "v": rng.standard_normal((F, 1)) * 0.1}
    arrays = {k: a.astype(np.float32) for k, a in arrays.items()}
    return arrays, store_arrays(tmp_path, arrays, TILE), str(tmp_path / "X.zarr")


def _passes_over_x(fn, x_path):
    out, reads = tile_reads(fn, x_path)
    return out, reads / (N // TILE)


def _host(tree) -> list:
    """Every leaf as a NumPy array (a DiskArray through ``np.asarray``, outside any jax function)."""
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _check(got, want):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-4, atol=1e-6)


def test_a_scaled_mse_step_reads_x_once_under_jit(data):
    """The README demo's loss: ``sum((X @ w - y) ** 2) * scale`` (the sum's cotangent is ``scale``)."""
    arrays, d, x_path = data
    loss = lambda w, X, y: jask.sum(jask.square(X @ w - y)) * (1.0 / N)
    step = jax.jit(jax.value_and_grad(loss))
    want = jax.value_and_grad(lambda w: jnp.sum(jnp.square(arrays["X"] @ w - arrays["y"])) / N)(arrays["w"])
    for _ in range(2):      # the second call reuses the compiled step
        with jask.profile() as p:
            got, passes = _passes_over_x(lambda: _host(step(d["w"], d["X"], d["y"])), x_path)
        assert passes == 1
        assert p.arrays_written == 0 and p.bytes_written <= F * 4     # w's scaled gradient, nothing more
        _check(got, want)


def test_two_weights_in_one_pass_eagerly_and_gradients_scaled_by_the_cotangent(data):
    """``3 * loss`` eagerly: the sum's cotangent is 3; both weights come from the loss pass."""
    arrays, d, x_path = data
    loss = lambda w, v, X, y: 3.0 * jask.sum(jask.square(X @ w + X @ v - y))
    ref = lambda w, v: 3.0 * jnp.sum(jnp.square(arrays["X"] @ w + arrays["X"] @ v - arrays["y"]))
    got, passes = _passes_over_x(
        lambda: _host(jax.value_and_grad(loss, argnums=(0, 1))(d["w"], d["v"], d["X"], d["y"])),
        x_path)
    assert passes == 1
    _check(got, jax.value_and_grad(ref, argnums=(0, 1))(arrays["w"], arrays["v"]))


def test_the_same_weight_used_twice_sums_both_contributions(data):
    arrays, d, x_path = data
    loss = lambda w, X, y: jask.sum(jask.square(X @ w - y)) + jask.sum(X @ w)
    ref = lambda w: jnp.sum(jnp.square(arrays["X"] @ w - arrays["y"])) + jnp.sum(arrays["X"] @ w)
    got = _host(jax.jit(jax.value_and_grad(loss))(d["w"], d["X"], d["y"]))
    _check(got, jax.value_and_grad(ref)(arrays["w"]))


def _used_twice(w, X, y):
    r = X @ w - y
    return jask.sum(jask.square(r) + r)


def _cross_entropy(w, X, labels):
    """Softmax cross-entropy of logits ``X @ w`` against integer labels: the logits are used twice."""
    z = X @ w
    return knp.mean(jask.nn.logsumexp(z, axis=1) - knp.sum(z * jask.nn.one_hot(labels, 8), axis=1))


@pytest.mark.parametrize("case", ["used_twice", "cross_entropy"])
@pytest.mark.parametrize("mode", ["jit", "eager"])
def test_an_intermediate_used_twice_sums_its_uses_in_the_loss_pass(data, case, mode):
    """``r`` feeds two terms: its cotangent is the sum of both uses' (a CotangentSum of tagged parts), known
    to be the loss's cotangent times the walk's unit one. These read X twice before (loss, then gradient)."""
    arrays, d, x_path = data
    if case == "used_twice":
        loss, args, y = _used_twice, (d["w"], d["X"], d["y"]), arrays["y"]
        ref = lambda w: jnp.sum(jnp.square(arrays["X"] @ w - y) + (arrays["X"] @ w - y))
        w0 = arrays["w"]
    else:
        labels = np.random.default_rng(4).integers(0, 8, N).astype(np.int32)
        y = np.eye(8, dtype=np.float32)[labels]
        w0 = (np.random.default_rng(5).standard_normal((F, 8)) * 0.1).astype(np.float32)
        loss, args = _cross_entropy, (jask.from_numpy(w0), d["X"], jask.from_numpy(labels))
        ref = lambda w: jnp.mean(jax.nn.logsumexp(arrays["X"] @ w, axis=1) - jnp.sum((arrays["X"] @ w) * y, axis=1))
    step = jax.value_and_grad(loss)
    step = jax.jit(step) if mode == "jit" else step
    got, passes = _passes_over_x(lambda: _host(step(*args)), x_path)
    _check(got, jax.value_and_grad(ref)(w0))
    assert passes == 1


def test_a_big_inputs_gradient_is_computed_lazily_beside_the_weights(data):
    arrays, d, _ = data
    loss = lambda w, X, y: jask.sum(jask.square(X @ w - y))
    ref = lambda w, X: jnp.sum(jnp.square(X @ w - arrays["y"]))
    gw, gx = jax.jit(jax.grad(loss, argnums=(0, 1)))(d["w"], d["X"], d["y"])
    _check((np.asarray(gw), np.asarray(jask.materialize(gx))),
           jax.grad(ref, argnums=(0, 1))(arrays["w"], arrays["X"]))


@pytest.mark.parametrize("backend", ["xla", "pallas-interpret"])
def test_a_weight_of_several_tiles_has_its_gradient_in_the_loss_pass(tmp_path, backend):
    """X of 2 column tiles makes W1 2 x 1 tiles: each window takes entry k (row block k) of both tiles of
    W1's gradient with the loss's entry k, which reads the same row block of X, so X is read once."""
    jask.config.update("backend", backend)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((N, 2 * TILE)).astype(np.float32)
    y = rng.standard_normal((N, 1)).astype(np.float32)
    w1 = (rng.standard_normal((2 * TILE, 8)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((8, 1)) * 0.1).astype(np.float32)
    X, x_path = store_arrays(tmp_path, {"X2": x}, TILE)["X2"], str(tmp_path / "X2.zarr")
    Y, W1, W2 = jask.from_numpy(y), jask.from_numpy(w1), jask.from_numpy(w2)
    loss = lambda W1, W2, X, y: jask.sum(jask.square(X @ W1 @ W2 - y))
    ref = lambda W1, W2: jnp.sum(jnp.square(x @ W1 @ W2 - y))
    got, passes = _passes_over_x(
        lambda: _host(jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(W1, W2, X, Y)), x_path)
    assert passes == 2          # X has 2 tiles per row block: one pass
    _check(got, jax.value_and_grad(ref, argnums=(0, 1))(w1, w2))


@pytest.mark.parametrize("backend", ["xla", "pallas-interpret"])
@pytest.mark.parametrize("columns", [1, 2])
def test_an_x_of_a_single_row_block_is_read_once_per_step(tmp_path, backend, columns):
    """The README's example: X is one row block (one tile, or two column tiles), so the loss is a reduction
    of a single entry. Its small weights' gradients (one entry per tile too) share its window: X is read
    once per jitted step, also in the second step (the compiled step reused), values as jax's."""
    jask.config.update("backend", backend)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((TILE, columns * TILE)).astype(np.float32)
    y = rng.standard_normal((TILE, 1)).astype(np.float32)
    w = (rng.standard_normal((columns * TILE, 1)) * 0.1).astype(np.float32)
    X, x_path = store_arrays(tmp_path, {"X1": x}, TILE)["X1"], str(tmp_path / "X1.zarr")
    loss = lambda w, X, y: jask.sum(jask.square(X @ w - y))
    step = jax.jit(jax.value_and_grad(loss))
    want = jax.value_and_grad(lambda w: jnp.sum(jnp.square(x @ w - y)))(w)
    for _ in range(2):
        with jask.profile() as p:
            got, reads = tile_reads(lambda: _host(step(jask.from_numpy(w), X, jask.from_numpy(y))), x_path)
        assert reads == columns and p.windows == 1, (reads, p.windows)
        _check(got, want)


def test_reductions_of_several_tiles_without_a_one_tile_anchor_keep_their_own_passes(tmp_path):
    """Row sums of X and of X * X, X of 8 x 2 tiles: 8 output tiles of 2 entries each, and entry k of
    every tile is a column block of X, not what one entry of a one-tile reduction reads. They are not
    joined (a window would hold a whole column of X): each its own pass, both right."""
    x = np.random.default_rng(6).standard_normal((N, 2 * TILE)).astype(np.float32)
    X, x_path = store_arrays(tmp_path, {"X2": x}, TILE)["X2"], str(tmp_path / "X2.zarr")
    import jask.numpy as jnp_
    s1, s2 = jnp_.sum(X, axis=1), jnp_.sum(X * X, axis=1)
    assert "same pass" not in jask.explain(s1, s2)
    (a, b), passes = _passes_over_x(lambda: [np.asarray(v) for v in jask.persist(s1, s2)], x_path)
    assert passes == 2 * 2      # 2 tiles per row block, read in each of two passes
    np.testing.assert_allclose(a, x.sum(1), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(b, (x ** 2).sum(1), rtol=1e-5, atol=1e-4)


def test_without_small_weights_the_loss_runs_alone(data, monkeypatch):
    """No candidate (every stored input counts as big): two passes, as before the loss pass shared."""
    arrays, d, x_path = data
    monkeypatch.setattr(unit_grads, "SMALL_SHARE", float("inf"))
    loss = lambda w, X, y: jask.sum(jask.square(X @ w - y))
    got, passes = _passes_over_x(
        lambda: _host(jax.jit(jax.value_and_grad(loss))(d["w"], d["X"], d["y"])), x_path)
    assert passes == 2
    _check(got, jax.value_and_grad(lambda w: jnp.sum(jnp.square(arrays["X"] @ w - arrays["y"])))(arrays["w"]))


def test_a_forward_only_sum_computes_no_gradient(data):
    """Outside differentiation a scalar runs alone: one pass, one output tile, no unit gradient kept."""
    _, d, x_path = data
    before = len(unit_grads._walks)
    got, passes = _passes_over_x(lambda: float(jax.jit(lambda w, X: jask.sum(X @ w))(d["w"], d["X"])), x_path)
    assert passes == 1 and len(unit_grads._walks) == before


def test_column_sums_persisted_together_share_one_pass(data):
    """The executor side without gradients: two reductions to one tile over the same X (column sums
    and sums of squares, e.g. for normalizing features) are one group, X read once, values right."""
    arrays, d, x_path = data
    import jask.numpy as jnp_
    s1, s2 = jnp_.sum(d["X"], axis=0), jnp_.sum(d["X"] * d["X"], axis=0)
    assert "+ in the same pass: sum" in jask.explain(s1, s2)
    (a, b), passes = _passes_over_x(lambda: [np.asarray(v) for v in jask.persist(s1, s2)], x_path)
    assert passes == 1
    np.testing.assert_allclose(a, arrays["X"].sum(0), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(b, (arrays["X"] ** 2).sum(0), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("backend", ["pallas-interpret", "xla"])
def test_a_costly_shared_product_is_computed_once_per_window(data, backend):
    """Two-layer MSE: ``H = X @ W1`` feeds the loss and both weights' gradients. It gets a program of
    its own per window, read by the three members; the cheap shared nodes (``r``, ``dZ``) are recomputed
    inside each member's program. So 4 programs per window: 3 if H were inlined into every member (three
    products over X), 6 if every shared node had its own. A window's programs are joined into one call
    (jask.exec.joined_window)."""
    jask.config.update("backend", backend)
    arrays, d, x_path = data
    rng = np.random.default_rng(5)
    w1, w2 = (rng.standard_normal((F, 8)) * 0.1).astype(np.float32), (rng.standard_normal((8, 1)) * 0.1).astype(np.float32)
    loss = lambda W1, W2, X, y: jask.sum(jask.square(X @ W1 @ W2 - y))
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    with jask.profile() as p:
        got, passes = _passes_over_x(lambda: _host(step(jask.from_numpy(w1), jask.from_numpy(w2), d["X"], d["y"])),
                                     x_path)
    assert passes == 1 and p.kernel_calls == p.windows and p.window_programs == 4 * p.windows, p
    _check(got, jax.value_and_grad(lambda a, b: jnp.sum(jnp.square(arrays["X"] @ a @ b - arrays["y"])),
                                   argnums=(0, 1))(w1, w2))
