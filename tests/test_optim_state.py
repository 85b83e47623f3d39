"""Checkpointed optimizer state (jask.optim.checkpoint_state / load_state / update_params(state=...)):
a restarted job follows the uninterrupted trajectory (against optax), a SIGKILL between the group's
commits leaves parameters and state of one step, and a folder of another state is refused untouched."""
import gc
import json
import os
import re
import shutil
import signal

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import zarr

import jask
import jask.optim
from jask.hijax.array import is_disk_array
from test_optim import _on_host, jitted_step, regression  # noqa: F401 (regression: the fixture)
from test_reliability import _hidden, _leftovers, where_killed, zygotes  # noqa: F401 (zygotes: the fixture)
import reliability_worker as rw


def _optax_adam(X, Y, steps, lr, restart_at=None):
    """optax.adam from zero weights; ``restart_at``: the state reset to init there (what a job
    restarted without its optimizer state does)."""
    with _on_host():
        opt = optax.adam(lr)
        w = jnp.zeros((X.shape[1], Y.shape[1]), jnp.float32)
        state = opt.init(w)
        for i in range(steps):
            if i == restart_at:
                state = opt.init(w)
            g = jax.grad(lambda w: jnp.sum((X @ w - Y) ** 2))(w)
            updates, state = opt.update(g, state)
            w = optax.apply_updates(w, updates)
        return np.asarray(w), state


def _train(folder, X, Y, steps, traces, lr=0.1):
    """The README's jitted loop with the state checkpointed in ``folder/ckpt``, continued from there if it exists."""
    x, y = jask.from_numpy(X), jask.from_numpy(Y)
    w = jask.from_zarr(os.path.join(folder, "w.zarr"), mode="r+")
    opt = jask.optim.adam(lr)
    ckpt = os.path.join(folder, "ckpt")
    state = jask.optim.load_state(opt.init(w), ckpt) if os.path.exists(ckpt) else \
        jask.optim.checkpoint_state(opt.init(w), ckpt)
    step = jitted_step(opt, x, y, traces)
    identity = w
    while int(state.count) < steps:
        new_w, state, _ = step(w, state)
        jask.optim.update_params(w, new_w, state=state, state_path=ckpt)
    assert w is identity
    return w, state


def _start(folder, features, outputs):
    os.makedirs(folder)
    jask.to_zarr(jask.from_numpy(np.zeros((features, outputs), np.float32)), os.path.join(folder, "w.zarr"))


def test_restarted_adam_follows_the_uninterrupted_trajectory(regression, tmp_path):
    """N jitted Adam steps in one run == k steps, a "restart" (arrays dropped, parameters and state
    reopened from their stores, a new jitted step) and N - k more; both equal optax.adam."""
    jask.config.update("tile", 8)
    X, Y = regression
    N, k = 6, 2
    w_ref, s_ref = _optax_adam(X, Y, N, 0.1)
    w_reset, _ = _optax_adam(X, Y, N, 0.1, restart_at=k)
    assert np.abs(w_reset - w_ref).max() > 1e-2 * np.abs(w_ref).max()     # zeroed moments: another path

    _start(tmp_path / "once", 11, 3)
    traces = []
    w, state = _train(tmp_path / "once", X, Y, N, traces)
    assert len(traces) == 1                 # checkpointed leaves are plain DiskArray arguments: no retrace
    once = [np.asarray(a) for a in (w, state.mu, state.nu)]
    del w, state

    _start(tmp_path / "twice", 11, 3)
    _train(tmp_path / "twice", X, Y, k, [])
    gc.collect()
    ckpt = os.path.join(tmp_path / "twice", "ckpt")
    assert int(zarr.open_array(os.path.join(ckpt, "leaf-0.zarr"), mode="r")[0]) == k      # the count
    w, state = _train(tmp_path / "twice", X, Y, N, [])                                     # the "new process"
    assert isinstance(state.count, jax.Array) and int(state.count) == N
    twice = [np.asarray(a) for a in (w, state.mu, state.nu)]

    for a, b in zip(once, twice):
        np.testing.assert_array_equal(b, a)                              # restarted == uninterrupted, bit for bit
    for got, want in zip(twice, (w_ref, s_ref[0].mu, s_ref[0].nu)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)   # jask, optax: 2.2e-6 apart (f32 op order)
    del w, state
    gc.collect()
    assert _hidden(tmp_path / "twice") == [] and _hidden(ckpt) == []


def test_a_checkpointed_step_is_one_pass(tmp_path, small_tiles):
    """update_params with the state: one pass reads W, the gradient's input, m and v (and the 4-byte count)
    once and writes W, m and v, as the step without a checkpoint writes W and stores m and v."""
    _start(tmp_path / "run", 12, 8)
    w = jask.from_zarr(os.path.join(tmp_path / "run", "w.zarr"), mode="r+")
    t = jask.from_numpy(np.ones((12, 8), np.float32))
    opt = jask.optim.adam(0.1)
    ckpt = str(tmp_path / "ckpt")
    state = jask.optim.checkpoint_state(opt.init(w), ckpt)
    S = 12 * 8 * 4
    for _ in range(2):
        updates, state = opt.update(w - t, state, w)
        with jask.profile() as p:
            jask.optim.update_params(w, jask.optim.apply_updates(w, updates), state=state, state_path=ckpt)
        assert p.plans == 1 and p.bytes_read == 4 * S + 4 and 3 * S <= p.bytes_written <= 3 * S + 4
        assert p.arrays_written == 4                                  # W, m, v, the count
    np.testing.assert_array_equal(np.asarray(state.mu), zarr.open_array(os.path.join(ckpt, "leaf-1.zarr"))[...])
    fresh = opt.init(w)                          # a reset: mu and nu share one zero node, each still gets a copy
    jask.optim.update_params(w, w * 1.0, state=fresh, state_path=ckpt)
    again = jask.optim.load_state(opt.init(w), ckpt)
    assert int(again.count) == 0 and not np.asarray(again.mu).any() and not np.asarray(again.nu).any()


def test_a_checkpointed_two_layer_model_matches_optax(regression, tmp_path):
    """Two parameters, one read by the other's gradient through a product: the step's new moments of W1 are
    stored before the new W2 is computed from them in the same pass (they are committed after it, with the
    group). This failed at the first step with a TileReadError before the ninth session: any checkpointed
    model of two parameters did."""
    jask.config.update("tile", 8)
    X, Y = regression
    rng = np.random.default_rng(1)
    init = {"w1": rng.standard_normal((11, 5)).astype(np.float32) * 0.3,
            "w2": rng.standard_normal((5, 3)).astype(np.float32) * 0.3}
    for k, v in init.items():
        jask.to_zarr(jask.from_numpy(v), str(tmp_path / f"{k}.zarr"))
    p = {k: jask.from_zarr(str(tmp_path / f"{k}.zarr"), mode="r+") for k in init}
    x, y = jask.from_numpy(X), jask.from_numpy(Y)
    opt = jask.optim.adam(0.05)
    state = jask.optim.checkpoint_state(opt.init(p), str(tmp_path / "ckpt"))

    @jax.jit
    def step(p, state):
        loss, g = jax.value_and_grad(lambda p: jask.sum(jask.square((x @ p["w1"]) @ p["w2"] - y)))(p)
        updates, state = opt.update(g, state, p)
        return jask.optim.apply_updates(p, updates), state, loss

    with _on_host():
        ref_opt, ref = optax.adam(0.05), {k: jnp.asarray(v) for k, v in init.items()}
        ref_state = ref_opt.init(ref)
        ref_loss = jax.jit(jax.value_and_grad(lambda p: jnp.sum(((X @ p["w1"]) @ p["w2"] - Y) ** 2)))
    for _ in range(3):
        new_p, state, loss = step(p, state)
        jask.optim.update_params(p, new_p, state=state, state_path=str(tmp_path / "ckpt"))
        with _on_host():
            want_loss, g = ref_loss(ref)
            updates, ref_state = ref_opt.update(g, ref_state, ref)
            ref = optax.apply_updates(ref, updates)
        np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5)
        for k in init:
            np.testing.assert_allclose(np.asarray(p[k]), np.asarray(ref[k]), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(zarr.open_array(str(tmp_path / f"{k}.zarr"), mode="r")[...],
                                       np.asarray(ref[k]), rtol=1e-5, atol=1e-6)
    again = jask.optim.load_state(opt.init(p), str(tmp_path / "ckpt"))
    assert int(again.count) == 3
    np.testing.assert_allclose(np.asarray(again.mu["w1"]), np.asarray(ref_state[0].mu["w1"]), rtol=1e-5, atol=1e-7)


def test_a_checkpointed_store_is_not_committed_alone(tmp_path, small_tiles):
    """After a commit with the state, committing a parameter or a state leaf without it (update_params without
    state=, update_, update_all) would leave the checkpoint a step behind: refused by name before anything is
    computed or written. Committing with the state still works; a removed checkpoint frees them."""
    _start(tmp_path / "run", 12, 8)
    w = jask.from_zarr(os.path.join(tmp_path / "run", "w.zarr"), mode="r+")
    opt = jask.optim.adam(0.1)
    ckpt = str(tmp_path / "ckpt")
    state = jask.optim.checkpoint_state(opt.init(w), ckpt)
    updates, state = opt.update(w - 1.0, state, w)
    jask.optim.update_params(w, jask.optim.apply_updates(w, updates), state=state, state_path=ckpt)
    before = _files(tmp_path)
    said = re.escape(f"is committed together with the optimizer state checkpointed at {ckpt}; commit it with "
                     f"jask.optim.update_params(params, new_params, state=new_state, state_path='{ckpt}')")
    with jask.profile() as p:
        with pytest.raises(ValueError, match=r"update_all: .*w\.zarr " + said):
            jask.optim.update_params(w, w + 1.0)
        with pytest.raises(ValueError, match=r"update_: .*w\.zarr " + said):
            w.update_(w + 1.0)
        with pytest.raises(ValueError, match=r"update_all: .*leaf-1\.zarr " + said):
            jask.update_all([state.mu], [state.mu * 2.0])
    assert p.plans == 0 and p.bytes_read == 0
    gc.collect()
    assert _files(tmp_path) == before
    updates, state = opt.update(w - 1.0, state, w)                   # with the state: as before
    jask.optim.update_params(w, jask.optim.apply_updates(w, updates), state=state, state_path=ckpt)
    assert int(jask.optim.load_state(opt.init(w), ckpt).count) == 2
    shutil.rmtree(ckpt)                                              # no checkpoint: nothing to keep in step
    value = np.asarray(w) + 1
    jask.optim.update_params(w, w + 1.0)
    np.testing.assert_array_equal(np.asarray(w), value)


def test_optax_state_with_schedule_round_trips(regression, tmp_path, small_tiles):
    """on_disk(optax.adamw(schedule)): its counts (two, in memory) and moments are restored exactly."""
    X, Y = regression
    _start(tmp_path / "run", 11, 3)
    w = jask.from_zarr(os.path.join(tmp_path / "run", "w.zarr"), mode="r+")
    x, y = jask.from_numpy(X), jask.from_numpy(Y)
    opt = jask.optim.on_disk(optax.adamw(optax.linear_schedule(0.1, 0.01, 5)))
    ckpt = str(tmp_path / "ckpt")
    state = jask.optim.checkpoint_state(opt.init(w), ckpt)
    for _ in range(2):
        updates, state = opt.update(jax.grad(lambda w: jask.sum(jask.square(x @ w - y)))(w), state, w)
        jask.optim.update_params(w, jask.optim.apply_updates(w, updates), state=state, state_path=ckpt)
    again = jask.optim.load_state(opt.init(w), ckpt)
    leaves, again_leaves = (jax.tree.leaves(s, is_leaf=is_disk_array) for s in (state, again))
    assert len(leaves) == len(again_leaves) == 4          # count, mu, nu; the schedule's count
    for a, b in zip(leaves, again_leaves):
        assert type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
    assert sorted(int(a) for a in again_leaves if not is_disk_array(a)) == [2, 2]


def test_memory_leaves_come_back_as_they_went(tmp_path, small_tiles):
    """Python numbers, NumPy (64-bit too) and JAX arrays, a zero-size one: restored with their kind and dtype."""
    d = jask.from_numpy(np.arange(24, dtype=np.float32).reshape(4, 6))
    state = (3, 0.5, True, np.float64(2.5), np.arange(3, dtype=np.int64), jnp.ones((2, 2)), np.zeros((0, 2)), d)
    jask.optim.checkpoint_state(state, tmp_path / "ckpt")
    template = (0, 0.0, False, np.float64(0), np.zeros(3, np.int64), jnp.zeros((2, 2)), np.zeros((0, 2)),
                jask.from_numpy(np.zeros((4, 6), np.float32)))
    again = jask.optim.load_state(template, tmp_path / "ckpt")
    for a, b in zip(state, again):
        assert type(a) is type(b), (a, b)
        if not isinstance(a, (int, float)):
            assert (a.dtype, a.shape) == (b.dtype, b.shape), (a, b)
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
    assert again[-1]._node.resolved().store.path == str(tmp_path / "ckpt" / "leaf-7.zarr")


def _files(folder):
    """Every file under ``folder`` with its bytes."""
    return {os.path.join(d, f): open(os.path.join(d, f), "rb").read()
            for d, _, fs in os.walk(folder) for f in fs}


def test_a_folder_of_another_state_is_refused_before_anything_is_touched(tmp_path, small_tiles):
    for name, shape in (("w", (8, 12)), ("v", (12, 8))):
        jask.to_zarr(jask.from_numpy(np.ones(shape, np.float32)), tmp_path / f"{name}.zarr")
    w, v = (jask.from_zarr(tmp_path / f"{n}.zarr", mode="r+") for n in ("w", "v"))
    opt = jask.optim.adam(0.1)
    ckpt = str(tmp_path / "ckpt")
    state = jask.optim.checkpoint_state(opt.init({"w": w}), ckpt)
    before = _files(tmp_path)
    with pytest.raises(ValueError, match=r"load_state: state\.mu\['w'\] has shape \(12, 8\), dtype float32.*"
                                         r"checkpoint at .*ckpt holds shape \(8, 12\), dtype float32.*leaf-1\.zarr"):
        jask.optim.load_state(opt.init({"w": v}), ckpt)
    with pytest.raises(ValueError, match=r"state\.mu\['v'\] is state\.mu\['w'\] in the checkpoint"):
        jask.optim.load_state(opt.init({"v": v}), ckpt)
    with pytest.raises(ValueError, match=r"the state has 0 leaves, the checkpoint at .*ckpt 3"):
        jask.optim.load_state(jask.optim.sgd(0.1).init({"w": w}), ckpt)
    with pytest.raises(FileExistsError, match=r"ckpt holds an optimizer checkpoint; continue from it with .*load_st"):
        jask.optim.checkpoint_state(opt.init({"w": w}), ckpt)
    with pytest.raises(FileExistsError, match=r"w\.zarr exists and is not an optimizer checkpoint"):
        jask.optim.checkpoint_state(opt.init({"w": w}), tmp_path / "w.zarr")
    with pytest.raises(ValueError, match=r"w\.zarr is not an optimizer checkpoint .*jask-state\.json"):
        jask.optim.load_state(opt.init({"w": w}), tmp_path / "w.zarr")
    with pytest.raises(FileNotFoundError, match=r"no optimizer checkpoint at .*nothing"):
        jask.optim.load_state(opt.init({"w": w}), tmp_path / "nothing")
    with pytest.raises(ValueError, match=r"memory://x is a store URL"):
        jask.optim.checkpoint_state(opt.init({"w": w}), "memory://x")
    # a step's commit: the new state must be this checkpoint's, the parameters stores of their own
    updates, new_state = opt.update({"v": v * 0.5}, opt.init({"v": v}), {"v": v})
    with pytest.raises(ValueError, match=r"update_params: the state's leaf state\.mu\['v'\] is state\.mu\['w'\]"):
        jask.optim.update_params({"v": v}, jask.optim.apply_updates({"v": v}, updates), state=new_state,
                                 state_path=ckpt)
    updates, new_state = opt.update({"w": w * 0.5}, state, {"w": w})
    with pytest.raises(ValueError, match=r"parameter 0 \(shape \(8, 12\)\) is not a local Zarr store opened with"):
        jask.optim.update_params({"w": jask.from_numpy(np.ones((8, 12), np.float32))},
                                 jask.optim.apply_updates({"w": w}, updates), state=new_state, state_path=ckpt)
    with pytest.raises(TypeError, match=r"update_params cannot run inside jit"):
        jax.jit(lambda s: jask.optim.update_params({"w": w}, {"w": w * 1.0}, state=s, state_path=ckpt))(state)
    with pytest.raises(ValueError, match="pass state= .* and state_path= .* together"):
        jask.optim.update_params({"w": w}, jask.optim.apply_updates({"w": w}, updates), state=new_state)
    # a leaf store replaced by another tool's array of another shape
    jask.to_zarr(jask.from_numpy(np.ones((4, 4), np.float32)), tmp_path / "other.zarr")
    os.rename(os.path.join(ckpt, "leaf-2.zarr"), tmp_path / "nu.zarr")
    os.rename(tmp_path / "other.zarr", os.path.join(ckpt, "leaf-2.zarr"))
    with pytest.raises(ValueError, match=r"state\.nu\['w'\] should be stored with shape \(8, 12\) and dtype "
                                         r"float32, but .*ckpt/leaf-2\.zarr holds shape \(4, 4\)"):
        jask.optim.update_params({"w": w}, jask.optim.apply_updates({"w": w}, updates), state=new_state,
                                 state_path=ckpt)
    os.rename(os.path.join(ckpt, "leaf-2.zarr"), tmp_path / "other.zarr")
    os.rename(tmp_path / "nu.zarr", os.path.join(ckpt, "leaf-2.zarr"))
    del updates, new_state
    gc.collect()
    after = {k: v for k, v in _files(tmp_path).items() if "other.zarr" not in k}
    assert after == before                               # nothing written, nothing left beside the arrays
    assert json.load(open(os.path.join(ckpt, "jask-state.json")))["leaves"][0]["key"] == ".count"


# ---- SIGKILL between the group's commits (children forked by the reliability zygotes) ----

def _reference_steps():
    """optax.adam(0.1) on the worker's p1, p2 with gradients p - a, p - b: (params, mu, nu) per step."""
    with _on_host():
        opt = optax.adam(0.1)
        params = {"p1": jnp.asarray(rw.P1), "p2": jnp.asarray(rw.P2)}
        state = opt.init(params)
        out = [(params, state[0].mu, state[0].nu)]
        for _ in range(rw.STATE_STEPS):
            updates, state = opt.update({"p1": params["p1"] - rw.A, "p2": params["p2"] - rw.B}, state)
            params = optax.apply_updates(params, updates)
            out.append((params, state[0].mu, state[0].nu))
    return [[np.asarray(t[name]) for t in step for name in ("p1", "p2")] for step in out]


def _open_step(d):
    """Parameters and state as a new process sees them: (count, [p1, p2, mu1, mu2, nu1, nu2]) or count None
    when no checkpoint exists yet."""
    params = {n: jask.from_zarr(os.path.join(d, f"{n}.zarr"), mode="r+") for n in ("p1", "p2")}
    ckpt = os.path.join(d, "ckpt")
    if not os.path.exists(ckpt):
        return None, [np.asarray(params["p1"]), np.asarray(params["p2"])]
    state = jask.optim.load_state(jask.optim.adam(0.1).init(params), ckpt)
    arrays = [params["p1"], params["p2"], state.mu["p1"], state.mu["p2"], state.nu["p1"], state.nu["p2"]]
    return int(state.count), [np.asarray(a) for a in arrays]


def _step_of(values, ref, count):
    """The one reference step every array equals (and the count says), else an AssertionError naming the mix."""
    steps = [{n for n, r in enumerate(ref) if np.allclose(v, r[i], rtol=1e-5, atol=1e-6)}
             for i, v in enumerate(values)]
    assert all(s == {count} for s in steps), f"count {count}, arrays at steps {steps}: mixed"
    return count


def test_sigkill_between_the_groups_commits_leaves_one_step(zygotes, tmp_path):
    ref = _reference_steps()
    base = dict(scenario="optim-state", scratch=str(tmp_path / "scratch"))
    record = str(tmp_path / "points.json")
    rw.make_inputs("optim-state", str(tmp_path / "dry"))
    (dry,) = zygotes.run([dict(base, dir=str(tmp_path / "dry"), record=record)])
    assert dry["code"] == 0, zygotes.log_tail()
    count, final = _open_step(str(tmp_path / "dry"))
    assert _step_of(final, ref, count) == rw.STATE_STEPS
    points = [p for p, _ in json.load(open(record))]
    logs = [n for n, p in enumerate(points, 1) if p == "after_group_log"]
    assert len(logs) == rw.STATE_STEPS                         # one group per step
    g = logs[1]                                                # step 2 (state count 1 -> 2)
    swaps = [n for n, p in enumerate(points, 1) if p == "after_swap" and n > g]
    kills = {points.index("after_swap") + 1: 0,                # inside checkpoint_state: no checkpoint yet
             g - 1: 1,                                          # every new array written, no log: step 1
             g: 2, swaps[1]: 2, swaps[3]: 2}                    # the group's log, its 2nd and 4th swaps: step 2
    dirs = [str(tmp_path / f"k{n}") for n in kills]
    for d in dirs:
        rw.make_inputs("optim-state", d)
    # each kill by its point's name and occurrence, not its number: writer threads' tile writes may fall on
    # either side of another point, so a run's n-th point is not always the dry run's
    faults = [f"{points[n - 1]}:{points[:n].count(points[n - 1])}" for n in kills]
    results = list(zygotes.run([dict(base, dir=d, fault=f, trace=d + ".trace") for f, d in zip(faults, dirs)]))
    for (n, want), res, d in zip(kills.items(), results, dirs):
        assert res["signal"] == signal.SIGKILL, f"point {n}: {res}; {zygotes.log_tail()}"
        where = where_killed(d + ".trace", [(p, None) for p in points], n)
        count, values = _open_step(d)
        if want == 0:
            assert count is None and all(np.array_equal(v, r) for v, r in zip(values, ref[0])), where
        else:
            try:
                got = _step_of(values, ref, count)
            except AssertionError as e:
                raise AssertionError(f"killed at point {n} ({points[n - 1]}): {e}\n{where}") from None
            assert got == want, f"killed at point {n} ({points[n - 1]}): step {got}, not {want}\n{where}"
        del values
        gc.collect()
    reruns = list(zygotes.run([dict(base, dir=d) for d in dirs]))    # the same script, continued
    for (n, _), res, d in zip(kills.items(), reruns, dirs):
        assert res["code"] == 0, zygotes.log_tail()
        count, values = _open_step(d)
        assert count == rw.STATE_STEPS
        for v, f in zip(values, final):
            np.testing.assert_array_equal(v, f, err_msg=f"rerun after a kill at point {n}")
        del values
        gc.collect()
        assert _hidden(d) == [] and _hidden(os.path.join(d, "ckpt")) == [], n
    assert _leftovers(tmp_path) == []


def test_a_killed_checkpointed_step_resumes(zygotes, tmp_path, monkeypatch):
    """Steps with resume=True, killed before step 2's last tile write: the same script continues step 2
    from the tiles on disk (fewer tiles than steps 2 and 3 uninterrupted; the targets' journals skip a
    tile position only when all hold it, and the writers' order varies) and ends bit for bit where the
    uninterrupted run does."""
    import warnings
    from jask.io import faults
    jask.config.update("tile", rw.TILE)                       # the children's tiles
    # The killed child computes on the host CPU (conftest pins children there on an accelerator
    # machine): so do this process's runs, tiles and the optimizer's own jnp scalars alike, or "bit
    # for bit" would compare a chip's float32 with the host's (1e-4 apart after 3 Adam steps on a TPU v5e).
    host = jax.devices("cpu")[0]
    jask.config.update("device", host)

    def steps(d, upto):
        monkeypatch.setattr(rw, "STATE_STEPS", upto)
        a, b = (jask.from_zarr(os.path.join(d, n)) for n in ("a.zarr", "b.zarr"))
        recorder = faults.Recorder()
        monkeypatch.setattr(faults, "hook", recorder)
        with jask.profile() as prof, warnings.catch_warnings(), jax.default_device(host):
            warnings.simplefilter("error", RuntimeWarning)    # resume=True takes the killed folders over
            rw.adam_state_steps(jask, lambda n: os.path.join(d, n), a, b, resume=True)
        monkeypatch.setattr(faults, "hook", None)
        return prof, [p for p, _ in recorder.points]

    full = str(tmp_path / "full")
    rw.make_inputs("optim-state-resume", full)
    _, first = steps(full, 1)                                # checkpoint_state and step 1
    uninterrupted, rest = steps(full, 3)                      # steps 2 and 3
    step2 = rest[:rest.index("after_group_log")].count("after_tile_write")
    k = first.count("after_tile_write") + step2 - 1            # every tile of step 2 written but one
    d = str(tmp_path / "killed")
    rw.make_inputs("optim-state-resume", d)
    (res,) = zygotes.run([dict(scenario="optim-state-resume", dir=d, scratch=str(tmp_path / "scratch"),
                               fault=f"after_tile_write:{k}")])
    assert res["signal"] == signal.SIGKILL, zygotes.log_tail()
    assert _open_step(d)[0] == 1                               # killed in step 2: all at step 1
    gc.collect()
    resumed, _ = steps(d, 3)
    assert 0 < resumed.tiles < uninterrupted.tiles, (resumed.tiles, uninterrupted.tiles)
    print(f"checkpointed step resumed: {resumed.tiles} tiles for steps 2-3, {uninterrupted.tiles} uninterrupted")
    _, want = _open_step(full)
    count, got = _open_step(d)
    assert count == 3
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    del got, want
    gc.collect()
    assert _hidden(d) == [] and _hidden(os.path.join(d, "ckpt")) == []
    jask.cleanup_scratch(str(tmp_path / "scratch"))
    assert _leftovers(tmp_path) == []
