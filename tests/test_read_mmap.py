"""The ``read_mmap`` setting: whole uncompressed chunks read as read-only maps of their files.

Checked against NumPy on the same data, with the live-map count (jask.io.maps)
and the kernel's own list of mappings (/proc/self/maps) for leaks.
"""
import gc
import os

import jax
import ml_dtypes
import numpy as np
import pytest
import zarr

import jask
from jask.io import leases, maps
from jask.io.prefetch import Prefetcher
from jask.io.reader import CorruptChunkError, MissingChunkError, TileKey, TileReader
from jask.io.store import PendingStore

SHAPE = (37, 45)
CHUNK = (8, 8)


def _regions(shape, tile):
    return [tuple(slice(i * t, min((i + 1) * t, d)) for i, t, d in zip(idx, tile, shape))
            for idx in np.ndindex(*[-(-d // t) for d, t in zip(shape, tile)])]


def _write(path, a, chunks=CHUNK, **kw):
    pending = PendingStore(str(path), a.shape, a.dtype, chunks, **kw)
    for reg in _regions(a.shape, chunks):
        pending.write(reg, a[reg])
    return pending.commit(owned=False)


def _maps_of(folder) -> int:
    """Mappings of files under ``folder`` the kernel lists for this process."""
    folder = os.path.realpath(folder)
    with open("/proc/self/maps") as f:
        return sum(folder in line for line in f)


@pytest.fixture
def read_mmap():
    jask.config.update("read_mmap", True)   # the autouse settings fixture restores the default after


def _leases_work(folder) -> bool:
    """Whether the kernel grants this process read leases on files in ``folder``."""
    probe = os.path.join(folder, "lease-probe")
    with open(probe, "wb") as f:
        f.write(b"x")
    fd = os.open(probe, os.O_RDONLY)
    try:
        return leases.take(fd)
    finally:
        os.close(fd)
        os.unlink(probe)


@pytest.fixture
def leased(tmp_path, monkeypatch):
    """Leases work here, and "auto" maps this file's tiny test chunks too (it maps chunks of 4 MiB and up)."""
    if not _leases_work(tmp_path):
        pytest.skip("this kernel or filesystem grants no read leases (F_SETLEASE): 'auto' reads every chunk")
    monkeypatch.setattr(maps, "AUTO_MIN_BYTES", 0)


@pytest.mark.parametrize("dtype", [np.float32, np.uint8, ml_dtypes.bfloat16])
def test_mapped_tiles_equal_numpy_for_full_and_edge_tiles(tmp_path, dtype):
    a = np.random.default_rng(0).standard_normal(SHAPE).astype(dtype)
    store = _write(tmp_path / "a.zarr", a)
    reader = TileReader(store)
    for reg in _regions(SHAPE, CHUNK):
        view = reader.map_chunk(reg)
        assert view is not None, reg
        assert view.dtype == np.dtype(dtype) and not view.flags.writeable
        np.testing.assert_array_equal(view, a[reg])
    full = reader.map_chunk(_regions(SHAPE, CHUNK)[0])
    assert full.ctypes.data % 4096 == 0, "a full tile's map is page-aligned"
    placed = jax.device_put(full, jax.devices("cpu")[0])
    assert placed.unsafe_buffer_pointer() == full.ctypes.data, "XLA on CPU takes the mapped tile uncopied"
    np.testing.assert_array_equal(np.asarray(placed), a[_regions(SHAPE, CHUNK)[0]])
    assert maps.live()["maps"] >= 1
    del view, full, placed
    gc.collect()
    assert maps.live()["maps"] == 0 and _maps_of(tmp_path) == 0


def test_regions_other_than_one_chunk_and_other_layouts_are_read_instead(tmp_path):
    a = np.arange(16 * 24, dtype=np.float32).reshape(16, 24)
    plain = TileReader(_write(tmp_path / "a.zarr", a))
    assert plain.map_chunk((slice(0, 16), slice(0, 8))) is None      # two chunks
    assert plain.map_chunk((slice(0, 4), slice(0, 8))) is None       # part of one, not at the edge
    sharded = TileReader(_write(tmp_path / "s.zarr", a, shards=(16, 24)))
    assert sharded.mode == "shard" and sharded.map_chunk((slice(0, 8), slice(0, 8))) is None
    assert maps.live()["maps"] == 0


def test_chunks_not_in_the_page_cache_are_read_not_mapped(tmp_path, read_mmap, monkeypatch):
    """A chunk whose pages mincore reports absent is read with one preadv (a cold map faults in slowly)."""
    a = np.random.default_rng(3).standard_normal((16, 24)).astype(np.float32)
    store = _write(tmp_path / "a.zarr", a)
    regions = _regions(a.shape, CHUNK)
    fd = os.open(tmp_path / "a.zarr" / "c" / "0" / "0", os.O_RDONLY)
    try:
        assert maps.in_page_cache(fd, 8 * 8 * 4), "a chunk just written is in the page cache"
    finally:
        os.close(fd)
    monkeypatch.setattr(maps, "_resident", lambda address: False)
    assert TileReader(store).map_chunk(regions[0]) is None
    maps.reset_peak()
    with Prefetcher([(TileKey(0, i), (store, r)) for i, r in enumerate(regions)], depth=2) as p:
        got = [block.copy() for _, block in p]
    for g, r in zip(got, regions):
        np.testing.assert_array_equal(g, a[r])
    assert maps.live()["peak_bytes"] == 0


def test_prefetcher_maps_tiles_and_unmaps_them_as_the_pass_goes(tmp_path, read_mmap):
    """No buffer is allocated, at most the prefetcher's depth plus the tile in hand is mapped at once,
    and nothing is left mapped after the pass."""
    a = np.random.default_rng(1).standard_normal((64, 48)).astype(np.float32)
    store = _write(tmp_path / "a.zarr", a)
    regions = _regions(a.shape, CHUNK)
    maps.reset_peak()
    depth = 2
    with Prefetcher([(TileKey(0, i), (store, r)) for i, r in enumerate(regions)], depth=depth) as p:
        sums = [float(block.sum(dtype=np.float64)) for _, block in p]
        allocated = p.buffers_allocated
    np.testing.assert_allclose(sums, [a[r].sum(dtype=np.float64) for r in regions], rtol=1e-6)
    assert allocated == 0
    chunk_bytes = 8 * 8 * 4
    assert maps.live()["peak_bytes"] <= (depth + 2) * chunk_bytes, maps.live()
    gc.collect()
    assert maps.live()["maps"] == 0 and _maps_of(tmp_path) == 0


def test_passes_agree_with_numpy_and_hold_maps_within_the_budget(tmp_path, read_mmap, small_tiles):
    """Maps are held like read buffers: a pass over 62 KiB (edge tiles on both axes) under a 16 KiB budget
    never has more than the budget mapped, and none after it."""
    a = np.random.default_rng(2).standard_normal((62, 254)).astype(np.float32)
    jask.from_numpy(a).to_zarr(tmp_path / "x.zarr", chunks=(4, 4))
    x = jask.from_zarr(tmp_path / "x.zarr")
    jask.config.update("memory_budget", 16 * 1024)
    maps.reset_peak()
    total = float(jask.sum(x))
    y = np.asarray(x[:8] * 2.0 + 1.0)
    np.testing.assert_allclose(total, a.sum(dtype=np.float64), rtol=1e-4)
    np.testing.assert_allclose(y, a[:8] * 2.0 + 1.0, rtol=1e-6)
    assert 0 < maps.live()["peak_bytes"] <= 16 * 1024, maps.live()
    del x
    gc.collect()
    assert maps.live()["maps"] == 0 and _maps_of(tmp_path) == 0


def test_missing_chunks_fill_or_raise_as_without_maps(tmp_path, read_mmap, small_tiles):
    foreign = tmp_path / "foreign.zarr"
    z = zarr.create_array(foreign, shape=(16, 8), chunks=(4, 4), dtype="f4", fill_value=7.0, compressors=None)
    z[:8] = 1.0
    want = np.concatenate([np.ones((8, 8), "f4"), np.full((8, 8), 7.0, "f4")])
    assert float(jask.sum(jask.from_zarr(foreign))) == float(want.sum())
    mine = tmp_path / "mine.zarr"
    jask.from_numpy(want).to_zarr(mine, chunks=(4, 4))
    os.unlink(mine / "c" / "1" / "0")
    with pytest.raises(MissingChunkError, match="c/1/0"):
        float(jask.sum(jask.from_zarr(mine)))


def test_truncated_chunk_is_not_mapped_and_is_named(tmp_path, read_mmap, small_tiles):
    p = tmp_path / "t.zarr"
    jask.from_numpy(np.ones((16, 8), np.float32)).to_zarr(p, chunks=(4, 4))
    f = p / "c" / "1" / "0"
    f.write_bytes(f.read_bytes()[:10])
    with pytest.raises(CorruptChunkError, match="c/1/0") as info:
        float(jask.sum(jask.from_zarr(p)))
    assert str(p) in str(info.value)


def test_mapped_tile_keeps_the_opened_version_when_the_path_is_swapped(tmp_path, read_mmap, small_tiles):
    """A tile mapped before another writer replaces the array (jask's rename, or zarr-python rewriting
    a chunk, which also writes a new file and renames it) keeps its values, and so do later reads."""
    p = tmp_path / "x.zarr"
    jask.from_numpy(np.ones((8, 8), np.float32)).to_zarr(p, chunks=(4, 4))
    x = jask.from_zarr(p)
    from jask.io.reader import reader_for
    held = reader_for(x._node.store).map_chunk((slice(0, 4), slice(0, 4)))
    assert held is not None
    zarr.open_array(p, mode="r+")[:4, :4] = 5.0            # a chunk file rewritten by another tool
    np.testing.assert_array_equal(held, 1.0)
    assert float(jask.sum(x)) == 5.0 * 16 + 48                # the pinned folder, now with that chunk
    jask.from_numpy(np.full((8, 8), 3.0, np.float32)).to_zarr(p, chunks=(4, 4), overwrite=True)
    np.testing.assert_array_equal(held, 1.0)
    assert float(jask.sum(x)) == 5.0 * 16 + 48                # still the version x opened
    assert float(jask.sum(jask.from_zarr(p))) == 3.0 * 64
    del held, x
    gc.collect()
    assert maps.live()["maps"] == 0


def test_setting_is_checked():
    assert jask.config.config.read_mmap == "auto", "the default"
    for value in (True, False, "auto"):
        jask.config.update("read_mmap", value)
    with pytest.raises(TypeError, match="read_mmap"):
        jask.config.update("read_mmap", "yes")


@pytest.mark.parametrize("value,want", [("", "auto"), ("auto", "auto"), ("1", True), ("on", True),
                                        ("0", False), ("off", False)])
def test_environment_sets_the_default(monkeypatch, value, want):
    from jask.config import _read_mmap_from_env
    monkeypatch.setenv("JASK_READ_MMAP", value)
    assert _read_mmap_from_env() == want
    monkeypatch.setenv("JASK_READ_MMAP", "sometimes")
    with pytest.raises(ValueError, match="JASK_READ_MMAP"):
        _read_mmap_from_env()


def _fds_on(folder) -> int:
    folder = os.path.realpath(folder)
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith(folder)
        except OSError:
            pass
    return n


def test_auto_maps_warm_chunks_under_a_lease_and_lets_go_of_them(tmp_path, leased, small_tiles):
    """The default maps warm chunks, each under a lease whose file is closed with its map."""
    a = np.random.default_rng(5).standard_normal((16, 24)).astype(np.float32)
    jask.from_numpy(a).to_zarr(tmp_path / "x.zarr", chunks=(4, 4))
    x = jask.from_zarr(tmp_path / "x.zarr")
    before = leases.counts()["taken"]
    maps.reset_peak()
    np.testing.assert_allclose(float(jask.sum(x)), a.sum(dtype=np.float64), rtol=1e-5)
    assert maps.live()["peak_bytes"] > 0, "warm chunks under a lease should be mapped by default"
    assert leases.counts()["taken"] - before >= 24, "every mapped chunk is leased (24 tiles)"
    gc.collect()
    assert maps.live()["maps"] == 0 and leases.counts()["live"] == 0
    assert _maps_of(tmp_path) == 0 and _fds_on(tmp_path / "x.zarr" / "c") == 0, "a chunk file is left open"


def test_a_chunk_someone_has_open_for_writing_is_read_under_auto(tmp_path, leased):
    """The kernel grants no read lease on a file open for writing: "auto" reads it, True maps it anyway."""
    a = np.arange(64, dtype=np.float32).reshape(8, 8)
    store = _write(tmp_path / "a.zarr", a)
    region = _regions(a.shape, CHUNK)[0]
    writer = os.open(tmp_path / "a.zarr" / "c" / "0" / "0", os.O_WRONLY)
    try:
        refused = leases.counts()["refused"]
        assert TileReader(store).map_chunk(region, lease_only=True) is None
        assert leases.counts()["refused"] == refused + 1
        view = TileReader(store).map_chunk(region)
        np.testing.assert_array_equal(view, a)
        del view
    finally:
        os.close(writer)
    view = TileReader(store).map_chunk(region, lease_only=True)
    np.testing.assert_array_equal(view, a)
    del view
    gc.collect()
    assert maps.live()["maps"] == 0


TRUNCATE_IN_PLACE = """
import os, sys, time
t0 = time.monotonic()
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)   # waits while another process holds a read lease
os.write(fd, b"\\0" * 16)
os.close(fd)
print(time.monotonic() - t0)
"""

TOUCH_AFTER_TRUNCATION = """
import os, subprocess, sys
import numpy as np
from jask.io import leases, maps
path, guard = sys.argv[1], sys.argv[2] == "lease"
fd = os.open(path, os.O_RDONLY)
nbytes = os.fstat(fd).st_size
assert not guard or leases.take(fd)
m = maps.map_file(fd, nbytes)
view = np.frombuffer(m, np.float32)
if guard:
    leases.watch(m, fd, view.ctypes.data, nbytes)
else:
    os.close(fd)
before = float(view.sum())
subprocess.run([sys.executable, "-c", sys.argv[3], path], check=True, timeout=30)
print(os.path.getsize(path), before, float(view.sum()), leases.counts()["released_for_writers"], flush=True)
"""


def test_a_writer_truncating_a_mapped_chunk_in_place_cannot_kill_the_reader(tmp_path, leased):
    """Without a lease, truncating a mapped file in place kills the process that maps it (SIGBUS) at its
    next touch; under the lease the writer waits until the map is made private, and the tile keeps
    the bytes it was opened with. Both in child processes, so the first can die."""
    import signal
    import subprocess
    import sys
    data = np.arange(64 * 1024, dtype=np.float32)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    outcomes = {}
    for guard in ("none", "lease"):
        path = tmp_path / f"chunk-{guard}"
        data.tofile(path)
        out = subprocess.run([sys.executable, "-c", TOUCH_AFTER_TRUNCATION, str(path), guard, TRUNCATE_IN_PLACE],
                             capture_output=True, text=True, timeout=60, env=env)
        outcomes[guard] = out
    assert outcomes["none"].returncode == -signal.SIGBUS, (outcomes["none"].returncode, outcomes["none"].stderr)
    lease = outcomes["lease"]
    assert lease.returncode == 0, lease.stderr
    size, before, after, released = lease.stdout.split()[-4:]   # the writer prints its wait first
    assert int(size) == 16, "the writer did truncate and rewrite the file"
    assert float(before) == float(after) == float(data.sum(dtype=np.float64)), "the tile kept its bytes"
    assert int(released) == 1, "the watcher released the lease for the writer"
    waited = float(lease.stdout.split()[0])
    assert waited < 20, f"the writer waited {waited} s: the watcher should release within {leases.POLL_S} s"



def test_auto_maps_only_for_tiles_used_on_the_host(tmp_path, leased):
    """Tiles bound for an accelerator are read under "auto" (a mapped tile's copy to a TPU v5e ran at
    0.66x a read's); ``True`` still maps them."""
    a = np.random.default_rng(6).standard_normal((16, 24)).astype(np.float32)
    store = _write(tmp_path / "a.zarr", a)
    regions = _regions(a.shape, CHUNK)
    mapped = {}
    for value, host in (("auto", False), ("auto", True), (True, False)):
        jask.config.update("read_mmap", value)
        maps.reset_peak()
        with Prefetcher([(TileKey(0, i), (store, r)) for i, r in enumerate(regions)], depth=2,
                        host_consumer=host) as p:
            got = [block.copy() for _, block in p]
        for g, r in zip(got, regions):
            np.testing.assert_array_equal(g, a[r])
        mapped[value, host] = maps.live()["peak_bytes"] > 0
    assert mapped == {("auto", False): False, ("auto", True): True, (True, False): True}


def test_auto_reads_chunks_below_its_size_threshold(tmp_path, leased, monkeypatch):
    """A map costs a fixed 120-160 us: "auto" maps chunks of ``AUTO_MIN_BYTES`` and up, and reads smaller ones."""
    a = np.random.default_rng(7).standard_normal((16, 24)).astype(np.float32)
    store = _write(tmp_path / "a.zarr", a)
    regions = _regions(a.shape, CHUNK)
    mapped = []
    for threshold in (8 * 8 * 4 + 1, 8 * 8 * 4):
        monkeypatch.setattr(maps, "AUTO_MIN_BYTES", threshold)
        maps.reset_peak()
        with Prefetcher([(TileKey(0, i), (store, r)) for i, r in enumerate(regions)], depth=2) as p:
            got = [block.copy() for _, block in p]
        for g, r in zip(got, regions):
            np.testing.assert_array_equal(g, a[r])
        mapped.append(maps.live()["peak_bytes"] > 0)
    assert mapped == [False, True]
