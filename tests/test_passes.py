"""Whole passes: bytes moved match the plan's arithmetic; failures stop cleanly and name the tile."""
import os
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jask
from jask.base import BlockParallelOp
from jask.base.base_algo import make_op


def _arr(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_bytes_moved_by_sum_add_and_dot(small_tiles):
    A, B = _arr((10, 7)), _arr((10, 7), 1)
    M = _arr((7, 9), 2)
    a, b, m = jask.from_numpy(A), jask.from_numpy(B), jask.from_numpy(M)
    with jask.profile() as p:
        np.testing.assert_allclose(float(jask.sum(a)), A.sum(), rtol=1e-5)
    assert (p.bytes_read, p.bytes_written) == (A.nbytes, 0)

    with jask.profile() as p:
        c = jask.persist(a + b)
    assert (p.bytes_read, p.bytes_written) == (A.nbytes + B.nbytes, A.nbytes)
    np.testing.assert_allclose(np.asarray(c), A + B)

    # dot: every output tile reads a row of A tiles and a column of M tiles, but the pass is one
    # window, which reads each distinct tile once
    with jask.profile() as p:
        d = jask.persist(a @ m)
    assert p.windows == 1 and p.bytes_read == A.nbytes + M.nbytes
    assert p.bytes_written == 10 * 9 * 4
    np.testing.assert_allclose(np.asarray(d), A @ M, rtol=1e-4, atol=1e-4)


def test_explain_predicts_the_bytes_a_pass_moves(small_tiles):
    A, B = _arr((10, 7)), _arr((10, 7), 1)
    a, b = jask.from_numpy(A), jask.from_numpy(B)
    da, db = jax.grad(lambda a, b: jask.sum(jask.square(a - b)), argnums=(0, 1))(a, b)
    text = jask.explain(da, db)
    assert "in lockstep" in text
    with jask.profile() as p:
        jask.persist(da, db)
    # one pass reads a and b once and writes exactly the two gradients
    assert (p.bytes_read, p.bytes_written) == (A.nbytes + B.nbytes, 2 * A.nbytes)
    assert f"reads {p.bytes_read} B, writes {p.bytes_written} B" in text
    np.testing.assert_allclose(np.asarray(da), 2 * (A - B), rtol=1e-5)


class FailsOnTile(BlockParallelOp):
    """Elementwise copy that raises on one output tile, to test failure mid-pass."""

    def __init__(self, bad=(1, 0)):
        self.bad = bad

    def forward_block(self, a):
        return a

    def index_map(self, out_idx):
        if tuple(out_idx) == self.bad:
            raise RuntimeError("injected failure")
        return [(out_idx,)]

    def backward_block(self, d, a):
        return (d,)

    def output_shape(self, a_shape):
        return a_shape


fails_on_tile = make_op(FailsOnTile)


def test_failure_mid_pass_leaves_nothing_and_names_the_tile(tmp_path, small_tiles):
    a = jask.from_numpy(_arr((12, 12)))
    before = threading.active_count()
    target = tmp_path / "out.zarr"
    with pytest.raises(RuntimeError, match="injected failure") as info:
        fails_on_tile(a).to_zarr(target)
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "(1, 0)" in notes and "failsontile" in notes
    assert not target.exists()
    assert os.listdir(tmp_path) == []  # no hidden partial store either
    assert threading.active_count() <= before  # reader and writer threads stopped


def test_missing_chunk_names_the_array(tmp_path, small_tiles):
    p = tmp_path / "x.zarr"
    jask.from_numpy(_arr((12, 12))).to_zarr(p)
    chunk = next(os.path.join(d, f) for d, _, files in os.walk(p) for f in files if f != "zarr.json")
    os.remove(chunk)
    x = jask.from_zarr(p)
    with pytest.raises(FileNotFoundError) as info:
        float(jask.sum(x))
    assert str(p) in str(info.value) or str(p) in " ".join(getattr(info.value, "__notes__", []))


def test_reads_are_double_buffered(small_tiles, monkeypatch):
    """Reads run at most one window ahead: the prefetcher holds at most a window's tiles."""
    from jask.io import prefetch
    held = []
    real = prefetch.Prefetcher.__exit__

    def spy(self, *exc):
        held.append((self.max_held, self.depth))
        return real(self, *exc)

    monkeypatch.setattr(prefetch.Prefetcher, "__exit__", spy)
    a = jask.from_numpy(_arr((16, 16)))
    jask.set_memory_budget(4 * 4 * 4 * 4 * 6)   # a few 4x4 tiles per window
    with jask.profile() as p:
        float(jask.sum(jask.square(a)))
    assert p.windows > 2
    assert held and all(0 < h <= d < 16 for h, d in held)
