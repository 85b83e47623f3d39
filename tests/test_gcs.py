"""gs:// store URLs against a GCS emulator on loopback (gcp-storage-emulator, through gcsfs).

The emulator runs in this process on 127.0.0.1 (a thread), holds its buckets
in memory and checks no credentials, so bad credentials are tested against S3
only (tests/test_remote.py). Skipped, saying why, where gcsfs or the emulator is
not installed (both are in the ``[test]`` extras).

gcsfs >= 2025 first asks a bucket's type over gRPC with TLS, which the
emulator does not serve: each new bucket then stalls 60 s before gcsfs falls
back to its JSON API. ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` (read when
gcsfs is imported) skips that question; the tests set it, as a user of an
emulator would.
"""
import os
import signal
import socket
import subprocess
import sys

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import jask  # noqa: E402

BUCKET = "jask-gcs-test"
MISSING = next((f"gs:// tests need {name} (pip install {pip})" for name, pip in
                (("gcsfs", "gcsfs"), ("gcp_storage_emulator", "gcp-storage-emulator"))
                if not __import__("importlib").util.find_spec(name)), None)
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def gcs():
    """``storage_options`` of a GCS emulator on loopback with one bucket; stopped after the module."""
    from gcp_storage_emulator.server import create_server
    port = _free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    server.start()
    yield {"endpoint_url": f"http://127.0.0.1:{port}", "token": "anon"}
    server.stop()


def _data(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _versions(opts, path):
    import gcsfs
    fs = gcsfs.GCSFileSystem(**opts)
    fs.invalidate_cache()
    return {p.rsplit("/", 1)[1] for p in fs.ls(f"{BUCKET}/{path}") if "/v-" in p}


def test_gcs_round_trip_ops_and_update(gcs):
    a, b = _data((48, 40), 1), _data((48, 40), 2)
    url = f"gs://{BUCKET}/rt/a.zarr"
    jask.to_zarr(jask.from_numpy(a), url, chunks=(16, 16), storage_options=gcs)
    x = jask.from_zarr(url, mode="r+", storage_options=gcs)
    np.testing.assert_array_equal(np.asarray(x), a)
    np.testing.assert_allclose(float(jask.sum(x * 2.0 + 1.0)), float((a * 2 + 1).sum()), rtol=1e-5)
    with pytest.raises(FileExistsError, match=url):
        jask.to_zarr(jask.from_numpy(b), url, storage_options=gcs)
    before = jask.from_zarr(url, storage_options=gcs)
    x.update_(x + jask.from_numpy(b))
    np.testing.assert_allclose(np.asarray(jask.from_zarr(url, storage_options=gcs)), a + b, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(before), a)          # opened before the update: its version stays
    out = f"gs://{BUCKET}/rt/c.zarr"
    jask.to_zarr(jask.square(x), out, storage_options=gcs)          # a lazy op written straight to the bucket
    np.testing.assert_allclose(np.asarray(jask.from_zarr(out, storage_options=gcs)), (a + b) ** 2, rtol=1e-5)


def test_gcs_training_step_reads_the_bucket(gcs):
    """jit(value_and_grad) of the demo's loss over X, y in the bucket; w in the bucket updated with update_."""
    Xn, yn = _data((96, 8), 3), _data((96, 1), 4)
    for name, value, chunks in (("X", Xn, (32, 8)), ("y", yn, (32, 1)), ("w", np.zeros((8, 1), np.float32), None)):
        jask.to_zarr(jask.from_numpy(value), f"gs://{BUCKET}/train/{name}.zarr", chunks=chunks, storage_options=gcs)
    X, y = (jask.from_zarr(f"gs://{BUCKET}/train/{n}.zarr", storage_options=gcs) for n in ("X", "y"))
    w = jask.from_zarr(f"gs://{BUCKET}/train/w.zarr", mode="r+", storage_options=gcs)
    step = jax.jit(jax.value_and_grad(lambda w, X, y: jask.sum(jask.square(X @ w - y)) / X.shape[0]))
    ref = jax.value_and_grad(lambda w: jnp.sum(jnp.square(Xn @ w - yn)) / Xn.shape[0])
    wn = np.zeros((8, 1), np.float32)
    for _ in range(2):
        loss, g = step(w, X, y)
        want, want_g = ref(wn)
        np.testing.assert_allclose(float(loss), float(want), rtol=1e-5)
        np.testing.assert_allclose(np.asarray(g), np.asarray(want_g), rtol=1e-4, atol=1e-6)
        w.update_(w - 0.1 * g)
        wn = wn - 0.1 * np.asarray(want_g)
    np.testing.assert_allclose(np.asarray(jask.from_zarr(f"gs://{BUCKET}/train/w.zarr", storage_options=gcs)), wn,
                               rtol=1e-5, atol=1e-7)


_KILL_CHILD = """
import sys, jask
jask.config.update("tile", 16)   # 4 tiles written
x = jask.from_zarr(sys.argv[1], mode="r+", storage_options={"endpoint_url": sys.argv[2], "token": "anon"})
x.update_(x * 2)
"""


def test_gcs_killed_writer_leaves_a_whole_version(gcs, tmp_path):
    """SIGKILL an ``update_`` mid-write, before its commit and just after it: old or new, never a mix."""
    old = np.full((64, 16), 1.0, np.float32)
    cases = {"after_tile_write:2": old, "before_commit:1": old, "after_swap:1": old * 2}
    for n, (spec, want) in enumerate(cases.items()):
        url = f"gs://{BUCKET}/kill/{n}.zarr"
        jask.to_zarr(jask.from_numpy(old), url, chunks=(16, 16), storage_options=gcs)
        env = dict(os.environ, JASK_FAULT=spec, JASK_SCRATCH_DIR=str(tmp_path), OPENBLAS_NUM_THREADS="1")
        proc = subprocess.run([sys.executable, "-c", _KILL_CHILD, url, gcs["endpoint_url"]], env=env,
                              capture_output=True, text=True, timeout=180)
        assert proc.returncode == -signal.SIGKILL, f"{spec}: {proc.stderr[-2000:]}"
        np.testing.assert_array_equal(np.asarray(jask.from_zarr(url, storage_options=gcs)), want, err_msg=spec)
        left = _versions(gcs, f"kill/{n}.zarr")
        jask.to_zarr(jask.from_numpy(old * 3), url, overwrite=True, storage_options=gcs)     # still writable
        np.testing.assert_array_equal(np.asarray(jask.from_zarr(url, storage_options=gcs)), old * 3)
        now = _versions(gcs, f"kill/{n}.zarr")
        if spec != "after_swap:1":      # the old version and the killed write's (young: kept, it may be live)
            assert len(left) == 2 and len(now) == 2 and len(left & now) == 1, (spec, left, now)


def test_gcs_missing_bucket_and_array_are_named_before_any_work(gcs):
    from test_remote import check_missing_bucket_and_array_are_named
    check_missing_bucket_and_array_are_named("gs", BUCKET, gcs)
