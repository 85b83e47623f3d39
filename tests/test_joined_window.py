"""One window, one program (jask/exec/joined_window.py), one program per window shape.

A window of several programs (ragged edge tiles, a shared producer, a reduction's partials carried
between windows, low-precision values passed from one program to the next) runs as one call, and
its results equal those of the same programs called one by one (``MAX_JOINED_CALLS = 1``) and
NumPy's. A reduction's first window runs the same compiled program as its later ones.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest

import jask
from jask.exec import run_windows


def _data(*shapes, dtype=np.float32):
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s).astype(dtype) for s in shapes]
    return arrays, [jask.from_numpy(x) for x in arrays]


def _one_by_one(monkeypatch, fn):
    monkeypatch.setattr(run_windows, "MAX_JOINED_CALLS", 1)
    with jask.profile() as p:
        out = fn()
    monkeypatch.undo()
    return out, p


def test_ragged_tiles_and_a_shared_producer_are_one_call(small_tiles, monkeypatch):
    """9x6 in tiles of 4 (four tile shapes); ``x = a - b`` feeds both outputs, computed together."""
    (A, B), (a, b) = _data((9, 6), (9, 6))

    def run():
        x = a - b
        return [np.asarray(v) for v in jask.persist(x * x, jask.sum(x, axis=0))]

    with jask.profile() as p:
        joined = run()
    alone, q = _one_by_one(monkeypatch, run)
    assert p.kernel_calls == p.windows < q.kernel_calls, (p.kernel_calls, p.windows, q.kernel_calls)
    np.testing.assert_allclose(joined[0], (A - B) ** 2, rtol=1e-6)
    np.testing.assert_allclose(joined[1], (A - B).sum(0), rtol=1e-5, atol=1e-6)
    for j, s in zip(joined, alone):
        np.testing.assert_allclose(j, s, rtol=1e-6, atol=1e-6)


def test_partials_carried_between_windows(small_tiles, monkeypatch):
    """A budget of a few tiles: the column sums' partials cross windows of several programs each."""
    (A, B), (a, b) = _data((30, 10), (30, 10))
    jask.set_memory_budget(6000)

    def run():
        return [np.asarray(v) for v in jask.persist(jask.sum(jask.square(a - b), axis=0), jask.sum(a * b, axis=0))]

    with jask.profile() as p:
        joined = run()
    alone, q = _one_by_one(monkeypatch, run)
    assert p.windows > 2 and p.kernel_calls == p.windows < q.kernel_calls, (p.windows, p.kernel_calls)
    np.testing.assert_allclose(joined[0], ((A - B) ** 2).sum(0), rtol=1e-5)
    np.testing.assert_allclose(joined[1], (A * B).sum(0), rtol=1e-5, atol=1e-5)
    for j, s in zip(joined, alone):
        np.testing.assert_allclose(j, s, rtol=1e-6, atol=1e-6)


def test_bfloat16_values_are_cast_between_joined_programs(small_tiles, monkeypatch):
    """A bfloat16 product's tiles (accumulated in float32) reach the next program in bfloat16, as when apart."""
    import ml_dtypes
    (A, B), (a, b) = _data((9, 8), (8, 6), dtype=ml_dtypes.bfloat16)

    def run():
        return np.asarray(jask.sum(jask.square(a @ b), axis=0)).astype(np.float32)

    with jask.profile() as p:
        joined = run()
    alone, _ = _one_by_one(monkeypatch, run)
    ref = (A.astype(np.float32) @ B.astype(np.float32)).astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_allclose(joined, (ref ** 2).sum(0), rtol=2e-2)
    np.testing.assert_array_equal(joined, alone)
    assert p.kernel_calls == p.windows


def test_a_window_of_more_programs_than_the_cap_runs_in_several_calls(small_tiles, monkeypatch):
    """``MAX_JOINED_CALLS = 2``: the four tile shapes of a 9x6 window take two calls."""
    (A, B), (a, b) = _data((9, 6), (9, 6))
    monkeypatch.setattr(run_windows, "MAX_JOINED_CALLS", 2)
    with jask.profile() as p:
        out = np.asarray(jask.persist(jask.square(a - b) + a))
    assert (p.windows, p.kernel_calls) == (1, 2)
    np.testing.assert_allclose(out, (A - B) ** 2 + A, rtol=1e-6)


def test_a_pallas_window_is_one_call_of_one_kernel_per_program(small_tiles, monkeypatch):
    """On Pallas a window's kernels are joined too: two passes (an elementwise op, a column sum) of one
    window each, each window one call of four programs (its tile shapes), each a ``pallas_call`` (none on
    the xla fallback); values as when called one by one and as NumPy's."""
    jask.config.update("backend", "pallas-interpret")
    (A, B), (a, b) = _data((9, 6), (9, 6))

    def run():
        return [np.asarray(v) for v in jask.persist(jask.square(a - b) + a, jask.sum(a * b, axis=0))]

    with jask.profile() as p:
        joined = run()
    alone, q = _one_by_one(monkeypatch, run)
    assert (p.windows, p.kernel_calls, p.window_programs, p.xla_fallback_calls) == (2, 2, 8, 0), p
    assert q.kernel_calls == q.window_programs == 8
    np.testing.assert_allclose(joined[0], (A - B) ** 2 + A, rtol=1e-6)
    np.testing.assert_allclose(joined[1], (A * B).sum(0), rtol=1e-5, atol=1e-6)
    for j, s in zip(joined, alone):
        np.testing.assert_allclose(j, s, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="simulates a compiler's refusal with compiled Pallas on a "
                    "CPU, where it fails at its first call; a TPU or GPU compiles it")
def test_a_joined_pallas_window_the_compiler_refuses_runs_its_calls_one_by_one(small_tiles, monkeypatch):
    """Compiled (not interpret) Pallas kernels on this CPU fail at their first call, as a kernel Mosaic
    refuses does on a TPU: the joined program is refused with a warning, its calls run one by one (each
    refused in turn, run by xla), and the next window joins the xla programs into one call again."""
    from jask.kernels.registry import get_backend
    jask.config.update("backend", "pallas-interpret")
    backend = get_backend("pallas-interpret")
    monkeypatch.setattr(backend, "interpret", False)
    monkeypatch.setattr(backend, "target", lambda: "tpu")
    monkeypatch.setattr(backend, "platform", lambda: "tpu")
    monkeypatch.setattr(run_windows, "kernels_cache", run_windows.Kernels())
    (A, B), (a, b) = _data((9, 6), (9, 6))
    with pytest.warns(RuntimeWarning, match="could not compile a joined window program"):
        with jask.profile() as p:
            first = np.asarray(jask.persist(jask.square(a - b) + a))
    with jask.profile() as q:
        again = np.asarray(jask.persist(jask.square(a - b) + a))
    assert (p.kernel_calls, p.xla_fallback_calls) == (4, 4), p
    assert (q.windows, q.kernel_calls, q.window_programs, q.xla_fallback_calls) == (1, 1, 4, 4), q
    for got in (first, again):
        np.testing.assert_allclose(got, (A - B) ** 2 + A, rtol=1e-6)


def _window_programs():
    """The compiled window programs in the cache: xla's per-window programs and joined windows."""
    from jask.exec.run_windows import kernels_cache
    return [k for k in kernels_cache.programs._entries if isinstance(k, tuple) and k[0] in ("xla-tiles", "joined")]


@pytest.mark.parametrize("backend", ["xla", "pallas-interpret"])
@pytest.mark.parametrize("budget,windows", [(1500, 4), (600, 16)])
def test_the_first_window_of_a_reduction_runs_the_later_windows_program(small_tiles, budget, windows, backend):
    """A column of 16 tiles summed over windows of equal shape compiles ONE program: the first window
    passes a placeholder accumulator marked absent instead of needing a program without one."""
    from jask.exec.run_windows import kernels_cache
    jask.config.update("backend", backend)
    X = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
    x = jask.from_numpy(X)
    jask.set_memory_budget(budget)
    kernels_cache.programs.clear()
    with jask.profile() as p:
        got = np.asarray(jask.sum(x * x, axis=0))
    assert (p.windows, p.kernel_calls, len(_window_programs())) == (windows, windows, 1), _window_programs()
    np.testing.assert_allclose(got, (X * X).sum(0), rtol=1e-5)


def test_a_placeholder_is_never_folded_in(small_tiles):
    """``max`` folds: a placeholder of zeros folded in would turn an all-negative column's max into 0."""
    X = -1.0 - np.random.default_rng(1).random((64, 4)).astype(np.float32)
    jask.set_memory_budget(1500)
    with jask.profile() as p:
        got = np.asarray(jask.numpy.max(jask.from_numpy(X), axis=0))
    assert p.windows == 4
    np.testing.assert_array_equal(got, X.max(0))
