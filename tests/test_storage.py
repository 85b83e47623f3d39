"""Zarr storage: round trips, atomic writes, update_, crash recovery, scratch hygiene, array facts."""
import gc
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import zarr

import jask
from jask.config import config
from jask.io import owners, scratch
from jask.io.recovery import recover


def _rand(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _hidden(folder):
    return [n for n in os.listdir(folder) if n.startswith(".")]


def _dead_pid():
    """The pid of a process that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _earlier_token():
    """A token an earlier process on this host with this process's pid made (another process tag)."""
    return owners._HOST + ("0000" if owners._tag != "0000" else "1111") + "abcd"


def _other_host_token():
    """A token a process of another host made (its pid means nothing here)."""
    return ("0000" if owners._HOST != "0000" else "1111") + "1234abcd"


@pytest.fixture
def private_scratch(tmp_path):
    """A scratch root of this test's own, so its process folder holds only this test's stores."""
    root = tmp_path / "scratch"
    jask.set_memory_budget(config.memory_budget, scratch_dir=root, allow_tmpfs=True)
    return root


# ---------------------------------------------------------------- round trips

@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8, np.bool_, np.float16])
def test_from_numpy_round_trip(small_tiles, dtype):
    data = (_rand((5, 7), 1) * 10).astype(dtype)
    x = jask.from_numpy(data)
    out = np.asarray(x)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, data)
    np.testing.assert_array_equal(np.asarray(jask.materialize(x)), data)


def test_from_numpy_accepts_jax_arrays(small_tiles):
    data = _rand((5, 7), 2)
    np.testing.assert_array_equal(np.asarray(jask.from_numpy(jax.numpy.asarray(data))), data)


def test_from_numpy_custom_chunks(small_tiles):
    data = _rand((5, 7), 3)
    x = jask.from_numpy(data, chunks=(2, 3))
    assert x.chunks == (2, 3)
    assert zarr.open_array(x.path, mode="r").chunks == (2, 3)
    np.testing.assert_array_equal(np.asarray(x), data)
    # a chunking different from the compute tiles still computes correctly
    np.testing.assert_allclose(np.asarray(x @ x.T), data @ data.T, rtol=1e-5, atol=1e-5)


def test_from_zarr_round_trip(small_tiles, tmp_path):
    data = _rand((5, 7), 4)
    p = tmp_path / "a.zarr"
    z = zarr.create_array(p, shape=data.shape, dtype=data.dtype, chunks=(3, 3), zarr_format=3)
    z[...] = data
    x = jask.from_zarr(p)
    np.testing.assert_array_equal(np.asarray(x), data)
    np.testing.assert_allclose(np.asarray(x + x), 2 * data, rtol=1e-6)
    # from an opened zarr.Array as well
    y = jask.from_zarr(zarr.open_array(p, mode="r"))
    assert y.path == str(p)
    np.testing.assert_array_equal(np.asarray(y), data)


def test_from_zarr_v2_array(small_tiles, tmp_path):
    data = _rand((5, 7), 5)
    p = tmp_path / "v2.zarr"
    z = zarr.create_array(p, shape=data.shape, dtype=data.dtype, chunks=(4, 4), zarr_format=2)
    z[...] = data
    np.testing.assert_array_equal(np.asarray(jask.from_zarr(p)), data)


@pytest.mark.parametrize("layout", ["odd_chunks", "shards_index_first"])
def test_update_of_a_store_written_by_zarr_keeps_its_layout(small_tiles, tmp_path, layout):
    """A store another tool wrote, with chunks unlike jask's tiles: update_ writes the new value in its layout."""
    from zarr.codecs import BytesCodec, ShardingCodec
    data = _rand((16, 12), 7)
    p = tmp_path / f"{layout}.zarr"
    if layout == "odd_chunks":
        zarr.create_array(p, shape=data.shape, dtype=data.dtype, chunks=(5, 7))[:] = data
    else:
        zarr.create_array(p, shape=data.shape, dtype=data.dtype, chunks=(8, 12), compressors=None,
                          serializer=ShardingCodec(chunk_shape=(4, 4), codecs=[BytesCodec()],
                                                   index_location="start"))[:] = data
    before = zarr.open_array(p, mode="r")
    x = jask.from_zarr(p, mode="r+")
    x.update_(x * 2.0 + 1.0)
    after = zarr.open_array(p, mode="r")
    np.testing.assert_array_equal(after[...], 2 * data + 1)
    np.testing.assert_array_equal(np.asarray(x), 2 * data + 1)
    assert (after.chunks, after.shards) == (before.chunks, before.shards)
    del x
    gc.collect()
    assert [n for n in os.listdir(tmp_path) if ".jask-" in n] == []


def test_from_zarr_does_not_copy(small_tiles, tmp_path):
    data = _rand((5, 7), 6)
    p = tmp_path / "src.zarr"
    jask.from_numpy(data).to_zarr(p)
    x = jask.from_zarr(p)
    assert x.path == str(p)
    assert sorted(os.listdir(tmp_path)) == ["src.zarr"]
    np.testing.assert_array_equal(np.asarray(x), data)


def test_to_zarr_writes_readable_v3_array(small_tiles, tmp_path):
    A, B = _rand((5, 7), 7), _rand((5, 7), 8)
    a, b = jask.from_numpy(A), jask.from_numpy(B)
    lazy_path, stored_path = tmp_path / "lazy.zarr", tmp_path / "stored.zarr"
    jask.to_zarr(a * b - a, lazy_path)      # a lazy value: computed straight into the path
    a.to_zarr(stored_path)                  # an already stored value: copied
    for p, want in ((lazy_path, A * B - A), (stored_path, A)):
        z = zarr.open_array(p, mode="r")
        assert z.metadata.zarr_format == 3
        assert z.shape == (5, 7) and z.dtype == np.float32
        np.testing.assert_allclose(z[...], want, rtol=1e-6, atol=1e-6)
        # and jask reads it back
        np.testing.assert_allclose(np.asarray(jask.from_zarr(p)), want, rtol=1e-6, atol=1e-6)
    assert _hidden(tmp_path) == [], "temporary siblings left behind"
    assert not any(".jask-" in n for n in os.listdir(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["lazy.zarr", "stored.zarr"]


def test_to_zarr_chunks(small_tiles, tmp_path):
    A = _rand((5, 7), 9)
    p = tmp_path / "c.zarr"
    jask.to_zarr(jask.from_numpy(A) * 2.0, p, chunks=(5, 2))
    z = zarr.open_array(p, mode="r")
    assert z.chunks == (5, 2)
    np.testing.assert_allclose(z[...], 2 * A, rtol=1e-6)


def test_zero_dim_and_empty_arrays_are_written(small_tiles, tmp_path):
    """A 0-d array and a size-0 one reach their paths: to_zarr, update_ and rechunk. (A 0-d array's to_zarr
    returned and wrote nothing, and its update_ left a broken array; a size-0 one divided by zero.)"""
    jask.to_zarr(jask.from_numpy(np.float32(3)), tmp_path / "s.zarr")
    assert zarr.open_array(tmp_path / "s.zarr", mode="r")[()] == 3
    u = jask.from_zarr(tmp_path / "s.zarr", mode="r+")
    u.update_(jask.from_numpy(np.float32(6)))          # (0-d arithmetic gives in-memory JAX scalars)
    assert zarr.open_array(tmp_path / "s.zarr", mode="r")[()] == 6 and float(np.asarray(u)) == 6
    empty = jask.from_numpy(np.zeros((0, 3), np.float32))
    jask.to_zarr(empty * 2.0, tmp_path / "e.zarr")
    assert zarr.open_array(tmp_path / "e.zarr", mode="r").shape == (0, 3)
    assert np.asarray(jask.rechunk(empty, (1, 3))).shape == (0, 3)


def test_to_zarr_creates_parent_folders(small_tiles, tmp_path):
    A = _rand((5, 7), 10)
    p = tmp_path / "deep" / "er" / "x.zarr"
    jask.from_numpy(A).to_zarr(p)
    np.testing.assert_array_equal(zarr.open_array(p, mode="r")[...], A)


def test_to_zarr_overwrite_replaces(small_tiles, tmp_path):
    A, B = _rand((5, 7), 11), _rand((9, 6), 12)
    p = tmp_path / "out.zarr"
    jask.from_numpy(A).to_zarr(p)
    jask.to_zarr(jask.square(jask.from_numpy(B)), p, overwrite=True)  # a different shape, even
    z = zarr.open_array(p, mode="r")
    assert z.shape == (9, 6)
    np.testing.assert_allclose(z[...], B * B, rtol=1e-6)
    assert sorted(os.listdir(tmp_path)) == ["out.zarr"], "old copy or temporaries left behind"


def test_to_zarr_failure_leaves_nothing(small_tiles, tmp_path):
    """A computation that fails part-way leaves neither the target nor hidden temporaries."""
    A = _rand((5, 7), 13)
    a = jask.from_numpy(A)
    lazy = a + a
    os.rename(a.path, a.path + ".moved")  # reading the input will fail mid-computation
    try:
        with pytest.raises(FileNotFoundError):
            jask.to_zarr(lazy, tmp_path / "never.zarr")
    finally:
        os.rename(a.path + ".moved", a.path)
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- update_

def test_update_user_store(small_tiles, tmp_path):
    A, B = _rand((5, 7), 14), _rand((5, 7), 15)
    p = tmp_path / "w.zarr"
    jask.from_numpy(A).to_zarr(p)
    x = jask.from_zarr(p, mode="r+")
    old_lazy = x * 2.0                  # computed from the old contents, not yet run
    old_sum = jask.sum(x)
    x.update_(jask.from_numpy(B) - x)   # the new value may read the old one
    np.testing.assert_allclose(np.asarray(x), B - A, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(old_lazy), 2 * A, rtol=1e-6)
    np.testing.assert_allclose(float(old_sum), float(A.sum()), rtol=1e-5)
    assert x.path == str(p)
    np.testing.assert_allclose(np.asarray(jask.from_zarr(p)), B - A, rtol=1e-6)
    np.testing.assert_allclose(zarr.open_array(p, mode="r")[...], B - A, rtol=1e-6)
    assert zarr.open_array(p, mode="r").chunks == (4, 4)
    # a second update_ works too
    x.update_(jask.from_numpy(A))
    np.testing.assert_array_equal(zarr.open_array(p, mode="r")[...], A)
    del old_lazy
    gc.collect()
    assert sorted(os.listdir(tmp_path)) == ["w.zarr"]


@pytest.mark.parametrize("call", ["update_", "update_all", "resume"])
def test_update_keeps_the_stores_metadata(small_tiles, tmp_path, call):
    """update_ / update_all write a new array in place of the old: it keeps the user's attributes (jask's
    marker merged in), dimension names, codecs, fill value and chunk key encoding, and still stores every chunk."""
    from zarr.codecs import ZstdCodec
    data = _rand((8, 8), 30)
    p = tmp_path / "meta.zarr"
    z = zarr.create_array(p, shape=data.shape, chunks=(4, 4), dtype="float32", compressors=ZstdCodec(level=5),
                          attributes={"units": "m"}, dimension_names=["t", "x"], fill_value=5.0,
                          chunk_key_encoding={"name": "v2", "separator": "."})
    z[...] = data
    w = jask.from_zarr(p, mode="r+")
    if call == "update_all":
        jask.update_all({"w": w}, {"w": w * 2.0 - 5.0})
    else:
        w.update_(w * 2.0 - 5.0, resume=(call == "resume"))
    after = zarr.open_array(p, mode="r")
    np.testing.assert_allclose(after[...], 2 * data - 5, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(w), 2 * data - 5, rtol=1e-6)
    assert dict(after.attrs) == {"units": "m", "jask": {"dense": True}}
    assert after.metadata.dimension_names == ("t", "x")
    assert after.compressors == (ZstdCodec(level=5),) and after.filters == z.filters
    assert after.fill_value == 5.0
    assert after.metadata.chunk_key_encoding == z.metadata.chunk_key_encoding
    assert sorted(n for n in os.listdir(p) if not n.startswith("zarr")) == ["0.0", "0.1", "1.0", "1.1"]
    w.update_(jask.from_numpy(np.full(data.shape, 5.0, np.float32)))    # all fill values: still every chunk
    assert len(os.listdir(p)) == 5 and zarr.open_array(p, mode="r").attrs["units"] == "m"
    np.testing.assert_array_equal(np.asarray(jask.from_zarr(p)), 5.0)


def test_update_of_bfloat16_store_keeps_its_dtype_and_attributes(small_tiles, tmp_path):
    import ml_dtypes
    data = _rand((6, 6), 31).astype(ml_dtypes.bfloat16)
    p = tmp_path / "bf.zarr"
    jask.to_zarr(jask.from_numpy(data), p, chunks=(3, 3))
    zarr.open_array(p, mode="r+").attrs["source"] = "run 7"
    w = jask.from_zarr(p, mode="r+")
    w.update_(w * 2)
    assert w.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(np.asarray(jask.from_zarr(p)), (data * 2).astype(ml_dtypes.bfloat16))
    assert dict(zarr.open_array(p, mode="r").attrs) == {"source": "run 7",
                                                       "jask": {"dense": True, "dtype": "bfloat16"}}


@pytest.mark.parametrize("layout", [dict(chunks=(8, 8)), dict(chunks=(4, 4), shards=(8, 8)),
                                    dict(chunks=(8, 8), compressors=zarr.codecs.ZstdCodec())],
                         ids=["chunks", "shards", "compressed"])
def test_a_jask_array_zarr_removed_a_chunk_of_fill_values_from(small_tiles, tmp_path, layout):
    """zarr-python (write_empty_chunks=False) removes a chunk it writes all fill values to. In an array jask
    wrote every chunk of, jask cannot tell that from damage: the error says what probably happened and names
    from_zarr(..., missing_chunks="fill"), which reads zarr's values; update_ then stores every chunk again."""
    from jask.io.read_errors import MissingChunkError
    p = tmp_path / "dense.zarr"
    jask.to_zarr(jask.from_numpy(np.ones((16, 16), np.float32)), p, **layout)
    z = zarr.open_array(p, mode="r+")
    edge = layout["chunks"][0]
    z[:edge, :edge] = 0.0                          # one (inner) chunk of fill values: zarr drops it
    want = z[...]
    assert want.sum() == 256 - edge * edge
    with pytest.raises(MissingChunkError, match=r"is missing.*write_empty_chunks=False.*"
                                                r"jask\.from_zarr\('.*dense\.zarr', missing_chunks='fill'\)"):
        float(jask.sum(jask.from_zarr(p)))
    x = jask.from_zarr(p, mode="r+", missing_chunks="fill")
    np.testing.assert_array_equal(np.asarray(x), want)
    assert float(jask.sum(x)) == want.sum()
    x.update_(x + 1.0)
    np.testing.assert_array_equal(np.asarray(jask.from_zarr(p)), want + 1)    # dense again: reads as it is
    with pytest.raises(ValueError, match="missing_chunks must be 'auto' or 'fill', got 'zero'"):
        jask.from_zarr(p, missing_chunks="zero")


def test_update_scratch_array(small_tiles):
    A, B = _rand((5, 7), 16), _rand((5, 7), 17)
    x = jask.from_numpy(A)
    old_lazy = jask.square(x)
    x.update_(x + jask.from_numpy(B))
    np.testing.assert_allclose(np.asarray(x), A + B, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(old_lazy), A * A, rtol=1e-6)


def test_update_keeps_jit_from_retracing(small_tiles, tmp_path):
    A = _rand((5, 7), 18)
    p = tmp_path / "w.zarr"
    jask.from_numpy(A).to_zarr(p)
    x = jask.from_zarr(p, mode="r+")
    traces = []

    @jax.jit
    def step(x):
        traces.append(1)
        return jask.sum(jask.square(x)), x * 0.5

    want = A
    for _ in range(3):
        loss, new = step(x)
        np.testing.assert_allclose(float(loss), float(np.sum(want ** 2)), rtol=1e-5)
        x.update_(new)
        want = want * 0.5
    assert len(traces) == 1
    np.testing.assert_allclose(zarr.open_array(p, mode="r")[...], want, rtol=1e-6)


# ---------------------------------------------------------------- crash recovery

@pytest.mark.parametrize("kind", ["new", "old"])
def test_recover_from_interrupted_swap(small_tiles, tmp_path, kind):
    A = _rand((5, 7), 19)
    p = tmp_path / "arr.zarr"
    jask.from_numpy(A).to_zarr(p)
    sibling = tmp_path / f".arr.zarr.jask-{kind}-{os.getpid()}-abc123"
    os.rename(p, sibling)           # the crash happened between the two renames
    assert not p.exists()
    recover(str(p))
    assert p.exists() and not sibling.exists()
    np.testing.assert_array_equal(zarr.open_array(p, mode="r")[...], A)


def test_recover_prefers_new_over_old(small_tiles, tmp_path):
    A, B = _rand((5, 7), 20), _rand((5, 7), 21)
    pa, pb = tmp_path / "a.zarr", tmp_path / "b.zarr"
    jask.from_numpy(A).to_zarr(pa)
    jask.from_numpy(B).to_zarr(pb)
    target = tmp_path / "t.zarr"
    os.rename(pa, tmp_path / f".t.zarr.jask-old-{os.getpid()}-aaaaaa")
    os.rename(pb, tmp_path / f".t.zarr.jask-new-{os.getpid()}-bbbbbb")
    recover(str(target))
    np.testing.assert_array_equal(zarr.open_array(target, mode="r")[...], B)


def test_from_zarr_recovers_automatically(small_tiles, tmp_path):
    A = _rand((5, 7), 22)
    p = tmp_path / "arr.zarr"
    jask.from_numpy(A).to_zarr(p)
    os.rename(p, tmp_path / f".arr.zarr.jask-old-{os.getpid()}-abc123")
    np.testing.assert_array_equal(np.asarray(jask.from_zarr(p)), A)


def test_recover_removes_dead_process_temporaries(small_tiles, tmp_path):
    A = _rand((5, 7), 23)
    p = tmp_path / "arr.zarr"
    jask.from_numpy(A).to_zarr(p)
    dead = tmp_path / f".arr.zarr.jask-tmp-{_dead_pid()}-abc123"
    live = tmp_path / f".arr.zarr.jask-tmp-{os.getpid()}-{owners.new_token()}"
    earlier = tmp_path / f".arr.zarr.jask-tmp-{os.getpid()}-{_earlier_token()}"   # a restarted container's pid
    elsewhere = tmp_path / f".arr.zarr.jask-tmp-{_dead_pid()}-{_other_host_token()}"   # another host's writer
    for d in (dead, live, earlier, elsewhere):
        d.mkdir()
    os.utime(earlier)                          # as new as can be: the pid's start time cannot tell
    recover(str(p))
    assert not dead.exists(), "an incomplete temporary of a dead process was kept"
    assert not earlier.exists(), "an earlier process's temporary was taken for this process's own"
    assert elsewhere.exists(), "another host's temporary was judged by a pid of this host"
    assert live.exists(), "a temporary of a live process (possibly still writing) was removed"
    np.testing.assert_array_equal(zarr.open_array(p, mode="r")[...], A)


def test_recover_leaves_complete_store_alone(small_tiles, tmp_path):
    A = _rand((5, 7), 24)
    p = tmp_path / "arr.zarr"
    jask.from_numpy(A).to_zarr(p)
    recover(str(p))
    recover(str(tmp_path / "missing.zarr"))
    assert sorted(os.listdir(tmp_path)) == ["arr.zarr"]
    np.testing.assert_array_equal(zarr.open_array(p, mode="r")[...], A)


# ---------------------------------------------------------------- scratch hygiene

def _stores(folder):
    return sorted(n for n in os.listdir(folder) if n.endswith(".zarr") or ".jask-" in n)


def test_scratch_freed_after_eager_work(small_tiles, private_scratch):
    A, B = _rand((5, 7), 25), _rand((5, 7), 26)
    pdir = scratch.process_dir()
    assert os.path.dirname(pdir) == str(private_scratch)
    a, b = jask.from_numpy(A), jask.from_numpy(B)
    c = (a + b).persist()
    s = jask.sum(jask.mul(c, c))
    ga, gb = jax.grad(lambda a, b: jask.sum(jask.square(a - b)), argnums=(0, 1))(a, b)
    np.testing.assert_allclose(float(s), float(np.sum((A + B) ** 2)), rtol=1e-5)
    np.asarray(ga), np.asarray(gb)
    assert _stores(pdir), "the work should have used scratch stores"
    del a, b, c, ga, gb
    gc.collect()
    assert _stores(pdir) == []


def test_scratch_freed_after_jitted_work(small_tiles, private_scratch):
    """Stores used by a compiled call are released by the next eager jask call at the latest."""
    A, B = _rand((5, 7), 27), _rand((5, 7), 28)
    pdir = scratch.process_dir()
    a, b = jask.from_numpy(A), jask.from_numpy(B)
    f = jax.jit(jax.grad(lambda a, b: jask.sum(jask.square(a - b)), argnums=(0, 1)))
    ga, gb = f(a, b)
    p = jax.jit(lambda a: jask.persist(a * 2.0))(a)
    np.testing.assert_allclose(np.asarray(p), 2 * A, rtol=1e-6)
    np.asarray(ga)
    assert _stores(pdir)
    del a, b, ga, gb, p
    gc.collect()
    x = jask.from_numpy(A)
    jask.sum(x)  # an eager op: a safe point
    del x
    gc.collect()
    assert _stores(pdir) == []


def test_failed_computation_leaves_no_scratch(small_tiles, private_scratch):
    A = _rand((5, 7), 29)
    pdir = scratch.process_dir()
    a = jask.from_numpy(A)
    d = a - a
    lazy = jask.mul(d, d)  # d has two consumers: it is written to scratch first
    os.rename(a.path, a.path + ".moved")
    try:
        with pytest.raises(FileNotFoundError):
            np.asarray(lazy)
    finally:
        os.rename(a.path + ".moved", a.path)
    hidden = [n for n in os.listdir(pdir) if ".jask-tmp-" in n]
    assert hidden == [], "a half-written temporary was left in scratch"


def test_cleanup_scratch_removes_only_dead_process_folders(tmp_path):
    root = tmp_path / "root"
    dead = root / f"jask-{_dead_pid()}-abcd1234"
    mine = root / f"jask-{os.getpid()}-{owners.new_token()}"
    earlier = root / f"jask-{os.getpid()}-{_earlier_token()}"     # this pid's earlier process (a container)
    parent = root / f"jask-{os.getppid()}-abcd1234"
    other = root / "jask-notapid-abcd1234"
    unrelated = root / "something-else"
    for d in (dead, mine, earlier, parent, other, unrelated):
        d.mkdir(parents=True)
        (d / "x.zarr").mkdir()
    removed = jask.cleanup_scratch(str(root))
    assert sorted(removed) == sorted([str(dead), str(earlier)])
    assert not dead.exists() and not earlier.exists()
    for d in (mine, parent, other, unrelated):
        assert d.exists(), d
    assert jask.cleanup_scratch(str(root)) == []
    assert jask.cleanup_scratch(str(tmp_path / "missing")) == []


def test_process_dir_is_per_process(private_scratch):
    pdir = scratch.process_dir()
    name = os.path.basename(pdir)
    prefix, pid, token = name.split("-")
    assert prefix == "jask" and int(pid) == os.getpid() and len(token) == 12          # host, process, random
    assert token.startswith(owners._HOST + owners._tag)
    assert scratch.process_dir() == pdir
    path = scratch.new_path()
    assert os.path.dirname(path) == pdir and path.endswith(".zarr") and not os.path.exists(path)


def test_stale_process_folder_swept_on_first_use(small_tiles, tmp_path):
    root = tmp_path / "scratch"
    stale = root / f"jask-{_dead_pid()}-deadbeef"
    (stale / "array-0.zarr").mkdir(parents=True)
    jask.set_memory_budget(config.memory_budget, scratch_dir=root, allow_tmpfs=True)
    x = jask.from_numpy(_rand((5, 7), 30))
    assert os.path.dirname(x.path) == scratch.process_dir()
    assert not stale.exists()


# ---------------------------------------------------------------- array facts

def test_diskarray_properties(small_tiles):
    A = _rand((5, 7), 31)
    x = jask.from_numpy(A)
    assert x.shape == (5, 7)
    assert x.dtype == np.float32
    assert x.ndim == 2
    assert x.size == 35
    assert x.nbytes == 35 * 4
    assert len(x) == 5
    assert x.chunks == (4, 4)
    assert os.path.isdir(x.path)
    r = repr(x)
    assert "shape=(5, 7)" in r and "float32" in r and "chunks=(4, 4)" in r and x.path in r


def test_lazy_diskarray_properties(small_tiles):
    a = jask.from_numpy(_rand((3, 5, 6), 32))
    y = jask.transpose(a, axes=(2, 0, 1)) * 2.0
    assert y.shape == (6, 3, 5) and y.ndim == 3 and y.size == 90 and y.nbytes == 360
    assert y.dtype == np.float32
    assert y.path is None
    assert y.chunks == (4, 3, 4)
    r = repr(y)
    assert "shape=(6, 3, 5)" in r and "lazy=mul" in r
    stored = y.persist()
    assert stored.path is not None and os.path.isdir(stored.path)
    assert "store=" in repr(stored)


def test_zero_dim_len_refused(small_tiles):
    x = jask.from_numpy(np.float32(3.0))
    assert x.shape == () and x.ndim == 0 and x.size == 1
    with pytest.raises(TypeError, match="len"):
        len(x)


def test_arrays_open_on_a_replaced_path_keep_their_values(tmp_path, small_tiles):
    """Arrays are values: replacing a path does not change arrays already open on it."""
    p = tmp_path / "x.zarr"
    jask.from_numpy(np.ones((9, 6), np.float32)).to_zarr(p)
    x = jask.from_zarr(p)
    lazy = x * 2.0
    jask.from_numpy(np.full((9, 6), 5, np.float32)).to_zarr(p, overwrite=True)
    np.testing.assert_array_equal(np.asarray(x), 1.0)
    np.testing.assert_array_equal(np.asarray(lazy), 2.0)
    np.testing.assert_array_equal(np.asarray(jask.from_zarr(p)), 5.0)

    writer, reader = jask.from_zarr(p, mode="r+"), jask.from_zarr(p)
    writer.update_(writer * 3.0)
    np.testing.assert_array_equal(np.asarray(reader), 5.0)
    np.testing.assert_array_equal(np.asarray(writer), 15.0)
    np.testing.assert_array_equal(np.asarray(jask.from_zarr(p)), 15.0)

    assert len(os.listdir(tmp_path)) > 1  # the old contents live on for x, lazy and reader
    del x, lazy, reader
    gc.collect()
    assert sorted(os.listdir(tmp_path)) == ["x.zarr"]


def test_to_zarr_sharded_layout(tmp_path, small_tiles):
    data = np.arange(16 * 8, dtype=np.float32).reshape(16, 8)
    jask.from_numpy(data).to_zarr(tmp_path / "s.zarr", chunks=(4, 4), shards=(8, 8))
    z = zarr.open_array(tmp_path / "s.zarr", mode="r")
    assert tuple(z.shards) == (8, 8) and tuple(z.chunks) == (4, 4)
    np.testing.assert_array_equal(np.asarray(jask.from_zarr(tmp_path / "s.zarr")), data)
    with pytest.raises(ValueError, match="multiples of chunks"):
        jask.from_numpy(data).to_zarr(tmp_path / "t.zarr", chunks=(4, 4), shards=(6, 8))
    assert not (tmp_path / "t.zarr").exists()


def test_rechunk_writes_the_requested_layout(tmp_path, small_tiles):
    data = np.arange(16 * 12, dtype=np.float32).reshape(16, 12)
    p = tmp_path / "odd.zarr"
    zarr.create_array(p, shape=data.shape, dtype=data.dtype, chunks=(5, 7))[:] = data
    x = jask.from_zarr(p)
    y = jask.rechunk(x, (4, 4), shards=(8, 12))
    assert y.chunks == (4, 4) and zarr.open_array(y.path, mode="r").shards == (8, 12)
    np.testing.assert_array_equal(np.asarray(y), data)
    np.testing.assert_array_equal(np.asarray(jask.rechunk(x * 2.0, (16, 12))), 2 * data)
    assert x.path == str(p)  # the source is untouched
    with pytest.raises(ValueError, match="chunks"):
        jask.rechunk(x, (4,))


def test_copying_a_stored_array_uses_whole_tiles(tmp_path):
    """``to_zarr`` of an array already on disk streams whole tiles (it once fell back to 1x1 tiles)."""
    x = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    a = jask.from_numpy(x, chunks=(16, 16))
    with jask.profile() as p:
        a.to_zarr(str(tmp_path / "copy.zarr"))
    assert p.tiles == 1 and p.bytes_read == x.nbytes
    np.testing.assert_array_equal(np.asarray(jask.from_zarr(str(tmp_path / "copy.zarr"))), x)


@pytest.mark.parametrize("how", ["copy", "deepcopy"])
def test_copies_are_snapshots_that_write_nothing(tmp_path, how):
    """copy.copy/copy.deepcopy (optax and user code call them) give an array of the same value,
    writing nothing; an update_ of the original later leaves the copy at the old value."""
    import copy
    path = str(tmp_path / "w.zarr")
    old, new = np.arange(12, dtype=np.float32).reshape(3, 4), np.ones((3, 4), np.float32)
    jask.from_numpy(old).to_zarr(path)
    w = jask.from_zarr(path, mode="r+")
    with jask.profile() as p:
        c = getattr(copy, how)(w)
    assert isinstance(c, jask.DiskArray) and c is not w and p.bytes_written == 0
    w.update_(jask.from_numpy(new))
    np.testing.assert_array_equal(np.asarray(c), old)
    np.testing.assert_array_equal(np.asarray(w), new)
    lazy = getattr(copy, how)(w * 2.0)        # a lazy value copies as lazy
    np.testing.assert_array_equal(np.asarray(lazy), new * 2)
