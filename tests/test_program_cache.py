"""Compiled window programs are bounded by the bytes they hold (jask.exec.program_cache)."""
import numpy as np
import pytest

import jask
from jask.exec import program_cache
from jask.exec.program_cache import Charged, ProgramCache
from jask.exec.run_windows import kernels_cache


def test_least_recently_used_entries_go_once_the_bytes_pass_the_limit(monkeypatch):
    monkeypatch.setattr(jask.config.config, "program_cache", 10)
    cache = ProgramCache()
    for key in "abc":
        cache.put(key, key.upper(), 4)
    assert len(cache) == 2 and cache.get("a") is None and cache.nbytes == 8 and cache.evictions == 1
    assert cache.get("b") == "B"                   # b is now the most recently used
    cache.put("d", "D", 4)
    assert cache.get("c") is None and cache.get("b") == "B" and cache.nbytes == 8
    cache.charge("d", 30)                          # measured bigger than the limit: the newest stays alone
    assert len(cache) == 1 and cache.get("d") == "D" and cache.nbytes == 30
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0


def test_a_program_is_charged_its_estimate_at_its_first_call_only(monkeypatch):
    import jax
    import jax.numpy as jnp
    monkeypatch.setattr(jask.config.config, "program_cache", None)
    cache, traces = ProgramCache(), []
    jitted = jax.jit(lambda v: traces.append(1) or jnp.tanh(v) * 2)
    fn = Charged(jitted, cache, "k")
    cache.put("k", fn)
    x = jnp.ones(8)
    want = program_cache.PROGRAM_BASE_BYTES + program_cache.BYTES_PER_HLO_CHAR * len(jitted.lower(x).as_text())
    # against jnp on the same device: a TPU's float32 tanh differs from NumPy's by 3e-6
    np.testing.assert_allclose(np.asarray(fn(x)), np.asarray(jnp.tanh(x) * 2), rtol=1e-6)
    assert cache.nbytes == want
    np.testing.assert_allclose(np.asarray(fn(x + 1)), np.asarray(jnp.tanh(x + 1) * 2), rtol=1e-6)
    assert cache.nbytes == want and len(traces) == 1          # estimated once; the call reused the trace
    plain = Charged(lambda v: v, cache, "plain")             # not a jax.jit function: the default charge
    cache.put("plain", plain)
    plain(1)
    assert cache.nbytes == want + program_cache.DEFAULT_PROGRAM_BYTES


def test_default_limit_is_a_quarter_of_the_budget_with_a_floor():
    jask.set_memory_budget("1GiB")
    assert program_cache.limit_bytes() == 2**30 // 4
    jask.set_memory_budget("64MB")
    assert program_cache.limit_bytes() == program_cache.MIN_LIMIT_BYTES
    jask.config.update("program_cache", "32MiB")
    assert program_cache.limit_bytes() == 32 * 2**20
    with pytest.raises(ValueError, match="cannot parse memory size"):
        jask.config.update("program_cache", "lots")


def test_distinct_chains_keep_the_cache_within_its_limit_and_stay_correct():
    """Each factor below is a constant of its program: 24 distinct programs against a 12 MiB limit."""
    jask.config.update("tile", 64)
    jask.config.update("program_cache", "12MiB")
    kernels_cache._programs.clear()
    a = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    x = jask.from_numpy(a)
    before = kernels_cache._programs.evictions
    for i in range(24):
        got = float(jask.sum(x * float(i + 2) + 1.0))
        np.testing.assert_allclose(got, float((a * np.float32(i + 2) + 1).sum()), rtol=1e-4)
        assert kernels_cache._programs.nbytes <= 12 * 2**20 or len(kernels_cache._programs) == 1
    assert kernels_cache._programs.evictions > before
    # every compiled program is charged at least the base; the other entries (a Pallas backend's traced
    # kernels, partial tiles' shapes) are small records
    cache = kernels_cache._programs
    programs = [key for key, value in cache._entries.items()
                if isinstance(value, Charged) or (isinstance(value, tuple) and isinstance(value[0], Charged))]
    assert programs and all(cache._bytes[key] >= program_cache.PROGRAM_BASE_BYTES for key in programs)
