"""A product's output tiles in bands of block rows (jask/exec/bands.py): windows hold rectangles of tiles, read
each row and column panel once per window, and multiply them as one product of panels; results equal NumPy's."""
from __future__ import annotations

import numpy as np
import pytest

import jask
from jask.exec import bands, schedule
from jask.exec.run_windows import kernels_cache
from jask.kernels import panels, xla


PANEL = 64 * 512 * 4   # bytes of a row (or column) panel of the 512^2 float32 product in tiles of 64


def _stores(tmp_path, n, seed=0):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal((n, n)).astype(np.float32) for _ in range(2)]
    for name, x in zip("ab", arrays):
        jask.from_numpy(x).to_zarr(tmp_path / f"{name}.zarr")
    return arrays, [jask.from_zarr(tmp_path / f"{name}.zarr") for name in "ab"]


def _window_input(monkeypatch, nbytes):
    """Windows stop growing at ``nbytes`` of input on every platform (the CPU's and an accelerator's limits)."""
    for platform in schedule.WINDOW_INPUT_BYTES:
        monkeypatch.setitem(schedule.WINDOW_INPUT_BYTES, platform, nbytes)


def _product(a, b):
    with jask.profile() as p:
        got = np.asarray(jask.dot(a, b))
    return got, p


@pytest.fixture
def rectangles(monkeypatch):
    """The panel plans of every window program: (output tiles, block rows, block columns), or None."""
    seen = []
    real = panels.panel_plan

    def spy(op, spec, table, valid):
        got = real(op, spec, table, valid)
        seen.append(None if got is None else (spec.n_tiles, len(got.a_rows), len(got.b_rows)))
        return got

    monkeypatch.setattr(xla, "panel_plan", spy)
    kernels_cache.programs.clear()   # programs compiled earlier would not plan their panels again
    return seen


def test_a_product_in_bands_reads_each_panel_once_per_window(tmp_path, monkeypatch, rectangles):
    """512^2 in tiles of 64 (an 8 x 8 grid, 8 entries each), windows of a quarter of the output's panels:
    in bands the windows are 4 x 4 rectangles, one product of panels each, and read half the bytes (with
    every tile read by the window that uses it: no tile kept for a later window). On the xla backend, whose
    programs the spy sees, also on a TPU or GPU."""
    jask.config.update("tile", 64)
    jask.config.update("backend", "xla")
    monkeypatch.setattr(schedule, "keep_reads", lambda sched, limit: sched)
    _window_input(monkeypatch, 8 * PANEL)
    (A, B), (a, b) = _stores(tmp_path, 512)
    in_bands, p = _product(a, b)
    assert rectangles and all(r == (16, 4, 4) for r in rectangles), rectangles
    monkeypatch.setattr(schedule, "band_rows", lambda *args: 1)
    row_major, q = _product(a, b)
    want = A.astype(np.float64) @ B.astype(np.float64)
    np.testing.assert_allclose(in_bands, want, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(in_bands, row_major, rtol=1e-5, atol=1e-4)
    # each window reads 4 row panels and 4 column panels: 4 windows, 4 MiB (2x the inputs)
    assert (p.windows, p.kernel_calls, p.bytes_read) == (4, 4, 4 * 8 * PANEL)
    assert q.bytes_read > 1.5 * p.bytes_read, (q.bytes_read, p.bytes_read)


def test_kept_reads_read_a_products_inputs_once_in_either_order(tmp_path, monkeypatch):
    """The same product with read tiles kept for later windows (jask.exec.kept_reads): a band's second window
    takes its row panels from the first, and row-major windows keep the column panels they share, so both
    orders read each input once (2 MiB; 4 MiB and more without the keep)."""
    jask.config.update("tile", 64)
    _window_input(monkeypatch, 8 * PANEL)
    (A, B), (a, b) = _stores(tmp_path, 512)
    in_bands, p = _product(a, b)
    monkeypatch.setattr(schedule, "band_rows", lambda *args: 1)
    row_major, q = _product(a, b)
    np.testing.assert_allclose(in_bands, A.astype(np.float64) @ B.astype(np.float64), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(row_major, in_bands, rtol=1e-5, atol=1e-4)
    assert p.windows == 4 and p.bytes_read == q.bytes_read == 2 * 8 * PANEL, (p, q)


def test_explain_predicts_the_reads_of_a_product_in_bands(tmp_path, monkeypatch):
    jask.config.update("tile", 64)
    _window_input(monkeypatch, 8 * PANEL)
    _, (a, b) = _stores(tmp_path, 512)
    c = jask.dot(a, b)
    said = jask.explain(c)
    _, p = _product(a, b)
    assert f"reads {p.bytes_read / 2**20:.1f} MiB" in said, said


@pytest.mark.parametrize("shape", [(200, 136), (64, 512)], ids=["ragged_edges", "one_block_row"])
def test_bands_of_ragged_and_thin_products_match_numpy(tmp_path, monkeypatch, shape):
    """Edge tiles of other shapes (calls of their own) and a single block row (no bands) stay right."""
    jask.config.update("tile", 32)
    _window_input(monkeypatch, 64 << 10)
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((shape[0], 96)).astype(np.float32), rng.standard_normal((96, shape[1])).astype(np.float32)
    got, p = _product(jask.from_numpy(A), jask.from_numpy(B))
    np.testing.assert_allclose(got, A.astype(np.float64) @ B, rtol=1e-4, atol=1e-4)
    assert p.kernel_calls == p.windows


def test_band_order_is_column_by_column_within_bands():
    tiles = [(i, j) for i in range(5) for j in range(3)]
    assert bands.band_order(tiles, 2)[:7] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (2, 0)]
    assert bands.band_order(tiles, 1) == tiles
    assert sorted(bands.band_order(tiles, 3)) == sorted(tiles)


def test_only_products_whose_neighbours_share_panels_take_bands(tmp_path):
    """Elementwise ops (one entry per tile) and a column sum (no panel shared along rows) stay row-major;
    a product of small tiles takes bands; so does it not where one tile's panels fill the window."""
    jask.config.update("tile", 64)
    (A, _), (a, b) = _stores(tmp_path, 512)
    from jask.exec.driver import make_plan

    def rows_of(x, input_bytes=8 * PANEL, limit=1 << 30):
        p = make_plan([x._node])
        node = p.groups[-1][0]
        draft = schedule._Draft(p, {id(node)})
        return bands.band_rows(p, node, limit, input_bytes, lambda idx, ents, seen: schedule._tile_cost(
            draft, [(node, idx, ents)], 0, len(ents), seen))

    assert rows_of(a + b) == 1
    assert rows_of(jask.numpy.sum(a.reshape(8, 64, 512), axis=1)) == 1
    assert rows_of(jask.dot(a, b), input_bytes=8 * PANEL) == 4   # 4 row and 4 column panels
    assert rows_of(jask.dot(a, b), input_bytes=2 * PANEL) == 1   # one tile's two panels fill it
