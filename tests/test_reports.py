"""What a user reads (issue 18): profile counters that cannot be misread, explain's answers, the scratch default."""
import os
import re
import tempfile

import jax
import numpy as np
import pytest

import jask
from jask.config import config
from jask.api import observe
from jask.io import scratch


@pytest.mark.parametrize("peak", ["resettable", "lifetime"])
def test_profile_names_input_and_output_tiles(small_tiles, monkeypatch, peak):
    """A sum over an 8-tile grid reads 8 input tiles and produces 1 output tile, and says so; its memory line
    splits the peak, or says it is the process's lifetime peak where the mark cannot be reset (gVisor)."""
    if peak == "lifetime":
        monkeypatch.setattr(observe, "reset_peak_rss", lambda: False)
    x = jask.from_numpy(np.ones((8, 16), np.float32))      # grid (2, 4) at tile edge 4
    with jask.profile() as p:
        jask.sum(x)
    assert (p.input_tiles_read, p.output_tiles) == (8, 1)
    assert p.bytes_read == x.nbytes
    text = str(p)
    assert "8 input tiles read" in text and "1 output tile," in text
    assert p.peak_rss_is_lifetime or peak == "resettable"
    if p.peak_rss_is_lifetime:   # forced here; on gVisor (the TPU machine) also when resettable is asked for
        assert re.search(r"peak RSS [\d.]+ \w+ \(process lifetime: this platform cannot measure the block alone; "
                         r"budget", text), text
    else:
        assert re.search(r"peak RSS [\d.]+ \w+ = .* \+ this block [\d.]+ \w+ \(jask budget", text), text


def test_profile_splits_memory_at_the_runtime_baseline():
    """With the baseline measured, peak = baseline + held at entry + growth during the block."""
    baseline = jask.runtime_baseline()
    assert baseline > 0 and jask.runtime_baseline() == baseline        # measured once
    with jask.profile() as p:
        np.ones(32 * 2**20 // 8).sum()                                 # 32 MiB, freed at the end
    if p.peak_rss_is_lifetime:
        pytest.skip("this platform cannot reset the peak-RSS mark, so the block cannot be measured alone")
    assert p.runtime_baseline_bytes == baseline
    assert p.peak_rss_bytes == p.rss_at_entry_bytes + p.working_set_bytes
    assert p.working_set_bytes >= 30 * 2**20
    assert p.memory_budget_bytes == config.memory_budget
    shown = min(baseline, p.rss_at_entry_bytes)     # RSS can fall below the baseline once memory is returned
    from jask.exec.progress import fmt_bytes as _fmt_bytes
    assert p.memory_line().startswith(f"peak RSS {_fmt_bytes(p.peak_rss_bytes)} = runtime baseline "
                                      f"{_fmt_bytes(shown)}")


def test_lifetime_peak_still_splits_off_the_runtime_baseline():
    """Where the peak cannot be reset (gVisor, as on the lent TPU machine, where opening the chip alone
    took 13.5 GiB of RSS), the line still says how much of the peak was the runtime's."""
    from jask.api.observe import Profile
    p = Profile(peak_rss_bytes=14 * 2**30, runtime_baseline_bytes=13 * 2**30, peak_rss_is_lifetime=True,
                memory_budget_bytes=64 * 2**20)
    assert p.memory_line() == ("peak RSS 14.00 GiB = runtime baseline 13.00 GiB + 1.00 GiB since (process "
                               "lifetime: this platform cannot measure the block alone; budget 64.00 MiB)")


def test_explain_a_computed_scalar_says_what_to_do():
    """jask.sum's result is a computed jax.Array: the message says so, not 'call it outside jit'."""
    x = jask.from_numpy(np.ones((8, 8), np.float32))
    with pytest.raises(TypeError, match="already computed jax.Array of shape ()") as e:
        jask.explain(jask.sum(x))
    assert "outside jit" not in str(e.value) and "jask.square(x)" in str(e.value)
    assert "square" in jask.explain(jask.square(x))


def test_explain_under_jit_asks_for_outside_jit():
    x = jask.from_numpy(np.ones((8, 8), np.float32))

    @jax.jit
    def f(x):
        jask.explain(x * 2.0)
        return jask.sum(x)

    with pytest.raises(TypeError, match="inside jit or grad"):
        f(x)


def test_explain_names_the_scratch_folder(tmp_path):
    jask.set_memory_budget(config.memory_budget, scratch_dir=tmp_path)
    text = jask.explain(jask.from_numpy(np.ones((8, 8), np.float32)) * 2.0)
    assert f"scratch {tmp_path} (from set_memory_budget(scratch_dir=...))" in text


@pytest.fixture
def tmpdir_on_tmpfs(monkeypatch, tmp_path):
    """$TMPDIR on tmpfs and the user cache dir under tmp_path, with no scratch folder configured."""
    if scratch.filesystem_type("/dev/shm") != "tmpfs":
        pytest.skip("/dev/shm is not tmpfs on this machine")
    shm = tempfile.mkdtemp(prefix="jask-test-", dir="/dev/shm")
    monkeypatch.setattr(tempfile, "tempdir", shm)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config.scratch_dir, config.allow_tmpfs = None, False
    yield shm
    os.rmdir(shm)


def test_default_scratch_leaves_tmpfs_for_the_user_cache(tmpdir_on_tmpfs, tmp_path):
    where, why = scratch.scratch_location()
    assert where == str(tmp_path / "cache" / "jask" / "scratch")
    assert "is on tmpfs" in why
    assert jask.explain(jask.from_numpy(np.ones((4, 4), np.float32)) * 2.0).endswith(f"scratch {where} ({why})")
    assert os.listdir(tmpdir_on_tmpfs) == [], "nothing may be written to the RAM-backed $TMPDIR"


def test_default_scratch_on_disk_stays_in_tmpdir(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    config.scratch_dir = None
    assert scratch.scratch_location() == (str(tmp_path / "jask-scratch"), "default: $TMPDIR/jask-scratch")


def test_tmpfs_error_names_the_ways_out(tmpdir_on_tmpfs):
    with pytest.raises(ValueError) as e:
        jask.set_memory_budget("64MB", scratch_dir=os.path.join(tmpdir_on_tmpfs, "s"))
    message = str(e.value)
    for words in ("lives in RAM", "JASK_SCRATCH_DIR", "scratch_dir=", "allow_tmpfs=True",
                  os.path.join(os.environ["XDG_CACHE_HOME"], "jask", "scratch")):
        assert words in message, (words, message)
