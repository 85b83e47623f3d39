"""Durability "power": the fsync order around a commit, and what a failure at each fsync leaves.

Killing a process at each fsync is covered in tests/test_reliability.py
(``test_sigkill_at_every_fsync_with_power_durability``); here the hook records
and fails fsyncs in this process.
"""
import errno
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

import jask
from jask.io import durable, faults, pins, scratch
from jask.io.store import PendingStore

SHAPE = (8, 12)


def _ints(seed):
    return np.random.default_rng(seed).integers(-9, 10, SHAPE).astype(np.float32)


class _Log:
    """A fault hook recording (point, fsync target or array path) in order, for the arrays at ``only``."""

    def __init__(self, only=None):
        self.events, self.only = [], only

    def __call__(self, point, info):
        if self.only is not None and info.get("path") != self.only:
            return
        if point in ("before_fsync", "before_commit", "after_swap", "after_commit"):
            self.events.append((point, info.get("target", info.get("path"))))


def _files_and_folders(root):
    files, folders = [], []
    for folder, _, names in os.walk(root):
        folders.append(os.path.relpath(folder, root))
        files += [os.path.relpath(os.path.join(folder, n), root) for n in names]
    return sorted(files), sorted(folders)


def _write(value, path, overwrite=False):
    jask.to_zarr(jask.from_numpy(value) * 1.0, path, overwrite=overwrite)


@pytest.mark.parametrize("replace", [False, True])
def test_power_fsyncs_every_file_then_folders_then_parent(small_tiles, tmp_path, replace):
    path = str(tmp_path / "out.zarr")
    if replace:
        _write(_ints(0), path)
    jask.config.update("durability", "power")
    with faults.armed(_Log(only=path)) as log:
        _write(_ints(1), path, overwrite=replace)
    events = log.events
    names = [p for p, _ in events]
    swap, commit = names.index("after_swap"), names.index("after_commit")
    before = [t for p, t in events[:names.index("before_commit")] if p == "before_fsync"]
    tmp_root = before[-1]                                    # the new folder itself comes last
    assert os.path.basename(tmp_root).startswith(".out.zarr.jask-tmp-")
    files, folders = _files_and_folders(path)
    assert len(files) >= 1 + 6                               # zarr.json and 2 x 3 chunks
    rel = [os.path.relpath(t, tmp_root) for t in before]
    assert sorted(rel[:len(files)]) == files                 # every file first ...
    assert sorted(rel[len(files):]) == folders               # ... then every folder once
    for i, folder in enumerate(rel[len(files):], len(files)):
        inside = [r for r in rel if r != folder and (folder == "." or r.startswith(folder + os.sep))]
        assert all(rel.index(r) < i for r in inside), f"{folder} synced before its entry"
    after = [(i, t) for i, (p, t) in enumerate(events) if p == "before_fsync" and i > swap]
    assert after == [(commit - 1, str(tmp_path))], events    # the parent, once, after the swap
    np.testing.assert_array_equal(np.asarray(jask.from_zarr(path)), _ints(1))


def test_power_removes_the_resume_journal_before_the_sync(small_tiles, tmp_path):
    """The journal goes before the fsyncs, so a power cut after the commit cannot leave it in the array."""
    from jask.io.resume import JOURNAL
    path = str(tmp_path / "out.zarr")
    jask.config.update("durability", "power")
    with faults.armed(_Log(only=path)) as log:
        jask.to_zarr(jask.from_numpy(_ints(1)) * 1.0, path, resume=True)
    synced = [t for p, t in log.events if p == "before_fsync"]
    assert synced and not any(t.endswith(JOURNAL) for t in synced), synced
    assert not os.path.exists(os.path.join(path, JOURNAL))


def test_process_durability_and_scratch_stores_never_fsync(small_tiles, tmp_path):
    with faults.armed(_Log()) as log:
        _write(_ints(1), str(tmp_path / "a.zarr"))
    assert [p for p, _ in log.events if p == "before_fsync"] == []
    jask.config.update("durability", "power")
    with faults.armed(_Log()) as log:
        x = (jask.from_numpy(_ints(2)) * 2.0).persist()     # scratch: dies with the process anyway
        np.testing.assert_array_equal(np.asarray(x), 2 * _ints(2))
        stage = PendingStore(scratch.new_path("stage"), (4,), np.float32, (4,))   # a shared stage: owned=False
        stage.write((slice(0, 4),), np.ones(4, np.float32))
        done = stage.commit(owned=False)
        done._pin.release()
        pins.remove_tree(done.path)
    assert [p for p, _ in log.events if p == "before_fsync"] == []


def test_durability_setting_is_checked():
    with pytest.raises(ValueError, match="durability 'disk'.*'process'.*'power'"):
        jask.config.update("durability", "disk")
    assert jask.config.config.durability == "process"


def test_failure_at_each_fsync_leaves_old_or_new(small_tiles, tmp_path):
    """An I/O error at fsync n: before the swap the old array stays whole; at the parent's, the new one is in."""
    old, new = _ints(3), _ints(4)
    probe = str(tmp_path / "probe.zarr")
    _write(old, probe)
    jask.config.update("durability", "power")
    with faults.armed(_Log(only=probe)) as log:
        _write(new, probe, overwrite=True)
    n_fsync = sum(p == "before_fsync" for p, _ in log.events)
    assert n_fsync >= 8
    for n in range(1, n_fsync + 1):
        path = str(tmp_path / f"k{n}.zarr")
        jask.config.update("durability", "process")
        _write(old, path)
        jask.config.update("durability", "power")
        with faults.armed(faults.Trigger("before_fsync", n, "EIO")):
            with pytest.raises(OSError) as info:
                _write(new, path, overwrite=True)
        assert info.value.errno == errno.EIO and path in str(info.value)
        last = n == n_fsync
        if last:
            assert "is in place" in str(info.value)
        got = zarr.open_array(path, mode="r")[...]
        np.testing.assert_array_equal(got, new if last else old, err_msg=f"fsync {n} of {n_fsync}")
        np.testing.assert_array_equal(np.asarray(jask.from_zarr(path)), new if last else old)
        assert [f for f in os.listdir(tmp_path) if ".jask-" in f] == [], f"fsync {n}: leftovers"


@pytest.mark.parametrize("shards", [None, (4, 12)])
def test_power_starts_writeback_of_each_chunk_file_as_written(small_tiles, tmp_path, monkeypatch, shards):
    started = []
    monkeypatch.setattr(durable, "start_writeback", lambda fd: started.append(os.fstat(fd).st_ino))
    value = _ints(5)
    jask.to_zarr(jask.from_numpy(value) * 1.0, str(tmp_path / "p.zarr"), shards=shards)
    assert started == []                                          # durability "process"
    jask.config.update("durability", "power")
    jask.to_zarr(jask.from_numpy(value) * 1.0, str(tmp_path / "q.zarr"), shards=shards)
    files, _ = _files_and_folders(str(tmp_path / "q.zarr"))
    chunk_inodes = {os.lstat(os.path.join(tmp_path, "q.zarr", f)).st_ino for f in files if f != "zarr.json"}
    assert set(started) == chunk_inodes and len(started) >= len(chunk_inodes)   # every chunk or shard file
    np.testing.assert_array_equal(np.asarray(jask.from_zarr(str(tmp_path / "q.zarr"))), value)


# ---------------------------------------------------------------- resume, as a property

def _dead_pid(_seen=[]):
    """The pid of a process that has exited (made once)."""
    if not _seen:
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        proc.wait()
        _seen.append(proc.pid)
    return _seen[0]


@settings(max_examples=12)
@given(shape=st.tuples(st.integers(1, 13), st.integers(1, 13)), tile=st.integers(2, 5),
       stop_at=st.integers(1, 40), durability=st.sampled_from(["process", "power"]))
def test_resume_continues_any_interrupted_write(tmp_path_factory, shape, tile, stop_at, durability):
    """A write stopped by an error after ``stop_at`` tiles keeps its folder, as a killed process's: resume=True
    computes exactly the tiles whose chunks are not journaled, and the result is exact."""
    folder = tmp_path_factory.mktemp("resume")
    out = str(folder / "out.zarr")
    jask.config.update("tile", tile)
    jask.config.update("durability", durability)
    value = np.random.default_rng(sum(shape) * tile).integers(-9, 10, shape).astype(np.float32)
    x = jask.from_numpy(value)
    n_tiles = -(-shape[0] // tile) * -(-shape[1] // tile)

    def stop(point, info):                      # fail: resume=True keeps the journaled folder
        if point == "after_tile_write" and info["path"] == out:
            stop.seen += 1
            if stop.seen == stop_at:
                raise OSError(errno.EIO, "stopped")
    stop.seen = 0
    with faults.armed(stop):
        try:
            jask.to_zarr(x * 2.0 - 1.0, out, resume=True)
        except OSError:
            pass
    if stop_at <= n_tiles:
        assert not os.path.exists(out) and len([n for n in os.listdir(folder) if ".jask-tmp-" in n]) == 1
        with jask.profile() as prof:
            jask.to_zarr(x * 2.0 - 1.0, out, resume=True)
        assert prof.tiles == n_tiles - stop_at               # every tile written had its chunk journaled
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[...], 2 * value - 1)
    assert [n for n in os.listdir(folder) if ".jask-" in n] == []
    shutil.rmtree(folder)
