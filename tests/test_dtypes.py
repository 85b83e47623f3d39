"""Low-precision dtypes in storage: bfloat16 as uint16 bits plus an attribute, float16 natively."""
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import zarr

import jask
from jask.io import dtypes
from jask.io.prefetch import Prefetcher
from jask.io.reader import TileKey, reader_for

BF16 = np.dtype(ml_dtypes.bfloat16)


def _rand(shape, seed=0, dtype=BF16):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _bits(x):
    """The raw 16-bit patterns, so comparisons are exact (NaN-safe, no float conversion)."""
    return np.asarray(x).view(np.uint16)


def _store(x):
    return x._node.resolved().store


# ---------------------------------------------------------------- the mapping

def test_mapping_is_a_view_not_a_copy():
    A = _rand((5, 7))
    raw = dtypes.to_storage(A)
    assert raw.dtype == np.uint16 and np.shares_memory(raw, A)
    back = dtypes.to_logical(raw, BF16)
    assert back.dtype == BF16 and np.shares_memory(back, A)
    F = np.ones(3, np.float16)
    assert dtypes.to_storage(F) is F  # natively stored dtypes pass through unchanged
    assert dtypes.storage_dtype(BF16) == np.uint16 and dtypes.storage_dtype(np.float16) == np.float16
    assert dtypes.dtype_attributes(BF16) == {"dtype": "bfloat16"} and dtypes.dtype_attributes(np.float32) == {}


# ---------------------------------------------------------------- round trips

@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)], ids=["bfloat16", "float16"])
def test_from_numpy_round_trip_is_bit_exact(small_tiles, dtype):
    A = _rand((5, 7), 1, dtype)
    A[0, 0], A[0, 1], A[1, 0] = np.nan, np.inf, -0.0
    x = jask.from_numpy(A)
    assert x.dtype == dtype
    out = np.asarray(x)
    assert out.dtype == dtype
    np.testing.assert_array_equal(_bits(out), _bits(A))
    np.testing.assert_array_equal(_bits(jask.materialize(x)), _bits(A))


def test_from_jax_bfloat16_array(small_tiles):
    A = jnp.asarray(_rand((5, 7), 2))
    x = jask.from_numpy(A)
    assert x.dtype == jnp.bfloat16
    np.testing.assert_array_equal(_bits(x), _bits(A))


def test_stored_as_uint16_with_attribute(small_tiles, tmp_path):
    """What a reader that does not know jask sees: uint16 plus ``attributes.jask.dtype``."""
    A = _rand((5, 7), 3)
    p = tmp_path / "bf.zarr"
    jask.from_numpy(A).to_zarr(p)
    z = zarr.open_array(p, mode="r")
    assert z.dtype == np.uint16
    assert z.attrs["jask"]["dtype"] == "bfloat16"
    np.testing.assert_array_equal(z[...], _bits(A))  # the bits; .view(ml_dtypes.bfloat16) gives the values
    # the scratch store behind from_numpy is stored the same way
    assert zarr.open_array(jask.from_numpy(A).path, mode="r").dtype == np.uint16


def test_float16_is_stored_natively(small_tiles, tmp_path):
    p = tmp_path / "f16.zarr"
    jask.from_numpy(_rand((5, 7), 4, np.float16)).to_zarr(p)
    z = zarr.open_array(p, mode="r")
    assert z.dtype == np.float16 and "dtype" not in z.attrs["jask"]


def test_ops_to_zarr_from_zarr_round_trip(small_tiles, tmp_path):
    """from_numpy -> ops -> to_zarr -> from_zarr keeps bfloat16 and the values jnp computes."""
    A, B = _rand((9, 6), 5), _rand((9, 6), 6)
    a, b = jask.from_numpy(A), jask.from_numpy(B)
    p = tmp_path / "out.zarr"
    (jask.square(a - b) * 0.5 + a).to_zarr(p)
    y = jask.from_zarr(p)
    assert y.dtype == jnp.bfloat16
    want = jnp.square(jnp.asarray(A) - jnp.asarray(B)) * 0.5 + jnp.asarray(A)
    np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(want, np.float32), rtol=2e-2, atol=2e-2)
    s = jask.sum(y @ jask.transpose(y))
    assert s.dtype == jnp.bfloat16
    w = jnp.sum(want.astype(jnp.float32) @ want.astype(jnp.float32).T)
    np.testing.assert_allclose(float(s), float(w), rtol=3e-2)


@pytest.mark.parametrize("layout", [dict(), dict(shards=(8, 8)), dict(compressors=zarr.codecs.ZstdCodec())],
                         ids=["chunks", "shards", "zstd"])
def test_layouts(small_tiles, tmp_path, layout):
    """Direct chunk reads, sharded files and decoding libraries all return bfloat16."""
    A = _rand((10, 9), 7)
    p = tmp_path / "l.zarr"
    jask.from_numpy(A).to_zarr(p, chunks=(4, 4), **layout)
    y = jask.from_zarr(p)
    np.testing.assert_array_equal(_bits(y), _bits(A))
    np.testing.assert_array_equal(_bits(y + y), _bits(jnp.asarray(A) + jnp.asarray(A)))


def test_update_user_store(small_tiles, tmp_path):
    A = _rand((5, 7), 8)
    p = tmp_path / "u.zarr"
    jask.from_numpy(A).to_zarr(p)
    x = jask.from_zarr(p, mode="r+")
    x.update_(x * 2.0)
    assert x.dtype == jnp.bfloat16
    np.testing.assert_array_equal(_bits(x), _bits(jnp.asarray(A) * 2))
    z = zarr.open_array(p, mode="r")
    assert z.dtype == np.uint16 and z.attrs["jask"]["dtype"] == "bfloat16"


def test_gradients_eager_and_jit(small_tiles):
    A = _rand((5, 7), 9)
    a = jask.from_numpy(A)
    loss = lambda x: jask.sum(jask.square(x))
    for g in (jax.grad(loss)(a), jax.jit(jax.grad(loss))(a)):
        assert isinstance(g, jask.DiskArray) and g.dtype == jnp.bfloat16
        np.testing.assert_array_equal(_bits(g), _bits(jax.grad(lambda x: jnp.sum(jnp.square(x)))(jnp.asarray(A))))


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("factor", [2.5, np.float32(2.5), jnp.float32(2.5)], ids=["python", "numpy_f32", "jax_f32"])
def test_scalar_factor_keeps_low_precision_dtype(small_tiles, dtype, factor):
    """jask.mul's rule: a scalar never widens a float array. The ``*`` operator promotes as jnp does."""
    A = _rand((5, 7), 13, dtype)
    out = jask.mul(jask.from_numpy(A), factor)
    assert out.dtype == dtype
    np.testing.assert_array_equal(_bits(out), _bits((jnp.asarray(A) * jnp.asarray(2.5, dtype))))
    out, want = jask.from_numpy(A) * factor, jnp.asarray(A) * factor
    assert out.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16), np.dtype(np.int8)], ids=["bfloat16", "float16", "int8"])
def test_weakly_typed_scalars_take_the_arrays_dtype(small_tiles, dtype):
    """A weak scalar operand (``jnp.asarray(2.0)``, a Python number passed through ``jit``) takes the array's
    dtype as in jnp, values and gradients alike: a learning rate must not widen float16 parameters to float32.
    (The result was float32, or int32 for int8.)"""
    A = _rand((5, 7), 14, dtype) if dtype.kind == "f" or dtype == BF16 else np.arange(35, dtype=dtype).reshape(5, 7)
    s = 2 if dtype.kind == "i" else 0.75
    a, ref = jask.from_numpy(A), jnp.asarray(A)
    for got, want in ((a * jnp.asarray(s), ref * jnp.asarray(s)), (jnp.asarray(s) + a, jnp.asarray(s) + ref),
                      (jax.jit(lambda x, s: x * s)(a, s), jax.jit(lambda x, s: x * s)(ref, s)),
                      (jax.jit(lambda x, s: jask.numpy.maximum(x, s))(a, s), jnp.maximum(ref, s))):
        assert got.dtype == want.dtype == dtype
        np.testing.assert_array_equal(np.asarray(got).astype(np.float32), np.asarray(want).astype(np.float32))
    if dtype.kind == "i":
        return
    for f in (jax.grad, lambda f: jax.jit(jax.grad(f))):
        g = f(lambda s: jask.sum(a * s).astype(jnp.float32))(s)
        want = jax.grad(lambda s: jnp.sum(ref * s).astype(jnp.float32))(s)
        assert g.dtype == want.dtype       # a sum of 35 rounded products: 35 roundings of |A| at most
        bound = A.size * float(jnp.finfo(dtype).eps) * float(np.abs(A.astype(np.float32)).sum())
        np.testing.assert_allclose(float(g), float(want), rtol=0, atol=bound)


def test_gradient_for_a_python_number_argument(small_tiles):
    """``jax.grad(f)(2.0)`` eagerly: the primal reached jask as NumPy's float64 and was refused (64-bit JAX is off)."""
    A = _rand((5, 7), 15, np.dtype(np.float32))
    a = jask.from_numpy(A)
    cases = [(lambda s: jask.sum(a * s), lambda s: jnp.sum(A * s)),
             (lambda s: jask.sum(jask.numpy.maximum(a, s) + s), lambda s: jnp.sum(jnp.maximum(A, s) + s))]
    for f, ref in cases:
        want = float(jax.grad(ref)(0.25))
        for g in (jax.grad(f)(0.25), jax.jit(jax.grad(f))(0.25)):
            np.testing.assert_allclose(float(g), want, rtol=1e-5)


# ---------------------------------------------------------------- the read path

def test_reader_returns_bfloat16_views(small_tiles):
    """The reader the executor uses (``reader_for(store).read``) hands back bfloat16, into a given buffer too."""
    A = _rand((10, 9), 10)
    store = _store(jask.from_numpy(A))
    reader = reader_for(store)
    assert reader.mode == "chunk" and reader.layout.dtype == np.uint16 and reader.dtype == BF16
    region = (slice(4, 8), slice(0, 4))
    out = reader.read(region)
    assert out.dtype == BF16
    np.testing.assert_array_equal(_bits(out), _bits(A[region]))
    buf = np.empty((4, 4), BF16)
    assert reader.read(region, out=buf) is buf
    with pytest.raises(ValueError, match=r"read buffer of shape \(4, 4\) uint16 does not fit.*\(bfloat16\)"):
        reader.read(region, out=np.empty((4, 4), np.uint16))
    assert store.dtype == BF16 and store.read(region).dtype == BF16


def test_prefetcher_yields_bfloat16(small_tiles):
    A = _rand((10, 9), 11)
    store = _store(jask.from_numpy(A))
    regions = [(slice(0, 4), slice(0, 4)), (slice(8, 10), slice(8, 9))]
    with Prefetcher([(TileKey(0, (i,)), (store, r)) for i, r in enumerate(regions)]) as stream:
        got = [block for _, block in stream]
    for block, r in zip(got, regions):
        assert block.dtype == BF16
        np.testing.assert_array_equal(_bits(block), _bits(A[r]))


# ---------------------------------------------------------------- arrays written by other tools

def test_foreign_uint16_marked_bfloat16(small_tiles, tmp_path):
    A = _rand((5, 7), 12)
    p = tmp_path / "foreign.zarr"
    z = zarr.create_array(p, shape=A.shape, dtype="uint16", chunks=(3, 3), attributes={"jask": {"dtype": "bfloat16"}})
    z[...] = A.view(np.uint16)
    x = jask.from_zarr(p)
    assert x.dtype == jnp.bfloat16
    np.testing.assert_array_equal(_bits(x), _bits(A))
    # unmarked, the same bits are plain uint16
    q = tmp_path / "plain.zarr"
    zarr.create_array(q, shape=A.shape, dtype="uint16", chunks=(3, 3))[...] = A.view(np.uint16)
    assert jask.from_zarr(q).dtype == np.uint16


@pytest.mark.parametrize("stored, name, fragment", [
    ("float32", "bfloat16", "records jask dtype bfloat16 but stores float32; bfloat16 must be stored as uint16"),
    ("uint16", "float8", "records jask dtype 'float8', which jask does not know"),
])
def test_bad_dtype_attribute(tmp_path, stored, name, fragment):
    p = tmp_path / "bad.zarr"
    zarr.create_array(p, shape=(5, 7), dtype=stored, chunks=(4, 4), attributes={"jask": {"dtype": name}})
    with pytest.raises(ValueError, match=re.escape(str(p)) + ".*" + re.escape(fragment)):
        jask.from_zarr(p)


def test_other_ml_dtypes_refused():
    with pytest.raises(TypeError, match=r"dtype float8_e4m3fn is not supported.*or bfloat16"):
        jask.from_numpy(np.zeros((3, 3), ml_dtypes.float8_e4m3fn))


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("dtype", [">f4", ">i4", ">f2"])
def test_big_endian_store_computes_in_native_byte_order(small_tiles, tmp_path, fmt, dtype):
    """A big-endian Zarr array (v2 '>f4') is computed in the same dtype in native byte order: ops, slices,
    reductions and copies give numpy's values."""
    data = (np.arange(48).reshape(6, 8) - 20).astype(dtype)
    p = tmp_path / "be.zarr"
    zarr.create_array(p, shape=data.shape, chunks=(4, 4), dtype=dtype, zarr_format=fmt)[...] = data
    x = jask.from_zarr(p)
    native = data.astype(np.dtype(dtype).newbyteorder("="))
    assert x.dtype == native.dtype and native.dtype.isnative
    np.testing.assert_array_equal(np.asarray(x), native)
    np.testing.assert_array_equal(np.asarray(x * 2), native * 2)
    np.testing.assert_array_equal(np.asarray(x[1:, 3:]), native[1:, 3:])
    assert float(jask.sum(x)) == float(native.sum())
    np.testing.assert_array_equal(_store(x).read((slice(0, 3), slice(2, 7))), native[:3, 2:7])
    jask.to_zarr(x + 1, tmp_path / "copy.zarr")
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "copy.zarr", mode="r")[...], native + 1)
