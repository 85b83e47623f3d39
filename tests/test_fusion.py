"""Fusion: chains of ops run as one pass, match jnp, and move only the bytes they must.

``CHAINS`` has the same row form as ``OPS`` in ``test_ops.py``. Each chain is
checked forward, eagerly and under jit, gradients eager and ``jit(grad)`` on
``xla``; ``jit(grad)`` again with fusion off; forward (and gradients for a few
chains) on ``pallas-interpret``, which is slow.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jask
from jask.base import BlockParallelOp
from jask.hijax import compat
from jask.base.base_algo import make_op
from test_ops import _RUNNERS, _mat, _scalar


class Cube(BlockParallelOp):
    """A user-defined op: fuses like a built-in, with no extra method."""

    def forward_block(self, a):
        return a * a * a

    def index_map(self, out_idx):
        return [(out_idx,)]

    def combine(self, acc, partial):
        return acc + partial

    def backward_block(self, d, a):
        return (3 * a * a * d,)

    def output_shape(self, a_shape):
        return a_shape


cube = make_op(Cube)


def _chain8(a, b, sq, k=2.0):
    """Nine elementwise ops over two inputs (the issue's "8-op chain", counted generously)."""
    return sq(((a + b) * a - b) * k + a) - b * b + a


CHAINS = [
    pytest.param((_mat((9, 6)), _mat((9, 6))), lambda a, b: jask.sum(jask.square(a - b)),
                 lambda a, b: jnp.sum(jnp.square(a - b)), id="sum_square_sub"),
    pytest.param((_mat((9, 6)), _mat((9, 6))), lambda a, b: _chain8(a, b, jask.square),
                 lambda a, b: _chain8(a, b, jnp.square), id="elementwise_8"),
    pytest.param((_mat((9, 6)), _mat((6, 7)), _mat((9, 7))),
                 lambda a, m, t: jask.sum(jask.square(a @ m - t)),
                 lambda a, m, t: jnp.sum(jnp.square(a @ m - t)), id="sum_square_dot_sub"),
    pytest.param((_mat((9, 6)), _mat((9, 6)), _mat((6, 5))), lambda a, b, m: (a + b) @ m * 2.0,
                 lambda a, b, m: (a + b) @ m * 2.0, id="dot_prologue_epilogue"),
    pytest.param((_mat((9, 6)), _mat((9, 6))), lambda a, b: jask.sum((a - b) * (a + b)),
                 lambda a, b: jnp.sum((a - b) * (a + b)), id="shared_inputs"),
    pytest.param((_mat((9, 6)), _mat((6, 9))), lambda a, b: jask.transpose(jask.transpose(a) * 3.0) - b.T,
                 lambda a, b: (a.T * 3.0).T - b.T, id="transposes"),
    pytest.param((_mat((9, 6)), _mat((9, 6)), _scalar(jnp.float32(1.5))),
                 lambda a, b, s: jask.square(a * s + b), lambda a, b, s: jnp.square(a * s + b),
                 id="traced_scalar"),
    pytest.param((_mat((9, 6)), _mat((9, 6))), lambda a, b: cube(a - b) + a,
                 lambda a, b: (a - b) ** 3 + a, id="user_op"),
    pytest.param((_mat((9, 6)), _mat((6, 5))), lambda a, m: jask.sum(jask.square(a @ m) - a @ m),
                 lambda a, m: jnp.sum(jnp.square(a @ m) - a @ m), id="dot_used_twice"),
    pytest.param((_mat((9, 6)), _mat((6, 5)), _mat((5, 4))), lambda a, m, n: jask.square(a @ m) @ n,
                 lambda a, m, n: jnp.square(a @ m) @ n, id="two_matmuls"),
    pytest.param((_mat((9, 6)), _mat((9, 6))), lambda a, b: -a + b / 2.0,
                 lambda a, b: -a + b / 2.0, id="neg_div"),
    pytest.param((_mat((3, 5, 6)), _mat((6, 4))), lambda a, m: jask.sum(jask.square(a @ m)),
                 lambda a, m: jnp.sum(jnp.square(a @ m)), id="batched_dot_into_sum"),
]

MODES = ("forward", "forward_jit", "grad_eager", "jit_of_grad")
CASES = [pytest.param(*p.values, mode, id=f"{p.id}-{mode}") for p in CHAINS for mode in MODES]


@pytest.mark.parametrize("args, jask_fn, ref_fn, mode", CASES)
def test_chain_xla(small_tiles, args, jask_fn, ref_fn, mode):
    jask.config.update("backend", "xla")
    _RUNNERS[mode](args, jask_fn, ref_fn)


@pytest.mark.parametrize("args, jask_fn, ref_fn, mode", [c for c in CASES if c.id.endswith("-jit_of_grad")])
def test_chain_unfused(small_tiles, args, jask_fn, ref_fn, mode):
    jask.config.update("fusion", False)
    _RUNNERS[mode](args, jask_fn, ref_fn)


PALLAS_GRAD = ("sum_square_sub", "dot_prologue_epilogue", "traced_scalar", "user_op")


@pytest.mark.parametrize("args, jask_fn, ref_fn, mode",
                         [c for c in CASES if c.id.endswith("-forward")
                          or c.id in {f"{n}-jit_of_grad" for n in PALLAS_GRAD}])
def test_chain_pallas_interpret(small_tiles, args, jask_fn, ref_fn, mode):
    jask.config.update("backend", "pallas-interpret")
    _RUNNERS[mode](args, jask_fn, ref_fn)


# ---------------------------------------------------------------- bytes moved

def _data(*shapes):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    return arrays, [jask.from_numpy(x) for x in arrays]


def test_sum_square_sub_reads_inputs_once_and_writes_nothing(small_tiles):
    (A, B), (a, b) = _data((9, 6), (9, 6))
    with jask.profile() as p:
        jask.sum(jask.square(a - b))
    assert (p.bytes_read, p.bytes_written) == (A.nbytes + B.nbytes, 0)


def test_its_gradient_reads_inputs_once_more_and_writes_exactly_the_gradients(small_tiles):
    (A, B), (a, b) = _data((9, 6), (9, 6))
    with jask.profile() as p:
        da, db = jax.jit(jax.grad(lambda a, b: jask.sum(jask.square(a - b)), argnums=(0, 1)))(a, b)
        jask.persist(da, db)
    # the loss pass reads a and b (unless JAX drops the unused loss); the gradient pass reads them once more
    passes = 1 if compat.UNUSED_OPS_SKIPPED_UNDER_JIT else 2
    assert p.bytes_read == passes * (A.nbytes + B.nbytes)
    assert p.bytes_written == A.nbytes + B.nbytes and p.arrays_written == 2


def test_dot_chain_writes_no_intermediate(small_tiles):
    (A, M, T), (a, m, t) = _data((9, 6), (6, 7), (9, 7))
    with jask.profile() as p:
        out = jask.sum(jask.square(a @ m - t))
    assert p.bytes_written == 0 and p.arrays_written == 0
    np.testing.assert_allclose(float(out), float(jnp.sum(jnp.square(A @ M - T))), rtol=1e-4)


def test_elementwise_chain_of_8_reads_two_arrays_and_writes_one(small_tiles):
    (A, B), (a, b) = _data((9, 6), (9, 6))
    with jask.profile() as p:
        out = jask.persist(_chain8(a, b, jask.square))
    assert (p.bytes_read, p.bytes_written, p.arrays_written) == (A.nbytes + B.nbytes, A.nbytes, 1)
    np.testing.assert_allclose(np.asarray(out), _chain8(A, B, np.square), rtol=1e-5, atol=1e-5)
    jask.config.update("fusion", False)
    with jask.profile() as q:
        jask.persist(_chain8(a, b, jask.square))
    assert q.arrays_written > 1 and q.bytes_written > p.bytes_written
    assert q.bytes_read > p.bytes_read   # unfused, each op is its own pass and reads its input back


def test_dot_feeding_two_consumers_is_computed_once(small_tiles):
    (A, M), (a, m) = _data((9, 6), (6, 5))
    y = a @ m
    text = jask.explain(jask.square(y) - y)
    assert text.splitlines()[1].lstrip().startswith("dot")  # stored once, then read by both consumers
    with jask.profile() as p:
        jask.persist(jask.square(y) - y)
    assert p.arrays_written == 2


def test_stage_reading_an_earlier_stage_in_step_takes_its_tile_from_memory(small_tiles):
    """``b`` and ``b * 2 + a`` both stored: one lockstep pass reads a and c once; b is not read back."""
    (A, C), (a, c) = _data((9, 6), (9, 6))
    b = a + c
    d = b * 2.0 + a
    assert "in lockstep" in jask.explain(b, d)
    with jask.profile() as p:
        jask.persist(b, d)
    assert (p.bytes_read, p.bytes_written, p.arrays_written) == (A.nbytes + C.nbytes, 2 * A.nbytes, 2)
    np.testing.assert_allclose(np.asarray(b), A + C, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(d), (A + C) * 2 + A, rtol=1e-6)


def test_lockstep_never_costs_a_refused_plan(small_tiles):
    """With a forced tile and a budget that fits each stage but not both together, the stages run apart."""
    from jask.exec import driver
    (A, C), (a, c) = _data((9, 6), (9, 6))
    b = a + c
    d = b * 2.0 + a
    together = driver.make_plan([b._node, d._node])
    assert [len(g) for g in together.groups] == [2]
    jask.set_memory_budget(together.projected_bytes - 1)
    apart = driver.make_plan([b._node, d._node])
    assert [len(g) for g in apart.groups] == [1, 1] and apart.projected_bytes < together.projected_bytes
    jask.persist(b, d)
    np.testing.assert_allclose(np.asarray(d), (A + C) * 2 + A, rtol=1e-6)


def test_stage_reading_an_earlier_stage_at_another_tile_waits_for_it(small_tiles):
    """``b.T + a`` reads tile (j, i) of b for its tile (i, j): b must be stored first, then read."""
    (A, C), (a, c) = _data((8, 8), (8, 8))
    b = a + c
    d = b.T + a
    assert "in lockstep" not in jask.explain(b, d)
    with jask.profile() as p:
        jask.persist(b, d)
    assert (p.bytes_read, p.bytes_written) == (4 * A.nbytes, 2 * A.nbytes)   # a, c; then b, a
    np.testing.assert_allclose(np.asarray(d), (A + C).T + A, rtol=1e-6)


def test_deferred_persist_is_stored_by_the_next_pass(small_tiles):
    """``persist(defer=True)`` stores with whatever runs next, reading shared inputs once."""
    (A, C), (a, c) = _data((9, 6), (9, 6))
    m = a * 0.5 + c
    same = jask.persist(m, defer=True)
    assert same._node is m._node and m._node.result is None   # nothing ran yet
    out = jask.persist(m * 3.0 - a)
    assert m._node.result is not None                      # stored in that pass
    with jask.profile() as p:
        np.testing.assert_allclose(np.asarray(m), A * 0.5 + C, rtol=1e-6)
    assert p.bytes_read == A.nbytes                        # read back, not recomputed from a and c
    np.testing.assert_allclose(np.asarray(out), (A * 0.5 + C) * 3 - A, rtol=1e-5)


def test_explain_names_fused_ops(small_tiles):
    _, (a, b) = _data((9, 6), (9, 6))
    text = jask.explain(cube(a - b) + a)
    assert "add" in text and "fused: cube, sub" in text


# ---------------------------------------------------------------- one kernel call per window

# 9x6 in tiles of 4: rows of 4, 4, 1 and columns of 4, 2, so four tile shapes, each a program of its own
# (ragged edges are never padded); a window joins its programs into one call (jask.exec.joined_window),
# on every backend, and everything here fits one window.
RAGGED_SHAPES = 4


@pytest.mark.parametrize("backend", ["xla", "pallas-interpret"])
def test_elementwise_chain_is_one_kernel_per_window(small_tiles, backend):
    """The 8-op chain (a user op among them) runs as one kernel launch per window, a program per tile shape."""
    jask.config.update("backend", backend)
    (A, B), (a, b) = _data((9, 6), (9, 6))
    with jask.profile() as p:
        out = jask.persist(cube(_chain8(a, b, jask.square)))
    assert (p.tiles, p.windows, p.kernel_calls, p.window_programs) == (6, 1, 1, RAGGED_SHAPES)
    np.testing.assert_allclose(np.asarray(out), _chain8(A, B, np.square) ** 3, rtol=1e-4, atol=1e-4)
    jask.config.update("fusion", False)
    with jask.profile() as q:
        jask.persist(cube(_chain8(a, b, jask.square)))
    # the chain's nine ops and cube, each its own kernel in passes of one window (two independent
    # stages of one shape may share a pass and its reads, and then a window)
    assert q.windows <= 10 and q.kernel_calls == q.windows
    assert q.window_programs == 10 * RAGGED_SHAPES


@pytest.mark.parametrize("backend", ["xla", "pallas-interpret"])
def test_kernel_calls_equal_windows_when_tiles_are_equal(small_tiles, backend):
    """8x12 in tiles of 4: every tile has one shape, so a pass makes exactly one call per window."""
    jask.config.update("backend", backend)
    (A, B), (a, b) = _data((8, 12), (8, 12))
    with jask.profile() as p:
        out = jask.persist(cube(_chain8(a, b, jask.square)))
    assert (p.tiles, p.windows, p.kernel_calls) == (6, 1, 1)
    np.testing.assert_allclose(np.asarray(out), _chain8(A, B, np.square) ** 3, rtol=1e-4, atol=1e-4)
    with jask.profile() as q:
        total = jask.sum(jask.square(a - b) @ jask.transpose(b))
    # square(a - b) and b.T are stored (the dot reads their tiles repeatedly): a window each; the
    # sum's window holds two programs, the fused dot's tiles and then the sum over them (joined)
    assert (q.windows, q.kernel_calls, q.window_programs) == (3, 3, 4)
    np.testing.assert_allclose(float(total), float(np.sum(np.square(A - B) @ B.T)), rtol=1e-4)


def test_small_budget_splits_a_pass_into_windows(small_tiles):
    """A budget of a few tiles: many windows, each one kernel call, each within the budget."""
    (A, B), (a, b) = _data((16, 16), (16, 16))
    from jask.exec.schedule import windows
    from jask.exec.driver import make_plan as plan
    jask.set_memory_budget(4096)
    x = jask.square(a - b) + a
    p = plan([x._node])
    sched = list(windows(p, p.groups[0], [(i, j) for i in range(4) for j in range(4)], 4096))
    assert len(sched) > 1 and all(len(w.calls) == 1 for w in sched)
    with jask.profile() as prof:
        out = jask.persist(x)
    assert prof.windows == len(sched) and prof.kernel_calls == prof.windows and prof.tiles == 16
    assert prof.peak_projected_bytes <= 4096
    np.testing.assert_allclose(np.asarray(out), np.square(A - B) + A, rtol=1e-5)


def test_reduction_of_a_chain_is_one_kernel_per_tile_shape(small_tiles):
    """sum(square(a - b)): one fused program per input tile shape folds its entries, all in one call."""
    _, (a, b) = _data((9, 6), (9, 6))
    for backend in ("xla", "pallas-interpret"):
        jask.config.update("backend", backend)
        with jask.profile() as p:
            jask.sum(jask.square(a - b))
        assert (p.windows, p.kernel_calls, p.window_programs) == (1, 1, RAGGED_SHAPES), backend


def test_producer_used_twice_in_one_entry_is_computed_and_read_once(small_tiles):
    """``x * x`` with ``x = a - b`` inside a sum: each tile of a and b is read once, x computed once."""
    (A, B), (a, b) = _data((9, 6), (9, 6))
    x = a - b
    with jask.profile() as p:
        out = jask.sum(x * x)
    assert (p.bytes_read, p.kernel_calls) == (A.nbytes + B.nbytes, 1)   # the default backend here: xla
    np.testing.assert_allclose(float(out), float(np.sum((A - B) ** 2)), rtol=1e-4)


def test_fused_window_is_one_pallas_call_holding_the_chain(small_tiles):
    """On Pallas a fused chain's window program is one ``pallas_call`` whose body runs every op of the chain."""
    from jask import kernels
    from jask.exec import driver
    from jask.kernels.window import WindowSpec
    from jask.plan.fusion import FusedTileOp, entries_of, entry_program
    jask.config.update("backend", "pallas-interpret")
    (A, B), (a, b) = _data((9, 6), (9, 6))
    out = (a - b) * a + b
    p = driver.make_plan([out._node])
    root = p.stages[0]
    program = entry_program(p, root, entries_of(p.prepared[id(root)], root, (0, 0))[0])
    assert [type(op).__name__ for op, *_ in program.steps] == ["Sub", "MulArrays"]
    assert [leaf.node.shape for leaf in program.leaves] == [(9, 6), (9, 6)]
    spec = WindowSpec(((4, 4), (4, 4)), (np.dtype(np.float32),) * 2, (1, 1), 1, 1, (4, 4), True)
    run = kernels.get_backend().compile_window(FusedTileOp(program), spec)
    jaxpr = str(jax.make_jaxpr(run)([A[None, :4, :4], B[None, :4, :4]], np.zeros((1, 1, 2), np.int32),
                                    np.ones((1, 1), bool)))
    assert jaxpr.count("pallas_call[") == 1 and "sub" in jaxpr and "mul" in jaxpr and "add" in jaxpr
    np.testing.assert_allclose(np.asarray(run([A[None, :4, :4], B[None, :4, :4]], np.zeros((1, 1, 2), np.int32),
                                              np.ones((1, 1), bool)))[0],
                               ((A - B) * A + B)[:4, :4], rtol=1e-6)


def test_a_long_rebinding_loop_is_cut_into_stages():
    """``x = x + u`` 400 times (optax-style code without update_) computes, in constant stack depth.

    It used to raise RecursionError at ~329 chained ops while building the fused
    program; chains longer than MAX_FUSED_CHAIN are now cut into stages, so the
    pass computes at least 400 / MAX_FUSED_CHAIN stage tiles instead of one (on xla
    the stages of one window are then joined into one program).
    """
    from jask.plan.planner import MAX_FUSED_CHAIN
    A = np.arange(12, dtype=np.float32).reshape(3, 4)
    U = np.full((3, 4), 0.5, np.float32)
    x, u = jask.from_numpy(A), jask.from_numpy(U)
    for _ in range(400):
        x = x + u
    with jask.profile() as p:
        out = np.asarray(x)
    np.testing.assert_allclose(out, A + 400 * U)
    assert p.tiles >= 400 // MAX_FUSED_CHAIN and p.windows == p.kernel_calls == 1
