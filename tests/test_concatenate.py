"""``concatenate``/``stack`` (``jask/ops/indexing.py``): pieces padded to their places by ``Strided`` and joined by
OR-ing their bits; the projection charges what one output tile reaches (``jask/plan/walk.py`` ``TileReach``)."""
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import zarr

import jask
import jask.numpy as knp
from jask.ops.indexing import _axis_kind


def _special(shape, dtype, seed):
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    x.flat[:4] = np.array([-0.0, np.nan, -np.inf, np.inf]).astype(dtype)
    return x


def _bits(x):
    x = np.asarray(x)
    return x.view(f"uint{8 * x.itemsize}") if x.dtype.kind == "f" or x.dtype == ml_dtypes.bfloat16 else x


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.int32, np.bool_])
def test_concatenate_and_stack_equal_numpy_bit_for_bit(small_tiles, dtype):
    """Pieces at tile edges and across them, along every axis: -0.0, NaN and infinities come back as they went in."""
    A, B, C = (_special(s, np.float32, k) for k, s in enumerate([(8, 6), (5, 6), (8, 3)]))
    A, B, C = ((x > 0) if dtype == np.bool_ else x.astype(dtype) if dtype != np.int32 else
               np.nan_to_num(x * 9, posinf=7, neginf=-7).astype(np.int32) for x in (A, B, C))
    a, b, c = (jask.from_numpy(x) for x in (A, B, C))
    cases = [(knp.concatenate([a, b, a]), np.concatenate([A, B, A])),
             (knp.concatenate([a[:4], a[4:]]), A),
             (knp.concatenate([c, a, c], axis=-1), np.concatenate([C, A, C], axis=-1)),
             (knp.stack([a, a[::-1]]), np.stack([A, A[::-1]])),
             (knp.stack([a, a, a], axis=2), np.stack([A, A, A], axis=2)),
             (knp.stack([b, b], axis=1), np.stack([B, B], axis=1))]
    for got, want in cases:
        got = np.asarray(got)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(_bits(got), _bits(want))


def test_concatenate_of_mixed_dtypes_promotes_as_jnp(small_tiles):
    A, I = _special((8, 6), np.float32, 0), np.arange(18, dtype=np.int32).reshape(3, 6)
    got = knp.concatenate([jask.from_numpy(I), jask.from_numpy(A)])
    want = jnp.concatenate([I, A])
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(_bits(np.asarray(got)), _bits(np.asarray(want)))


def test_concatenate_and_stack_gradients_match_jnp(small_tiles):
    """The join's tangent is the sum of the pieces' (each zero outside its piece); each pad takes its rows back."""
    rng = np.random.default_rng(3)
    A, B = rng.standard_normal((8, 6)).astype(np.float32), rng.standard_normal((5, 6)).astype(np.float32)
    W = rng.standard_normal((6, 21)).astype(np.float32)
    V = rng.standard_normal((8, 6, 2)).astype(np.float32)

    def loss(xp, x, y):
        joined = xp.concatenate([x, y, x], axis=0)                      # 21 rows: pieces across tile edges
        return xp.sum(joined * W.T) + xp.sum(xp.stack([x, x * 2.0], axis=2) * V)

    want = jax.grad(lambda x, y: loss(jnp, x, y), argnums=(0, 1))(A, B)
    got = jax.jit(jax.grad(lambda x, y: loss(knp, x, y), argnums=(0, 1)))(jask.from_numpy(A), jask.from_numpy(B))
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-5)


def _stored(tmp_path, name, x, chunk):
    z = zarr.create_array(str(tmp_path / f"{name}.zarr"), shape=x.shape, chunks=(chunk,) * x.ndim,
                          dtype=x.dtype, compressors=None)
    z[...] = x
    return jask.from_zarr(str(tmp_path / f"{name}.zarr"))


def test_pieces_at_tile_edges_read_only_their_tiles(tmp_path):
    """Each output tile is a piece's tile whole: no int32 row numbers are read (each was a tiny read per window,
    and the read-ahead counts reads: it held back the next tile's read, halving a concatenate's read rate)."""
    jask.config.update("tile", 16)
    A, B = (np.random.default_rng(k).standard_normal((32, 48)).astype(np.float32) for k in (0, 1))
    a, b = _stored(tmp_path, "a", A, 16), _stored(tmp_path, "b", B, 16)
    for got, want in ((knp.concatenate([a, b]), np.concatenate([A, B])),
                      (knp.concatenate([b, a], axis=1), np.concatenate([B, A], axis=1)),
                      (knp.stack([a, b], axis=1), np.stack([A, B], axis=1)),
                      (a[16:32, 32:48], A[16:32, 32:48])):
        with jask.profile() as p:
            np.testing.assert_array_equal(np.asarray(got), want)
        assert p.bytes_read == (want.nbytes if want.shape != (16, 16) else 16 * 16 * 4), want.shape


def test_the_projection_charges_the_one_piece_a_tile_reads(tmp_path):
    """An output tile of ``concatenate([a, b])`` reads a tile of a or of b, not both: the plan charges one (40 KiB
    at edge 32: 4 slots of a's tile, 2 of the concatenate, 2 of b's padded zero piece, 2 of the output; the
    padding inlined in its consumer's program holds no tile). Charging both pieces took half the edge: tiles a
    quarter of the chunks, whose reads decode whole chunks (4x slower per byte)."""
    A, B = (np.random.default_rng(k).standard_normal((64, 64)).astype(np.float32) for k in (0, 1))
    a, b = _stored(tmp_path, "a", A, 32), _stored(tmp_path, "b", B, 32)
    jask.set_memory_budget(48 * 1024)
    x = knp.concatenate([a, b], axis=1)
    plan = jask.explain(x).splitlines()[0]
    assert re.match(r"plan: tile edge 32, projected peak 40\.0 KiB", plan), plan
    np.testing.assert_array_equal(np.asarray(x), np.concatenate([A, B], axis=1))


def test_past_max_reach_tiles_every_piece_is_charged(tmp_path, monkeypatch):
    """Walking every output tile's index maps is bounded: past ``MAX_REACH_TILES`` tiles the plan charges all."""
    from jask.plan import memory
    monkeypatch.setattr(memory, "MAX_REACH_TILES", 4)        # the (64, 128) result has 8 tiles of 32
    A, B = (np.random.default_rng(k).standard_normal((64, 64)).astype(np.float32) for k in (0, 1))
    a, b = _stored(tmp_path, "a", A, 32), _stored(tmp_path, "b", B, 32)
    jask.set_memory_budget(48 * 1024)                        # every piece charged: 56 KiB at edge 32
    x = knp.concatenate([a, b], axis=1)
    assert jask.explain(x).startswith("plan: tile edge 16"), jask.explain(x)
    np.testing.assert_array_equal(np.asarray(x), np.concatenate([A, B], axis=1))


@pytest.mark.parametrize("args, kind", [
    ((64, 0, 1, 32, 16, 16), "whole"),        # x[:32] at edge 16
    ((64, 16, 1, 32, 16, 16), "whole"),       # x[16:48]
    ((64, -64, 1, 128, 16, 16), "whole"),     # the second piece of a concatenate of two 64-row pieces
    ((60, 0, 1, 64, 16, 16), "rows"),         # a 60-row piece: its last output tile is part padding
    ((64, 4, 1, 32, 16, 16), "rows"),         # x[4:36]: every output tile straddles two input tiles
    ((64, 0, 2, 32, 16, 16), "rows"),         # x[::2]
    ((1, 0, 1, 2, 1, 2), "fixed"),            # stack's new axis: one output tile
    ((8, 7, -1, 8, 16, 16), "fixed"),         # x[::-1] of one tile
])
def test_axis_kinds(args, kind):
    """Which axes of a ``Strided`` need their row numbers read (``_axis_kind``)."""
    assert _axis_kind(*args) == kind
