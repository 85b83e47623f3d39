"""Tiles smaller than their compressed chunk: each chunk is decoded once per pass, not once per tile
(jask/io/decoded_chunks.py), and the plan charges the chunks kept decoded."""
import threading

import numpy as np
import pytest
import zarr
import zarr.codecs.zstd

import jask
import jask.numpy
from jask.exec import driver
from jask.io import decoded_chunks
from jask.io.prefetch import Prefetcher
from jask.io.reader import CorruptChunkError, TileReadError, reader_for
from jask.ops.batches import span_order
from jask.plan.memory import DECODED_CHUNK_SLOTS


@pytest.fixture
def decodes(monkeypatch):
    """Chunks zstd has decoded in this test (zarr decodes a whole chunk for any part of it)."""
    count = [0]
    decode = zarr.codecs.zstd.ZstdCodec._decode_sync

    def counted(self, *args, **kwargs):
        with lock:
            count[0] += 1
        return decode(self, *args, **kwargs)
    lock = threading.Lock()
    monkeypatch.setattr(zarr.codecs.zstd.ZstdCodec, "_decode_sync", counted)
    return count


def _store(path, a, chunks, **kw):
    z = zarr.create_array(str(path), shape=a.shape, chunks=chunks, dtype=a.dtype, **kw)
    z[...] = a
    return jask.from_zarr(str(path))


def _tall(seed=0, rows=4096, cols=16):
    return np.random.default_rng(seed).standard_normal((rows, cols), dtype=np.float32)


@pytest.mark.parametrize("sharded", [False, True], ids=["chunks", "shards"])
def test_small_tiles_decode_each_compressed_chunk_once(tmp_path, decodes, sharded):
    """4 chunks of 1024 rows read as 32 tiles of 128 rows: 4 decodes (it was 32, one per tile)."""
    a = _tall()
    x = _store(tmp_path / "a.zarr", a, (1024, 16), **(dict(shards=(2048, 16)) if sharded else {}))
    jask.config.update("tile", 128)
    with jask.profile() as p:
        (x + 1.0).to_zarr(str(tmp_path / "b.zarr"))
    assert decodes[0] == 4
    assert p.bytes_read == a.nbytes
    np.testing.assert_array_equal(np.asarray(jask.from_zarr(str(tmp_path / "b.zarr"))), a + 1.0)
    assert decoded_chunks.live()["bytes"] == 0, "every kept chunk goes when the pass ends"


def test_tiles_straddling_chunks_and_ragged_edges(tmp_path, decodes):
    """Chunks of 1000 rows under tiles of 256: a tile may span two chunks, the last chunk is short."""
    a = _tall(1, rows=4100, cols=5)
    x = _store(tmp_path / "a.zarr", a, (1000, 5))
    jask.config.update("tile", 256)
    np.testing.assert_allclose(np.asarray(jask.numpy.sum(x * 2.0, axis=0)), (a * 2.0).sum(axis=0), rtol=1e-5)
    assert decodes[0] == 5


def test_two_dimensional_chunks_hold_at_most_the_kept_chunks(tmp_path, decodes):
    """Tiles of a quarter of a 2-D chunk (in row-major tile order a chunk row is needed again after a
    tile row): values exact, at most two chunks kept at once, about 2 decodes per chunk (was 4: one per tile)."""
    a = _tall(2, rows=256, cols=256)
    x = _store(tmp_path / "a.zarr", a, (64, 64))
    jask.config.update("tile", 32)
    decoded_chunks.reset_peak()
    np.testing.assert_array_equal(np.asarray(jask.materialize(x * 1.0)), a)
    assert decodes[0] <= 40
    assert decoded_chunks.live()["peak_bytes"] <= decoded_chunks.CACHED_CHUNKS * 64 * 64 * 4
    assert decoded_chunks.live()["bytes"] == 0


def test_reads_outside_a_pass_keep_nothing(tmp_path, decodes):
    a = _tall(3)
    x = _store(tmp_path / "a.zarr", a, (1024, 16))
    reader = reader_for(x._node.resolved().store)
    for r in range(0, 1024, 128):
        np.testing.assert_array_equal(reader.read((slice(r, r + 128), slice(0, 16))), a[r:r + 128])
    assert decodes[0] == 8 and decoded_chunks.live()["chunks"] == 0


def test_prefetched_tiles_of_one_chunk_share_its_decode(tmp_path, decodes):
    """Several reader threads asking for tiles of the same chunk at once: one decodes, the others wait."""
    a = _tall(4, rows=2048)
    x = _store(tmp_path / "a.zarr", a, (2048, 16))
    store = x._node.resolved().store
    regions = [(slice(r, r + 64), slice(0, 16)) for r in range(0, 2048, 64)]
    with Prefetcher([(i, (store, reg)) for i, reg in enumerate(regions)], depth=8, threads=4) as stream:
        for (i, tile), reg in zip(stream, regions):
            np.testing.assert_array_equal(tile, a[reg])
    assert decodes[0] == 1


def test_a_corrupt_chunk_read_by_small_tiles_names_the_chunk(tmp_path):
    a = _tall(5)
    x = _store(tmp_path / "a.zarr", a, (1024, 16))
    with open(tmp_path / "a.zarr" / "c" / "2" / "0", "r+b") as f:
        f.seek(20)
        f.write(b"\xff" * 64)
    jask.config.update("tile", 128)
    with pytest.raises(CorruptChunkError, match="chunk file c/2/0"):
        jask.materialize(x + 1.0)
    assert decoded_chunks.live()["bytes"] == 0


@pytest.mark.parametrize("where", ["local", "url"])
def test_only_a_chunk_that_fails_on_its_own_is_called_damaged(tmp_path, monkeypatch, where):
    """A garbled compressed chunk is named as damaged (CorruptChunkError); a read that fails where every
    chunk decodes alone (here a fault raised in the reading code) is a plain TileReadError saying the data
    is not damaged, locally and at a URL."""
    import fsspec
    a = _tall(7)
    if where == "local":
        path = str(tmp_path / "a.zarr")
        chunk = tmp_path / "a.zarr" / "c" / "2" / "0"
    else:
        path = "memory://jask-test-damage/a.zarr"
        chunk = "/jask-test-damage/a.zarr/c/2/0"
    fs = fsspec.filesystem("memory")
    try:
        x = _store(path, a, (1024, 16))
        jask.config.update("tile", 128)
        failures = [TypeError("a fault in the reading code")]
        read = decoded_chunks.DecodedChunks.read

        def faulty(self, *args):
            if failures:
                raise failures.pop()
            return read(self, *args)
        monkeypatch.setattr(decoded_chunks.DecodedChunks, "read", faulty)
        with pytest.raises(TileReadError) as info:
            np.asarray(x + 1.0)
        assert not isinstance(info.value, CorruptChunkError)
        assert "a fault in the reading code" in str(info.value) and "not damaged" in str(info.value)
        np.testing.assert_array_equal(np.asarray(x + 1.0), a + 1.0)      # the store is fine

        if where == "local":
            raw = bytearray(open(chunk, "rb").read())
            raw[20:84] = b"\xff" * 64
            open(chunk, "wb").write(bytes(raw))
        else:
            raw = bytearray(fs.cat(chunk))
            raw[20:84] = b"\xff" * 64
            fs.pipe(chunk, bytes(raw))
        with pytest.raises(CorruptChunkError, match="chunk file c/2/0"):
            np.asarray(jask.from_zarr(path) + 1.0)
    finally:
        if fs.exists("/jask-test-damage"):
            fs.rm("/jask-test-damage", recursive=True)


def test_batches_smaller_than_a_chunk_decode_it_once(tmp_path, decodes):
    a = _tall(6)
    x = _store(tmp_path / "a.zarr", a, (1024, 16))
    got = np.concatenate(list(jask.batches(x, batch_size=64)))
    np.testing.assert_array_equal(got, a)
    assert decodes[0] == 4


@pytest.mark.parametrize("columns", [8, 4])
def test_shuffled_batches_decode_each_chunk_once_per_epoch(tmp_path, decodes, columns):
    """Shuffled batches inside compressed chunks are drawn span by span (a few chunks' rows open at once):
    each chunk is decoded once per epoch, as unshuffled (a shuffled order of single batches decoded a
    chunk for nearly every batch: 214 decodes of these 24 chunks before). Every row comes once, X and y
    paired, in an order that is shuffled, the same for the same seed and epoch, another for another.
    X's chunks of 4 columns put two chunks side by side in each of its row bands."""
    a = _tall(8, rows=1024, cols=8)
    labels = np.arange(1024, dtype=np.int32)
    x = _store(tmp_path / "x.zarr", a, (64, columns))
    x_chunks = 16 * 8 // columns
    y = _store(tmp_path / "y.zarr", labels, (128,))           # spans of 128 rows: 16 batches, 1 + x_chunks / 8 chunks
    orders = []
    for epoch, buffer in ((0, 1), (0, 1), (1, 1), (0, 4)):
        decodes[0] = 0
        got = list(jask.batches(x, y, batch_size=8, shuffle=3, epoch=epoch, shuffle_buffer=buffer))
        assert decodes[0] == x_chunks + 8, (epoch, buffer)
        assert decoded_chunks.live()["bytes"] == 0              # nothing kept once the epoch ends
        for xb, yb in got:
            assert xb.shape == (8, 8)
            np.testing.assert_array_equal(xb, a[yb])
        rows = np.concatenate([yb for _, yb in got])
        assert sorted(rows) == list(range(1024))
        orders.append(rows)
    assert not np.array_equal(orders[0], labels)
    assert np.array_equal(orders[0], orders[1]) and not np.array_equal(orders[0], orders[2])
    assert any(len({int(r) // 8 for r in yb}) > 1 for _, yb in got[:4])     # the buffer deals rows


def test_shuffled_batches_hold_the_chunks_of_as_many_spans_as_a_quarter_of_the_budget_holds(tmp_path, decodes):
    """At a 40KB budget a span's chunks (two of X's, 4 KiB, and one of y's, 512 B) fit twice in a quarter
    of it: two spans are open at once, and the chunks kept decoded stay within two spans' and the two
    slots' every store has; each chunk is still decoded once."""
    a = _tall(9, rows=1024, cols=8)
    x = _store(tmp_path / "x.zarr", a, (64, 8))
    y = _store(tmp_path / "y.zarr", np.arange(1024, dtype=np.int32), (128,))
    jask.set_memory_budget("40KB")
    decoded_chunks.reset_peak()
    rows = np.concatenate([yb for _, yb in jask.batches(x, y, batch_size=8, shuffle=1)])
    assert sorted(rows) == list(range(1024)) and decodes[0] == 16 + 8
    assert 0 < decoded_chunks.live()["peak_bytes"] <= (2 * 2 + 2) * 2048 + (2 * 1 + 2) * 512


@pytest.mark.parametrize("open_spans", [1, 2, 5])
def test_a_span_order_keeps_at_most_its_open_spans_begun(open_spans):
    """Batches of 3 rows in spans of 12 (4 batches each; the last span has 1): a permutation in which no
    more than ``open_spans`` spans are begun and not finished at any point; one span at a time takes the
    spans whole, in shuffled order."""
    order = span_order(29, 3, 12, open_spans, np.random.default_rng(open_spans))
    assert sorted(order) == list(range(29)) and order != list(range(29))
    span = [3 * b // 12 for b in order]
    size = {s: span.count(s) for s in span}
    for i in range(len(order)):
        seen = span[:i + 1]
        assert sum(0 < seen.count(s) < size[s] for s in size) <= open_spans, (i, span)
    if open_spans == 1:
        firsts = [s for i, s in enumerate(span) if i == 0 or span[i - 1] != s]
        assert sorted(firsts) == sorted(size) and firsts != sorted(size)


def test_the_plan_charges_the_chunks_kept_decoded(tmp_path):
    """A tile covering part of a compressed chunk holds the whole chunk decoded; an uncompressed one
    reads its rows in place, and a tile of whole chunks holds nothing more."""
    a = _tall(7)
    zipped = _store(tmp_path / "z.zarr", a, (1024, 16))
    plain = _store(tmp_path / "p.zarr", a, (1024, 16), compressors=None)
    jask.config.update("tile", 128)
    extra = DECODED_CHUNK_SLOTS * 1024 * 16 * 4
    projected = lambda x: driver.make_plan([(x + 1.0)._node]).projected_bytes  # noqa: E731
    assert projected(zipped) == projected(plain) + extra
    jask.config.update("tile", 2048)
    assert projected(zipped) == projected(plain)


def test_object_store_tiles_fetch_and_decode_each_chunk_once(decodes):
    """An object store's reader (zarr fetches and decodes a whole chunk for any part of it) goes through the
    kept chunks too: 4 chunks of 1024 rows read as 32 tiles of 128 rows are 4 GETs and 4 decodes, not 32."""
    import fsspec
    fs = fsspec.filesystem("memory")
    url = "memory://jask-test-decoded/a.zarr"
    a = _tall(6)
    try:
        jask.to_zarr(jask.from_numpy(a), url, chunks=(1024, 16), compressors=zarr.codecs.ZstdCodec())
        x = jask.from_zarr(url)
        assert reader_for(x._node.store).mode == "remote"
        gets, get = [], zarr.storage.FsspecStore.get

        async def counted_get(self, key, *args, **kw):
            gets.append(key)
            return await get(self, key, *args, **kw)
        jask.config.update("tile", 128)
        decodes[0] = 0
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(zarr.storage.FsspecStore, "get", counted_get)
            with jask.profile() as p:
                y = jask.persist(x + 1.0)
        assert decodes[0] == 4
        assert sorted(k for k in gets if k.startswith("c/")) == [f"c/{i}/0" for i in range(4)], gets
        assert p.bytes_read == a.nbytes
        np.testing.assert_array_equal(np.asarray(y), a + 1.0)
        assert decoded_chunks.live()["bytes"] == 0
    finally:
        fs.rm("/jask-test-decoded", recursive=True)
