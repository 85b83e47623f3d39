"""Shape/indexing ops beyond the OPS table (errors named before any data is read, reads of slices),
jask.nn.one_hot, in-memory operands on either side of ``@``, and jask.batches (bytes read, one compile)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jask
import jask.numpy as knp


def _arr(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_transpose_positional_axes_and_bad_axes_name_the_shape(small_tiles):
    A = _arr((2, 3, 5))
    c = jask.from_numpy(A)
    np.testing.assert_array_equal(np.asarray(jask.transpose(c, (2, 0, 1))), np.transpose(A, (2, 0, 1)))
    np.testing.assert_array_equal(np.asarray(c.transpose(1, 0, 2)), np.transpose(A, (1, 0, 2)))
    with pytest.raises(ValueError, match=r"axes \(2, 0\) for an array of ndim 3"):
        jask.transpose(c, (2, 0))


def test_bad_indices_are_refused_before_reading(small_tiles):
    a = jask.from_numpy(_arr((5, 7)))
    with jask.profile() as p:
        with pytest.raises(IndexError, match="index 5 is out of bounds for axis 0 with size 5"):
            a[5]
        with pytest.raises(IndexError, match="too many indices"):
            a[1, 2, 3]
        with pytest.raises(NotImplementedError, match="one 1-D integer or boolean array index.*jask.batches"):
            a[np.array([0, 2]), 1]
        with pytest.raises(NotImplementedError, match="one 1-D integer or boolean array index"):
            a[np.array([[0, 2]])]
        with pytest.raises(IndexError, match="index 5 is out of bounds for an axis of size 5"):
            a[np.array([0, 5])]
        with pytest.raises(IndexError, match=r"boolean index along an axis of size 7 must have shape \(7,\)"):
            a[:, np.array([True, False])]
        with pytest.raises(NotImplementedError, match="traced indices"):
            jax.jit(lambda a, i: a[i])(a, jnp.array([0, 1]))
        with pytest.raises(ValueError, match=r"cannot reshape array of shape \(5, 7\)"):
            a.reshape(6, 6)
        with pytest.raises(ValueError, match="equal sizes on the other axes"):
            knp.concatenate([a, a.T])
        with pytest.raises(ValueError, match="not equal to one"):
            knp.squeeze(a, 0)
    assert p.bytes_read == 0


def test_aligned_row_slice_reads_only_its_tiles(small_tiles):
    A = _arr((16, 8))
    a = jask.from_numpy(A)
    with jask.profile() as p:
        out = np.asarray(a[4:8])
    np.testing.assert_array_equal(out, A[4:8])
    assert p.bytes_read == 4 * 8 * 4   # one row of tiles (not 16 * 8 * 4), and no row numbers: whole tiles


def test_one_hot_matches_jax(small_tiles):
    labels = np.array([0, 3, 1, 2, 3, 0, 9], np.int32)     # 9 is out of range: an all-zero row, as in JAX
    got = jask.nn.one_hot(jask.from_numpy(labels), 4)
    want = jax.nn.one_hot(labels, 4)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(np.asarray(jask.nn.one_hot(jask.from_numpy(labels), 4, axis=0)),
                                  jax.nn.one_hot(labels, 4, axis=0))


def test_inmemory_operand_on_either_side_of_matmul(small_tiles):
    X, W, V = _arr((6, 5)), _arr((5, 3), 1), _arr((2, 6), 2)
    x = jask.from_numpy(X)
    np.testing.assert_allclose(np.asarray(x @ W), X @ W, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(V @ x), V @ X, rtol=1e-5, atol=1e-5)          # NumPy defers to us
    np.testing.assert_allclose(np.asarray(jnp.asarray(V) @ x), V @ X, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(knp.tensordot(x, W, axes=1)), X @ W, rtol=1e-5, atol=1e-5)
    with pytest.raises(NotImplementedError, match="traced in-memory array of shape \\(5, 3\\)"):
        jax.jit(lambda w: x @ w)(W)


def test_batches_read_only_their_rows_and_compile_once(small_tiles):
    X, y = _arr((20, 8)), np.arange(20, dtype=np.int32)
    xs, ys = jask.from_numpy(X), jask.from_numpy(y)
    traces = []

    @jax.jit
    def step(w, xb, yb):
        traces.append(1)
        return w - 0.1 * jax.grad(lambda w: jnp.mean((xb @ w - yb) ** 2))(w)

    w = jnp.zeros(8)
    with jask.profile() as p:
        seen = []
        for xb, yb in jask.batches(xs, ys, batch_size=6, shuffle=3):
            assert xb.shape == (6, 8) and yb.shape == (6,)
            np.testing.assert_array_equal(xb, X[yb[0]:yb[0] + 6])
            seen.append(int(yb[0]))
            w = step(w, xb, yb)
    assert sorted(seen) == [0, 6, 12] and seen != [0, 6, 12]      # 3 full batches, order shuffled
    assert len(traces) == 1
    assert p.bytes_read == 3 * 6 * (8 * 4 + 4)                # exactly the batches' rows of X and y
    orders = [[int(b[0]) for b in jask.batches(ys, batch_size=6, shuffle=3, epoch=e)] for e in range(3)]
    assert len({tuple(o) for o in orders}) > 1
    assert [int(b[-1]) for b in jask.batches(ys, batch_size=6, drop_last=False)] == [5, 11, 17, 19]


def test_a_shuffle_buffer_mixes_rows_across_batches_and_reads_each_row_once(small_tiles):
    """``shuffle_buffer=3``: each epoch yields every row once, the rows of X and y still paired, batches of
    the same sizes; rows of different batches of the order are dealt together (other partners each epoch,
    the same for the same seed and epoch), and the bytes read are the batches' rows, as without it."""
    X, y = _arr((30, 8)), np.arange(30, dtype=np.int32)
    xs, ys = jask.from_numpy(X), jask.from_numpy(y)
    plain = list(jask.batches(ys, batch_size=4, shuffle=5, epoch=0))

    def epoch(e, drop_last=True):
        with jask.profile() as p:
            got = list(jask.batches(xs, ys, batch_size=4, shuffle=5, epoch=e, shuffle_buffer=3, drop_last=drop_last))
        return got, p.bytes_read

    got, read = epoch(0)
    assert [len(yb) for _, yb in got] == [4] * 7 and all(xb.shape == (4, 8) for xb, _ in got)
    for xb, yb in got:
        np.testing.assert_array_equal(xb, X[yb])                       # the arrays' rows dealt alike
    rows = np.concatenate([yb for _, yb in got])
    assert sorted(rows) == list(range(28))                              # each row of the 7 batches, once
    assert read == 28 * (8 * 4 + 4)
    for k in range(0, 7, 3):        # a group deals the rows of the same 3 batches as the order without mixing
        assert sorted(np.concatenate([yb for _, yb in got[k:k + 3]])) == sorted(np.concatenate(plain[k:k + 3]))
    assert any(len({int(r) // 4 for r in yb}) > 1 for _, yb in got)     # rows of several batches together
    again, _ = epoch(0)
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(got, again))  # reproducible
    other, _ = epoch(1)
    assert any(not np.array_equal(a[1], b[1]) for a, b in zip(got, other))
    tail, read = epoch(0, drop_last=False)
    assert sorted(len(yb) for _, yb in tail) == [2] + [4] * 7 and read == 30 * (8 * 4 + 4)
    assert sorted(np.concatenate([yb for _, yb in tail])) == list(range(30))
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="shuffle_buffer is a number of batches >= 1"):
            jask.batches(xs, batch_size=4, shuffle=1, shuffle_buffer=bad)
    with pytest.raises(ValueError, match="shuffle_buffer=3 shuffles rows with a seed; pass shuffle=SEED too"):
        jask.batches(xs, batch_size=4, shuffle_buffer=3)


def test_index_array_from_disk_and_reads_only_the_tiles_it_needs(small_tiles):
    A = _arr((32, 4))
    a = jask.from_numpy(A)
    idx = np.array([5, 4, 6, 5])
    np.testing.assert_array_equal(np.asarray(a[jask.from_numpy(idx)]), A[idx])
    a = jask.from_numpy(A)
    with jask.profile() as p:
        got = np.asarray(a[idx])
    np.testing.assert_array_equal(got, A[idx])
    assert p.bytes_read < A.nbytes / 4      # one row tile of A (and the small index columns), not all of A


def test_pass_through_reshapes_on_a_long_axis_are_free_not_gathers(small_tiles):
    A = _arr((3, 10))          # axis 1 spans three tiles of 4
    a = jask.from_numpy(A)
    for got, want in [(a[0], A[0]), (a[:, 0], A[:, 0]), (knp.expand_dims(a, 1), np.expand_dims(A, 1)),
                      (knp.expand_dims(a[1], 0), A[1][None])]:
        assert type(got._node).__name__ == "OpNode" and got._node.spec.cls.__name__ == "Reshape"
        np.testing.assert_array_equal(np.asarray(got), want)


def test_take_on_an_axis_past_int32_row_numbers_is_refused_before_building_columns():
    long = jask.numpy.zeros((2**31 + 5,), np.int8)     # storage-free: nothing is read or written
    with pytest.raises(NotImplementedError, match="longer than the int32 row numbers"):
        jask.numpy.take(long, np.array([0, 2**31 + 2]), axis=0)


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint8, np.int16, np.float16, jnp.bfloat16, np.float32])
def test_a_zero_d_result_keeps_its_dtype_and_bits(small_tiles, dtype):
    """``x[i, j]``, ``reshape(())`` and ``squeeze`` to 0-d: jnp's dtype (no promotion by a sum), -0.0 kept,
    eager and under jit; the gradient is jnp's."""
    A = (np.arange(20) - 3).reshape(4, 5).astype(dtype)
    if np.dtype(dtype).kind == "f" or dtype is jnp.bfloat16:
        A[1, 2] = -0.0
    a, r = jask.from_numpy(A), jnp.asarray(A)
    f = lambda m, x: (x[1, 2], x[3, -1], x[1:2, 2:3].reshape(()), m.squeeze(x[2:3, :1]))
    for wrap in (lambda f: f, jax.jit):
        for got, want in zip(wrap(lambda x: f(knp, x))(a), f(jnp, r)):
            assert np.shape(got) == () and np.asarray(got).dtype == want.dtype
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
            assert np.signbit(np.asarray(got).astype(np.float32)) == np.signbit(np.asarray(want).astype(np.float32))
    if dtype is np.float32:
        loss = lambda x: x[1, 2] * 3 + x[2:3, 4:5].reshape(()) ** 2
        np.testing.assert_array_equal(np.asarray(jax.jit(jax.grad(loss))(a)), jax.grad(loss)(r))


BOOL_KEYS = [True, False, np.True_, (Ellipsis, True), (0, False), (0, slice(None), True), (True, 0), (0, True),
             (slice(None), True), (True, True), (True, False), (None, True), (0, None, True), (True, None, 0),
             (Ellipsis, True, 0), (np.array(True), 1), (0, 1, 2, True), (slice(None, None, -2), np.False_, 1)]


def test_boolean_scalar_indices_add_an_axis_as_numpy(small_tiles):
    """``x[True]`` is ``x[None]``, ``x[False]`` an empty axis; with integers they form one advanced index
    whose axis goes first when they are not adjacent (NumPy's rule; jnp differs for ``x[None, True]``)."""
    A = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    a = jask.from_numpy(A)
    for key in BOOL_KEYS:
        want = A[key]
        for got in (a[key], jax.jit(lambda x: x[key])(a)):
            assert isinstance(got, jask.DiskArray) and got.shape == want.shape, key
            np.testing.assert_array_equal(np.asarray(got), want)
    W = np.random.default_rng(3).standard_normal((1, 4, 5)).astype(np.float32)
    got = jax.grad(lambda x: knp.sum(x[0, :, True] * W))(a)
    np.testing.assert_array_equal(np.asarray(got), jax.grad(lambda x: jnp.sum(x[0, :, True] * W))(A))
    np.testing.assert_array_equal(np.asarray(jask.from_numpy(np.float32(2.5))[True]), np.float32(2.5)[True])


def test_zero_d_index_arrays_and_scalar_take_index_as_integers(small_tiles):
    A = np.arange(35, dtype=np.float32).reshape(5, 7)
    a, r = jask.from_numpy(A), jnp.asarray(A)
    three = jnp.array(3)             # concrete (one made inside jit is traced, which is refused)
    cases = [(lambda m, x: x[np.array(2)]), (lambda m, x: x[1, np.int64(-2)]), (lambda m, x: x[:, three]),
             (lambda m, x: m.take(x, 2, axis=1)), (lambda m, x: m.take(x, np.array(-1), axis=0)),
             (lambda m, x: m.take(x[0], 4))]
    for case in cases:
        want = case(jnp, r)
        for got in (case(knp, a), jax.jit(lambda x: case(knp, x))(a)):
            assert np.shape(got) == want.shape and np.asarray(got).dtype == want.dtype
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    W = np.arange(5, dtype=np.float32)
    got = jax.grad(lambda x: knp.sum(knp.take(x, 2, axis=1) * W))(a)
    np.testing.assert_array_equal(np.asarray(got), jax.grad(lambda x: jnp.sum(jnp.take(x, 2, axis=1) * W))(r))


def test_a_large_step_with_few_result_rows_is_not_refused(small_tiles):
    """The tiles an output tile spans are bounded by its rows too: ``y[::17]`` of 7 rows is one row."""
    Y, L = np.arange(7, dtype=np.float32), np.arange(100, dtype=np.float32)
    y, long = jask.from_numpy(Y), jask.from_numpy(L)
    for got, want in ((y[::17], Y[::17]), (y[::-30], Y[::-30]), (long[::17], L[::17]), (long[5::-40], L[5::-40]),
                      (long[::-16], L[::-16])):
        assert got.shape == want.shape
        np.testing.assert_array_equal(np.asarray(got), want)
    got = jax.jit(jax.grad(lambda v: knp.sum(v[::17] * 2.0)))(long)
    np.testing.assert_array_equal(np.asarray(got), np.where(np.arange(100) % 17 == 0, 2.0, 0.0))


def test_concatenate_and_index_arrays_keep_negative_zero(small_tiles):
    Z = np.array([-0.0, 1.0, np.nan, -0.0, 0.0, -np.inf, 2.0], np.float32)
    z = jask.from_numpy(Z)
    bits = lambda v: np.asarray(v).view(np.int32)
    idx = np.array([5, 0, 4, 3, 3, 2, 1, 0])
    for got, want in ((knp.concatenate([z, z[:2], z]), np.concatenate([Z, Z[:2], Z])), (z[idx], Z[idx]),
                      (knp.stack([z, z]), np.stack([Z, Z])), (knp.take(z, idx), Z[idx]),
                      (jax.jit(lambda v: knp.concatenate([v[3:], v]))(z), np.concatenate([Z[3:], Z]))):
        np.testing.assert_array_equal(bits(got), want.view(np.int32))
    B = np.array([True, False, True])
    np.testing.assert_array_equal(np.asarray(knp.concatenate([jask.from_numpy(B), jask.from_numpy(~B)])),
                                  np.concatenate([B, ~B]))


def test_a_regrouping_reshape_lists_each_output_tiles_inputs_once(small_tiles, monkeypatch):
    """Merging axes across tiles: each output tile's input tiles are found once per group, not at every
    index_map call of the planner, schedule and explain (a 2048^2 reshape spent 37 s planning), and in one
    sort of tile numbers."""
    from jask.ops import regroup
    calls = []
    enumerate_tiles = regroup.Regroup._enumerate_tiles
    monkeypatch.setattr(regroup.Regroup, "_enumerate_tiles",
                        lambda self, *a: calls.append((id(self), a[2])) or enumerate_tiles(self, *a))
    A = np.arange(12 * 10, dtype=np.float32).reshape(12, 10)
    y = knp.reshape(jask.from_numpy(A), (10, 12))
    jask.explain(y)
    np.testing.assert_array_equal(np.asarray(y), A.reshape(10, 12))
    assert len(calls) == len(set(calls))                    # once per op object (the call's check builds one)
    assert {t for _, t in calls} == {(i, j) for i in range(3) for j in range(3)}   # (10, 12) in tiles of 4


def test_a_regrouping_reshape_plans_without_listing_every_element():
    """Planning asks each output tile's input tiles at every candidate tile edge, the first ones far too big to
    run (an output tile of 4M elements here): every offset of the tile, as int64s with a hashed unique, took
    640 MiB and 11 s to plan a 64 MiB reshape. Run starts and the offsets where an input tile edge can fall
    are enough."""
    import tracemalloc
    jask.set_memory_budget("4MB")
    y = knp.reshape(knp.zeros((2048, 2048), np.float32), (1024, 4096))     # lazy: planning alone
    tracemalloc.start()
    try:
        jask.explain(y)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, peak        # one int64 per element of a 4M-element tile would be 32 MiB


@pytest.mark.parametrize("in_shape, out_shape, tile", [
    ((12, 10), (10, 12), 4), ((12, 10), (8, 15), 5), ((7, 6, 5), (5, 42), 4), ((6, 35), (5, 7, 6), 3),
    ((1, 9, 8), (3, 24, 1), 5), ((16, 4), (64,), 8), ((64,), (4, 16), 3), ((5, 7), (35,), 1)])
def test_regroup_tiles_read_are_those_of_its_elements(in_shape, out_shape, tile):
    """Each output tile's input tiles, found from a few offsets, are those its elements come from (ragged tiles,
    groups of several axes, size-1 axes)."""
    from jask.ops.regroup import Regroup
    from jask.ops.shape import _groups
    op = Regroup(in_shape, out_shape, _groups(in_shape, out_shape), tuple(min(tile, d) for d in in_shape),
                 tuple(min(tile, d) for d in out_shape))
    where = np.arange(int(np.prod(in_shape))).reshape(in_shape)
    of_element = np.stack(np.unravel_index(where, in_shape), axis=-1).reshape(out_shape + (len(in_shape),)) // tile
    for idx in np.ndindex(*[-(-d // tile) for d in out_shape]):
        block = of_element[tuple(slice(i * tile, (i + 1) * tile) for i in idx)].reshape(-1, len(in_shape))
        want = {tuple(int(c) for c in row) for row in block}
        assert {e[0] for e in op.index_map(idx)} == want, idx
