"""Strided slices (``jask/ops/indexing.py`` ``Strided``): each input tile an output tile takes rows from is one
entry, so a window holds one input tile per entry, and an aligned slice reads each input tile once."""
import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jask
import jask.numpy as knp

KEYS = [np.s_[::2, ::3], np.s_[1::2, 5:12:3], np.s_[::-1, -2::-2], np.s_[3:10:5, ::-7], np.s_[::9], np.s_[8::-6, 2],
        np.s_[4:8, 5:9]]


@pytest.fixture
def reads(monkeypatch):
    """Every region read from a store, as ``{(dtype name, (start, stop) per axis): times}``; maps are off, so
    every read goes through ``TileReader.read``."""
    from jask.io import reader
    jask.config.update("read_mmap", False)
    seen = collections.Counter()
    original = reader.TileReader.read

    def read(self, region, out=None):
        seen[(np.dtype(self.dtype).name, tuple((s.start, s.stop) for s in region))] += 1
        return original(self, region, out)

    monkeypatch.setattr(reader.TileReader, "read", read)
    return seen


def _bytes(reads, dtype):
    return sum(n * np.dtype(dtype).itemsize * int(np.prod([b - a for a, b in region]))
               for (name, region), n in reads.items() if name == dtype)


def test_strided_slices_match_numpy_and_their_gradients_match_jnp(small_tiles):
    """Rows, columns, both, negative steps, starts and stops at tile 4, where output tiles straddle input tiles
    (``tests/test_ops.py``'s ``getitem_steps`` runs under ``jit`` and ``jit(grad)`` too)."""
    A = np.random.default_rng(0).standard_normal((11, 13)).astype(np.float32)
    a = jask.from_numpy(A)
    for key in KEYS:
        np.testing.assert_array_equal(np.asarray(a[key]), A[key], err_msg=str(key))
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: v[KEYS[2]])(a)), A[KEYS[2]])
    W = np.random.default_rng(1).standard_normal(A[KEYS[1]].shape).astype(np.float32)
    want = jax.grad(lambda x: jnp.sum(x[KEYS[1]] * W))(jnp.asarray(A))
    np.testing.assert_array_equal(np.asarray(jax.grad(lambda x: knp.sum(x[KEYS[1]] * W))(a)), want)


def _slice_spanning_windows(tmp_path, key, seed):
    """``A[key]`` of a stored (224, 96) A in chunks and tiles of 16, at a budget of a few entries per window;
    checked against NumPy. Returns A and the run's profile."""
    import zarr
    A = np.random.default_rng(seed).standard_normal((224, 96)).astype(np.float32)
    z = zarr.create_array(str(tmp_path / "a.zarr"), shape=A.shape, chunks=(16, 16), dtype="float32", compressors=None)
    z[...] = A
    jask.config.update("tile", 16)
    jask.set_memory_budget(40_000)
    a = jask.from_zarr(str(tmp_path / "a.zarr"))
    with jask.profile() as p:
        got = np.asarray(a[key])
    np.testing.assert_array_equal(got, A[key])
    assert p.windows > np.prod([-(-n // 16) for n in A[key].shape]), "entries must span windows for this test"
    return A, p


@pytest.mark.parametrize("key, tiles", [(np.s_[::2, ::3], 84), (np.s_[1::2, ::-3], 84), (np.s_[::7, 16:80], 56)],
                         ids=["rows_cols", "negative", "rows_of_columns"])
def test_an_aligned_strided_slice_reads_each_input_tile_once(key, tiles, reads, tmp_path):
    """The first row of each output tile sits within ``|step|`` rows of an input tile's start, so every input
    tile feeds one output tile: read once, though a tile's entries are spread over several windows (the
    whole input, 84 tiles, where every tile holds selected elements)."""
    A, p = _slice_spanning_windows(tmp_path, key, 2)
    rows, cols = (np.unique(np.arange(n)[k] // 16) * 16 for n, k in zip(A.shape, key))
    holding = {((r, r + 16), (c, c + 16)) for r in rows for c in cols}     # tiles holding selected elements
    assert {region: n for (dtype, region), n in reads.items() if dtype == "float32"} == dict.fromkeys(holding, 1)
    assert len(holding) == tiles and _bytes(reads, "float32") == tiles * 16 * 16 * 4 <= A.nbytes
    assert p.bytes_read == _bytes(reads, "float32") + _bytes(reads, "int32")   # and the int32 row numbers beside


def test_a_step_past_the_tile_edge_reads_only_tiles_holding_rows(small_tiles, reads):
    """``x[::20]`` at tile 4 takes one row from every fifth tile: those are read, once (it was refused)."""
    L = np.arange(100, dtype=np.float32)
    x = jask.from_numpy(L)
    reads.clear()
    np.testing.assert_array_equal(np.asarray(x[::20]), L[::20])
    np.testing.assert_array_equal(np.asarray(x[97::-40]), L[97::-40])
    assert {region: n for (dtype, region), n in reads.items() if dtype == "float32"} == {
        ((r, r + 4),): 1 for r in (0, 20, 40, 60, 80, 96, 56, 16)}
    got = jax.jit(jax.grad(lambda v: knp.sum(v[::20] * 2.0)))(x)
    np.testing.assert_array_equal(np.asarray(got), np.where(np.arange(100) % 20 == 0, 2.0, 0.0))


def _strided_op(shape, starts, steps, tile):
    from jask.ops.indexing import Strided, _axis_sources
    out = [len(range(s, n, st)) for n, s, st in zip(shape, starts, steps)]
    sources = [_axis_sources(n, s, st, m, tile, tile) for n, s, st, m in zip(shape, starts, steps, out)]
    return Strided(shape, tuple(range(len(shape))), starts, steps, out, sources, (tile,) * len(shape)), out


@pytest.mark.parametrize("starts, steps", [((1, 5), (2, 3)), ((5, 1), (3, 2)), ((5, 6), (3, 3)), ((0, 13), (1, 4))],
                         ids=["columns", "rows", "both", "columns_only"])
def test_an_unaligned_slice_lists_the_tiles_it_shares_with_the_next_output_tile_at_its_edges(starts, steps):
    """``x[1::2, 5::3]``'s output tiles take 4 input tile columns, sharing the last with the next output tile along
    that axis: those shared tiles are a tile's last entries and the next one's first, so a schedule that keeps a
    read for the next window reads them once (the last axis whose tiles share any, where both do)."""
    tile = 8
    op, out = _strided_op((64, 96), starts, steps, tile)
    shares = [k for k in range(2) if any(set(a) & set(b) for a, b in zip(op.sources[k], op.sources[k][1:]))]
    k = shares[-1]
    grid = [-(-m // tile) for m in out]
    for idx in np.ndindex(*grid):
        if idx[k] + 1 == grid[k]:
            continue
        after = tuple(i + (a == k) for a, i in enumerate(idx))
        first, second = [[e[0] for e in op.index_map(i)] for i in (idx, after)]
        shared = set(first) & set(second)
        assert shared and set(first[-len(shared):]) == shared == set(second[:len(shared)]), (idx, first, second)


@pytest.mark.parametrize("key", [np.s_[1::2, 5::3], np.s_[7::5, 16:32], np.s_[5::3, 7::3]],
                         ids=["columns", "rows_of_one_tile_column", "both"])
def test_an_unaligned_strided_slice_reads_each_input_tile_once(key, reads, tmp_path):
    """Neighbouring output tiles share an input tile at their edge (``x[1::2, 5::3]``: 4 tile columns each,
    3 of them their own), read by the last windows of one and the first of the next: kept, it is read once
    (here the tile rows of ``both`` are two output tiles apart, within the keep's horizon)."""
    _slice_spanning_windows(tmp_path, key, 3)
    assert {n for (dtype, _), n in reads.items() if dtype == "float32"} == {1}
