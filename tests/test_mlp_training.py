"""Issue 14's training loop: a 2-layer MLP with bias, ReLU and softmax cross-entropy, trained with
stock optax.adamw under jit(value_and_grad) on jask.batches, equals the same loop on in-RAM arrays
step by step, and each step reads only its batch's rows."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jask


def _trainer(features, traces):
    k1, k2 = jax.random.split(jax.random.key(0))
    params = {"w1": jax.random.normal(k1, (features, 16)) / 4, "b1": jnp.zeros(16),
              "w2": jax.random.normal(k2, (16, 2)) / 4, "b2": jnp.zeros(2)}
    opt = optax.adamw(1e-2)

    def loss_fn(params, xb, yb):
        hidden = jax.nn.relu(xb @ params["w1"] + params["b1"])
        logits = hidden @ params["w2"] + params["b2"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

    @jax.jit
    def step(params, state, xb, yb):
        traces.append(xb.shape)
        value, grads = jax.value_and_grad(loss_fn)(params, xb, yb)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    return params, opt.init(params), step


def test_mlp_epochs_equal_the_in_memory_loop_and_read_each_batch_once(small_tiles):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((48, 10)).astype(np.float32)
    y = X @ rng.standard_normal((10, 3)).astype(np.float32)          # learnable labels
    labels_ref = (y[:, 0] > 0).astype(np.int32)
    xs = jask.from_numpy(X)
    labels = jask.persist((jask.from_numpy(y)[:, 0] > 0).astype(np.int32))    # computed out of core

    params, state, step = _trainer(X.shape[1], [])
    want = []
    for _ in range(2):
        for i in range(0, 48, 8):
            params, state, value = step(params, state, X[i:i + 8], labels_ref[i:i + 8])
            want.append(float(value))

    traces = []
    params, state, step = _trainer(X.shape[1], traces)
    got = []
    with jask.profile() as prof:
        for epoch in range(2):
            for xb, yb in jask.batches(xs, labels, batch_size=8, epoch=epoch):
                params, state, value = step(params, state, xb, yb)
                got.append(float(value))
    assert len(got) == len(want) == 12
    np.testing.assert_allclose(got, want, rtol=1e-4)
    assert np.mean(want[6:]) < np.mean(want[:6])                     # the second epoch's loss is lower
    assert traces == [(8, 10)]                                      # one compiled step for every batch
    assert prof.bytes_read == 2 * (X.nbytes + labels.nbytes)        # each batch's rows once per epoch
