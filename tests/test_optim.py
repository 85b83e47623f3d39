"""Training loops over DiskArray parameters: Adam matches optax.adam, the step compiles once."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jask
import jask.optim
from jask.hijax import compat


@pytest.fixture
def regression():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((45, 11)).astype(np.float32)
    W = rng.standard_normal((11, 3)).astype(np.float32)
    return X, X @ W + 0.01 * rng.standard_normal((45, 3)).astype(np.float32)


def _on_host():
    """Compute references on the host CPU: IEEE float32, the same on every machine. On a TPU v5e,
    optax run on the chip and jask differed by 2.3e-4 over 12 Adam steps."""
    return jax.default_device(jax.devices("cpu")[0])


def _reference_adam(X, Y, steps, lr):
    with _on_host():
        return _reference_adam_steps(X, Y, steps, lr)


def _reference_adam_steps(X, Y, steps, lr):
    opt = optax.adam(lr)
    w = jnp.zeros((X.shape[1], Y.shape[1]), jnp.float32)
    state = opt.init(w)
    losses = []
    for _ in range(steps):
        loss, g = jax.value_and_grad(lambda w: jnp.sum((X @ w - Y) ** 2))(w)
        updates, state = opt.update(g, state)
        w = optax.apply_updates(w, updates)
        losses.append(float(loss))
    return np.asarray(w), losses


def jitted_step(opt, x, y, traces):
    """The README's jitted step for the least-squares loss of ``x @ w`` against ``y`` (``traces`` counts traces)."""
    @jax.jit
    def step(w, state):
        traces.append(1)
        loss, g = jax.value_and_grad(lambda w: jask.sum(jask.square(x @ w - y)))(w)
        updates, state = opt.update(g, state, w)
        return jask.optim.apply_updates(w, updates), state, loss
    return step


def test_adam_loop_matches_optax_and_traces_once(regression):
    jask.config.update("tile", 8)
    X, Y = regression
    x, y = jask.from_numpy(X), jask.from_numpy(Y)
    w = jask.from_numpy(np.zeros((11, 3), np.float32))
    opt = jask.optim.adam(0.1)
    assert isinstance(opt, optax.GradientTransformation)
    state = opt.init(w)
    traces = []
    step = jitted_step(opt, x, y, traces)
    identity = w
    losses = []
    for _ in range(12):
        new_w, state, loss = step(w, state)
        w.update_(new_w)
        losses.append(float(loss))
    assert w is identity
    assert len(traces) == 1
    assert losses[-1] < 0.2 * losses[0]
    w_ref, losses_ref = _reference_adam(X, Y, 12, 0.1)
    np.testing.assert_allclose(losses, losses_ref, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(w), w_ref, rtol=1e-4, atol=1e-5)


def test_adam_moments_are_stored_not_recomputed(regression):
    """Each step persists the moments, so step k's plan does not grow with k."""
    jask.config.update("tile", 8)
    X, Y = regression
    x, y = jask.from_numpy(X), jask.from_numpy(Y)
    w = jask.from_numpy(np.zeros((11, 3), np.float32))
    opt = jask.optim.adam(0.05)
    state = opt.init(w)
    step = jax.jit(lambda w, s: opt.update(jax.grad(lambda w: jask.sum(jask.square(x @ w - y)))(w), s, w))
    reads = []
    for _ in range(4):
        stats = jask.Stats()
        from jask.exec import events
        events.listeners.append(stats)
        try:
            updates, state = step(w, state)
            w.update_(jask.optim.apply_updates(w, updates))
        finally:
            events.listeners.remove(stats)
        reads.append(stats.bytes_read)
    assert reads[1] == reads[2] == reads[3]


def test_adam_step_reads_parameters_gradient_inputs_and_moments_once(tmp_path):
    """One jitted step and ``update_``: a pass reads W, T, m, v once and writes W, m, v.

    The loss pass of ``jax.grad`` reads W and T once more (its value is computed, then unused), except
    on a JAX that drops unused ops under jit (``compat.UNUSED_OPS_SKIPPED_UNDER_JIT``).
    """
    jask.config.update("tile", 16)
    rng = np.random.default_rng(0)
    W0, T = (rng.standard_normal((64, 48)).astype(np.float32) for _ in range(2))
    jask.from_numpy(W0).to_zarr(tmp_path / "w.zarr")
    w, t = jask.from_zarr(tmp_path / "w.zarr", mode="r+"), jask.from_numpy(T)
    opt = jask.optim.adam(0.1)
    state = opt.init(w)

    @jax.jit
    def step(w, state, t):
        g = jax.grad(lambda w: jask.sum(jask.square(w - t)))(w)
        updates, state = opt.update(g, state, w)
        return jask.optim.apply_updates(w, updates), state

    ref, ref_opt = W0, optax.adam(0.1)
    with _on_host():
        ref_state = ref_opt.init(W0)
    S = W0.nbytes
    for i in range(3):
        with jask.profile() as p:
            new_w, state = step(w, state, t)
            w.update_(new_w)
        with _on_host():
            u, ref_state = ref_opt.update(2 * (ref - T), ref_state, ref)
            ref = optax.apply_updates(ref, u)
        moments_read = 0 if i == 0 else 2 * S            # step 0's moments are zeros: nothing stored
        loss_pass = 0 if compat.UNUSED_OPS_SKIPPED_UNDER_JIT else 2 * S
        assert (p.bytes_read, p.bytes_written) == (loss_pass + 2 * S + moments_read, 3 * S)
        assert p.arrays_written == 3
    np.testing.assert_allclose(np.asarray(w), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(state.mu), ref_state[0].mu, rtol=1e-5, atol=1e-6)


def test_sgd_and_schedule(regression):
    jask.config.update("tile", 8)
    X, Y = regression
    x, y = jask.from_numpy(X), jask.from_numpy(Y)
    params = {"w": jask.from_numpy(np.zeros((11, 3), np.float32))}
    loss = lambda p: jask.sum(jask.square(x @ p["w"] - y))
    for opt in (jask.optim.sgd(1e-3), jask.optim.adam(optax.linear_schedule(0.1, 0.01, 10))):
        state = opt.init(params)
        first = float(loss(params))
        for _ in range(5):
            updates, state = opt.update(jax.grad(loss)(params), state, params)
            jask.optim.update_params(params, jask.optim.apply_updates(params, updates))
        assert float(loss(params)) < first


@pytest.mark.parametrize("name", ["adam", "sgd_schedule", "sgd_traced_lr"])
def test_mixed_parameter_trees_and_sgd_rates_match_optax(regression, name):
    """A tree of a DiskArray weight and an in-memory scale (jask.optim's own transforms took DiskArrays only:
    adam's init failed, sgd refused the scale), and sgd with a schedule or a traced rate (refused before),
    each step under jit against optax on the host."""
    jask.config.update("tile", 8)
    X, Y = regression
    x, y = jask.from_numpy(X), jask.from_numpy(Y)
    schedule = optax.linear_schedule(0.05, 0.01, 4)
    opt, ref_opt = {"adam": (jask.optim.adam(0.1), optax.adam(0.1)),
                    "sgd_schedule": (jask.optim.sgd(schedule), optax.sgd(schedule)),
                    "sgd_traced_lr": (jask.optim.sgd(0.0), optax.sgd(0.01))}[name]
    p = {"w": jask.from_numpy(np.full((11, 3), 0.1, np.float32)), "s": jnp.float32(0.5)}
    with _on_host():
        ref = {"w": jnp.full((11, 3), 0.1, jnp.float32), "s": jnp.float32(0.5)}
        ref_state = ref_opt.init(ref)
    state = opt.init(p)

    @jax.jit
    def step(p, state, lr):
        g = jax.grad(lambda p: jask.sum(jask.square(x @ p["w"] * p["s"] - y)))(p)
        local = jask.optim.sgd(lr) if name == "sgd_traced_lr" else opt
        updates, state = local.update(g, state, p)
        return jask.optim.apply_updates(p, updates), state

    for _ in range(3):
        new_p, state = step(p, state, jnp.float32(0.01))
        p["w"].update_(new_p["w"])
        p["s"] = new_p["s"]
        with _on_host():
            g = jax.grad(lambda q: jnp.sum(jnp.square(X @ q["w"] * q["s"] - Y)))(ref)
            u, ref_state = ref_opt.update(g, ref_state, ref)
            ref = optax.apply_updates(ref, u)
        np.testing.assert_allclose(np.asarray(p["w"]), np.asarray(ref["w"]), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(float(p["s"]), float(ref["s"]), rtol=1e-5, atol=1e-6)


def test_update_params_refuses_what_it_cannot_commit(small_tiles):
    """Inside jit, or an in-memory leaf among the parameters: a TypeError saying what to do, not an
    AttributeError from deep inside (a jax array leaf has no store to commit into)."""
    w = jask.from_numpy(np.ones((4, 4), np.float32))
    with pytest.raises(TypeError, match="update_params cannot run inside jit"):
        jax.jit(lambda w: jask.optim.update_params(w, w * 2.0))(w)
    with pytest.raises(TypeError, match=r"the parameter at \['s'\] is an in-memory ArrayImpl, not a DiskArray"):
        jask.optim.update_params({"w": w, "s": jnp.float32(1)}, {"w": w * 2.0, "s": jnp.float32(2)})
    with pytest.raises(ValueError, match=r"only in params: \['w'\]; only in new_params: \['v'\]"):
        jask.optim.update_params({"w": w}, {"v": w * 2.0})
    np.testing.assert_array_equal(np.asarray(w), np.ones((4, 4), np.float32))


def test_update_params_commits_local_parameters_as_one_group(tmp_path, small_tiles, monkeypatch):
    """update_params goes through update_all for local stores: one pass, one group commit
    (the group log exists before the first swap), so a kill between commits cannot mix steps."""
    import zarr
    from jask.io import faults
    rng = np.random.default_rng(1)
    values = {k: rng.standard_normal((8, 12)).astype(np.float32) for k in ("w", "b")}
    for k, v in values.items():
        zarr.create_array(str(tmp_path / f"{k}.zarr"), shape=v.shape, dtype=v.dtype, chunks=(4, 4),
                          compressors=None, fill_value=0)[...] = v
    params = {k: jask.from_zarr(str(tmp_path / f"{k}.zarr"), mode="r+") for k in values}
    recorder = faults.Recorder()
    monkeypatch.setattr(faults, "hook", recorder)
    with jask.profile() as prof:
        jask.optim.update_params(params, jask.optim.apply_updates(params, {k: p * -0.5 for k, p in params.items()}))
    points = [p for p, _ in recorder.points]
    assert points.count("after_group_log") == 1
    assert points.index("after_group_log") < points.index("after_swap")
    assert prof.plans == 1 and prof.bytes_read == 2 * 8 * 12 * 4     # both read once, in one pass
    for k, v in values.items():
        np.testing.assert_array_equal(zarr.open_array(str(tmp_path / f"{k}.zarr"), mode="r")[...], v * np.float32(0.5))
