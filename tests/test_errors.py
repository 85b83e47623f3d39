"""Bad inputs fail early with the right exception type and a message that says what is wrong."""
import os
import pickle
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import zarr

import jask
from jask.config import config
from jask.io import scratch


def _rand(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _arr(shape, seed=0, dtype=np.float32):
    return jask.from_numpy(_rand(shape, seed, dtype))


def _entries(folder):
    """Every file and folder (hidden ones included) below ``folder``."""
    out = set()
    for root, dirs, files in os.walk(folder):
        out.update(os.path.join(root, n) for n in dirs + files)
    return out


# ---------------------------------------------------------------- shapes and dtypes

@pytest.mark.parametrize("op", [jask.add, jask.sub, jask.mul])
def test_elementwise_mismatched_shapes(small_tiles, op):
    a, b = _arr((5, 7)), _arr((7, 5))
    with pytest.raises(ValueError, match=r"\(5, 7\).*\(7, 5\)"):
        op(a, b)


def test_operator_mismatched_shapes(small_tiles):
    a, b = _arr((5, 7)), _arr((5, 6))
    with pytest.raises(ValueError, match=r"\(5, 7\).*\(5, 6\)"):
        a + b


@pytest.mark.parametrize("other", [np.int32, np.float16])
def test_mismatched_dtypes(small_tiles, other):
    a, b = _arr((5, 7)), _arr((5, 7), dtype=other)
    with pytest.raises(TypeError, match=r"mismatched dtypes float32, " + np.dtype(other).name):
        jask.add(a, b)


def test_mismatched_dtypes_float32_float64(small_tiles):
    with jax.enable_x64(True):
        a, b = _arr((5, 7)), _arr((5, 7), dtype=np.float64)
        with pytest.raises(TypeError, match="mismatched dtypes float32, float64"):
            jask.add(a, b)
        with pytest.raises(TypeError, match="mismatched dtypes"):
            jask.dot(a, _arr((7, 3), dtype=np.float64))
        assert (a @ _arr((7, 3), dtype=np.float64)).dtype == np.float64    # the operator promotes, as jnp


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.uint64])
def test_64bit_data_becomes_32bit_without_x64_as_in_jnp(dtype, tmp_path):
    """from_numpy(np.random.rand(...)) works as jnp.asarray does; a 64-bit STORE is still refused
    (reading it would silently change what the store holds: the message says how to proceed)."""
    data = (np.random.default_rng(0).random((5, 7)) * 100).astype(dtype)
    with jax.enable_x64(False):
        x = jask.from_numpy(data)
        want = jnp.asarray(data)
        assert x.dtype == want.dtype and np.dtype(x.dtype).itemsize == 4
        np.testing.assert_array_equal(np.asarray(x), np.asarray(want))
        import zarr
        zarr.create_array(str(tmp_path / "wide.zarr"), data=data)
        with pytest.raises(TypeError, match="64-bit"):
            jask.from_zarr(str(tmp_path / "wide.zarr"))


@pytest.mark.parametrize("op", [jask.add, jask.sub, jask.mul, jask.dot])
@pytest.mark.parametrize("first, second", [(np.float32, jnp.bfloat16), (np.float16, jnp.bfloat16),
                                           (jnp.bfloat16, np.float32)])
def test_mismatched_low_precision_dtypes(small_tiles, op, first, second):
    """No implicit promotion between float widths: the message names both dtypes."""
    a, b = _arr((5, 5), 1, first), _arr((5, 5), 2, second)
    names = f"{np.dtype(first).name}, {np.dtype(second).name}"
    with pytest.raises(TypeError, match=f"mismatched dtypes {names}.*convert the inputs to one dtype"):
        op(a, b)


@pytest.mark.parametrize("call, fragment", [
    (lambda a: jask.add(a, a, a), "add takes 2 DiskArray arguments, got 3"),
    (lambda a: jask.dot(a), "dot takes 2 DiskArray arguments, got 1"),
    (lambda a: jask.square(a, a), "square takes 1 DiskArray argument, got 2"),
    (lambda a: jask.sum(a, axes=0), "sum() got an unexpected keyword argument 'axes'"),
    (lambda a: jask.transpose(a, perm=(1, 0)),
     "transpose got unexpected keyword argument 'perm'; it takes keyword arguments: axes"),
    (lambda a: jask.add(a, a, alpha=2), "add got unexpected keyword argument 'alpha'"),
], ids=["too_many_arrays", "too_few_arrays", "unary_two_arrays", "sum_axis", "transpose_perm", "add_keyword"])
def test_wrong_arguments_named_by_the_public_op(small_tiles, call, fragment):
    """Arity and keywords are checked against the op's methods and reported as the public function's."""
    with pytest.raises(TypeError, match=re.escape(fragment)):
        call(_arr((5, 5)))


@pytest.mark.parametrize("a_shape, b_shape, fragment", [
    ((5, 7), (5, 7), r"incompatible shapes \(5, 7\), \(5, 7\).*7 and 5"),
    ((5, 7), (6,), r"incompatible shapes \(5, 7\), \(6,\)"),
    ((2, 5, 7), (3, 7, 4), r"incompatible batch dimensions.*\(2, 5, 7\), \(3, 7, 4\)"),
])
def test_dot_incompatible(small_tiles, a_shape, b_shape, fragment):
    a, b = _arr(a_shape), _arr(b_shape, 1)
    with pytest.raises(ValueError, match=fragment):
        jask.dot(a, b)
    with pytest.raises(ValueError, match=fragment):
        a @ b


@pytest.mark.parametrize("axes", [(0, 0, 1), (0, 1, 3), (1, 0), (0, 1, 2, 3), (0, -4, 1)],
                         ids=["repeated", "out_of_range", "too_short", "too_long", "negative_out_of_range"])
def test_transpose_bad_axes(small_tiles, axes):
    a = _arr((3, 5, 6))
    with pytest.raises(ValueError, match=r"axes must be a permutation of \(0, 1, 2\)"):
        jask.transpose(a, axes=axes)


def test_transpose_axes_not_a_sequence(small_tiles):
    with pytest.raises(TypeError, match="sequence of ints"):
        jask.transpose(_arr((5, 7)), axes=3)


@pytest.mark.parametrize("bad", [np.ones((5, 7), np.float32), jnp.ones((5, 7)), 1.0, [[1.0]]],
                         ids=["numpy", "jax", "float", "list"])
def test_add_non_diskarray(small_tiles, bad):
    a = _arr((5, 7))
    with pytest.raises(TypeError, match="expects DiskArray inputs; argument 1 is"):
        jask.add(a, bad)
    with pytest.raises(TypeError, match="expects DiskArray inputs; argument 0 is"):
        jask.add(bad, a)


@pytest.mark.parametrize("op", [jask.sub, jask.dot])
@pytest.mark.parametrize("bad", [np.ones((5, 5), np.float32), jnp.ones((5, 5)), None],
                         ids=["numpy", "jax", "none"])
def test_binary_ops_reject_non_diskarray(small_tiles, op, bad):
    a = _arr((5, 5))
    with pytest.raises(TypeError, match=f"{op.__name__} expects DiskArray inputs; argument 1 is "
                                        f"{type(bad).__name__}.*jask.from_numpy"):
        op(a, bad)


def test_a_traced_in_memory_operand_is_named_with_the_way_out(small_tiles):
    """Under grad, the seed ops' refusal of a traced array says what it is and what to pass instead."""
    a = _arr((5, 5))
    with pytest.raises(TypeError, match=r"dot expects DiskArray inputs; argument 1 is a traced in-memory value of "
                                        r"shape \(5, 3\).*jask.from_numpy\(value\) outside jit and grad"):
        jax.grad(lambda b: jask.sum(jask.dot(a, b)))(jnp.ones((5, 3)))


def test_single_input_ops_reject_non_diskarray():
    for op in (jask.square, jask.sum, jask.transpose):
        with pytest.raises(TypeError, match="DiskArray"):
            op(np.ones((5, 7), np.float32))


def test_mul_non_finite_python_scalar(small_tiles):
    """jask.mul refuses a non-finite factor; the ``*`` operator follows jnp (NaN and inf propagate)."""
    A = _rand((5, 7))
    a = jask.from_numpy(A)
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError, match="not finite"):
            jask.mul(a, bad)
        np.testing.assert_array_equal(np.asarray(bad * a), np.asarray(bad * jnp.asarray(A)))


@pytest.mark.parametrize("bad", [jnp.float32(np.nan), jnp.float32(-np.inf), jnp.asarray(np.inf, jnp.bfloat16),
                                 np.float16(np.inf)], ids=["jax_nan", "jax_-inf", "jax_bf16_inf", "numpy_f16_inf"])
def test_mul_non_finite_concrete_scalar(small_tiles, bad):
    """jask.mul checks a concrete JAX or NumPy scalar like a Python number; ``*`` follows jnp."""
    A = _rand((5, 7))
    a = jask.from_numpy(A)
    with pytest.raises(ValueError, match=r"mul: scalar factor .*(nan|inf).* is not finite"):
        jask.mul(a, bad)
    with pytest.raises(ValueError, match="is not finite"):
        jask.mul(bad, a)
    want = jnp.asarray(A) * bad
    out = np.asarray(a * bad)
    assert out.dtype == want.dtype
    np.testing.assert_array_equal(out, np.asarray(want))


def test_mul_non_finite_traced_scalar_propagates(small_tiles):
    """Under jit the scalar's value is unknown when the op is built: NaN flows through as in jnp."""
    A = _rand((5, 7))
    out = jax.jit(lambda a, s: jask.sum(a * s))(jask.from_numpy(A), jnp.float32(np.nan))
    assert np.isnan(float(out))


def test_mul_bad_operands(small_tiles):
    a = _arr((5, 7))
    with pytest.raises(ValueError, match=r"not by an array of shape \(3,\)"):
        jask.mul(a, jnp.ones(3))
    with pytest.raises(ValueError, match=r"multiply got incompatible shapes for broadcasting: \(5, 7\), \(3,\)"):
        a * jnp.ones(3)
    with pytest.raises(TypeError, match="cannot multiply a DiskArray by str"):
        jask.mul(a, "x")
    with pytest.raises(TypeError, match="multiply cannot take an operand of type str"):
        a * "x"
    with pytest.raises(TypeError, match="at least one DiskArray"):
        jask.mul(2.0, 3.0)


def test_unsupported_operators(small_tiles):
    a = _arr((5, 7))
    with pytest.raises(TypeError, match="ambiguous"):
        bool(a)
    with pytest.raises(TypeError, match="iterating"):
        iter(a)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(a)


@pytest.mark.parametrize("data", [np.array(["a", "b"]), np.array([object(), object()]),
                                  np.ones(3, np.complex64), np.array([b"x"])],
                         ids=["str", "object", "complex", "bytes"])
def test_from_numpy_unsupported_dtype(data):
    with pytest.raises(TypeError, match=f"dtype {re.escape(str(data.dtype))} is not supported"):
        jask.from_numpy(data)


def test_from_numpy_bad_chunks_and_diskarray(small_tiles):
    with pytest.raises(ValueError, match=r"chunks \(0, 2\) do not fit"):
        jask.from_numpy(np.ones((5, 7), np.float32), chunks=(0, 2))
    with pytest.raises(ValueError, match=r"chunks \(2,\) do not fit"):
        jask.from_numpy(np.ones((5, 7), np.float32), chunks=(2,))
    with pytest.raises(TypeError, match="already disk-backed"):
        jask.from_numpy(_arr((5, 7)))


# ---------------------------------------------------------------- stores

def test_from_zarr_missing_path(tmp_path):
    missing = tmp_path / "nope" / "arr.zarr"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        jask.from_zarr(missing)


def test_from_zarr_not_zarr(tmp_path):
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "data.txt").write_text("hello")
    with pytest.raises(ValueError, match="not a Zarr array"):
        jask.from_zarr(folder)
    f = tmp_path / "file.bin"
    f.write_bytes(b"x")
    with pytest.raises(ValueError, match="is a file"):
        jask.from_zarr(f)


@pytest.mark.parametrize("shape", [(0,), (0, 3), (4, 0)])
def test_from_zarr_zero_size_dimension(tmp_path, shape):
    p = tmp_path / "empty.zarr"
    zarr.create_array(p, shape=shape, dtype="float32", chunks=tuple(max(d, 1) for d in shape))
    with pytest.raises(ValueError, match=re.escape(f"shape {shape} has a zero-size dimension")):
        jask.from_zarr(p)


def test_from_zarr_group_is_not_an_array(tmp_path):
    p = tmp_path / "group.zarr"
    zarr.create_group(p)
    with pytest.raises(ValueError, match=f"cannot open {re.escape(str(p))} as a Zarr array.*group"):
        jask.from_zarr(p)


def test_from_zarr_unsupported_stored_dtype(tmp_path):
    p = tmp_path / "complex.zarr"
    zarr.create_array(p, shape=(3,), dtype="complex64", chunks=(3,))
    with pytest.raises(TypeError, match=r"from_zarr\(.*complex.zarr'\): dtype complex64 is not supported"):
        jask.from_zarr(p)


def test_from_zarr_v2_read_but_not_updated(small_tiles, tmp_path):
    """A Zarr v2 array is read; opening it for update_ is refused, since jask would rewrite it as v3."""
    A = _rand((5, 7))
    p = tmp_path / "v2.zarr"
    zarr.create_array(p, shape=A.shape, dtype=A.dtype, chunks=(4, 4), zarr_format=2)[...] = A
    np.testing.assert_array_equal(np.asarray(jask.from_zarr(p)), A)
    with pytest.raises(ValueError, match=f"{re.escape(str(p))} is a Zarr v2 array.*writes only v3"):
        jask.from_zarr(p, mode="r+")
    assert zarr.open_array(p, mode="r").metadata.zarr_format == 2


def test_from_zarr_corrupt_metadata(tmp_path):
    folder = tmp_path / "bad.zarr"
    folder.mkdir()
    (folder / "zarr.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot open"):
        jask.from_zarr(folder)


@pytest.mark.parametrize("value", ["my-tool-version-1", 3, ["a"], None])
def test_a_jask_attribute_that_is_not_jasks_is_left_alone(small_tiles, tmp_path, value):
    """Another tool's attribute named "jask" (not a dict) is not jask's marker: the array opens and reads as
    any other Zarr array (missing chunks are fill values), and update_ keeps that attribute."""
    p = tmp_path / "j.zarr"
    z = zarr.create_array(p, shape=(6,), chunks=(2,), dtype="f4", fill_value=7.0, attributes={"jask": value})
    z[:4] = np.arange(4, dtype="f4")
    x = jask.from_zarr(p, mode="r+")
    np.testing.assert_array_equal(np.asarray(x), [0, 1, 2, 3, 7, 7])
    x.update_(x * 2.0)
    np.testing.assert_array_equal(zarr.open_array(p, mode="r")[...], [0, 2, 4, 6, 14, 14])
    assert zarr.open_array(p, mode="r").attrs["jask"] == value


def test_from_zarr_bad_mode_and_type(tmp_path):
    p = tmp_path / "a.zarr"
    zarr.create_array(p, shape=(5, 7), dtype="float32", chunks=(4, 4))
    with pytest.raises(ValueError, match="mode must be 'r' or 'r\\+'"):
        jask.from_zarr(p, mode="w")
    with pytest.raises(TypeError, match="expects a path or a zarr.Array"):
        jask.from_zarr(42)


def _tree(root):
    """Every entry under ``root`` with its bytes (files) or None (folders): to show nothing was touched."""
    out = {}
    for folder, dirs, files in os.walk(root):
        out.update({os.path.relpath(os.path.join(folder, d), root): None for d in dirs})
        for f in files:
            with open(os.path.join(folder, f), "rb") as fh:
                out[os.path.relpath(os.path.join(folder, f), root)] = fh.read()
    return out


def test_to_zarr_refuses_to_replace_what_is_not_a_zarr_array(small_tiles, tmp_path):
    """overwrite=True replaces Zarr arrays only: a file, a plain folder, a Zarr group, a path under a file are refused
    before any tile is computed, and nothing on disk changes."""
    (tmp_path / "file.bin").write_bytes(b"mine")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("mine too")
    zarr.create_group(tmp_path / "group.zarr").create_array("a", shape=(2,), dtype="f4")
    before = _tree(tmp_path)
    x = jask.from_numpy(_rand((5, 7))) * 2.0
    cases = [("file.bin", FileExistsError, "is a file, not a Zarr array"),
             ("plain", FileExistsError, "holds no Zarr array"),
             ("group.zarr", FileExistsError, "is a Zarr group, not an array"),
             ("file.bin/x.zarr", NotADirectoryError, "file.bin is a file, not a folder")]
    with jask.profile() as prof:
        for name, err, text in cases:
            with pytest.raises(err, match=re.escape(text)) as info:
                jask.to_zarr(x, tmp_path / name, overwrite=True)
            assert str(tmp_path / name) in str(info.value)
    assert prof.tiles == 0 and prof.bytes_written == 0
    assert _tree(tmp_path) == before


def test_to_zarr_destination_errors_say_what_works(small_tiles, tmp_path, monkeypatch):
    """A file or a non-Zarr folder is refused without suggesting overwrite=True (which would be refused too);
    an empty folder is written into, with or without overwrite; an empty path is refused, not the cwd."""
    (tmp_path / "file.bin").write_bytes(b"mine")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("mine too")
    data = _rand((5, 7))
    x = jask.from_numpy(data)
    for name in ("file.bin", "plain"):
        for overwrite in (False, True):
            with pytest.raises(FileExistsError, match=re.escape(str(tmp_path / name))) as info:
                jask.to_zarr(x, tmp_path / name, overwrite=overwrite)
            assert "pass overwrite=True" not in str(info.value) and "choose another path" in str(info.value)
    for overwrite in (False, True):
        empty = tmp_path / f"empty-{overwrite}"
        empty.mkdir()
        jask.to_zarr(x, empty, overwrite=overwrite)
        np.testing.assert_array_equal(zarr.open_array(empty, mode="r")[...], data)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    for call in (lambda: jask.to_zarr(x, ""), lambda: jask.to_zarr(x, "", overwrite=True), lambda: jask.from_zarr("")):
        with pytest.raises(ValueError, match="the path is empty"):
            call()
    assert os.listdir(cwd) == [] and (tmp_path / "file.bin").read_bytes() == b"mine"


def test_chunks_and_compressors_are_taken_as_zarr_takes_them(small_tiles, tmp_path):
    """chunks=4 is 4 on every axis (to_zarr, rechunk, from_numpy, shards too), one codec is a list of one;
    a fractional chunk edge, a numcodecs codec or an unknown compressor is refused by name, before any work."""
    from zarr.codecs import ZstdCodec
    data = _rand((8, 12))
    x = jask.from_numpy(data, chunks=3)
    assert x._node.resolved().store.chunks == (3, 3)
    jask.to_zarr(x, tmp_path / "a.zarr", chunks=4, shards=8, compressors=ZstdCodec(level=3))
    z = zarr.open_array(tmp_path / "a.zarr", mode="r")
    assert (z.chunks, z.shards, z.compressors) == ((4, 4), (8, 8), (ZstdCodec(level=3),))
    np.testing.assert_array_equal(z[...], data)
    r = jask.rechunk(x, 5)
    assert r._node.resolved().store.chunks == (5, 5)
    np.testing.assert_array_equal(np.asarray(r), data)
    numcodecs = pytest.importorskip("numcodecs")
    cases = [(dict(chunks=(4.5, 4)), TypeError, r"chunks \(4\.5, 4\) must hold whole numbers: axis 0 has 4\.5"),
             (dict(chunks=True), TypeError, "chunks must be an int or a tuple of ints"),
             (dict(chunks=(4, 0)), ValueError, r"chunks \(4, 0\) do not fit an array of shape \(8, 12\)"),
             (dict(shards=2.0), TypeError, r"shards must be an int or a tuple of ints .*got 2\.0"),
             (dict(compressors=numcodecs.Zstd()), TypeError, r"numcodecs \(Zarr v2\) codec.*zarr\.codecs\.ZstdCodec"),
             (dict(compressors="zstdx"), TypeError, "to_zarr: compressors='zstdx' is not a Zarr v3 compressor")]
    with jask.profile() as prof:
        for kwargs, err, text in cases:
            with pytest.raises(err, match=text):
                jask.to_zarr(x * 2.0, tmp_path / "b.zarr", **kwargs)
        with pytest.raises(TypeError, match=r"rechunk: chunks \(2\.5, 1\) must hold whole numbers"):
            jask.rechunk(x, (2.5, 1))
    assert prof.tiles == 0 and sorted(os.listdir(tmp_path)) == ["a.zarr"]


def test_to_zarr_into_a_read_only_folder(small_tiles, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders: permissions cannot be tested as root")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with jask.profile() as prof:
            with pytest.raises(PermissionError, match=f"{re.escape(str(ro))} is not writable"):
                jask.to_zarr(jask.from_numpy(_rand((5, 7))) * 2.0, ro / "x.zarr")
        assert prof.tiles == 0 and os.listdir(ro) == []
    finally:
        ro.chmod(0o755)


def test_update_read_only_store(small_tiles, tmp_path):
    A = _rand((5, 7))
    p = tmp_path / "ro.zarr"
    jask.from_numpy(A).to_zarr(p)
    x = jask.from_zarr(p)
    with pytest.raises(ValueError, match="read-only"):
        x.update_(_arr((5, 7), 3))
    np.testing.assert_array_equal(np.asarray(x), A)
    np.testing.assert_array_equal(zarr.open_array(p, mode="r")[...], A)


def test_update_wrong_shape_or_dtype(small_tiles):
    A = _rand((5, 7))
    x = jask.from_numpy(A)
    with pytest.raises(ValueError, match=r"shape \(7, 5\).*shape \(5, 7\)"):
        x.update_(_arr((7, 5)))
    with pytest.raises(ValueError, match="dtype int32.*dtype float32"):
        x.update_(_arr((5, 7), dtype=np.int32))
    with pytest.raises(TypeError, match="expects a DiskArray"):
        x.update_(A)
    np.testing.assert_array_equal(np.asarray(x), A)


def test_update_inside_jit_refused(small_tiles):
    x = _arr((5, 7))
    with pytest.raises(TypeError, match="eagerly"):
        jax.jit(lambda x: jask.update_(x, x))(x)
    with pytest.raises(TypeError, match="update_ must be called eagerly"):    # the method form: an AttributeError
        jax.jit(lambda x: x.update_(x * 2.0))(x)
    with pytest.raises(TypeError, match="to_zarr cannot run inside jit"):
        jax.jit(lambda x: x.to_zarr("never.zarr"))(x)


def test_sinks_reject_non_diskarrays_and_tracers(small_tiles, tmp_path):
    with pytest.raises(TypeError, match="to_zarr expects a DiskArray"):
        jask.to_zarr(np.ones((5, 7)), tmp_path / "x.zarr")
    with pytest.raises(TypeError, match="materialize expects a DiskArray"):
        jask.materialize(np.ones((5, 7)))
    with pytest.raises(TypeError, match="inside jit"):
        jax.jit(lambda x: jask.to_zarr(x, tmp_path / "y.zarr"))(_arr((5, 7)))
    assert not (tmp_path / "y.zarr").exists()
    with pytest.raises(ValueError, match=r"chunks \(1,\) do not fit"):
        jask.to_zarr(_arr((5, 7)), tmp_path / "z.zarr", chunks=(1,))
    assert not (tmp_path / "z.zarr").exists()


def test_to_zarr_existing_path_without_overwrite(small_tiles, tmp_path):
    A, B = _rand((5, 7), 1), _rand((5, 7), 2)
    p = tmp_path / "out.zarr"
    jask.from_numpy(A).to_zarr(p)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(FileExistsError, match=re.escape(str(p))):
        jask.to_zarr(jask.from_numpy(B), p)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        jask.from_numpy(B).to_zarr(p)
    np.testing.assert_array_equal(zarr.open_array(p, mode="r")[...], A)
    assert sorted(os.listdir(tmp_path)) == before  # no leftover temporaries


def test_op_on_deleted_store(small_tiles):
    a, b = _arr((5, 7), 1), _arr((5, 7), 2)
    path = a.path
    shutil.rmtree(path)
    with pytest.raises(FileNotFoundError, match=re.escape(path)):
        jask.add(a, b)
    with pytest.raises(FileNotFoundError, match=re.escape(path)):
        jask.sum(a)
    with pytest.raises(FileNotFoundError, match=re.escape(path)):
        np.asarray(a)


def test_lazy_value_over_deleted_store(small_tiles):
    a, b = _arr((5, 7), 1), _arr((5, 7), 2)
    lazy = jask.square(a - b)
    path = a.path
    shutil.rmtree(path)
    with pytest.raises(FileNotFoundError, match=re.escape(path)):
        np.asarray(lazy)


def test_jit_on_deleted_store(small_tiles):
    a = _arr((5, 7), 1)
    path = a.path
    shutil.rmtree(path)
    with pytest.raises(Exception) as info:
        jax.jit(lambda x: jask.sum(jask.square(x)))(a)
    assert path in str(info.value) or any(path in n for n in getattr(info.value, "__notes__", []))


# ---------------------------------------------------------------- settings

def test_memory_budget_smaller_than_a_tile():
    # 3-D float32: even the smallest tile jask will use (edge 8) is 8*8*8*4 = 2048 bytes > 1000
    A, B = _rand((9, 10, 11), 1), _rand((9, 10, 11), 2)
    a, b = jask.from_numpy(A), jask.from_numpy(B)
    d = a - b  # consumed twice below, so it would be materialized to scratch first
    root = scratch.process_dir()
    before = _entries(root)
    jask.set_memory_budget(1000)
    with pytest.raises(ValueError, match=r"memory budget of 1000 bytes is too small"):
        jask.sum(jask.mul(d, d))
    with pytest.raises(ValueError, match="budget"):
        np.asarray(d)
    assert _entries(root) - before == set(), "a store was written before the budget was checked"
    # with a workable budget the same lazy values still compute
    jask.set_memory_budget("64MB")
    np.testing.assert_allclose(float(jask.sum(jask.mul(d, d))), float(np.sum((A - B) ** 2)), rtol=1e-4)


def test_memory_budget_with_forced_tile_too_big():
    a = _arr((40, 40))
    jask.config.update("tile", 32)  # one 32x32 float32 tile is 4096 bytes
    jask.set_memory_budget(1000)
    with pytest.raises(ValueError, match=r"memory budget of 1000 bytes.*tile edge 32"):
        jask.sum(a)


@pytest.mark.parametrize("value, exc, fragment", [
    ("lots", ValueError, "cannot parse memory size"),
    (-5, ValueError, "must be positive"),
    (0, ValueError, "must be positive"),
    (True, TypeError, "memory size must be"),
    (1.5, TypeError, "memory size must be"),
])
def test_bad_memory_budget(value, exc, fragment):
    before = config.memory_budget
    with pytest.raises(exc, match=fragment):
        jask.set_memory_budget(value)
    assert config.memory_budget == before


def test_bad_settings():
    with pytest.raises(ValueError, match="unknown jask setting 'nope'"):
        jask.config.update("nope", 1)
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="tile must be a positive int"):
            jask.config.update("tile", bad)
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        jask.config.update("backend", "cuda")
    assert config.tile is None


def test_every_setting_checks_its_value_naming_it():
    """Sizes, switches and options are checked when set, naming the setting (``memory_budget=None`` was taken
    and failed at the next op; ``fusion="no"`` was truthy, so fusion stayed on)."""
    before = dict(vars(config))
    cases = [("memory_budget", None, ValueError, "memory_budget cannot be None"),
             ("memory_budget", "lots", ValueError, "memory_budget: cannot parse memory size 'lots'"),
             ("device_budget", -1, ValueError, "device_budget: memory size must be positive"),
             ("program_cache", "x", ValueError, "program_cache: cannot parse"),
             ("fusion", "no", TypeError, "fusion must be True or False, got 'no'"),
             ("progress", 1, TypeError, "progress must be True or False"),
             ("allow_tmpfs", "yes", TypeError, "allow_tmpfs must be True or False"),
             ("scratch_storage_options", 3, TypeError, "scratch_storage_options must be a dict"),
             ("scratch_dir", 3, TypeError, "scratch_dir must be a folder path or store URL")]
    for name, value, error, says in cases:
        with pytest.raises(error, match=re.escape(says)):
            jask.config.update(name, value)
    assert dict(vars(config)) == before
    jask.config.update("device_budget", None)
    jask.config.update("memory_budget", "64MB")
    assert config.memory_budget == 64 * 10**6 and config.device_budget is None


def test_tile_setting_types():
    for bad in ("8", [8], 1e3):
        with pytest.raises(ValueError, match=re.escape(f"tile must be a positive int or None, got {bad!r}")):
            jask.config.update("tile", bad)
    assert config.tile is None


def _fake_gpu(monkeypatch):
    """Make the ``pallas`` backend believe it compiles for a GPU (Triton), without one."""
    from jask.kernels import pallas
    monkeypatch.setattr(pallas, "current_platform", lambda: "gpu")
    jask.config.update("backend", "pallas")


@pytest.mark.parametrize("sink", ["sum", "to_zarr", "numpy"])
def test_tile_the_backend_cannot_use(monkeypatch, tmp_path, sink):
    """A forced tile edge that is not a power of two is refused for Pallas on GPU before any tile is read."""
    a, b = _arr((9, 10), 1), _arr((9, 10), 2)
    d = a - b
    _fake_gpu(monkeypatch)
    jask.config.update("tile", 6)
    root = scratch.process_dir()
    before = _entries(root)
    run = {"sum": lambda: jask.sum(jask.square(d)), "to_zarr": lambda: d.to_zarr(tmp_path / "out.zarr"),
           "numpy": lambda: np.asarray(d)}[sink]
    with jask.profile() as prof:
        with pytest.raises(ValueError, match=r"tile 6 set with jask.config.update\('tile', \.\.\.\) is illegal "
                                             r"for Pallas on GPU.*power of two") as info:
            run()
        assert str(info.value).split(":")[0] in ("sub", "sub+square+sum"), "the error names the user's ops"
    assert prof.bytes_read == 0 and prof.tiles == 0
    assert _entries(root) - before == set(), "a store was written before the tile was checked"
    assert not (tmp_path / "out.zarr").exists()


def test_pallas_backend_without_accelerator(small_tiles):
    from jask.kernels import pallas
    if pallas.current_platform() in ("tpu", "gpu"):
        pytest.skip("this machine has an accelerator, so backend 'pallas' is legal here")
    a = _arr((5, 7))
    jask.config.update("backend", "pallas")
    with jask.profile() as prof:
        with pytest.raises(RuntimeError, match=r"compiles for TPU \(Mosaic\) or GPU \(Triton\).*'cpu'.*"
                                               r"pallas-interpret"):
            jask.sum(a)
    assert prof.bytes_read == 0


def _shm():
    if not os.path.isdir("/dev/shm"):
        pytest.skip("/dev/shm does not exist on this machine")
    fstype = scratch.filesystem_type("/dev/shm")
    if fstype not in ("tmpfs", "ramfs"):
        pytest.skip(f"/dev/shm is not RAM-backed here (filesystem type {fstype!r})")
    return fstype


def test_tmpfs_scratch_dir_refused():
    fstype = _shm()
    target = "/dev/shm/jask-test-scratch-never-created"
    before = (config.scratch_dir, config.memory_budget)
    with pytest.raises(jask.TmpfsScratchError, match=f"is on {fstype}.*JASK_SCRATCH_DIR.*scratch_dir=") as info:
        jask.set_memory_budget("256MB", scratch_dir=target)
    assert info.value.path == target and info.value.disks == scratch.real_disks()
    for mount, kind in info.value.disks:                     # the real disks it found are named
        assert f"{mount} ({kind})" in str(info.value)
    assert all(kind not in ("tmpfs", "ramfs", "proc") for _, kind in info.value.disks)
    with pytest.raises(ValueError, match="allow_tmpfs=True"):
        jask.config.update("scratch_dir", target)
    assert (config.scratch_dir, config.memory_budget) == before
    assert not os.path.exists(target)
    # explicitly allowed, it is accepted (nothing is created until an array is)
    jask.set_memory_budget("256MB", scratch_dir=target, allow_tmpfs=True)
    assert config.scratch_dir == target and config.allow_tmpfs
    assert not os.path.exists(target)


def test_scratch_dir_that_is_a_file_or_in_memory_is_refused_naming_the_setting(tmp_path, monkeypatch):
    """A scratch dir that is a file (or under one) is refused when set, naming the setting; from
    JASK_SCRATCH_DIR, at first use, naming that. A memory:// URL lives in RAM as tmpfs does: refused alike."""
    (tmp_path / "afile").write_text("x")
    before = (config.scratch_dir, config.memory_budget)
    for bad, where in ((tmp_path / "afile", "is a file"), (tmp_path / "afile" / "sub", "lies under")):
        with pytest.raises(NotADirectoryError, match=rf"set_memory_budget\(scratch_dir=...\): scratch dir .*{where}"):
            jask.set_memory_budget("64MB", scratch_dir=bad)
        with pytest.raises(NotADirectoryError, match=r"jask.config.update\('scratch_dir', ...\)"):
            jask.config.update("scratch_dir", str(bad))
    assert (config.scratch_dir, config.memory_budget) == before
    monkeypatch.setenv("JASK_SCRATCH_DIR", str(tmp_path / "afile"))
    config.scratch_dir = str(tmp_path / "afile")           # as read from the environment at import
    with pytest.raises(NotADirectoryError, match="JASK_SCRATCH_DIR: scratch dir .* is a file"):
        jask.from_numpy(np.ones(3, np.float32))
    config.scratch_dir = before[0]
    with pytest.raises(jask.TmpfsScratchError, match="memory:// URL, which lives in this process's RAM"):
        jask.set_memory_budget("64MB", scratch_dir="memory://jask-test-ram")
    with pytest.raises(jask.TmpfsScratchError, match="allow_tmpfs=True"):
        jask.config.update("scratch_dir", "memory://jask-test-ram")
    assert (config.scratch_dir, config.memory_budget) == before
    assert (tmp_path / "afile").read_text() == "x"


def test_materialize_over_the_budget_is_refused_unless_allowed(small_tiles):
    jask.set_memory_budget("64KB")
    a = np.arange(160 * 120, dtype=np.float32).reshape(160, 120)       # 75 KiB
    x = jask.from_numpy(a) * 2.0
    with jask.profile() as prof:
        with pytest.raises(jask.OverBudgetError, match=r"shape \(160, 120\) takes 75.00 KiB, more than the "
                           r"memory budget of 62.50 KiB; pass materialize\(x, allow_over_budget=True\)") as info:
            jask.materialize(x)
        with pytest.raises(jask.OverBudgetError):
            jax.jit(jask.materialize)(x)
    assert (info.value.nbytes, info.value.budget) == (a.nbytes, 64000)
    assert prof.tiles == 0 and prof.bytes_read == 0                      # refused before any work
    np.testing.assert_array_equal(np.asarray(jask.materialize(x, allow_over_budget=True)), 2 * a)
    np.testing.assert_array_equal(np.asarray(jask.materialize(x[:80])), 2 * a[:80])   # within: as before


def test_filesystem_type():
    if not os.path.exists("/proc/mounts"):
        pytest.skip("no /proc/mounts on this system")
    assert scratch.filesystem_type("/proc") == "proc"
    assert isinstance(scratch.filesystem_type(os.getcwd()), str)
    assert scratch.filesystem_type("/") != ""


# ---------------------------------------------------------------- transformations jask does not support

def test_second_order_grad(small_tiles):
    a = _arr((5, 7))
    f = lambda a: jask.sum(jask.square(a))
    with pytest.raises(NotImplementedError, match="second-order"):
        jax.grad(lambda a: jask.sum(jax.grad(f)(a)))(a)


def test_second_order_grad_of_scalar_mul(small_tiles):
    a = _arr((5, 7))
    f = lambda a, s: jask.sum(a * s)
    with pytest.raises(NotImplementedError, match="second-order"):
        jax.grad(lambda s: jask.sum(jax.grad(f)(a, s)))(jnp.float32(2.0))


def test_forward_mode(small_tiles):
    a = _arr((5, 7))
    with pytest.raises(NotImplementedError, match=r"forward-mode.*use jax.grad"):
        jax.jvp(lambda a: jask.sum(jask.square(a)), (a,), (a,))


def test_hessian_not_implemented(small_tiles):
    a = _arr((5, 7))
    with pytest.raises(NotImplementedError, match="use jax.grad"):
        jax.hessian(lambda a: jask.sum(jask.square(a)))(a)
    with pytest.raises(NotImplementedError, match="use jax.grad"):
        jax.jacfwd(lambda a: jask.sum(jask.square(a)))(a)


def test_vmap(small_tiles):
    a = _arr((5, 7))
    with pytest.raises(NotImplementedError, match="vmap over DiskArrays is not supported"):
        jax.vmap(jask.square)(a)
    with pytest.raises(NotImplementedError, match="jax.vmap of jask.mul"):
        jax.vmap(lambda s: jask.sum(a * s))(jnp.arange(3.0))
    with pytest.raises(NotImplementedError, match="jax.vmap of jask.add"):
        jax.vmap(lambda s: jask.sum(a + a) * s)(jnp.arange(3.0))


def test_jacrev_not_implemented(small_tiles):
    a = _arr((5, 7))
    with pytest.raises(NotImplementedError, match="vmap"):
        jax.jacrev(lambda a: jask.sum(jask.square(a)))(a)


def test_numpy_conversion_inside_jit_refused(small_tiles):
    def f(x):
        with pytest.raises(TypeError):
            np.asarray(x)
        return jask.sum(x)

    A = _rand((5, 7))
    out = jax.jit(f)(jask.from_numpy(A))
    np.testing.assert_allclose(float(out), float(A.sum()), rtol=1e-5, atol=1e-5)


def test_grad_of_materialize_under_jit(small_tiles):
    A = _rand((5, 7))
    a = jask.from_numpy(A)
    f = lambda a: jnp.sum(jask.materialize(a) ** 2)
    np.testing.assert_allclose(np.asarray(jax.grad(f)(a)), 2 * A, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(f))(a)), 2 * A, rtol=1e-5)


def test_messages_name_the_call_the_user_made(small_tiles):
    """update_(resume=True) at a URL named to_zarr; softmax's where= named log_softmax; explain showed a URL
    scratch dir as a local path."""
    jask.to_zarr(_arr((5, 7)), "memory://names/a.zarr")
    u = jask.from_zarr("memory://names/a.zarr", mode="r+")
    with pytest.raises(ValueError, match=r"^update_: resume=True works for local folders only"):
        u.update_(u * 2.0, resume=True)
    with pytest.raises(NotImplementedError, match=r"^jask.nn.softmax: where= is not supported"):
        jask.nn.softmax(u, where=u > 0)
    jask.set_memory_budget(config.memory_budget, scratch_dir="memory://names-scratch", allow_tmpfs=True)
    assert "\n  scratch memory://names-scratch (" in jask.explain(u * 2.0)
