"""jask.numpy against jax.numpy on the same inputs: every elementwise name (value, dtype, gradient),
promotion, comparisons and ``==``, argmax/argmin, and the refusal of unsupported names.

The five-mode rows for a representative set (broadcasting, scalars, reductions) are in test_ops.py.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jask
import jask.numpy as knp

RTOL = ATOL = 1e-4
SHAPE, ROW = (5, 7), (7,)          # tile 4: several ragged tiles; the row broadcasts over the rows


def _data(domain, shape, seed):
    rng = np.random.default_rng(seed)
    if domain == "pos":
        return rng.uniform(0.5, 2.0, shape).astype(np.float32)
    if domain == "gt1":
        return rng.uniform(1.5, 3.0, shape).astype(np.float32)
    if domain == "unit":
        return rng.uniform(-0.9, 0.9, shape).astype(np.float32)
    if domain == "bool":
        return rng.standard_normal(shape) > 0
    return rng.standard_normal(shape).astype(np.float32)


def _ref(name):
    return {"rsqrt": jax.lax.rsqrt, "sigmoid": jax.nn.sigmoid}.get(name) or getattr(jnp, name)


# name: domains of the operands (a second operand is a (7,) row: broadcast along the rows)
UNARY = {n: "normal" for n in (
    "negative positive abs absolute exp exp2 expm1 square sin cos tan tanh sinh cosh arctan arcsinh sigmoid "
    "sign floor ceil trunc round cbrt isnan isfinite isinf logical_not").split()}
UNARY.update({n: "pos" for n in "log log1p log2 log10 sqrt rsqrt reciprocal".split()})
UNARY.update({"arcsin": "unit", "arccos": "unit", "arctanh": "unit", "arccosh": "gt1"})
BINARY = {n: ("normal", "normal") for n in (
    "add subtract multiply maximum minimum arctan2 hypot logaddexp logical_and logical_or logical_xor "
    "equal not_equal less less_equal greater greater_equal").split()}
BINARY.update({n: ("normal", "pos") for n in "divide true_divide floor_divide mod remainder".split()})
BINARY.update({"power": ("pos", "normal"), "float_power": ("pos", "normal")})
NAMES = ([(n, (d,)) for n, d in UNARY.items()] + [(n, d) for n, d in BINARY.items()]
         + [("where", ("bool", "normal", "normal")), ("clip", ("normal", "normal", "normal"))])
ISSUE_NAMES = set("""add subtract multiply divide true_divide floor_divide power negative abs exp expm1 log log1p sqrt
    rsqrt square sin cos tanh sigmoid maximum minimum where clip sign floor ceil round isnan isfinite logical_and
    logical_or logical_not logical_xor equal not_equal less less_equal greater greater_equal""".split())

GRAD_SAMPLE = {"logaddexp", "arctan2", "remainder", "arccosh", "reciprocal", "isinf"}


def test_every_issue_name_is_covered():
    assert ISSUE_NAMES <= {n for n, _ in NAMES}


@pytest.mark.parametrize("name, domains", NAMES, ids=[n for n, _ in NAMES])
def test_elementwise_name(small_tiles, name, domains):
    """Value and dtype as jnp; gradient of sum(f * W) as jax.grad of the jnp version (float outputs);
    for bool outputs, grad through ``astype`` of the comparison is that comparison, and does not crash.
    Names beyond the issue's list share the one mechanism: their gradient is checked for a sample only."""
    shapes = [SHAPE] + [ROW if len(domains) == 2 else SHAPE] * (len(domains) - 1)
    if name == "clip":
        shapes = [SHAPE, ROW, (5, 1)]
    data = [_data(d, s, seed) for seed, (d, s) in enumerate(zip(domains, shapes), 1)]
    if name == "clip":
        data[2] = data[1].max() + np.abs(data[2])   # max above min everywhere
    fn, ref = getattr(knp, name), _ref(name)
    if name == "clip":
        fn, ref = (lambda x, lo, hi: knp.clip(x, lo, hi)), (lambda x, lo, hi: jnp.clip(x, lo, hi))
    xs, rs = [jask.from_numpy(d) for d in data], [jnp.asarray(d) for d in data]
    out, want = fn(*xs), ref(*rs)
    assert isinstance(out, jask.DiskArray) and out.shape == want.shape and out.dtype == want.dtype
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=RTOL, atol=ATOL)
    if name not in ISSUE_NAMES | GRAD_SAMPLE:
        return
    argnums = tuple(i for i, d in enumerate(data) if d.dtype == np.float32)
    if jnp.issubdtype(want.dtype, jnp.floating):
        W = np.random.default_rng(0).standard_normal(want.shape).astype(np.float32)
        got = jax.grad(lambda *a: jask.sum(fn(*a) * jask.from_numpy(W)), argnums)(*xs)
        exp = jax.grad(lambda *a: jnp.sum(ref(*a) * W), argnums)(*rs)
    else:
        got = jax.grad(lambda *a: jask.sum(knp.astype(fn(*a), jnp.float32) * a[argnums[0]]), argnums)(*xs)
        exp = jax.grad(lambda *a: jnp.sum(ref(*a).astype(jnp.float32) * a[argnums[0]]), argnums)(*rs)
    for g, e in zip(got, exp):
        assert isinstance(g, jask.DiskArray) and g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("first, second, scalar", [
    (np.float32, np.float16, None), (np.float16, np.float32, None), (np.float16, "bfloat16", None),
    (np.int32, np.float32, None), (np.int32, None, 2.5), (np.int32, None, 3), (np.float16, None, 1.0),
    (np.float16, None, "jax_f32"), (np.bool_, None, 1), (np.int8, np.int32, None),
], ids=["f32+f16", "f16+f32", "f16+bf16", "i32+f32", "i32+2.5", "i32+3", "f16+1.0", "f16+jax_f32", "bool+1",
        "i8+i32"])
def test_promotion_matches_jnp(small_tiles, first, second, scalar):
    """Mixed dtypes promote as jnp (float32 + float16 is float32); Python scalars are weakly typed."""
    A = (np.random.default_rng(1).standard_normal(SHAPE) * 3).astype(first)
    if second is not None:
        B = (np.random.default_rng(2).standard_normal(ROW) * 3).astype(jnp.dtype(second))
        out, want = jask.from_numpy(A) + jask.from_numpy(B), jnp.asarray(A) + jnp.asarray(B)
    else:
        s = jnp.float32(0.5) if scalar == "jax_f32" else scalar
        out, want = jask.from_numpy(A) + s, jnp.asarray(A) + s
    assert out.dtype == want.dtype
    np.testing.assert_allclose(np.asarray(out).astype(np.float32), np.asarray(want).astype(np.float32),
                               rtol=1e-3)


def test_eq_is_elementwise_and_arrays_stay_hashable(small_tiles):
    A = np.random.default_rng(3).integers(0, 3, SHAPE).astype(np.float32)
    a, b = jask.from_numpy(A), jask.from_numpy(A.T.copy().T)
    eq = a == b
    assert isinstance(eq, jask.DiskArray) and eq.dtype == np.bool_
    np.testing.assert_array_equal(np.asarray(eq), np.ones(SHAPE, bool))
    np.testing.assert_array_equal(np.asarray(a != 1.0), A != 1.0)
    np.testing.assert_array_equal(np.asarray(a >= jask.from_numpy(A[0])), A >= A[0])
    assert len({a, b, a}) == 2 and {a: 1}[a] == 1          # hashing is by identity


def test_comparisons_and_operators_under_jit(small_tiles):
    A, B = np.random.default_rng(4).standard_normal((2, *SHAPE)).astype(np.float32)
    f = lambda a, b: (knp.where(a < b, a // 0.5, -b) % 0.7, abs(a) ** 0.5, 2.0 ** a)
    for got, want in zip(jax.jit(f)(jask.from_numpy(A), jask.from_numpy(B)), f(jnp.asarray(A), jnp.asarray(B))):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=RTOL, atol=ATOL)


def test_traced_scalar_on_the_left_under_grad(small_tiles):
    """``s + x``, ``s - x``, ``s / x``, ``s ** x`` with both traced reach the DiskArray's reflected operator."""
    A = np.random.default_rng(5).uniform(0.5, 2.0, SHAPE).astype(np.float32)
    loss = lambda x, s: (s + x) * (s - x) / (s / x) + s ** x
    got = jax.jit(jax.grad(lambda x, s: jask.sum(loss(x, s)), argnums=(0, 1)))(jask.from_numpy(A), jnp.float32(1.5))
    want = jax.grad(lambda x, s: jnp.sum(loss(x, s)), argnums=(0, 1))(jnp.asarray(A), jnp.float32(1.5))
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(float(got[1]), float(want[1]), rtol=RTOL)


def test_user_elementwise_function(small_tiles):
    def gelu_ish(x, b, *, k):
        return x * jax.nn.sigmoid(k * (x + b))

    f = knp.elementwise(gelu_ish)
    A, b = np.random.default_rng(6).standard_normal(SHAPE).astype(np.float32), np.float32(0.3)
    x = jask.from_numpy(A)
    np.testing.assert_allclose(np.asarray(f(x, 0.3, k=1.7)), gelu_ish(A, b, k=1.7), rtol=RTOL, atol=ATOL)
    g = jax.grad(lambda x: jask.sum(f(x, 0.3, k=1.7)))(x)
    np.testing.assert_allclose(np.asarray(g), jax.grad(lambda x: jnp.sum(gelu_ish(x, b, k=1.7)))(A),
                               rtol=RTOL, atol=ATOL)
    with pytest.raises(ValueError, match="must be elementwise"):
        knp.elementwise(lambda x: jnp.sum(x, axis=0))(x)


@pytest.mark.parametrize("axis, keepdims", [(None, False), (None, True), (1, False), (-3, True)])
@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_argmin_first_index_of_ties(small_tiles, name, axis, keepdims):
    A = np.random.default_rng(7).integers(0, 4, (5, 6, 7)).astype(np.float32)   # many ties
    out = getattr(knp, name)(jask.from_numpy(A), axis=axis, keepdims=keepdims)
    want = getattr(jnp, name)(jnp.asarray(A), axis=axis, keepdims=keepdims)
    assert np.shape(out) == want.shape and np.asarray(out).dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))


def test_argmax_nan_and_jit(small_tiles):
    A = np.random.default_rng(8).standard_normal((5, 7)).astype(np.float32)
    A[3, 2] = A[1, 6] = np.nan
    a = jask.from_numpy(A)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda x: knp.argmax(x, axis=1))(a)), jnp.argmax(A, axis=1))
    assert int(knp.argmax(a)) == int(jnp.argmax(A))


def test_max_gradient_splits_ties_as_jax(small_tiles):
    A = np.random.default_rng(9).integers(0, 3, (5, 7)).astype(np.float32)
    got = jax.grad(lambda x: knp.max(x))(jask.from_numpy(A))
    np.testing.assert_allclose(np.asarray(got), jax.grad(jnp.max)(jnp.asarray(A)), rtol=RTOL)
    got = jax.grad(lambda x: jask.sum(knp.min(x, axis=0) * 1.5))(jask.from_numpy(A))
    np.testing.assert_allclose(np.asarray(got), jax.grad(lambda x: jnp.sum(jnp.min(x, axis=0) * 1.5))(jnp.asarray(A)),
                               rtol=RTOL)


def test_prod_gradient_with_zeros(small_tiles):
    A = np.random.default_rng(10).standard_normal((5, 7)).astype(np.float32)
    A[1, 3] = 0.0                     # one zero in row 1
    A[2, 0] = A[2, 5] = 0.0           # two zeros in row 2
    got = jax.grad(lambda x: jask.sum(knp.prod(x, axis=1) * 2.0))(jask.from_numpy(A))
    want = jax.grad(lambda x: jnp.sum(jnp.prod(x, axis=1) * 2.0))(jnp.asarray(A))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=RTOL, atol=ATOL)


def test_reductions_of_integers_and_bools(small_tiles):
    I = np.random.default_rng(11).integers(-5, 5, (5, 7)).astype(np.int32)
    i = jask.from_numpy(I)
    for name in ("sum", "mean", "max", "min", "prod", "var"):
        got, want = getattr(knp, name)(i, axis=0), getattr(jnp, name)(jnp.asarray(I), axis=0)
        assert got.dtype == want.dtype, name
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=RTOL)
    got = (i > 0).sum(axis=1)
    assert got.dtype == jnp.sum(jnp.asarray(I) > 0, axis=1).dtype
    np.testing.assert_array_equal(np.asarray(got), (I > 0).sum(1))


def test_methods_and_astype(small_tiles):
    A = np.random.default_rng(12).standard_normal((5, 7)).astype(np.float32)
    a, r = jask.from_numpy(A), jnp.asarray(A)
    for got, want in ((a.mean(), r.mean()), (a.max(), r.max()), (a.min(axis=1), r.min(axis=1)),
                      (a.std(axis=0, ddof=1), r.std(axis=0, ddof=1)), (a.astype(jnp.float16), r.astype(jnp.float16)),
                      (a.argmax(axis=0), r.argmax(axis=0)), (a.prod(axis=1), r.prod(axis=1))):
        assert np.shape(got) == want.shape and np.asarray(got).dtype == want.dtype
        np.testing.assert_allclose(np.asarray(got).astype(np.float32), np.asarray(want).astype(np.float32),
                                   rtol=1e-3, atol=1e-3)
    g = jax.grad(lambda x: x.astype(jnp.float16).astype(jnp.float32).mean())(a)
    assert g.dtype == np.float32
    np.testing.assert_allclose(np.asarray(g), np.full(A.shape, 1 / A.size, np.float32), rtol=1e-3)


def test_in_memory_operand_is_written_once(small_tiles):
    """A concrete NumPy/JAX array operand (a bias row) is broadcast like a DiskArray."""
    A, b = np.random.default_rng(13).standard_normal((2, 5, 7)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(jask.from_numpy(A) + jnp.asarray(b[0])), A + b[0], rtol=RTOL)
    np.testing.assert_allclose(np.asarray(knp.maximum(b[1:2], jask.from_numpy(A))), np.maximum(b[1:2], A),
                               rtol=RTOL)


def test_unsupported_names_raise_with_alternative():
    with pytest.raises(NotImplementedError, match=r"jask.numpy.vdot is not supported yet; nearest supported: sum"):
        knp.vdot
    with pytest.raises(NotImplementedError, match=r"jask.numpy.nanargmax .*nearest supported: argmax"):
        knp.nanargmax
    with pytest.raises(NotImplementedError, match=r"jask.numpy.linalg.svd"):
        knp.linalg.svd
    for name, hint in (("cumprod", "prod"), ("nanstd", "std"), ("fmax", "max"), ("acos", "arccos"),
                       ("logaddexp2", "logaddexp"), ("isin", "jask.numpy.elementwise"), ("sort", "jask.numpy.elem"),
                       ("insert", "jask.numpy.elementwise"), ("flip", "jask.numpy.elementwise")):
        with pytest.raises(NotImplementedError, match=rf"jask.numpy.{name} is not .*nearest supported: {hint}"):
            getattr(knp, name)
    with pytest.raises(AttributeError):
        knp.not_a_jnp_name
    with pytest.raises(NotImplementedError, match="where\\(condition, x, y\\)"):
        knp.where(jask.from_numpy(np.ones(SHAPE, np.float32)))


def test_errors_name_the_op_and_shapes(small_tiles):
    a = jask.from_numpy(np.ones(SHAPE, np.float32))
    with pytest.raises(ValueError, match=r"add got incompatible shapes for broadcasting: \(5, 7\), \(5,\)"):
        knp.add(a, jask.from_numpy(np.ones(5, np.float32)))
    with pytest.raises(ValueError, match=r"sum: axis 2 is out of range"):
        knp.sum(a, axis=2)
    for name in ("sum", "mean", "var", "std", "max", "prod", "any", "argmin"):
        with pytest.raises(ValueError, match=rf"^{name}: axis 5 is out of range"):
            getattr(knp, name)(a, axis=5)
        for bad in (1.0, "a", (0, 1.5)):
            with pytest.raises(TypeError, match=rf"^{name}: axis must be None, an int or a tuple of ints, got"):
                getattr(knp, name)(a, axis=bad)
    with pytest.raises(NotImplementedError, match="where= argument"):
        knp.sum(a, where=a > 0)
    assert knp.mean(np.ones(SHAPE)) == 1.0      # no DiskArray: jnp's mean (test_reductions_of_in_memory_values_are_jnps)


def test_creation_dtypes_match_jnp(small_tiles):
    """Dtypes canonical as in jnp (float -> float32 without x64); full with an array fill honours dtype=."""
    row = np.arange(3, dtype=np.float32)
    cases = [(lambda m: m.zeros(3, float), None), (lambda m: m.ones(3, float), None),
             (lambda m: m.zeros(3, np.int64), None), (lambda m: m.full((2, 3), 1.5, np.float64), None),
             (lambda m, a: m.zeros_like(a), np.zeros(3)), (lambda m, a: m.ones_like(a, dtype=float), row),
             (lambda m, a: m.full((2, 3), a, dtype=np.int32), row), (lambda m, a: m.full((2, 3), a), row),
             (lambda m, a: m.full_like(a, 2, dtype=float), row)]
    for make, arg in cases:
        want = make(jnp) if arg is None else make(jnp, arg)
        got = make(jask.numpy) if arg is None else make(jask.numpy, jask.from_numpy(arg))
        assert isinstance(got, jask.DiskArray) and got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(np.asarray(got), want)


def test_broadcast_to_and_full_with_a_traced_array_refuse_clearly(small_tiles):
    v = jnp.arange(3.0)
    for f in (lambda v: jask.numpy.broadcast_to(v, (2, 3)), lambda v: jask.numpy.full((2, 3), v)):
        with pytest.raises(NotImplementedError, match=r"traced in-memory array of shape \(3,\).*jask.from_numpy"):
            jax.jit(f)(v)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=["float16", "bfloat16"])
def test_low_precision_reductions_accumulate_in_float32(small_tiles, dtype):
    """jnp sums float16/bfloat16 in float32 and casts back: 2000 x 100 must not overflow a mean to inf, and
    a sum's tile partials must not be rounded to 11 (8) bits at each combine. Eager and jit; gradients."""
    X = np.full((40, 50), 100, dtype)
    Y = (np.random.default_rng(14).uniform(0.5, 1.5, (40, 50)) / 10).astype(dtype)
    Z = np.random.default_rng(15).uniform(0.97, 1.03, (40, 50)).astype(dtype)     # products near 1
    x, y, xr, yr = jask.from_numpy(X), jask.from_numpy(Y), jnp.asarray(X), jnp.asarray(Y)
    cases = [(lambda m, a: m.mean(a)), (lambda m, a: m.var(a)), (lambda m, a: m.std(a, axis=0)),
             (lambda m, a: m.mean(a, axis=1, keepdims=True)), (lambda m, a: m.sum(a, axis=0)),
             (lambda m, a: m.sum(a)), (lambda m, a: m.prod(a, axis=1))]
    z, zr = jask.from_numpy(Z), jnp.asarray(Z)
    for wrap in (lambda f: f, jax.jit):
        for case in (cases if wrap is not jax.jit else cases[::3]):     # jit: a mean, a std, the product
            for a, r in ((x, xr), (y, yr)) + (((z, zr),) if case is cases[-1] else ()):     # Z for the product
                got, want = wrap(lambda a: case(knp, a))(a), case(jnp, r)
                assert np.asarray(got).dtype == want.dtype and np.shape(got) == want.shape
                np.testing.assert_allclose(np.asarray(got).astype(np.float32), np.asarray(want).astype(np.float32),
                                           rtol=1e-2, atol=1e-3)
    assert np.isfinite(float(knp.mean(x))) and float(knp.mean(x)) == 100.0
    got = jax.grad(lambda a: knp.mean(a).astype(jnp.float32))(y)
    want = jax.grad(lambda a: jnp.mean(a).astype(jnp.float32))(yr)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(np.asarray(got).astype(np.float32), np.asarray(want).astype(np.float32), rtol=1e-2)


@pytest.mark.slow
def test_bitwise_operators_and_functions_match_jnp(small_tiles):
    """``~ & | ^ << >> %`` (and reflected) on int and bool arrays, the jnp bitwise names, eager and under jit
    with a traced scalar on the left; a float operand is refused as in jnp."""
    I = np.random.default_rng(15).integers(1, 9, SHAPE).astype(np.int32)
    B = I > 4
    ops = [lambda i, b: 7 % i, lambda i, b: i % 3, lambda i, b: ~i, lambda i, b: ~b, lambda i, b: b & (i > 2),
           lambda i, b: b | True, lambda i, b: b ^ True, lambda i, b: True ^ b, lambda i, b: i << 2,
           lambda i, b: 1 << i, lambda i, b: 300 >> i, lambda i, b: i >> 1, lambda i, b: 6 & i, lambda i, b: 6 | i,
           lambda i, b: i ^ i.T.T, lambda i, b: -i >> 1]
    i, b = jask.from_numpy(I), jask.from_numpy(B)
    for op in ops:
        want, got = op(jnp.asarray(I), jnp.asarray(B)), op(i, b)
        assert isinstance(got, jask.DiskArray) and got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    for name in ("bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "bitwise_left_shift",
                 "bitwise_right_shift"):
        got, want = getattr(knp, name)(i, 2), getattr(jnp, name)(jnp.asarray(I), 2)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    for name in ("bitwise_not", "invert", "bitwise_invert"):
        for x, xr in ((i, I), (b, B)):
            got, want = getattr(knp, name)(x), getattr(jnp, name)(jnp.asarray(xr))
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    f = lambda i, b, s: (s % i, s & i, s | i, s ^ i, s << i, s >> i, i % s, ~b & (i > s))
    for got, want in zip(jax.jit(f)(i, b, jnp.int32(5)), f(jnp.asarray(I), jnp.asarray(B), jnp.int32(5))):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    with pytest.raises(TypeError, match="float32"):
        jask.from_numpy(I.astype(np.float32)) & 1


@pytest.mark.parametrize("axis, keepdims", [(None, False), (0, False), (1, True), ((0, 1), False), (-1, False)])
def test_any_all_match_jnp(small_tiles, axis, keepdims):
    A = np.random.default_rng(16).integers(0, 3, SHAPE).astype(np.float32)
    A[0], A[:, 3], A[2, 2] = 1.0, 0.0, np.nan           # a row all true, a column all false, a NaN (true)
    a, r = jask.from_numpy(A), jnp.asarray(A)
    for name in ("any", "all"):
        for x, xr in ((a, r), (a > 0, r > 0), (a.astype(jnp.int32), r.astype(jnp.int32))):
            want = getattr(jnp, name)(xr, axis=axis, keepdims=keepdims)
            for got in (getattr(knp, name)(x, axis=axis, keepdims=keepdims),
                        jax.jit(lambda x: getattr(x, name)(axis=axis, keepdims=keepdims))(x)):
                assert np.shape(got) == want.shape and np.asarray(got).dtype == np.bool_
                np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    E = np.zeros((0, 7), np.float32)
    for name in ("any", "all"):
        for ax in (None, 0, 1):
            want = getattr(jnp, name)(E, axis=ax)
            got = getattr(knp, name)(jask.from_numpy(E), axis=ax)
            assert np.shape(got) == want.shape
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.slow
def test_array_methods_and_unknown_attributes(small_tiles):
    """flatten, ravel, clip, round, itemsize, mT as on jax arrays (eager and jit, with gradients); any other
    attribute says it is not supported on DiskArrays."""
    A = np.random.default_rng(17).standard_normal((2, 5, 7)).astype(np.float32)
    a, r = jask.from_numpy(A), jnp.asarray(A)
    f = lambda x: (x.flatten(), x.ravel(), x.clip(-0.5, 0.5), x.round(1), x.mT, x[0].mT * 2)
    for wrap in (lambda f: f, jax.jit):
        for got, want in zip(wrap(f)(a), f(r)):
            assert isinstance(got, jask.DiskArray) and got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
    assert a.itemsize == r.itemsize == 4 and jax.jit(lambda x: x.itemsize)(a) == 4
    np.testing.assert_array_equal(np.asarray(knp.ravel(a)), np.ravel(A))
    loss = lambda m: lambda x: m.sum(x.mT.flatten() * x.clip(-0.5, 0.5).ravel()[: x.size])
    jask.config.update("tile", 8)   # the gradients of reshapes across tiles are the OPS table's (test_ops.py):
    got = jax.grad(loss(knp))(a)    # at tile 4 this line took 11-15 s, 7.5 s of it compiling gathers
    np.testing.assert_allclose(np.asarray(got), jax.grad(loss(jnp))(r), rtol=1e-5, atol=1e-6)
    with pytest.raises(AttributeError, match="DiskArray.tolist is not supported on DiskArrays"):
        a.tolist()
    with pytest.raises(AttributeError) as err:
        jax.jit(lambda x: x.no_such_attribute)(a)
    assert "not supported on DiskArrays" in str(err.value) + str(err.value.__cause__)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        a[0, 0].mT
    assert not hasattr(a, "weak_type")


def test_zero_d_full_and_ones_are_disk_arrays_eagerly_and_under_jit(small_tiles):
    half = jnp.bfloat16(2.5)         # made outside jit: one made inside is traced (a JAX scalar results)
    cases = [(lambda m: m.ones(())), (lambda m: m.full((), 3.0)), (lambda m: m.full((), 7, jnp.int8)),
             (lambda m: m.full((), half)), (lambda m: m.full((), True)),
             (lambda m: m.ones_like(m.zeros(()))), (lambda m: m.zeros(()))]
    for make in cases:
        want = make(jnp)
        for got in (make(knp), jax.jit(lambda: make(knp))()):
            assert isinstance(got, jask.DiskArray) and got.shape == () and got.dtype == want.dtype
            assert np.asarray(got) == np.asarray(want)
    x = jask.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    g = jax.jit(jax.grad(lambda x: knp.sum(x * knp.full((), 3.0))))(x)
    np.testing.assert_array_equal(np.asarray(g), np.full((2, 3), 3.0, np.float32))
    assert float(jax.jit(lambda v: knp.full((), v))(2.0)) == 2.0     # a traced fill: a JAX scalar


def test_reductions_of_in_memory_values_are_jnps():
    """A reduction given no DiskArray (the JAX scalar a full reduction returns, an in-memory array) is jnp's,
    as elementwise functions are: ``knp.sum(knp.std(x))`` raised TypeError."""
    A = np.arange(35, dtype=np.float32).reshape(5, 7)
    x = jask.from_numpy(A)
    np.testing.assert_allclose(float(knp.sum(knp.std(x))), float(np.std(A)), rtol=1e-6)
    for name in ("sum", "max", "min", "prod", "mean", "var", "std", "any", "all", "argmax", "argmin"):
        np.testing.assert_allclose(np.asarray(getattr(knp, name)(jnp.asarray(A), axis=1)),
                                   np.asarray(getattr(jnp, name)(jnp.asarray(A), axis=1)))
