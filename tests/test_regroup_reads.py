"""A regrouping reshape reads its input about once: output tiles that take rows of the same input tiles run
together, entry by entry (``jask.exec.schedule._reading_together``), instead of each reading them again."""
import numpy as np
import pytest

import jask
import jask.numpy as knp

A = np.arange(512 * 512, dtype=np.float32).reshape(512, 512) / 7    # tiles of 64 x 64: 8 x 8 of them


def _reshape_reads(shape, budget):
    jask.config.update("tile", 64)
    jask.set_memory_budget(budget)
    y = knp.reshape(jask.from_numpy(A), shape)
    with jask.profile() as p:
        got = np.asarray(y)
    np.testing.assert_array_equal(got, A.reshape(shape))
    return p


@pytest.mark.parametrize("shape, before", [
    ((4096, 64), 8),     # an output tile takes 8 rows of 8 input tiles; 8 output tiles share them
    ((64, 4096), 8),     # every 8th row of 8 input tiles of one column; 8 output tiles share them
    ((256, 1024), 2),    # even or odd rows of 2 input tiles: 2 output tiles share them
])
def test_output_tiles_sharing_input_tiles_read_them_once(shape, before):
    """At 640 KB a window holds one entry of all output tiles that share their input tiles (8 x 64 KiB of
    output slots and 64 KiB of input), not two entries of one tile: read in tile order, the input was read
    ``before`` times. The int32 row numbers read beside each entry (256 bytes a tile, 2.8 KiB beside each
    16 KiB input tile) add up to 17%."""
    p = _reshape_reads(shape, 640_000)
    assert p.bytes_read <= 1.2 * A.nbytes, (p.bytes_read / A.nbytes, before)


def test_runs_a_window_cannot_hold_whole_are_split_evenly(monkeypatch):
    """At 300 KB a window holds one entry of 3 of the 8 output tiles sharing a row of input tiles: runs of
    3, 3 and 2 tiles read that row 3 times, not 8, and the values are right (runs end mid-window). Without
    the reads kept for later windows (:mod:`jask.exec.kept_reads`, which saves some more of them)."""
    from jask.exec import schedule
    monkeypatch.setattr(schedule, "keep_reads", lambda sched, limit: sched)
    p = _reshape_reads((4096, 64), 300_000)
    assert 2.9 * A.nbytes <= p.bytes_read <= 3.3 * A.nbytes, p.bytes_read / A.nbytes
