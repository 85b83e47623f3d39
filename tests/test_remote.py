"""Store URLs: s3:// against a real S3 server on loopback (moto), memory://, file://, and bad URLs.

The S3 tests start ``python -m moto.server`` on 127.0.0.1 (jask/bench/s3server.py)
and are skipped, saying why, where moto[server] or s3fs is not installed; the
memory://, file:// and URL-error tests need neither.
"""
import gc
import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jask
from jask.bench import s3server
from jask.io import backends
from jask.io.reader import MissingChunkError, reader_for
from jask.io.remote import RemoteStore
from jask.io.urls import BucketNotFoundError, RemoteAccessError, StoreURLError

BUCKET = "jask-test"
MOTO_MISSING = s3server.moto_missing()
needs_moto = pytest.mark.skipif(MOTO_MISSING is not None, reason=f"S3 tests: {MOTO_MISSING}")


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server (no credential checks) with one bucket."""
    server = s3server.S3Server()
    server.make_bucket(BUCKET)
    yield server
    server.stop()


@pytest.fixture(params=["obstore", "fsspec"])
def backend(request, monkeypatch):
    """s3:// through zarr's ObjectStore (obstore) and through its FsspecStore (s3fs)."""
    if request.param == "obstore":
        pytest.importorskip("obstore", reason="the obstore route needs obstore")
    monkeypatch.setattr(backends, "USE_OBSTORE", request.param == "obstore")
    return request.param


def _keys(server, prefix):
    listed = server.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return sorted(o["Key"] for o in listed.get("Contents", []))


def _data(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------- URLs

@pytest.mark.parametrize("url", ["s3:/bucket/x.zarr", "s3:bucket/x", "ftp://host/x.zarr", "memory:x",
                                 "s3://", "s3://bucket/../x", "file://otherhost/x"])
def test_malformed_urls_are_named_errors(url, tmp_path, monkeypatch):
    """A typo in a URL is refused, naming it, instead of becoming a local folder called 's3:'."""
    monkeypatch.chdir(tmp_path)
    x = jask.from_numpy(np.ones((2, 3), np.float32))
    for call in (lambda: jask.from_zarr(url), lambda: jask.to_zarr(x, url)):
        with pytest.raises(StoreURLError) as err:
            call()
        assert err.value.url == url and url in str(err.value)
    assert os.listdir(tmp_path) == []


def test_storage_options_for_a_local_path_are_refused(tmp_path):
    x = jask.from_numpy(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="storage_options apply to store URLs"):
        jask.to_zarr(x, tmp_path / "a.zarr", storage_options={"key": "k"})
    assert not os.path.exists(tmp_path / "a.zarr")
    with pytest.raises(ValueError, match="storage_options apply to store URLs"):
        jask.from_zarr(tmp_path / "a.zarr", storage_options={"key": "k"})


def test_missing_package_for_a_scheme_is_named(monkeypatch):
    """gs:// without gcsfs (hidden from imports here: CI installs it for tests/test_gcs.py): the
    error names the package to install."""
    monkeypatch.setitem(sys.modules, "gcsfs", None)     # `import gcsfs` now raises ImportError
    with pytest.raises(StoreURLError, match="pip install gcsfs") as err:
        jask.from_zarr("gs://some-bucket/x.zarr")
    assert err.value.url == "gs://some-bucket/x.zarr"


def test_file_url_uses_the_local_reader(tmp_path):
    """file:// URLs are local paths: same folder, direct reads, and update_'s folder swap."""
    a = _data((40, 30))
    url = f"file://{tmp_path}/a.zarr"
    jask.to_zarr(jask.from_numpy(a), url, chunks=(16, 16))
    assert os.path.exists(tmp_path / "a.zarr" / "zarr.json")
    x = jask.from_zarr(url, mode="r+")
    store = x._node.resolved().store
    assert not isinstance(store, RemoteStore) and reader_for(store).mode == "chunk"
    np.testing.assert_array_equal(np.asarray(x), a)
    x.update_(x * 2)
    np.testing.assert_array_equal(np.asarray(jask.from_zarr(str(tmp_path / "a.zarr"))), a * 2)


def test_memory_round_trip_and_update():
    import fsspec
    fs = fsspec.filesystem("memory")
    url = "memory://jask-test-mem/a.zarr"
    a, b = _data((50, 20), 1), _data((50, 20), 2)
    try:
        jask.to_zarr(jask.from_numpy(a), url, chunks=(16, 8))
        with pytest.raises(FileExistsError, match=url):
            jask.to_zarr(jask.from_numpy(b), url)
        x = jask.from_zarr(url, mode="r+")
        np.testing.assert_array_equal(np.asarray(x), a)
        np.testing.assert_allclose(float(jask.sum(x + x)), float((a + a).sum()), rtol=1e-5)
        before = jask.from_zarr(url)
        x.update_(jask.from_numpy(b))
        np.testing.assert_array_equal(np.asarray(jask.from_zarr(url)), b)
        np.testing.assert_array_equal(np.asarray(before), a)     # opened before: keeps its version
        versions = {p.split("/")[3] for p in fs.find("/jask-test-mem/a.zarr") if "/v-" in p}
        assert len(versions) == 2
        del before
        gc.collect()
        versions = {p.split("/")[3] for p in fs.find("/jask-test-mem/a.zarr") if "/v-" in p}
        assert len(versions) == 1                                # the replaced one is gone once unread
    finally:
        fs.rm("/jask-test-mem", recursive=True)


def test_pointer_write_that_lands_but_raises_keeps_the_new_version(monkeypatch):
    """A pointer PUT applied whose reply was lost: the version the URL now names is kept, not deleted."""
    import fsspec
    from jask.io import versions
    url, put = "memory://jask-test-lost/a.zarr", versions.write_pointer

    def lost_reply(root, version):
        put(root, version)
        raise TimeoutError("reply lost")

    monkeypatch.setattr(versions, "write_pointer", lost_reply)
    try:
        jask.to_zarr(jask.from_numpy(np.ones((4, 4), np.float32)), url)
        np.testing.assert_array_equal(np.asarray(jask.from_zarr(url)), 1.0)
    finally:
        fsspec.filesystem("memory").rm("/jask-test-lost", recursive=True)


def test_plain_zarr_array_at_a_url_is_read_and_replaced():
    """A Zarr array other tools wrote at a URL opens as it is; update_ turns it into jask's versioned layout."""
    import fsspec
    import zarr
    fs = fsspec.filesystem("memory")
    url = "memory://jask-test-plain/p.zarr"
    a = _data((12, 10), 9)
    try:
        zarr.create_array(url, shape=a.shape, chunks=(5, 5), dtype="float32", attributes={"units": "m"},
                          dimension_names=["t", "x"], fill_value=5.0)[...] = a
        x = jask.from_zarr(url, mode="r+")
        np.testing.assert_array_equal(np.asarray(x), a)
        x.update_(x * 2)
        np.testing.assert_array_equal(np.asarray(jask.from_zarr(url)), a * 2)
        current = zarr.open_group(url).attrs["jask"]["current"]
        assert current.startswith("v-")
        new = zarr.open_array(f"{url}/{current}", mode="r")      # the user's metadata is kept
        assert (dict(new.attrs), new.metadata.dimension_names, new.fill_value) == (
            {"units": "m", "jask": {"dense": True}}, ("t", "x"), 5.0)
        assert not [p for p in fs.find("/jask-test-plain/p.zarr") if "/c/" in p and "/v-" not in p]
    finally:
        fs.rm("/jask-test-plain", recursive=True)


def test_version_writer_fills_another_writers_version():
    """What a second process of a jax.distributed run does: write its tiles, zero tiles included, into the
    version another pending store created; the pointer moves only at that store's commit."""
    import fsspec
    from jask.io.remote import RemotePendingStore, VersionWriter
    from jask.io.urls import RemoteStoreError, parse
    url = "memory://jask-test-share/a.zarr"
    a = _data((8, 6), 11)
    a[4:] = 0                                   # a chunk of fill values: stored all the same (dense)
    try:
        pending = RemotePendingStore(parse(url), a.shape, a.dtype, (4, 6))
        pending.write((slice(0, 4), slice(0, 6)), a[:4])
        other = VersionWriter(f"{url}/{pending.version}")
        other.write((slice(4, 8), slice(0, 6)), a[4:])
        other.finish()
        with pytest.raises(FileNotFoundError):
            jask.from_zarr(url)                 # nothing committed yet
        pending.commit(owned=False)
        np.testing.assert_array_equal(np.asarray(jask.from_zarr(url)), a)
        with pytest.raises(RemoteStoreError, match="v-0000000000001-00000000"):
            VersionWriter(f"{url}/v-0000000000001-00000000")
    finally:
        fsspec.filesystem("memory").rm("/jask-test-share", recursive=True)


def test_reader_whose_version_is_deleted_gets_a_named_error():
    """Another process's writer deleted the version this reader opened: an error naming it, not other data."""
    import fsspec
    fs = fsspec.filesystem("memory")
    url = "memory://jask-test-gone/a.zarr"
    try:
        jask.to_zarr(jask.from_numpy(_data((20, 8), 10)), url, chunks=(10, 8))
        x = jask.from_zarr(url)
        version = x._node.resolved().store.version
        fs.rm(f"/jask-test-gone/a.zarr/{version}/c", recursive=True)
        with pytest.raises(MissingChunkError, match=f"{url}/{version}"):
            np.asarray(x)
    finally:
        fs.rm("/jask-test-gone", recursive=True)


def test_scratch_on_an_object_store():
    """Op outputs and persisted arrays can live under a store URL; each is deleted once freed."""
    import fsspec
    fs = fsspec.filesystem("memory")
    jask.config.update("allow_tmpfs", True)         # memory:// lives in RAM, as tmpfs: allowed for the test
    jask.config.update("scratch_dir", "memory://jask-test-scratch")
    a = _data((30, 20), 3)
    x = jask.from_numpy(a)
    y = jask.persist(x * 3 + 1)
    assert isinstance(y._node.resolved().store, RemoteStore)
    np.testing.assert_allclose(np.asarray(y), a * 3 + 1, rtol=1e-6, atol=1e-6)
    assert fs.find("/jask-test-scratch")
    del x, y
    gc.collect()
    left = fs.find("/jask-test-scratch")
    assert len(left) == 1 and left[0].endswith("/heartbeat"), "only the process folder's heartbeat stays"


def _put(fs, path, doc=None):
    with fs.open(path, "wb") as f:
        f.write(json.dumps(doc or {}).encode())


def test_dead_processes_scratch_folders_in_a_bucket_are_swept(monkeypatch):
    """A process folder in an object-store scratch dir whose heartbeat stopped (or never was) is deleted
    at the next process's first use of that dir and by cleanup_scratch; live ones and other keys stay."""
    import fsspec
    from jask.io import remote_scratch
    fs = fsspec.filesystem("memory")
    root = "/jask-test-scratch-sweep"      # memory:// URLs name it without the leading slash
    now = time.time()
    _put(fs, f"{root}/jask-11-deadbeef/heartbeat", {"time": now - remote_scratch.STALE_S - 5})
    _put(fs, f"{root}/jask-11-deadbeef/array-0.zarr/zarr.json")
    _put(fs, f"{root}/jask-12-cafebabe/array-3.zarr/zarr.json")          # killed before its heartbeat
    _put(fs, f"{root}/jask-13-0badf00d/heartbeat", {"time": now})        # alive, on some other host
    _put(fs, f"{root}/jask-13-0badf00d/array-1.zarr/zarr.json")
    _put(fs, f"{root}/notes/readme.json")                                 # not a process folder
    monkeypatch.setattr(remote_scratch, "HEARTBEAT_S", 0.05)
    jask.config.update("allow_tmpfs", True)         # memory:// lives in RAM, as tmpfs: allowed for the test
    jask.config.update("scratch_dir", f"memory:/{root}")
    y = jask.persist(jask.from_numpy(np.ones((4, 4), np.float32)) * 2)
    folders = {p.split("/")[2] for p in fs.find(root)}
    own = [f for f in folders if f.startswith(f"jask-{os.getpid()}-")]
    assert folders == {"jask-13-0badf00d", "notes", *own} and len(own) == 1
    beat = json.loads(fs.cat(f"{root}/{own[0]}/heartbeat"))["time"]
    time.sleep(0.3)
    assert json.loads(fs.cat(f"{root}/{own[0]}/heartbeat"))["time"] > beat, "the heartbeat is renewed"
    assert jask.cleanup_scratch() == []
    _put(fs, f"{root}/jask-13-0badf00d/heartbeat", {"time": now - remote_scratch.STALE_S - 5})   # it died
    assert jask.cleanup_scratch() == [f"memory:/{root}/jask-13-0badf00d"]
    assert {p.split("/")[2] for p in fs.find(root)} == {"notes", *own}, "its own folder is never swept"
    np.testing.assert_array_equal(np.asarray(y), 2.0)
    del y
    fs.rm(f"{root}/notes", recursive=True)


def test_orphan_versions_older_than_a_day_are_swept_and_young_or_kept_ones_stay():
    """versions.sweep_orphans (run at each commit to a URL): a version prefix no pointer names and older
    than ORPHAN_AGE_S is a killed writer's; a young one may be another writer's work in progress."""
    import fsspec
    from jask.io import backends, versions
    from jask.io.urls import parse
    fs = fsspec.filesystem("memory")
    root_path = "/jask-test-orphans"
    day_old = int((time.time() - versions.ORPHAN_AGE_S - 60) * 1000)
    old, kept = f"v-{day_old:013d}-aaaaaaaa", f"v-{day_old:013d}-bbbbbbbb"
    young = versions.new_version_name()
    for name in (old, kept, young):
        _put(fs, f"{root_path}/{name}/zarr.json")
    _put(fs, f"{root_path}/notes.json")
    root = backends.zarr_store(parse(f"memory:/{root_path}", "test"), None, "test")
    assert versions.sweep_orphans(root, keep={kept}) == [old]
    assert {p.split("/")[2] for p in fs.find(root_path)} == {kept, young, "notes.json"}
    fs.rm(root_path, recursive=True)


def test_local_output_with_object_store_scratch_and_cleanup_of_url_roots(tmp_path, monkeypatch):
    """A scratch dir on an object store does not stop writes to local paths; cleanup_scratch takes a
    file:// root as its folder (and sweeps nothing, deliberately, under an object store)."""
    from jask.io import owners
    jask.config.update("allow_tmpfs", True)         # memory:// lives in RAM, as tmpfs: allowed for the test
    jask.config.update("scratch_dir", "memory://jask-test-scratch2")
    jask.to_zarr(jask.from_numpy(np.ones((4, 4), np.float32)), str(tmp_path / "out.zarr"))
    np.testing.assert_array_equal(np.asarray(jask.from_zarr(str(tmp_path / "out.zarr"))), 1.0)
    assert jask.cleanup_scratch() == []
    left = tmp_path / "root" / "jask-4194000-abcd1234"
    left.mkdir(parents=True)
    monkeypatch.setattr(owners, "pid_alive", lambda pid: False)
    assert jask.cleanup_scratch("file://" + str(tmp_path / "root")) == [str(left)]


# ---------------------------------------------------------------- S3

@needs_moto
def test_s3_round_trip_and_ops(s3, backend):
    opts = s3.storage_options()
    a, b, w = _data((96, 40), 4), _data((96, 40), 5), _data((40, 8), 6)
    for name, arr in (("a", a), ("b", b), ("w", w)):
        jask.to_zarr(jask.from_numpy(arr), f"s3://{BUCKET}/{backend}/{name}.zarr", chunks=(32, 16),
                     storage_options=opts)
    x, y, v = (jask.from_zarr(f"s3://{BUCKET}/{backend}/{n}.zarr", storage_options=opts) for n in "abw")
    jask.config.update("tile", 32)     # several tiles per pass
    store = x._node.resolved().store
    assert type(store.array.store._store).__name__ == {"obstore": "ObjectStore", "fsspec": "FsspecStore"}[backend]
    np.testing.assert_array_equal(np.asarray(x), a)
    with jask.profile() as stats:
        total = float(jask.sum(x))
    assert stats.bytes_read == a.nbytes                      # every tile read once, through the prefetcher
    np.testing.assert_allclose(total, a.sum(dtype=np.float64), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(x + y), a + b, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(x @ v), a @ w, rtol=1e-4, atol=1e-4)
    jask.to_zarr(x * y, f"s3://{BUCKET}/{backend}/prod.zarr", storage_options=opts)
    np.testing.assert_allclose(np.asarray(jask.from_zarr(f"s3://{BUCKET}/{backend}/prod.zarr", storage_options=opts)),
                               a * b, rtol=1e-6)


@needs_moto
def test_s3_training_step_reads_the_bucket(s3):
    """jit(value_and_grad) of the demo's loss over X, y in the bucket; w in the bucket updated with update_."""
    opts = s3.storage_options()
    Xn, yn = _data((128, 16), 7), _data((128, 1), 8)
    jask.to_zarr(jask.from_numpy(Xn), f"s3://{BUCKET}/train/X.zarr", chunks=(32, 16), storage_options=opts)
    jask.to_zarr(jask.from_numpy(yn), f"s3://{BUCKET}/train/y.zarr", chunks=(32, 1), storage_options=opts)
    jask.to_zarr(jask.from_numpy(np.zeros((16, 1), np.float32)), f"s3://{BUCKET}/train/w.zarr",
                 storage_options=opts)
    X = jask.from_zarr(f"s3://{BUCKET}/train/X.zarr", storage_options=opts)
    y = jask.from_zarr(f"s3://{BUCKET}/train/y.zarr", storage_options=opts)
    w = jask.from_zarr(f"s3://{BUCKET}/train/w.zarr", mode="r+", storage_options=opts)

    def loss_fn(w, X, y):
        return jask.sum(jask.square(X @ w - y)) / X.shape[0]

    def ref_loss(w):
        return jnp.sum(jnp.square(Xn @ w - yn)) / Xn.shape[0]

    step = jax.jit(jax.value_and_grad(loss_fn))
    wn = np.zeros((16, 1), np.float32)
    for _ in range(2):
        loss, g = step(w, X, y)
        ref, ref_g = jax.value_and_grad(ref_loss)(wn)
        np.testing.assert_allclose(float(loss), float(ref), rtol=1e-5)
        np.testing.assert_allclose(np.asarray(g), np.asarray(ref_g), rtol=1e-4, atol=1e-6)
        w.update_(w - 0.1 * g)
        wn = wn - 0.1 * np.asarray(ref_g)
    stored = jask.from_zarr(f"s3://{BUCKET}/train/w.zarr", storage_options=opts)
    np.testing.assert_allclose(np.asarray(stored), wn, rtol=1e-5, atol=1e-7)
    del w, stored, step, loss, g
    jax.clear_caches()     # jit's cache holds the arrays it traced, and so their versions
    gc.collect()
    assert len({k.split("/")[2] for k in _keys(s3, "train/w.zarr/v-")}) == 1   # old versions deleted


_KILL_CHILD = """
import sys, jask
jask.config.update("tile", 16)   # 8 tiles written
x = jask.from_zarr(sys.argv[1], mode="r+",
                   storage_options={"key": "testing", "secret": "testing", "endpoint_url": sys.argv[2]})
x.update_(x * 2)     # no scratch store: every fault point counted is one of this remote write
"""


@needs_moto
def test_s3_killed_writer_leaves_a_whole_version(s3, tmp_path):
    """SIGKILL an ``update_`` mid-write, before its commit, and just after: old or new, never a mix."""
    opts = s3.storage_options()
    old = np.full((64, 32), 1.0, np.float32)
    cases = {"after_tile_write:2": old, "before_commit:1": old, "after_swap:1": old * 2}
    children = []
    for n, (spec, _) in enumerate(cases.items()):
        url = f"s3://{BUCKET}/kill/{n}.zarr"
        jask.to_zarr(jask.from_numpy(old), url, chunks=(16, 32), storage_options=opts)
        env = dict(os.environ, JASK_FAULT=spec, JASK_SCRATCH_DIR=str(tmp_path), OPENBLAS_NUM_THREADS="1")
        children.append((url, spec, subprocess.Popen([sys.executable, "-c", _KILL_CHILD, url, s3.endpoint],
                                                     env=env, stderr=subprocess.PIPE, text=True)))
    ancient = "v-0000000000001-0badc0de"    # a killed writer's version from long ago
    for n, (url, spec, proc) in enumerate(children):
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == -signal.SIGKILL, f"{spec}: {err[-2000:]}"
        np.testing.assert_array_equal(np.asarray(jask.from_zarr(url, storage_options=opts)), cases[spec])
        s3.client().put_object(Bucket=BUCKET, Key=f"kill/{n}.zarr/{ancient}/zarr.json", Body=b"{}")
        left = {k.split("/")[2] for k in _keys(s3, f"kill/{n}.zarr/v-")}
        jask.to_zarr(jask.from_numpy(old * 3), url, overwrite=True, storage_options=opts)   # still writable
        np.testing.assert_array_equal(np.asarray(jask.from_zarr(url, storage_options=opts)), old * 3)
        now = {k.split("/")[2] for k in _keys(s3, f"kill/{n}.zarr/v-")}
        assert ancient in left and ancient not in now          # swept by the next commit
        if spec != "after_swap:1":
            assert len(left) == 3 and len(now) == 2            # the killed write's young version stays


def check_missing_bucket_and_array_are_named(scheme, bucket, opts):
    """A missing bucket is BucketNotFoundError naming the URL, before any tile; a missing array in a
    bucket is FileNotFoundError naming it (tests/test_gcs.py runs it for gs://)."""
    url = f"{scheme}://no-such-bucket/x.zarr"
    with pytest.raises(BucketNotFoundError, match="no-such-bucket") as err:
        jask.from_zarr(url, storage_options=opts)
    assert err.value.url == url
    x = jask.from_numpy(np.ones((8, 8), np.float32))
    with jask.profile() as stats, pytest.raises(BucketNotFoundError, match="no-such-bucket"):
        jask.to_zarr(x * 2, url, storage_options=opts)
    assert stats.tiles == 0 and stats.bytes_written == 0
    with pytest.raises(FileNotFoundError, match=f"no Zarr array at {scheme}://{bucket}/absent.zarr"):
        jask.from_zarr(f"{scheme}://{bucket}/absent.zarr", storage_options=opts)


@needs_moto
def test_s3_missing_bucket_is_named_before_any_work(s3, backend):
    check_missing_bucket_and_array_are_named("s3", BUCKET, s3.storage_options())


@needs_moto
def test_s3_bad_credentials_are_named_before_any_work(backend):
    """Against a server that checks signatures: a wrong secret or unknown key is RemoteAccessError."""
    server = s3server.S3Server(auth=True)
    try:
        server.make_bucket(BUCKET)
        url = f"s3://{BUCKET}/x.zarr"
        for opts in (server.storage_options(secret="wrong-secret"), server.storage_options(key="AKIAUNKNOWN0")):
            with pytest.raises(RemoteAccessError, match="access denied") as err:
                jask.from_zarr(url, storage_options=opts)
            assert err.value.url == url
            x = jask.from_numpy(np.ones((8, 8), np.float32))
            with jask.profile() as stats, pytest.raises(RemoteAccessError):
                jask.to_zarr(x + 1, url, storage_options=opts)
            assert stats.tiles == 0 and stats.bytes_written == 0
        assert server.client().list_objects_v2(Bucket=BUCKET).get("KeyCount", 0) == 0
    finally:
        server.stop()


@needs_moto
def test_remote_benchmark_runs(tmp_path):
    """``python -m jask.bench --store=s3`` at a tiny size: it runs, every sum is right, every rate is there."""
    import json
    env = dict(os.environ, JASK_BENCH_DIR=str(tmp_path / "bench"))
    proc = subprocess.run([sys.executable, "-m", "jask.bench", "--store=s3", "--remote_mib=4", "--remote_repeat=1",
                           f"--out={tmp_path}"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "remote.json") as f:
        result = json.load(f)
    assert result["sum_ok"] and result["bytes"] == 4 * 2**20
    assert {"jask sum", "jask sum, fsspec route", "raw GET boto3 sequential"} <= result["rates"].keys()
    assert "jask sum / best raw GET" in proc.stdout


def test_memory_urls_are_refused_as_destinations_in_a_multi_process_run(monkeypatch):
    """Each process has its own memory:// store: process 0's commit would be invisible to the others."""
    url = "memory://jask-test-procs/a.zarr"
    a = jask.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
    jask.to_zarr(a, url)
    b = jask.from_zarr(url, mode="r+")
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ValueError, match=r"to_zarr: memory://jask-test-procs/c\.zarr is a memory:// URL.*2 processes"):
        jask.to_zarr(a, "memory://jask-test-procs/c.zarr")
    with pytest.raises(ValueError, match=r"update_: memory://jask-test-procs/a\.zarr is a memory:// URL"):
        b.update_(b + 1)
    monkeypatch.undo()
    np.testing.assert_array_equal(np.asarray(jask.from_zarr(url)), np.asarray(a))     # unchanged
    with pytest.raises(FileNotFoundError):
        jask.from_zarr("memory://jask-test-procs/c.zarr")                             # never written


def test_a_version_removal_fired_inside_an_event_loop_runs_on_a_thread_of_its_own():
    """A finalizer can fire on zarr's I/O thread, which runs an event loop: a blocking removal there
    would be refused, so it runs on a thread of its own (as every removal does; elsewhere the firing
    thread waits for it)."""
    import asyncio
    import threading
    from jask.io import remote
    ran, done = [], threading.Event()

    def remove(tag):
        ran.append((tag, threading.current_thread().name))
        done.set()

    remote._remove_off_loop(remove, ("here",))
    assert ran == [("here", "jask-remove-version")]       # finished when the call returned
    done.clear()

    async def in_loop():
        remote._remove_off_loop(remove, ("loop",))
    asyncio.run(in_loop())
    assert done.wait(5) and ran[-1] == ("loop", "jask-remove-version")



def test_a_removal_the_firing_thread_would_have_to_serve_does_not_hang_it(monkeypatch):
    """A finalizer fired on a thread that the removal itself needs (a loopback server's thread in this
    process, answering the removal's requests: a suite run hung there) waits only a bounded time."""
    import threading
    import time
    from jask.io import remote
    monkeypatch.setattr(remote, "REMOVE_WAIT_SECONDS", 0.2)
    served, removed = threading.Event(), threading.Event()

    def remove():                        # needs the firing thread to go on serving
        if served.wait(10):
            removed.set()

    t0 = time.perf_counter()
    remote._remove_off_loop(remove, ())
    waited = time.perf_counter() - t0
    served.set()                         # the firing thread serves again: the removal finishes
    assert waited < 5 and removed.wait(5), waited

_SCRATCH_CHILD = """
import sys, time, numpy as np, jask
jask.config.update("scratch_storage_options", {"key": "testing", "secret": "testing", "endpoint_url": sys.argv[2]})
jask.config.update("scratch_dir", sys.argv[1])
y = jask.persist(jask.from_numpy(np.ones((8, 8), np.float32)) * 2)    # a scratch store in the bucket
print("ready", flush=True)
time.sleep(600)
"""


@needs_moto
def test_a_killed_process_scratch_folder_in_a_bucket_is_swept_by_another(s3, monkeypatch):
    """A process killed while its scratch stores live in a bucket leaves its folder; once its heartbeat
    is stale, another process's cleanup_scratch deletes it (no pid can say so across hosts)."""
    from jask.io import remote_scratch
    url = f"s3://{BUCKET}/scratch-kill"
    child = subprocess.Popen([sys.executable, "-c", _SCRATCH_CHILD, url, s3.endpoint],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()[-2000:]
    finally:
        child.kill()
        child.wait(timeout=30)
    folders = {k.split("/")[1] for k in _keys(s3, "scratch-kill/")}
    assert len(folders) == 1 and next(iter(folders)).startswith(f"jask-{child.pid}-")
    jask.config.update("scratch_storage_options", s3.storage_options())
    jask.config.update("scratch_dir", url)
    assert jask.cleanup_scratch() == [], "a fresh heartbeat means a live owner"
    monkeypatch.setattr(remote_scratch, "STALE_S", 0.0)    # as if STALE_S had passed
    assert jask.cleanup_scratch() == [f"{url}/{next(iter(folders))}"]
    assert _keys(s3, "scratch-kill/") == []


_FINALIZER_IN_SYNC = """
import gc, sys, time, weakref, concurrent.futures
from zarr.core.sync import sync
from jask.io import remote
done = []
def remove(tag):
    async def one():
        return 1
    sync(one())
    done.append(tag)
class Cycle:
    pass
c = Cycle()
c.me = c                                 # freed only by the garbage collector
weakref.finalize(c, remote._remove_off_loop, remove, ("removed",))
del c
install = concurrent.futures._base._create_and_install_waiters
def collecting(fs, return_when):         # the collector runs at an allocation inside sync's wait
    gc.collect()
    return install(fs, return_when)
concurrent.futures._base._create_and_install_waiters = collecting
async def outer():
    import asyncio
    await asyncio.sleep(0.1)
    return "outer"
print(sync(outer()))
for _ in range(100):
    if done:
        break
    time.sleep(0.05)
print(done)
"""


def test_a_removal_the_collector_fires_inside_a_sync_wait_does_not_hang():
    """A store freed by the garbage collector while this thread waits in zarr's ``sync`` (holding its
    future's lock) is removed on a thread of its own: removing it in place hung a suite run."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", _FINALIZER_IN_SYNC], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["outer", "['removed']"], out.stdout
