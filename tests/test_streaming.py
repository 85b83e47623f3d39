"""Streaming I/O: tile reader routes, read-ahead, write-behind, shards, profiling.

Everything here is checked with deterministic counters and events, never with
wall-clock times.
"""
import io
import os
import threading

import numpy as np
import pytest
import zarr

import jask
from jask.io.prefetch import Prefetcher
from jask.io.buffers import BufferPool, aligned_empty
from jask.io.reader import MissingChunkError, TileKey, TileReadError, TileReader
from jask.io.open_local import open_existing
from jask.io.store import PendingStore
from jask.io.writer import ShardWriter, TileWriteError, WriteBehind
from jask.api.observe import profile
from jask.exec.progress import Progress, progress

SHAPE = (37, 45)


def _data(shape=SHAPE, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _regions(shape, tile):
    return [tuple(slice(i * t, min((i + 1) * t, d)) for i, t, d in zip(idx, tile, shape))
            for idx in np.ndindex(*[-(-d // t) for d, t in zip(shape, tile)])]


def _write(path, a, chunks, shards=None, compressors=None, tile=None):
    """A committed jask store holding ``a``, written tile by tile in C order."""
    pending = PendingStore(str(path), a.shape, a.dtype, chunks, compressors=compressors, shards=shards)
    for reg in _regions(a.shape, tile or chunks):
        pending.write(reg, a[reg])
    store = pending.commit(owned=False)
    return store


def _zstd():
    from zarr.codecs import ZstdCodec
    return [ZstdCodec(level=1)]


LAYOUTS = {
    "chunk": dict(chunks=(8, 8)),
    "shard": dict(chunks=(8, 8), shards=(16, 24)),
    "shard-rows": dict(chunks=(8, 8), shards=(8, 48)),
    "zstd": dict(chunks=(8, 8), compressors="zstd"),
    "zstd-shard": dict(chunks=(8, 8), shards=(16, 16), compressors="zstd"),
}
try:
    import tensorstore  # noqa: F401
    DECODER = "tensorstore"
except ImportError:
    DECODER = "zarr"
MODES = {"chunk": "chunk", "shard": "shard", "shard-rows": "shard", "zstd": DECODER, "zstd-shard": DECODER}


@pytest.fixture(params=["default", "zarr-only"])
def decoder(request, monkeypatch):
    """Run compressed reads through TensorStore (when installed) and through zarr-python."""
    if request.param == "zarr-only":
        monkeypatch.setattr("jask.io.reader.USE_TENSORSTORE", False)
        return "zarr"
    return DECODER


def _layout(name):
    kw = dict(LAYOUTS[name])
    if kw.get("compressors") == "zstd":
        kw["compressors"] = _zstd()
    return kw


# ---------------------------------------------------------------- reader routes

@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("write_tile", [(8, 8), (5, 7)], ids=["aligned-writes", "ragged-writes"])
def test_reader_reads_every_region_of_every_layout(tmp_path, layout, write_tile, decoder):
    a = _data()
    store = _write(tmp_path / "a.zarr", a, tile=write_tile, **_layout(layout))
    np.testing.assert_array_equal(zarr.open_array(store.path)[...], a)
    reader = TileReader(store)
    assert reader.mode == (decoder if MODES[layout] == DECODER else MODES[layout]) and reader.dense
    regions = _regions(a.shape, (8, 8)) + _regions(a.shape, (6, 10)) + [(slice(0, 37), slice(0, 45)),
                                                                        (slice(3, 4), slice(44, 45))]
    for reg in regions:
        np.testing.assert_array_equal(reader.read(reg), a[reg], err_msg=str(reg))
    out = aligned_empty((8, 8), np.float32)
    assert reader.read((slice(8, 16), slice(16, 24)), out=out) is out
    np.testing.assert_array_equal(out, a[8:16, 16:24])


@pytest.mark.parametrize("layout", ["chunk", "shard"])
def test_a_tile_inside_a_wide_chunk_reads_its_rows_not_the_chunk(tmp_path, monkeypatch, layout):
    """Chunks of 32 x 64 read as 8 x 16 tiles: each tile reads its 8 rows of the chunk (4x the tile,
    one range) or, for a 8 x 4 part (16x), row by row; never the 32 x 64 chunk. Values match."""
    from jask.io import reader as reader_mod
    a = _data((64, 128))
    store = _write(tmp_path / "w.zarr", a, chunks=(32, 64), shards=(64, 128) if layout == "shard" else None)
    sizes = []
    pread = reader_mod._pread_into
    monkeypatch.setattr(reader_mod, "_pread_into",
                        lambda fd, view, off: (sizes.append(len(view)), pread(fd, view, off)))
    reader = TileReader(store)
    for tile, most in (((8, 16), 8 * 64 * 4), ((8, 4), 4 * 4)):
        for reg in _regions(a.shape, tile):
            sizes.clear()
            np.testing.assert_array_equal(reader.read(reg), a[reg], err_msg=str(reg))
            assert sizes and max(sizes) <= most and sum(sizes) <= reader_mod.BAND_WASTE * a[reg].nbytes, (reg, sizes)


@pytest.mark.parametrize("dtype", [np.int16, np.uint8, np.float64, np.bool_])
def test_reader_handles_other_dtypes_and_1d(tmp_path, dtype):
    a = (np.arange(101) % 7).astype(dtype)
    store = _write(tmp_path / "a.zarr", a, chunks=(8,), shards=(24,))
    reader = TileReader(store)
    for reg in _regions(a.shape, (10,)):
        np.testing.assert_array_equal(reader.read(reg), a[reg])


def test_aligned_buffers_and_pool_reuse_only_free_buffers():
    b = aligned_empty((3, 5), np.float32)
    assert b.ctypes.data % 4096 == 0 and b.shape == (3, 5) and b.flags.c_contiguous
    pool = BufferPool(keep=4)
    first = pool.get((4, 4), np.float32)
    second = pool.get((4, 4), np.float32)      # ``first`` is still held here
    assert second is not first and pool.allocated == 2
    view = second[1:]                           # a view keeps ``second``'s memory busy
    del first
    assert pool.get((4, 4), np.float32) is not second
    assert pool.reused == 1
    del view, second
    assert pool.reused == 1 and pool.allocated == 2


def test_pool_follows_the_running_shape_and_trims_what_it_keeps():
    """A new shape drops the others' buffers beyond ``retain_bytes`` (0 here), in use or not (their users
    keep them); ``trim`` keeps at most the bytes asked for."""
    pool = BufferPool(keep=4)
    a, b = pool.get((4, 4), np.float32), pool.get((4, 4), np.float32)
    held = pool.get((4, 4), np.float32)
    del a, b
    c = pool.get((8, 8), np.float32)              # the (4, 4) buffers go from the pool; ``held`` is still usable
    assert list(pool._free) == [((8, 8), np.dtype(np.float32))] and held.shape == (4, 4)
    d = pool.get((8, 8), np.float32)
    back = pool.get((4, 4), np.float32, retain_bytes=8 * 8 * 4)   # keeps one (8, 8): the newest, ``d``
    del c, d
    pool.trim(8 * 8 * 4 + 4 * 4 * 4)              # room for ``back`` (in use: counted) and one (8, 8) buffer
    kept = pool._free[(8, 8), np.dtype(np.float32)]
    assert len(kept) == 1 and pool._free[(4, 4), np.dtype(np.float32)] == [back]
    again = pool.get((8, 8), np.float32)
    assert again is kept[0] and pool.reused == 1


def test_pool_reuses_alternating_full_and_edge_tiles_within_retain_bytes():
    pool = BufferPool(keep=2)
    for _ in range(10):                           # a row of full tiles, then its edge tile, row after row
        pool.get((8, 8), np.float32, retain_bytes=1 << 20)
        pool.get((8, 3), np.float32, retain_bytes=1 << 20)
    assert pool.allocated == 2
    for i in range(2 * BufferPool.MAX_SHAPES):    # more shapes than it pools: only the newest stay
        pool.get((i + 1, 1), np.float32, retain_bytes=1 << 20)
    assert len(pool._free) == BufferPool.MAX_SHAPES


def test_prefetcher_leaves_buffers_for_the_next_pass(tmp_path):
    """With ``retain_bytes`` the next pass over the same tiles allocates no read buffer."""
    jask.config.update("read_mmap", False)     # whole chunks would be mapped, not read into buffers
    a = _data((32, 48))
    store = _write(tmp_path / "a.zarr", a, **_layout("chunk"))
    regions = _regions(a.shape, (8, 8))
    reqs = lambda: [(TileKey(0, idx), (store, reg)) for idx, reg in enumerate(regions)]
    for retain, second_pass in ((1 << 20, 0), (0, None)):
        with Prefetcher(reqs(), depth=2, retain_bytes=retain) as p:
            sums = [float(block.sum()) for _, block in p]
        assert len(sums) == len(regions)
        with Prefetcher(reqs(), depth=2) as q:
            got = [block.copy() for _, block in q]
        np.testing.assert_array_equal(got[-1], a[regions[-1]])
        if second_pass is not None:
            assert q.buffers_allocated == second_pass
        else:
            assert q.buffers_allocated >= 1


def test_foreign_store_missing_chunk_reads_fill_value(tmp_path):
    z = zarr.create_array(str(tmp_path / "f.zarr"), shape=(16, 16), chunks=(8, 8), dtype="f4",
                          compressors=None, fill_value=3.0)
    z[:8, :] = 1.0                               # chunks of the lower half are never written
    reader = TileReader(open_existing(str(tmp_path / "f.zarr"), "r"))
    assert reader.mode == "chunk" and not reader.dense
    np.testing.assert_array_equal(reader.read((slice(8, 16), slice(0, 8))), np.full((8, 8), 3.0, "f4"))
    np.testing.assert_array_equal(reader.read((slice(4, 12), slice(0, 8)))[:4], np.ones((4, 8), "f4"))


def test_big_endian_store_is_decoded(tmp_path, decoder):
    from zarr.codecs import BytesCodec
    z = zarr.create_array(str(tmp_path / "b.zarr"), shape=(10, 10), chunks=(4, 4), dtype="f4",
                          serializer=BytesCodec(endian="big"), compressors=None)
    z[...] = np.arange(100, dtype="f4").reshape(10, 10)
    reader = TileReader(open_existing(str(tmp_path / "b.zarr"), "r"))
    assert reader.mode == decoder
    np.testing.assert_array_equal(reader.read((slice(2, 9), slice(3, 10))),
                                  np.arange(100, dtype="f4").reshape(10, 10)[2:9, 3:10])


# ---------------------------------------------------------------- prefetcher

def _gated_reads(n, gates=None, log=None):
    """Read callables returning their index; each waits for its gate (if any) first."""
    def make(i):
        def read():
            if log is not None:
                log.append(i)
            if gates is not None:
                assert gates[i].wait(10), f"gate {i} never opened"
            return i
        return read
    return [(i, make(i)) for i in range(n)]


@pytest.mark.parametrize("depth,threads", [(1, 1), (2, 1), (2, 2), (3, 3), (5, 2)])
def test_prefetcher_yields_in_order_and_never_holds_more_than_depth(depth, threads):
    with Prefetcher(_gated_reads(40), depth=depth, threads=threads) as p:
        got = [k for k, v in p if k == v]
    assert got == list(range(40))
    assert 1 <= p.max_held <= depth and p.reads == 40


def test_prefetcher_in_order_when_later_reads_finish_first():
    gates = [threading.Event() for _ in range(4)]
    gates[1].set()                               # read 1 finishes while read 0 is still blocked
    with Prefetcher(_gated_reads(4, gates), depth=2, threads=2) as p:
        it = iter(p)
        while p.reads < 2:                       # both threads have started a read
            threading.Event().wait(0.001)
        gates[0].set()
        first = next(it)
        for g in gates:
            g.set()
        rest = list(it)
    assert [first[0]] + [k for k, _ in rest] == [0, 1, 2, 3]


def test_prefetcher_fills_depth_and_stops_there():
    started = threading.Semaphore(0)
    log = []

    def make(i):
        def read():
            log.append(i)
            started.release()
            return i
        return read
    with Prefetcher(((i, make(i)) for i in range(10)), depth=3, threads=3) as p:
        for _ in range(3):
            assert started.acquire(timeout=10)
        # Three reads are done and none was taken: no thread may start a fourth.
        assert not started.acquire(timeout=0.05)
        assert p.held == 3 and p.max_held == 3 and sorted(log) == [0, 1, 2]
        assert [k for k, _ in p] == list(range(10))
    assert p.max_held == 3


def test_prefetcher_read_error_names_tile_and_stops_threads():
    log = []

    def boom():
        raise ValueError("disk on fire")
    reqs = _gated_reads(20, log=log)
    reqs[5] = (TileKey("a", (1, 2)), boom)
    p = Prefetcher(reqs, depth=2, threads=2)
    seen = []
    with pytest.raises(TileReadError, match=r"tile \(1, 2\).*ValueError: disk on fire") as info:
        for k, _ in p:
            seen.append(k)
    assert seen == [0, 1, 2, 3, 4]               # everything before the failure, in order
    assert isinstance(info.value.__cause__, ValueError) and info.value.tile == (1, 2)
    assert p.alive_threads == 0
    assert max(log) < 5 + 2                      # no read started more than depth past the failure


def test_prefetcher_error_in_request_list_is_raised_in_order():
    def requests():
        yield from _gated_reads(3)
        raise KeyError("bad index map")
    with Prefetcher(requests(), depth=2) as p:
        it = iter(p)
        assert [next(it)[0] for _ in range(3)] == [0, 1, 2]
        with pytest.raises(TileReadError, match="list of tiles to read.*bad index map"):
            next(it)
    assert p.alive_threads == 0


def test_prefetcher_close_midway_stops_threads_promptly():
    gates = [threading.Event() for _ in range(100)]
    for g in gates[:3]:
        g.set()
    p = Prefetcher(_gated_reads(100, gates), depth=2, threads=2)
    assert next(iter(p))[0] == 0
    gates[3].set()                               # let the reads under way finish
    gates[4].set()
    p.close()
    assert p.alive_threads == 0 and p.reads <= 5
    assert list(p) == []


def test_prefetcher_rejects_bad_depth():
    with pytest.raises(ValueError, match="depth"):
        Prefetcher([], depth=0)


def test_prefetcher_reads_stores_and_reports_counts(tmp_path):
    a = _data((32, 48))
    store = _write(tmp_path / "a.zarr", a, **_layout("shard"))
    counted = []
    regions = _regions(a.shape, (8, 8))
    reqs = [(TileKey(0, idx), (store, reg)) for idx, reg in enumerate(regions)]
    with Prefetcher(reqs, depth=2, count=lambda **c: counted.append(c)) as p:
        for (key, block), reg in zip(p, regions):
            np.testing.assert_array_equal(block, a[reg])
    assert sum(c["bytes_read"] for c in counted) == a.nbytes
    assert len(counted) == len(regions) and p.max_held <= 2
    assert p.buffers_allocated <= 2 * 2 + 2      # buffers are recycled, not one per tile (24 here)


@pytest.mark.parametrize("layout", ["chunk", "shard", "zstd", "zstd-shard"])
def test_missing_chunk_in_jask_store_names_store_and_tile(tmp_path, layout, decoder):
    a = _data()
    store = _write(tmp_path / "a.zarr", a, **_layout(layout))
    key = "c/1/0"                                # chunk (1, 0), or shard (1, 0): chunks (2..3, 0..2)
    first_bad = (2, 0) if layout.endswith("shard") else (1, 0)
    os.remove(os.path.join(store.path, key))
    regions = _regions(a.shape, (8, 8))
    reqs = [(TileKey(0, tuple(int(i) for i in idx)), (store, reg))
            for idx, reg in zip(np.ndindex(5, 6), regions)]
    with pytest.raises(MissingChunkError) as info:
        with Prefetcher(reqs, depth=2, threads=2) as p:
            for _ in p:
                pass
    msg = str(info.value)
    assert store.path in msg and "c/1/0" in msg and f"tile {first_bad}" in msg
    assert isinstance(info.value, FileNotFoundError) and p.alive_threads == 0


def test_missing_inner_chunk_of_shard_is_reported(tmp_path):
    a = _data((16, 16))
    store = _write(tmp_path / "a.zarr", a, chunks=(8, 8), shards=(16, 16))
    shard = os.path.join(store.path, "c/0/0")
    raw = bytearray(open(shard, "rb").read())
    index = np.frombuffer(bytes(raw[-4 - 64:-4]), "<u8").reshape(2, 2, 2).copy()
    index[1, 1] = 2**64 - 1                      # mark inner chunk (1, 1) as absent
    import google_crc32c
    body = index.tobytes()
    raw[-4 - 64:] = body + google_crc32c.value(body).to_bytes(4, "little")
    open(shard, "wb").write(bytes(raw))
    reader = TileReader(store)
    np.testing.assert_array_equal(reader.read((slice(0, 8), slice(0, 8))), a[:8, :8])
    with pytest.raises(MissingChunkError, match=r"inner chunk \(1, 1\) is missing"):
        reader.read((slice(8, 16), slice(8, 16)))


def test_deleted_store_is_a_file_not_found_error(tmp_path):
    a = _data()
    store = _write(tmp_path / "a.zarr", a, **_layout("chunk"))
    import shutil
    shutil.rmtree(store.path)
    with pytest.raises(FileNotFoundError, match="deleted while still in use"):
        with Prefetcher([(TileKey(0, (0, 0)), (store, (slice(0, 8), slice(0, 8))))]) as p:
            list(p)


@pytest.mark.parametrize("dense", [True, False], ids=["jask_store", "sparse_zarr_store"])
def test_a_deleted_store_is_named_where_its_folder_keeps_its_link_count(tmp_path, monkeypatch, dense):
    """gVisor (the TPU machine's sandbox) keeps a removed folder's link count, so the pin does not see the
    deletion; the missing chunk's own check finds the folder emptied. A store that may miss chunks (one
    zarr wrote) would otherwise read as its fill value."""
    from jask.io import pins
    monkeypatch.setattr(pins.Pin, "deleted", lambda self: False)
    a = _data()
    if dense:
        store = _write(tmp_path / "a.zarr", a, **_layout("chunk"))
    else:
        z = zarr.create_array(str(tmp_path / "a.zarr"), shape=a.shape, chunks=(8, 8), dtype=a.dtype,
                              compressors=None, fill_value=0.0)
        z[:] = a
        store = open_existing(str(tmp_path / "a.zarr"), "r")
    reader = TileReader(store)
    np.testing.assert_array_equal(reader.read((slice(0, 8), slice(0, 8))), a[:8, :8])
    import shutil
    shutil.rmtree(store.path)
    with pytest.raises(MissingChunkError, match="deleted while still in use"):
        reader.read((slice(8, 16), slice(0, 8)))


def test_corrupt_shard_index_is_reported(tmp_path):
    store = _write(tmp_path / "a.zarr", _data((16, 16)), chunks=(8, 8), shards=(16, 16))
    shard = os.path.join(store.path, "c/0/0")
    raw = bytearray(open(shard, "rb").read())
    raw[-10] ^= 0xFF
    open(shard, "wb").write(bytes(raw))
    with pytest.raises(ValueError, match="crc32c"):
        TileReader(store).read((slice(0, 8), slice(0, 8)))


# ---------------------------------------------------------------- writer

class _Recorder:
    """A write target that records writes; each waits for its gate when gates are given."""

    def __init__(self, gates=None, fail_at=None):
        self.writes, self.gates, self.fail_at = [], gates, fail_at
        self.final_path = "/somewhere/out.zarr"

    def write(self, region, tile):
        n = len(self.writes)
        if self.gates is not None:
            assert self.gates[n].wait(10)
        if n == self.fail_at:
            raise OSError("no space left on device")
        self.writes.append((region, np.asarray(tile).copy()))


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_write_behind_writes_everything_in_order_within_depth(depth):
    target = _Recorder()
    counted = []
    with WriteBehind(target, depth=depth, count=lambda **c: counted.append(c)) as w:
        for i in range(30):
            w.put((slice(i, i + 1),), np.full(3, i, np.int32))
    assert [int(t[0]) for _, t in target.writes] == list(range(30))
    assert 1 <= w.max_held <= depth and w.writes == 30
    assert sum(c.get("bytes_written", 0) for c in counted) == 30 * 12


def test_write_behind_blocks_at_depth():
    gates = [threading.Event() for _ in range(5)]
    target = _Recorder(gates)
    w = WriteBehind(target, depth=2)
    w.put((slice(0, 1),), np.zeros(1))
    w.put((slice(1, 2),), np.zeros(1))
    third = threading.Thread(target=w.put, args=((slice(2, 3),), np.zeros(1)))
    third.start()
    third.join(0.05)
    assert third.is_alive() and w.max_held == 2     # blocked: two tiles already held
    for g in gates:
        g.set()
    third.join(10)
    w.close()
    assert len(target.writes) == 3 and w.max_held == 2


def test_write_behind_error_names_store_and_tile_and_is_raised():
    target = _Recorder(fail_at=2)
    w = WriteBehind(target, depth=2)
    with pytest.raises(TileWriteError, match=r"tile \(2,\).*out\.zarr.*no space left"):
        for i in range(50):
            w.put((slice(i, i + 1),), np.zeros(1), key=(i,))
        w.close()
    assert len(target.writes) == 2
    w.abort()
    assert not w._thread.is_alive()


def test_write_behind_abort_drops_queued_tiles():
    gates = [threading.Event() for _ in range(5)]
    target = _Recorder(gates)
    w = WriteBehind(target, depth=3)
    for i in range(3):
        w.put((slice(i, i + 1),), np.zeros(1))
    gates[0].set()                               # only the write under way may finish
    w.abort()
    assert len(target.writes) <= 1 and not w._thread.is_alive()
    with pytest.raises(RuntimeError, match="after close"):
        w.put((slice(0, 1),), np.zeros(1))


def test_write_behind_converts_jax_arrays_on_its_thread(tmp_path):
    import jax.numpy as jnp
    a = _data((16, 16))
    pending = PendingStore(str(tmp_path / "o.zarr"), a.shape, a.dtype, (8, 8), shards=(8, 16))
    with WriteBehind(pending, depth=2) as w:
        for reg in _regions(a.shape, (8, 8)):
            w.put(reg, jnp.asarray(a[reg]) * 2)
    store = pending.commit(owned=False)
    np.testing.assert_array_equal(zarr.open_array(store.path)[...], a * 2)


# ---------------------------------------------------------------- shards and commits

def test_sharded_store_is_written_once_per_chunk_and_visible_only_on_commit(tmp_path):
    a = _data((32, 48))
    path = str(tmp_path / "s.zarr")
    pending = PendingStore(path, a.shape, a.dtype, (8, 8), shards=(16, 48))
    assert isinstance(pending._writer, ShardWriter)
    for reg in _regions(a.shape, (8, 8)):
        pending.write(reg, a[reg])
        assert not os.path.exists(path)
    store = pending.commit(owned=False)
    assert store.shards == (16, 48) and store.chunks == (8, 8)
    # Each shard file holds each inner chunk exactly once, plus its index and crc32c.
    for key in ("c/0/0", "c/1/0"):
        assert os.path.getsize(os.path.join(path, key)) == 12 * 8 * 8 * 4 + 12 * 16 + 4
    np.testing.assert_array_equal(zarr.open_array(path)[...], a)
    assert zarr.open_array(path).attrs["jask"]["dense"] is True


def test_zarr_can_update_a_shard_jask_streamed(tmp_path):
    a = _data((16, 16))
    store = _write(tmp_path / "s.zarr", a, chunks=(8, 8), shards=(16, 16))
    z = zarr.open_array(store.path, mode="r+")
    z[0:8, 8:16] = 7.0
    a[0:8, 8:16] = 7.0
    np.testing.assert_array_equal(TileReader(open_existing(store.path, "r")).read((slice(0, 16),) * 2), a)


def test_bad_shards_are_refused(tmp_path):
    with pytest.raises(ValueError, match="whole multiples"):
        PendingStore(str(tmp_path / "x.zarr"), (16, 16), np.float32, (8, 8), shards=(12, 16))
    with pytest.raises(ValueError, match="do not fit"):
        PendingStore(str(tmp_path / "y.zarr"), (16, 16), np.float32, (8, 8), shards=(16,))


def test_aborted_sharded_store_leaves_nothing(tmp_path):
    pending = PendingStore(str(tmp_path / "s.zarr"), (16, 16), np.float32, (8, 8), shards=(16, 16))
    pending.write((slice(0, 8), slice(0, 8)), np.ones((8, 8), np.float32))
    pending.abort()
    assert os.listdir(tmp_path) == []


def test_jask_ops_read_sharded_stores(tmp_path, small_tiles):
    a, b = _data((16, 12), seed=1), _data((16, 12), seed=2)
    sa = _write(tmp_path / "a.zarr", a, chunks=(4, 4), shards=(8, 12))
    sb = _write(tmp_path / "b.zarr", b, chunks=(4, 4), shards=(4, 12))
    x, y = jask.from_zarr(sa.path), jask.from_zarr(sb.path)
    np.testing.assert_allclose(np.asarray(jask.materialize(jask.add(x, y))), a + b, rtol=1e-6)
    np.testing.assert_allclose(float(jask.sum(x)), a.sum(), rtol=1e-4)


# ---------------------------------------------------------------- profile and progress

def test_profile_records_executed_work(tmp_path, small_tiles):
    a = _data((16, 12))
    x = jask.from_numpy(a)
    with profile() as outer:
        with jask.profile() as p:
            total = jask.sum(jask.add(x, x))
        jask.sum(x)
    np.testing.assert_allclose(float(total), 2 * a.sum(), rtol=1e-4)
    # x + x inside the sum's fused kernel reads each tile of x once
    assert p.bytes_read == a.nbytes and outer.bytes_read == 2 * a.nbytes
    assert p.windows == p.kernel_calls == 1  # add and sum's step fused, every tile of the 4x3 grid one call
    assert p.peak_rss_bytes > 0 and outer.peak_rss_bytes >= p.peak_rss_bytes
    assert p.wall_seconds > 0 and p.io_wait_seconds >= 0
    assert "read" in str(p) and "peak RSS" in str(p) and "waited" in str(p)
    from jask.exec import events
    assert p not in events.listeners and outer not in events.listeners


def test_progress_is_silent_unless_enabled_and_on_a_terminal():
    stream = io.StringIO()
    jask.config.update("progress", True)
    with progress(10, "sum", stream=stream) as bar:
        bar.update(10)
    assert stream.getvalue() == ""               # not a terminal (and under pytest)


def test_progress_bar_draws_counts():
    stream = io.StringIO()
    bar = Progress(4, "add", stream=stream)
    for _ in range(4):
        bar.update(1, nbytes=1024)
    bar.close()
    out = stream.getvalue()
    assert "add" in out and "4/4" in out and out.endswith("\n")


def test_reader_cache_does_not_keep_scratch_alive():
    import gc
    from jask.io.reader import reader_for
    x = jask.from_numpy(np.ones((16, 16), np.float32))
    store = x._node.resolved().store
    path = store.path
    reader_for(store).read((slice(0, 8), slice(0, 8)))
    del store, x
    gc.collect()
    assert not os.path.exists(path)


@pytest.mark.filterwarnings("ignore:Explicitly requested dtype")
def test_a_tile_placed_on_a_reader_thread_keeps_the_callers_64_bit_mode():
    """``jax.enable_x64`` is thread-local: a reader thread placing an int64 tile without the caller's mode
    gets int32 (on the TPU ``x + x`` of 2**40 came back 0). The placement carries the mode over."""
    import jax
    from jask.exec.executor import on_reader_thread
    X = np.full((2, 3), 2**40, dtype=np.int64)
    device = jax.devices()[0]
    with jax.enable_x64(True):
        carried = on_reader_thread(lambda x: jax.device_put(x, device))
        plain = lambda x: jax.device_put(x, device)   # noqa: E731 - what the reader did before
    got = {}

    def reader():
        try:
            got["plain"] = np.asarray(plain(X))   # JAX warns that it truncates the dtype
            got["carried"] = np.asarray(carried(X))
        except Exception as e:   # noqa: BLE001 - shown by the assertion below
            got["error"] = e
    t = threading.Thread(target=reader)
    t.start()
    t.join()
    assert "error" not in got, got.get("error")
    assert got["plain"].dtype == np.int32               # the bug this guards against, still there without it
    assert got["carried"].dtype == np.int64
    np.testing.assert_array_equal(got["carried"], X)
