"""A window of plain products filling a rectangle runs as ONE product of panels (jask/kernels/panels.py).

Checked against numpy's product of the same blocks, with tiles and their
stack rows in shuffled order (the table, not the layout, says which block is
which), for float32 and bfloat16, with a carried partial, and against the
block-by-block program for windows that must not take the panel path.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jask.kernels import panels
from jask.kernels.window import WindowSpec
from jask.kernels.xla import compile_window_tiles
from jask.linalg.dot import Dot
from jask.linalg.sub import Sub
from jask.plan.fusion import LEAF, STEP, EntryProgram, FusedTileOp

BM, BK, BN = 8, 16, 24   # distinct edges, so a transposed or misplaced block cannot pass


def _window(rows, cols, k, dtype=np.float32, tiles=None, seed=0):
    """Separate A and B blocks (shuffled stack rows), the table and valid mask of the given tiles
    (default: every (row, column), shuffled), and numpy's product of the whole A and B."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((rows * BM, k * BK)).astype(dtype)
    b = rng.standard_normal((k * BK, cols * BN)).astype(dtype)
    a_perm, b_perm = rng.permutation(rows * k), rng.permutation(k * cols)
    a_blocks = [None] * (rows * k)
    b_blocks = [None] * (k * cols)
    for pos, (r, kk) in enumerate(np.ndindex(rows, k)):
        a_blocks[a_perm[pos]] = a[r * BM:(r + 1) * BM, kk * BK:(kk + 1) * BK]
    for pos, (kk, c) in enumerate(np.ndindex(k, cols)):
        b_blocks[b_perm[pos]] = b[kk * BK:(kk + 1) * BK, c * BN:(c + 1) * BN]
    if tiles is None:
        tiles = [tuple(t) for t in rng.permutation(list(np.ndindex(rows, cols)))]
    table = np.array([[[a_perm[r * k + kk], b_perm[kk * cols + c]] for kk in range(k)] for r, c in tiles], np.int32)
    spec = WindowSpec(((BM, BK), (BK, BN)), (np.dtype(dtype),) * 2, (rows * k, k * cols), len(tiles), k, (BM, BN))
    want = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    return spec, a_blocks + b_blocks, table, np.ones(table.shape[:2], bool), tiles, want


def _dots(program, args) -> int:
    return str(jax.make_jaxpr(program)(*args)).count("dot_general")


def _tile(want, rc):
    r, c = rc
    return want[r * BM:(r + 1) * BM, c * BN:(c + 1) * BN]


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-5), (jnp.bfloat16, 2e-2)], ids=["f32", "bf16"])
def test_a_rectangle_of_plain_products_is_one_product_of_panels(dtype, tol):
    spec, blocks, table, valid, tiles, want = _window(3, 2, 4, dtype)
    assert panels.panel_plan(Dot(), spec, table, valid) is not None
    program = compile_window_tiles(Dot(), spec, table, valid)
    args = [jnp.asarray(x) for x in blocks]
    assert _dots(program, args) == 1, "the window must be one product, not one per block"
    outs = program(*args)
    assert len(outs) == len(tiles)
    for out, rc in zip(outs, tiles):
        assert out.dtype == jnp.float32   # bf16 blocks accumulate in float32, as the block-by-block fold does
        np.testing.assert_allclose(np.asarray(out, np.float64), _tile(want, rc), rtol=tol,
                                   atol=tol * np.abs(want).max())


def test_a_carried_partial_is_added_to_its_tile():
    spec, blocks, table, valid, tiles, want = _window(2, 2, 3)
    carried = np.full((BM, BN), 100.0, np.float32)
    program = compile_window_tiles(Dot(), spec, table, valid, carried=(1,))
    outs = program(*[jnp.asarray(x) for x in blocks], jnp.asarray(carried))
    for i, (out, rc) in enumerate(zip(outs, tiles)):
        np.testing.assert_allclose(np.asarray(out), _tile(want, rc) + (100.0 if i == 1 else 0.0), rtol=1e-5, atol=1e-4)


class TwiceTheProduct(Dot):
    def forward_block(self, a, b):
        return 2.0 * jnp.matmul(a, b)


class LargestProduct(Dot):
    def combine(self, acc, partial):
        return jnp.maximum(acc, partial)


def _fused_dot_of_difference():
    steps = [(Sub(), ((LEAF, 0), (LEAF, 1)), np.dtype(np.float32), (BM, BK), "sub")]
    return FusedTileOp(EntryProgram([], steps, Dot(), ((STEP, 0), (LEAF, 2)), 1))


@pytest.mark.parametrize("case", ["one block row", "one block column", "a missing tile", "a padded entry", "K = 1"])
def test_windows_that_are_not_full_rectangles_multiply_block_by_block(case):
    rows, cols, k, tiles = {"one block row": (1, 4, 3, None), "one block column": (4, 1, 3, None),
                            "a missing tile": (2, 2, 3, [(0, 0), (0, 1), (1, 0)]), "a padded entry": (2, 2, 3, None),
                            "K = 1": (2, 2, 1, None)}[case]
    spec, blocks, table, valid, tiles, want = _window(rows, cols, k, tiles=tiles)
    if case == "a padded entry":
        valid[2, 2] = False
        r, c = tiles[2]
        a_part = blocks[table[2, 2, 0]]
        b_part = blocks[spec.stack_rows[0] + table[2, 2, 1]]
        want = want.copy()
        want[r * BM:(r + 1) * BM, c * BN:(c + 1) * BN] -= np.asarray(a_part, np.float64) @ b_part
    assert panels.panel_plan(Dot(), spec, table, valid) is None
    program = compile_window_tiles(Dot(), spec, table, valid)
    args = [jnp.asarray(x) for x in blocks]
    assert _dots(program, args) == int(valid.sum())
    for out, rc in zip(program(*args), tiles):
        np.testing.assert_allclose(np.asarray(out), _tile(want, rc), rtol=1e-5, atol=1e-4)


def test_only_plain_products_take_the_panel_path():
    spec, _, table, valid, _, _ = _window(2, 2, 3)
    assert panels.panel_plan(TwiceTheProduct(), spec, table, valid) is None   # more than a product
    assert panels.panel_plan(LargestProduct(), spec, table, valid) is None    # folded by max, not +
    fused = WindowSpec(((BM, BK), (BM, BK), (BK, BN)), (np.dtype(np.float32),) * 3, spec.stack_rows[:1] * 2
                       + spec.stack_rows[1:], spec.n_tiles, spec.k, spec.out_block)
    fused_table = np.concatenate([table[:, :, :1], table], axis=2)
    assert panels.panel_plan(_fused_dot_of_difference(), fused, fused_table, valid) is None   # (a - b) @ c


def test_a_window_whose_panels_pass_the_memory_cap_multiplies_block_by_block(monkeypatch):
    spec, blocks, table, valid, tiles, want = _window(2, 2, 3)
    copies = (2 * BM * 3 * BK + 3 * BK * 2 * BN + 2 * BM * 2 * BN) * 4
    monkeypatch.setattr(panels, "MAX_PANEL_BYTES", copies)
    assert panels.panel_plan(Dot(), spec, table, valid) is not None
    monkeypatch.setattr(panels, "MAX_PANEL_BYTES", copies - 1)
    assert panels.panel_plan(Dot(), spec, table, valid) is None
