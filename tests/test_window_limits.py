"""Every window a pass runs stays within its limit (the budget): the planner charges one entry of a stage as a
window holds it, also where a fused producer puts several input tiles in each entry (a strided slice)."""
import numpy as np
import pytest
import zarr

import jask
import jask.numpy as knp
from jask.exec import driver
from jask.exec.executor import window_limit

CASES = {
    "sum_rows_of_a_slice": (lambda a: knp.sum(a[1::2, 5:500:3], axis=1), lambda A: A[1::2, 5:500:3].sum(axis=1)),
    "sum_columns_of_a_slice": (lambda a: knp.sum(a[1::2, 5:500:3], axis=0), lambda A: A[1::2, 5:500:3].sum(axis=0)),
    "scaled_slice": (lambda a: a[1::2, 5::3] * 2, lambda A: A[1::2, 5::3] * 2),
    "every_third_row_plus_one": (lambda a: a[5::3] + 1, lambda A: A[5::3] + 1),
}


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    A = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    path = str(tmp_path_factory.mktemp("limits") / "a.zarr")
    zarr.create_array(path, shape=A.shape, chunks=(64, 64), dtype="float32", compressors=None)[...] = A
    return A, path


# each pair ran windows over the limit before the planner charged every tile an entry holds
@pytest.mark.parametrize("case, budget", [("every_third_row_plus_one", 250_000), ("every_third_row_plus_one", 1_000_000),
                                          ("scaled_slice", 500_000), ("sum_columns_of_a_slice", 500_000),
                                          ("sum_rows_of_a_slice", 500_000)])
def test_windows_stay_within_the_limit_the_plan_promised(stored, case, budget):
    A, path = stored
    jask.set_memory_budget(budget)
    make, want = CASES[case]
    out = make(jask.from_zarr(path))
    p = driver.make_plan([out._node])
    limit = window_limit(p, 1)
    with jask.profile() as prof:
        got = np.asarray(jask.persist(out))
    np.testing.assert_allclose(got, want(A), rtol=1e-4, atol=1e-4)
    assert prof.windows > 1
    assert 0 < prof.largest_window_bytes <= limit, (case, p.tile, prof.largest_window_bytes, limit)


@pytest.mark.parametrize("case", ["mean_removed", "dot_chain"])
def test_explain_promises_the_windows_a_run_makes(small_tiles, case):
    """A later stage reading an earlier one's output was charged nothing for those tiles at plan time (they
    were not stored yet), so ``jask.explain`` promised fewer windows than ran: 8 for 9, and 107 for 197."""
    import re
    jask.set_memory_budget(20_000)
    A = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)
    a, w = jask.from_numpy(A), jask.from_numpy(A[::-1].copy())
    out = (a - knp.mean(a, axis=0)) * 2.0 if case == "mean_removed" else (a @ w.T) @ a + 1.0
    promised = int(re.search(r"(\d+) windows? of at most", jask.explain(out)).group(1))
    with jask.profile() as prof:
        got = np.asarray(out)
    want = (A - A.mean(axis=0)) * 2.0 if case == "mean_removed" else (A @ A[::-1].T) @ A + 1.0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    assert prof.windows == promised > 2
