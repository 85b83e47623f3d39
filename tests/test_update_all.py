"""update_all: values against NumPy, pytrees, scratch targets, and bad inputs refused before any work."""
import gc
import os

import numpy as np
import pytest
import zarr

import jask


def _store(path, value):
    zarr.create_array(str(path), shape=value.shape, dtype=value.dtype, chunks=(4, 4), compressors=None,
                      fill_value=0)[...] = value
    return str(path)


@pytest.fixture
def params(tmp_path, small_tiles):
    rng = np.random.default_rng(0)
    values = {k: rng.standard_normal((8, 12)).astype(np.float32) for k in ("w", "b")}
    return {k: _store(tmp_path / f"{k}.zarr", v) for k, v in values.items()}, values


def test_values_and_pytrees(params, tmp_path):
    paths, values = params
    p = {k: jask.from_zarr(v, mode="r+") for k, v in paths.items()}
    s = jask.from_numpy(np.ones((8, 12), np.float32))          # a scratch target: updated plainly
    jask.update_all({"p": p, "s": s}, {"p": {k: x * 0.5 - 1.0 for k, x in p.items()}, "s": s + p["w"]})
    for k, v in values.items():
        np.testing.assert_array_equal(np.asarray(p[k]), v * np.float32(0.5) - np.float32(1.0))
        np.testing.assert_array_equal(zarr.open_array(paths[k], mode="r")[...], v * np.float32(0.5) - 1)
    np.testing.assert_array_equal(np.asarray(s), 1 + values["w"])     # new values read the old arrays
    gc.collect()                                                      # old folders go with their last reader
    assert [n for n in os.listdir(tmp_path) if ".jask-" in n] == []


def test_bad_inputs_touch_nothing(params, tmp_path):
    paths, values = params
    w, b = jask.from_zarr(paths["w"], mode="r+"), jask.from_zarr(paths["b"], mode="r+")
    with pytest.raises(ValueError, match=r"differ in structure: only in the targets: \[1\]"):
        jask.update_all([w, b], [w + 1.0])
    with pytest.raises(ValueError, match=r"only in the targets: \['b'\]; only in the new values: \['c'\]"):
        jask.update_all({"w": w, "b": b}, {"w": w + 1.0, "c": b + 1.0})    # paired in order, it would swap them
    with pytest.raises(ValueError, match="same array is a target twice"):
        jask.update_all([w, w], [w + 1.0, w + 2.0])
    with pytest.raises(ValueError, match=r"update_all: new value has shape \(12, 8\)"):
        jask.update_all([w, b], [w.T, b])
    ro = jask.from_zarr(paths["b"])
    with pytest.raises(ValueError, match=r"b\.zarr must be a local folder opened with .*mode='r\+'"):
        jask.update_all([w, ro], [w + 1.0, ro + 1.0])
    with pytest.raises(ValueError, match="one new value for two targets"):
        v = w + 1.0
        jask.update_all([w, b], [v, v])
    for k, v in values.items():
        np.testing.assert_array_equal(zarr.open_array(paths[k], mode="r")[...], v)
    assert [n for n in os.listdir(tmp_path) if ".jask-" in n] == []


def test_a_new_value_read_by_a_later_stage_of_another(params, tmp_path):
    """``b``'s new value needs all of ``w``'s (a product over it): the pass stores ``w``'s first, uncommitted
    until the group commits, and the later stage reads it where it was written. (It read the lazy node as a
    store, and the checkpointed training step of any model of two parameters failed so.)"""
    paths, values = params
    w, b = jask.from_zarr(paths["w"], mode="r+"), jask.from_zarr(paths["b"], mode="r+")
    w_new = w * 2.0
    jask.update_all([w, b], [w_new, b + (w_new @ w_new.T) @ b])
    ww = values["w"] * np.float32(2)
    np.testing.assert_array_equal(np.asarray(w), ww)
    np.testing.assert_allclose(np.asarray(b), values["b"] + (ww @ ww.T) @ values["b"], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(zarr.open_array(paths["b"], mode="r")[...], np.asarray(b), rtol=0, atol=0)
    del w_new                                            # it reads w's old folder, which then goes
    gc.collect()
    assert [n for n in os.listdir(tmp_path) if ".jask-" in n] == []


def _killed_while_writing_logs(paths, values, tmp_path, cut_short):
    """What a group commit killed while writing its logs leaves: every new folder complete and marked,
    the first target's log written, the second's missing (or, ``cut_short``, half written)."""
    import json
    import subprocess
    import sys
    from jask.io import groups
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    token = f"{proc.pid}-abcdef"                                 # a process that has ended
    for k in ("w", "b"):
        tmp = tmp_path / f".{k}.zarr.jask-tmp-{token}"
        _store(tmp, values[k] + 1)
        (tmp / groups.MARK).write_text(token)
    text = json.dumps({"token": token, "targets": [paths["w"], paths["b"]]})
    (tmp_path / f".w.zarr.jask-group-{token}").write_text(text)
    if cut_short:
        (tmp_path / f".b.zarr.jask-group-{token}").write_text(text[:len(text) // 2])


def test_a_log_killed_before_its_rename_is_swept(params, tmp_path):
    """A writer killed while writing a log leaves it under its ``-glog-`` name, no swap done: the next open
    of the target removes it with the other leftovers, and the target keeps its value."""
    paths, values = params
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()                                                     # a process that has ended
    writing = tmp_path / f".w.zarr.jask-glog-{proc.pid}-abcdef"
    writing.write_text('{"token": "')                               # cut short by the kill
    np.testing.assert_array_equal(np.asarray(jask.from_zarr(paths["w"])), values["w"])
    assert not writing.exists()


@pytest.mark.parametrize("cut_short", [False, True])
@pytest.mark.parametrize("first", ["b", "w"])
def test_a_group_killed_while_writing_its_logs_stays_old(params, tmp_path, first, cut_short):
    """Killed before its last log: the group never reached its commit point, so whichever target is opened
    first, every target keeps its old value and the logs and new folders go (never one new, one old)."""
    paths, values = params
    _killed_while_writing_logs(paths, values, tmp_path, cut_short)
    opened = {k: jask.from_zarr(paths[k]) for k in (first, "w" if first == "b" else "b")}
    for k, v in values.items():
        np.testing.assert_array_equal(np.asarray(opened[k]), v)
        np.testing.assert_array_equal(jask.from_zarr(paths[k]).__array__(), v)
    assert [n for n in os.listdir(tmp_path) if ".jask-" in n] == []


def test_an_io_error_syncing_a_group_log_leaves_every_array_old(params, tmp_path):
    """Durability "power": the group's logs and their folder are fsynced through the same fault point as the
    stores' files (jask.io.durable), so an EIO there aborts the group before any swap: every array stays old,
    and its logs and new folders are gone, so no later recovery could roll it forward."""
    import errno
    from jask.io import faults
    paths, values = params
    jask.config.update("durability", "power")
    targets = []

    def record(point, info):
        if point in ("before_fsync", "after_group_log"):
            targets.append(info.get("target") if point == "before_fsync" else point)
    p = {k: jask.from_zarr(v, mode="r+") for k, v in paths.items()}
    with faults.armed(record):
        jask.update_all(p, {k: x + 1.0 for k, x in p.items()})   # a first commit, to find the logs' fsyncs
    targets = targets[:targets.index("after_group_log")]          # the fsyncs before the first swap
    log_syncs = [n for n, t in enumerate(targets, 1) if ".jask-group-" in os.path.basename(t)
                 or os.path.abspath(t) == str(tmp_path)]
    assert len(log_syncs) == 3, targets                          # two logs, their one folder
    for k, v in values.items():                                   # back to the fixture's values
        zarr.open_array(paths[k], mode="r+")[...] = v
    for n in log_syncs:
        p = {k: jask.from_zarr(v, mode="r+") for k, v in paths.items()}
        with faults.armed(faults.Trigger("before_fsync", n, "EIO")):
            with pytest.raises(OSError) as info:
                jask.update_all(p, {k: x * 2.0 for k, x in p.items()})
        assert info.value.errno == errno.EIO
        for k, v in values.items():
            np.testing.assert_array_equal(zarr.open_array(paths[k], mode="r")[...], v, err_msg=f"fsync {n}")
            np.testing.assert_array_equal(np.asarray(jask.from_zarr(paths[k])), v, err_msg=f"fsync {n}, reopened")
        gc.collect()                                              # the first commit's old folders go
        assert sorted(os.listdir(tmp_path)) == ["b.zarr", "w.zarr"], f"fsync {n}: the group is withdrawn"
    del p
    gc.collect()


_KILL_AFTER_FIRST_SWAP = """
import os, signal, sys
import jask
from jask.io import faults
jask.config.update("tile", 4)
seen = []
def hook(point, info):
    seen.append(point)
    if point == "after_swap" and "after_group_log" in seen:     # the group's first target is in place
        os.kill(os.getpid(), signal.SIGKILL)
faults.arm(hook)
w, b = (jask.from_zarr(p, mode="r+") for p in sys.argv[1:3])
jask.update_all([w, b], [w + 1.0, b + 1.0])
"""


def test_a_dead_writers_group_rolls_forward_though_its_pid_is_taken(params, tmp_path, monkeypatch):
    """A writer killed between its group's swaps, its pid since given to a new process (the pid in the log's
    name then looks alive): the next open still finishes the group, because the writer's lock on its logs
    died with it. Before, the group stayed half swapped, one target new and one old, until a later open."""
    import signal
    import subprocess
    import sys
    from jask.io import groups
    paths, values = params
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", _KILL_AFTER_FIRST_SWAP, paths["w"], paths["b"]], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert len([n for n in os.listdir(tmp_path) if ".jask-group-" in n]) == 2, os.listdir(tmp_path)
    np.testing.assert_array_equal(zarr.open_array(paths["w"], mode="r")[...], values["w"] + 1)   # half swapped
    np.testing.assert_array_equal(zarr.open_array(paths["b"], mode="r")[...], values["b"])
    monkeypatch.setattr(groups, "owner_gone", lambda pid, path: False)     # the pid names a live process now
    for k in ("b", "w"):
        np.testing.assert_array_equal(np.asarray(jask.from_zarr(paths[k])), values[k] + 1, err_msg=k)
    assert [n for n in os.listdir(tmp_path) if ".jask-group" in n] == []


def test_a_live_writers_group_is_left_to_it(params, tmp_path, monkeypatch):
    """While a group commit is between its swaps (paused in another thread), recovery does not touch it, even
    where the pid test would call its writer gone: the writer's lock on its logs decides. Then it finishes."""
    from jask.io import groups
    from test_reliability import paused_at
    paths, values = params
    p = {k: jask.from_zarr(v, mode="r+") for k, v in paths.items()}
    with paused_at("after_swap", lambda: jask.update_all(p, {k: x + 1.0 for k, x in p.items()})) as first:
        monkeypatch.setattr(groups, "owner_gone", lambda pid, path: True)
        assert groups.roll_forward(paths["b"]) == [] and groups.roll_forward(paths["w"]) == []
        (waiting,) = [k for k in paths if os.path.abspath(paths[k]) != os.path.abspath(first["path"])]
        np.testing.assert_array_equal(zarr.open_array(paths[waiting], mode="r")[...], values[waiting])  # untouched
    for k, v in values.items():
        np.testing.assert_array_equal(np.asarray(p[k]), v + 1, err_msg=k)


@pytest.mark.parametrize("where", ["after the first swap", "between the second target's renames"])
def test_an_error_between_the_swaps_is_finished_by_the_next_open(params, tmp_path, monkeypatch, where):
    """A group commit that raises after its first swap (the writer alive): the error reaches the caller, and
    the next open of either target, in the same process, finishes the group: both new, never one of each.
    Also when the second target's two-rename swap (no RENAME_EXCHANGE) fails with its old folder aside:
    the old one goes back, and its new folder is kept for recovery instead of removed."""
    import errno
    from jask.io import exchange, faults
    paths, values = params
    if where != "after the first swap":
        monkeypatch.setattr(exchange, "USE_EXCHANGE", False)
    p = {k: jask.from_zarr(v, mode="r+") for k, v in paths.items()}
    seen = []

    def fail(point, info):
        seen.append(point)
        if "after_group_log" not in seen:
            return
        if where == "after the first swap" and point == "after_swap" and seen.count("after_swap") == 1 or \
                point == "after_old_aside" and seen.count("after_old_aside") == 2:
            raise OSError(errno.EIO, f"injected {where}")
    with faults.armed(fail):
        with pytest.raises(OSError, match=f"injected {where}"):
            jask.update_all(p, {k: x + 1.0 for k, x in p.items()})
    for k in ("b", "w"):
        np.testing.assert_array_equal(np.asarray(jask.from_zarr(paths[k])), values[k] + 1, err_msg=k)
    del p
    gc.collect()
    assert [n for n in os.listdir(tmp_path) if ".jask-group" in n] == []
