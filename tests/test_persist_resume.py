"""persist(..., resume=True) in one process: refusals, what a killed process's complete store is reused
for (the identical computation over unchanged inputs only), and how long sweeps keep it.

The SIGKILL tests (a persist killed after k tiles, at its commit, after it) are in test_reliability.py.
"""
import gc
import os
import shutil
import time

import jax
import numpy as np
import pytest
import zarr

import jask
from jask.config import config
from jask.io import resumable_scratch, scratch
from test_storage import _dead_pid


@pytest.fixture
def inputs(tmp_path):
    root = tmp_path / "scratch"
    jask.set_memory_budget(config.memory_budget, scratch_dir=root)
    jask.config.update("tile", 4)
    a = np.arange(64, dtype=np.float32).reshape(8, 8)
    zarr.create_array(str(tmp_path / "a.zarr"), shape=a.shape, dtype=a.dtype, chunks=(4, 4),
                      compressors=None, fill_value=0)[...] = a
    return str(root), str(tmp_path / "a.zarr"), a


def _left_by_a_killed_process(make):
    """Run ``make`` (resumable persists), then put copies of their complete stores back in place after
    they are freed, owned by an ended process: what a process killed after them leaves; returns the paths."""
    arrays = make()
    arrays = arrays if isinstance(arrays, tuple) else (arrays,)
    paths = [c._node.store.path for c in arrays]
    for path in paths:
        shutil.copytree(path, path + "-copy")
    del arrays
    gc.collect()
    dead = _dead_pid()
    for path in paths:
        assert not os.path.exists(path)
        os.rename(path + "-copy", path)
        with open(os.path.join(path, resumable_scratch.OWNER), "w") as f:
            f.write(str(dead))
    return paths[0] if len(paths) == 1 else paths


def test_resume_is_refused_under_jit_and_with_defer(inputs):
    _, path, _ = inputs
    a = jask.from_zarr(path)
    with pytest.raises(TypeError, match=r"resume=True\) runs eagerly only"):
        jax.jit(lambda x: jask.persist(x * 2.0, resume=True))(a)
    with pytest.raises(ValueError, match="resume=True cannot be combined with defer=True"):
        jask.persist(a * 2.0, resume=True, defer=True)


def test_a_complete_store_is_reused_only_for_the_same_computation_on_unchanged_inputs(inputs):
    root, path, a_np = inputs
    a = jask.from_zarr(path, mode="r+")
    left = _left_by_a_killed_process(lambda: jask.persist(a * 2.0 + 1.0, resume=True))
    with jask.profile() as prof:
        other = jask.persist(a * 3.0 + 1.0, resume=True)       # another parameter: another store
    assert prof.tiles == 4 and os.path.isdir(left)
    np.testing.assert_array_equal(np.asarray(other), a_np * 3 + 1)
    a.update_(a + 1.0)                                          # the input changes: no reuse
    with jask.profile() as prof:
        changed = jask.persist(a * 2.0 + 1.0, resume=True)
    assert prof.tiles == 4 and os.path.isdir(left)
    np.testing.assert_array_equal(np.asarray(changed), (a_np + 1) * 2 + 1)
    a = None
    gc.collect()
    assert jask.cleanup_scratch(root, paths=[path]) == [left]   # the stale one: its owner ended
    assert not os.path.exists(left)


def test_a_reused_store_is_taken_whole_and_then_freed(inputs):
    root, path, a_np = inputs
    a = jask.from_zarr(path)
    left = _left_by_a_killed_process(lambda: jask.persist(a * 2.0 + 1.0, resume=True))
    with jask.profile() as prof:
        c = jask.persist(a * 2.0 + 1.0, resume=True)
    assert prof.tiles == 0 and prof.bytes_read == 0 and prof.bytes_written == 0
    assert not os.path.exists(left)                             # moved into this process's scratch folder
    np.testing.assert_array_equal(np.asarray(c), a_np * 2 + 1)
    taken = c._node.store.path
    del c
    gc.collect()
    assert not os.path.exists(taken)


def test_sweeps_keep_a_killed_persist_for_a_while(inputs, monkeypatch):
    root, path, _ = inputs
    a = jask.from_zarr(path)
    left = _left_by_a_killed_process(lambda: jask.persist(a * 2.0 + 1.0, resume=True))
    assert scratch.remove_stale(root) == [] and os.path.isdir(left)     # young: kept for a resume
    old = time.time() - resumable_scratch.KEEP_SECONDS - 60
    os.utime(left, (old, old))
    assert scratch.remove_stale(root) == [left] and not os.path.exists(left)


def test_chained_persists_resume_by_their_keys(inputs):
    """d = persist(f(c)) where c is itself a resumable persist: in a new process c is found under another
    path, yet d's key is the same, so both are taken over and nothing is computed."""
    _, path, a_np = inputs
    a = jask.from_zarr(path)

    def step():
        c = jask.persist(a * 2.0 + 1.0, resume=True)
        return c, jask.persist(c * c - a, resume=True)

    left = _left_by_a_killed_process(step)
    with jask.profile() as prof:
        c, d = step()
    assert prof.tiles == 0 and not any(os.path.exists(p) for p in left)
    np.testing.assert_array_equal(np.asarray(d), (a_np * 2 + 1) ** 2 - a_np)


def test_keys_see_chunks_written_in_place_and_name_jnp_functions_alike_in_every_process(inputs, tmp_path):
    """A chunk another tool rewrites in place changes no folder, only its file: the key changes (a stale store
    was taken over). jask.numpy's ops carry jnp's functions, whose repr holds an address: the key is now the
    same in a new process (it never was, so `exp`, slicing or `astype` never resumed). A URL input counts by
    its committed version."""
    import subprocess
    import sys
    from jask.api.resumable import graph_key
    _, path, a_np = inputs
    a = jask.from_zarr(path)
    exprs = "(jask.numpy.exp(a) * 2.0, a[1:7:2].astype('bfloat16'), jask.numpy.where(a > 3, a, 0.0))"
    keys = [graph_key(x._node) for x in eval(exprs)]
    code = (f"import jask, jask.numpy; jask.config.update('tile', 4); a = jask.from_zarr({path!r}); "
            f"from jask.api.resumable import graph_key; print([graph_key(x._node) for x in {exprs}])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(keys)
    before = graph_key((a * 2.0)._node)
    time.sleep(0.01)
    zarr.open_array(path, mode="r+")[0:4, 0:4] = 100.0          # in place: same folders, same zarr.json
    assert graph_key((jask.from_zarr(path) * 2.0)._node) != before
    jask.to_zarr(jask.from_numpy(a_np), "memory://resume-key/a.zarr")
    u = jask.from_zarr("memory://resume-key/a.zarr", mode="r+")
    first = graph_key((u * 2.0)._node)                           # it was a raw FileNotFoundError
    u.update_(u + 1.0)
    assert graph_key((u * 2.0)._node) != first
