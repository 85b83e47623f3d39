"""A pass spread over 4 devices: each reads its quarter, and the results are one device's.

The main pytest process has one CPU device, so the work runs in a child process
with ``XLA_FLAGS=--xla_force_host_platform_device_count=4``. The child computes
every case once with ``devices`` left at its default (one device) and once with
all four, eagerly and under ``jit``, and prints JSON: per case the bytes each
device read (per pass), the number of passes, and whether results match. The
assertions are here, so a failure names the case and the figures.

Targets (issue 16): each device reads 25% +- one tile of a pass's bytes; elementwise
results equal one device's bit for bit; reductions and contractions (whose partial
sums are added in another order) agree within float32 tolerance.
"""
import json
import os
import subprocess
import sys
import textwrap

import jax
import pytest

import jask

TILE = 4

SCRIPT = textwrap.dedent("""
    import json, os, jax, jax.numpy as jnp, numpy as np, jask, jask.optim
    assert len(jax.devices()) == 4, jax.devices()
    jask.config.update("tile", TILE)
    rng = np.random.default_rng(0)
    X_np = rng.standard_normal((32, 24)).astype(np.float32)
    Y_np = rng.standard_normal((32, 24)).astype(np.float32)
    w_np = rng.standard_normal((24, 8)).astype(np.float32)
    t_np = rng.standard_normal((32, 8)).astype(np.float32)
    X, Y, w, t = (jask.from_numpy(v) for v in (X_np, Y_np, w_np, t_np))
    mse = lambda w: jask.sum(jask.square(X @ w - t))
    step = jax.jit(lambda w: jask.optim.apply_updates(w, -0.01 * jax.grad(mse)(w)))

    def update(w0):
        target = jask.from_numpy(w0)
        target.update_(step(target))
        return target      # read back outside the profile: a host copy, no pass

    CASES = {
        "sum": lambda: float(jask.sum(X)),
        "sum_jit": lambda: float(jax.jit(jask.sum)(X)),
        "elementwise": lambda: np.asarray((X - Y) * 3.0 + X),
        "elementwise_jit": lambda: np.asarray(jax.jit(lambda a, b: (a - b) * 3.0 + a)(X, Y)),
        "dot": lambda: np.asarray(X @ w),
        "dot_jit": lambda: np.asarray(jax.jit(lambda a, b: a @ b)(X, w)),
        "grad": lambda: np.asarray(jax.grad(mse)(w)),
        "grad_jit": lambda: np.asarray(jax.jit(jax.grad(mse))(w)),
        "update_": lambda: update(w_np),
    }
    REF = {
        "sum": lambda: X_np.sum(dtype=np.float64),
        "elementwise": lambda: (X_np - Y_np) * np.float32(3.0) + X_np,
        "dot": lambda: X_np @ w_np,
        "grad": lambda: np.asarray(jax.grad(lambda w: jnp.sum(jnp.square(X_np @ w - t_np)))(w_np)),
        "update_": lambda: np.asarray(w_np - 0.01 * jax.grad(lambda w: jnp.sum(jnp.square(X_np @ w - t_np)))(w_np)),
    }
    report = {}
    only = os.environ.get("JASK_MD_CASES")
    for name, case in CASES.items():
        if only and name not in only.split(","):
            continue
        results, shares = [], None
        for devices in (None, jax.devices()):
            jask.config.update("devices", devices)
            with jask.profile() as p:
                value = case()
            results.append(np.asarray(value))
            if devices is not None:
                shares = dict(bytes={str(d): p.bytes_by_device.get(d, 0) for d in jax.devices()},
                              tiles={str(d): p.tiles_by_device.get(d, 0) for d in jax.devices()},
                              kernel_devices=sorted(str(d) for d in p.devices), passes=p.plans,
                              bytes_read=p.bytes_read)
        want = REF[name.removesuffix("_jit")]()
        one, four = results
        report[name] = dict(shares, bit_equal=bool(np.array_equal(one, four)),
                            max_diff=float(np.max(np.abs(one.astype(np.float64) - four))),
                            one_vs_ref=float(np.max(np.abs(one - want))),
                            four_vs_ref=float(np.max(np.abs(four - want))),
                            scale=float(np.max(np.abs(want))))
    print("REPORT" + json.dumps(report))
""").replace("TILE", str(TILE))


CASES = ["sum", "sum_jit", "elementwise", "elementwise_jit", "dot", "dot_jit", "grad", "grad_jit", "update_"]
# pallas-interpret runs three of them: an eager reduction, a jitted gradient, a jitted update in place (all nine
# took 46 s of the suite): device shares are the executor's, the same for every backend; its kernels' device is
# what differs.
PALLAS_CASES = ["sum", "grad_jit", "update_"]
BACKEND_CASES = [("xla", c) for c in CASES] + [pytest.param("pallas-interpret", c, marks=pytest.mark.slow)
                                               for c in PALLAS_CASES]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """``reports(backend)``: the child's report for that backend, run once per backend and module (a
    parametrized module fixture would run it again for every (backend, case) pair)."""
    done = {}

    def get(backend):
        if backend not in done:
            cases = ",".join(CASES if backend == "xla" else PALLAS_CASES)
            env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JASK_BACKEND=backend,
                       JASK_SCRATCH_DIR=str(tmp_path_factory.mktemp("multidevice")), JAX_PLATFORMS="cpu",
                       JASK_MD_CASES=cases)
            out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                                 timeout=300)
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("REPORT")]
            assert out.returncode == 0 and lines, out.stdout[-2000:] + out.stderr[-3000:]
            done[backend] = json.loads(lines[0][len("REPORT"):])
        return done[backend]
    return get


@pytest.mark.parametrize("backend, case", BACKEND_CASES)
def test_each_device_reads_a_quarter_of_every_pass(reports, backend, case):
    r = reports(backend)[case]
    total = sum(r["bytes"].values())
    assert total == r["bytes_read"] > 0, r
    assert len(r["kernel_devices"]) == 4, r
    tile_bytes = TILE * TILE * 4
    # one tile of slack per pass: each pass's share is within a tile, summed over the block's passes
    for device, got in r["bytes"].items():
        assert abs(got - total / 4) <= tile_bytes * r["passes"], (case, device, got, total, r)


@pytest.mark.parametrize("backend, case", BACKEND_CASES)
def test_four_devices_give_one_devices_results(reports, backend, case):
    r = reports(backend)[case]
    assert r["one_vs_ref"] <= 1e-4 * max(r["scale"], 1.0), r      # the one-device result is right
    if case.startswith("elementwise"):
        assert r["bit_equal"], r                                   # order-independent: bit for bit
    else:
        assert r["max_diff"] <= 1e-5 * max(r["scale"], 1.0), r     # partials summed in another order
    assert r["four_vs_ref"] <= 1e-4 * max(r["scale"], 1.0), r


def test_devices_setting_checks_its_value():
    with pytest.raises(TypeError, match="jax.Device"):
        jask.config.update("devices", ["cpu:0"])
    with pytest.raises(ValueError, match="twice"):
        jask.config.update("devices", [jax.devices()[0]] * 2)
    with pytest.raises(ValueError, match="empty"):
        jask.config.update("devices", [])
    with pytest.raises(ValueError, match="'all'"):
        jask.config.update("devices", "every")


def test_one_device_list_is_todays_pass(small_tiles):
    """``devices`` naming only the compute device changes nothing; ``all`` on one device neither."""
    import numpy as np
    A = np.arange(64, dtype=np.float32).reshape(8, 8)
    a = jask.from_numpy(A)
    for setting in ([jax.devices()[0]], "all", None):
        jask.config.update("devices", setting)
        with jask.profile() as p:
            total = float(jask.sum(a * a))
        assert total == float((A * A).sum())
        assert p.bytes_by_device == {jax.devices()[0]: A.nbytes}
        assert p.windows_by_device == {jax.devices()[0]: p.windows}


def test_no_more_devices_than_projected_windows_fit_in_the_budget(small_tiles):
    """Each device keeps windows of at least one projected tile: n devices may not exceed the budget."""
    import numpy as np
    from jask.exec.driver import make_plan
    from jask.config import config
    from jask.exec.executor import Executor, window_limit
    p = make_plan([(jask.from_numpy(np.ones((32, 24), np.float32)) * 2.0)._node])
    for fit in (1, 3, 4, 9):
        jask.config.update("memory_budget", fit * p.projected_bytes + 1)
        n = len(Executor(p, [jax.devices()[0]] * 4).devices)
        assert n == min(fit, 4)
        assert n * window_limit(p, n) <= config.memory_budget


PLACED = textwrap.dedent("""
    import jax, numpy as np, jask
    from jask.exec import executor, run_windows
    arrived = []     # for each read-ahead tile a kernel stacks: whether it is on that kernel's device
    def spy(wrapped):
        def f(values, dtype, device):
            vs = values if isinstance(values, list) else [values]
            arrived.extend(v.devices() == {device} for v in vs if isinstance(v, jax.Array))
            return wrapped(values, dtype, device)
        return f
    run_windows._stack, run_windows._operand = spy(run_windows._stack), spy(run_windows._operand)
    init = executor.Executor.__init__
    def as_on_an_accelerator(self, *a, **k):
        init(self, *a, **k)
        self.place_on_reader = True        # reader threads copy each tile to its window's device
    executor.Executor.__init__ = as_on_an_accelerator
    jask.config.update("tile", 4)
    jask.config.update("devices", "all")
    A = np.random.default_rng(0).standard_normal((32, 24)).astype(np.float32)
    B = np.random.default_rng(1).standard_normal((24, 8)).astype(np.float32)
    a, b = jask.from_numpy(A), jask.from_numpy(B)
    np.testing.assert_allclose(float(jask.sum(a * a)), (A * A).sum(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(a @ b), A @ B, rtol=1e-5, atol=1e-5)
    assert len(arrived) >= 48 + 12 and all(arrived), (len(arrived), arrived.count(False))
    print("OK")
""")


def test_tiles_read_ahead_for_an_accelerator_arrive_on_their_windows_device(tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JASK_BACKEND="xla",
               JASK_SCRATCH_DIR=str(tmp_path), JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", PLACED], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr[-3000:]
