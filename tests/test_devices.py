"""Tile math runs on the compute device: the default backend's first device, or the one set.

Inside ``jit`` jask's host work runs in ``io_callback``, where JAX makes the
host CPU the default device; kernels started there without naming a device
would run on the CPU of a GPU machine. These tests pick the *second* of two
forced host devices, so a kernel that silently falls back to the default
device shows up as running on the wrong one.
"""
import os
import subprocess
import sys
import textwrap

import jax
import pytest

import jask

SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np, jask
    assert len(jax.devices()) == 2, jax.devices()
    d1 = jax.devices()[1]
    jask.config.update("tile", 4)
    jask.config.update("device", d1)
    a_np = np.arange(96, dtype=np.float32).reshape(8, 12) / 7
    b_np = np.ones((12, 8), np.float32) / 3
    a, b = jask.from_numpy(a_np), jask.from_numpy(b_np)

    with jask.profile() as eager:
        total = jask.sum(jask.square(a @ b))
        grads = jax.grad(lambda a: jask.sum(jask.square(a @ b)))(a)
        g = np.asarray(grads)
    with jask.profile() as jitted:
        total_jit = jax.jit(lambda a, b: jask.sum(jask.square(a @ b)))(a, b)
        g_jit = np.asarray(jax.jit(jax.grad(lambda a: jask.sum(jask.square(a @ b))))(a))
    want = float(np.sum(np.square(a_np @ b_np)))
    want_g = jax.grad(lambda a: jnp.sum(jnp.square(a @ b_np)))(a_np)
    np.testing.assert_allclose(float(total), want, rtol=1e-5)
    np.testing.assert_allclose(float(total_jit), want, rtol=1e-5)
    np.testing.assert_allclose(g, want_g, rtol=1e-5)
    np.testing.assert_allclose(g_jit, want_g, rtol=1e-5)
    print("EAGER", sorted(str(d) for d in eager.devices), eager.kernel_calls)
    print("JIT", sorted(str(d) for d in jitted.devices), jitted.kernel_calls)
    assert eager.devices == {d1} and jitted.devices == {d1}, (eager.devices, jitted.devices)
    assert eager.kernel_calls > 0 and jitted.kernel_calls > 0
    # a device that is not the first of devices is refused (they would disagree on the compute device)
    for first, then in ((("device", d1), ("devices", jax.devices())), (("devices", jax.devices()), ("device", d1))):
        jask.config.update("device", None), jask.config.update("devices", None)
        jask.config.update(*first)
        try:
            jask.config.update(*then)
            raise AssertionError(f"{then} after {first} was accepted")
        except ValueError as e:
            assert "must be the first of devices" in str(e), e
    jask.config.update("devices", None), jask.config.update("device", d1)
    jask.config.update("devices", "all")            # "all" puts the chosen device first
    from jask.exec.devices import compute_device, compute_devices
    assert compute_devices() == [d1, jax.devices()[0]] and compute_device() == d1
    print("OK")
""")


@pytest.mark.parametrize("backend", ["xla", "pallas-interpret"])
def test_every_kernel_runs_on_the_chosen_device(tmp_path, backend):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JASK_BACKEND=backend,
               JASK_SCRATCH_DIR=str(tmp_path), JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr[-3000:]


def test_default_device_is_the_default_backends_first(small_tiles):
    import jax
    a = jask.from_numpy(__import__("numpy").ones((8, 8), "float32"))
    with jask.profile() as p:
        jask.sum(a + a)
    assert p.devices == {jax.devices()[0]}


def test_passes_spread_over_every_accelerator_by_default_and_one_cpu_device(monkeypatch):
    """The default ``devices`` (None): every local device of an accelerator platform (the compute device
    first), one device on the CPU (forced host devices share its cores), one where ``device`` names it.
    The platform is simulated: this machine has one CPU device."""
    from types import SimpleNamespace
    from jask.exec import devices
    chips = [SimpleNamespace(platform="tpu", id=i) for i in range(4)]
    monkeypatch.setattr(jax, "local_devices", lambda backend=None: chips)
    assert devices.compute_devices() == chips
    monkeypatch.setattr(jask.config.config, "device", chips[2])
    assert devices.compute_devices() == [chips[2]]
    monkeypatch.setattr(jask.config.config, "device", None)
    cpus = [SimpleNamespace(platform="cpu", id=i) for i in range(4)]
    monkeypatch.setattr(jax, "local_devices", lambda backend=None: cpus)
    assert devices.compute_devices() == [cpus[0]]
    monkeypatch.setattr(jask.config.config, "devices", "all")
    assert devices.compute_devices() == cpus


def test_device_setting_checks_its_value():
    with pytest.raises(TypeError, match="jax.Device"):
        jask.config.update("device", "gpu:0")
    with pytest.raises(ValueError, match="precision"):
        jask.config.update("precision", "fast")


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="simulates an accelerator on a CPU-only machine; "
                    "on a real one, code paths that ask for the actual compute device see it (tpu_tests cover it)")
def test_callback_that_cannot_reach_the_device_computes_on_the_host(small_tiles, monkeypatch):
    """Inside jit, if the accelerator is held by the program waiting for the callback, jask falls back.

    Simulated on the CPU: the compute device claims to be an accelerator and the
    probe says it cannot be reached; the pass must finish on the host with the
    right value and one warning, not hang. (A jitted function whose only
    traced argument is a scalar runs on the default device: the case the probe
    is for; DiskArray arguments put the program on the host.)
    """
    import jax
    import numpy as np
    from jask.exec import executor
    from jask.exec import devices

    class FakeAccelerator:
        platform = "gpu"

    fake = FakeAccelerator()
    monkeypatch.setattr(devices, "compute_device", lambda: fake)
    monkeypatch.setattr(devices, "compute_devices", lambda: [fake])   # this one accelerator
    monkeypatch.setattr(executor, "compute_devices", lambda: [fake])
    monkeypatch.setattr(executor, "callback_can_use", lambda d: d is not fake)
    monkeypatch.setattr(devices, "_warned", set())
    A = np.arange(64, dtype=np.float32).reshape(8, 8)
    a = jask.from_numpy(A)
    with pytest.warns(RuntimeWarning, match="ran on the host CPU"):
        with jask.profile() as p:
            total = jax.jit(lambda s: jask.sum(a * s))(np.float32(2))   # a traced scalar: a callback
    np.testing.assert_allclose(float(total), float((A * 2).sum()))
    assert p.devices == {jax.devices("cpu")[0]}


def test_pallas_windows_it_cannot_run_fall_back_per_window(small_tiles, monkeypatch):
    """A refused Pallas window runs as the xla program of ITS index table, window after window.

    The xla program bakes a window's table in, so it must be cached per table:
    two windows of one shape with different tables must not share it.
    """
    import numpy as np
    from jask.exec.program_cache import ProgramCache
    from jask.exec.run_windows import kernels_cache
    from jask.kernels import pallas as P
    from jask.kernels.legality import WindowNotLegal

    def refuse(self, op, spec):
        raise WindowNotLegal("refused for the test")

    monkeypatch.setattr(P.PallasBackend, "compile_window", refuse)
    monkeypatch.setattr(kernels_cache, "_programs", ProgramCache())
    jask.config.update("backend", "pallas-interpret")
    jask.set_memory_budget(4096)   # many small windows
    A = np.random.default_rng(3).standard_normal((16, 12)).astype(np.float32)
    B = np.random.default_rng(4).standard_normal((12, 8)).astype(np.float32)
    a, b = jask.from_numpy(A), jask.from_numpy(B)
    with jask.profile() as p:
        out = np.asarray(a @ b)
        total = float(jask.sum(a * a))
    np.testing.assert_allclose(out, A @ B, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(total, float((A * A).sum()), rtol=1e-5)
    assert p.windows > 2 and p.xla_fallback_calls == p.window_programs >= p.kernel_calls


def test_a_program_the_platform_compiler_refuses_runs_on_xla_from_then_on():
    """A compiled Pallas program whose FIRST call fails (Mosaic/Triton refusing what legality allowed)
    is refused with one warning; failures of a program that already ran, and interpret-mode
    failures (CI's kernel bugs), propagate."""
    from types import SimpleNamespace
    from jask.exec.run_windows import Kernels

    def failing(*args):
        raise RuntimeError("Mosaic failed to compile TPU kernel\nmore detail")

    call = SimpleNamespace(program=SimpleNamespace(key=lambda: "prog", root_op=SimpleNamespace(label="dot")),
                           spec="spec")
    compiled = SimpleNamespace(name="pallas", interpret=False, compile_window=lambda op, spec: failing)
    kernels = Kernels()
    with pytest.warns(RuntimeWarning, match=r"could not compile the window program of dot \(RuntimeError: "
                                            r"Mosaic failed to compile TPU kernel\)"):
        assert kernels.run_stacked(compiled, call, failing, ()) is None
    assert kernels._programs.get(Kernels._stacked_key(compiled, call)) == (None, "refused")

    calls = []

    def fails_second_time(*args):
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("device lost")
        return "out"

    kernels = Kernels()
    assert kernels.run_stacked(compiled, call, fails_second_time, ()) == "out"
    with pytest.raises(RuntimeError, match="device lost"):
        kernels.run_stacked(compiled, call, fails_second_time, ())

    interpret = SimpleNamespace(name="pallas-interpret", interpret=True)
    with pytest.raises(RuntimeError, match="Mosaic failed"):
        Kernels().run_stacked(interpret, call, failing, ())


def test_a_temporary_outlives_the_dispatched_program_that_reads_it(small_tiles):
    """A store read by an asynchronously dispatched program stays until that program has read it.

    On a GPU, a temporary was deleted while a dispatched program still had to
    read it ("deleted while still in use"). Here: a jitted call over a
    temporary is dispatched, the user drops the temporary and starts another
    op at once, and every read is slowed down, so a release that did not wait
    for the program would delete the store under it.
    """
    import gc
    import os
    import time

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jask.io import faults

    A = np.arange(96, dtype=np.float32).reshape(8, 12)
    tmp = jask.persist(jask.from_numpy(A) * 2.0)            # a scratch store, owned by jask
    path = tmp.path
    slow = lambda point, info: time.sleep(0.02) if point == "before_tile_read" else None  # noqa: E731
    f = jax.jit(lambda t, s: jask.sum(t * s))
    with faults.armed(slow):
        result = f(tmp, jnp.float32(3.0))                    # may return before its callbacks have run
        del tmp
        gc.collect()
        other = jask.sum(jask.from_numpy(A))                 # an op call: releases finished calls' nodes
        np.testing.assert_allclose(float(result), float((A * 6).sum()), rtol=1e-6)
    np.testing.assert_allclose(float(other), float(A.sum()), rtol=1e-6)
    jask.sum(jask.from_numpy(A))                            # a later op releases the temporary
    gc.collect()
    assert not os.path.exists(path), "the temporary is deleted once nothing reads it"
