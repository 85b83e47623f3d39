"""DiskArray's operators and methods, as jnp's, installed on the hi-type from the layer that has them.

``x + y``, ``x @ y``, ``x.sum()``, ``np.asarray(x)``, ``x.to_zarr(...)``: each is
an op or a sink, which sit above :mod:`jask.hijax.array`, so they are set on
:class:`DiskArray` (concrete arrays) and :class:`DiskArrayType` (traced ones:
a tracer forwards ``x + y`` to ``aval._add(x, y)``) here, once, at import, the
way JAX sets its own array methods. Operators follow ``jask.numpy``
(broadcasting, promotion); ``==`` is elementwise, so hashing stays by identity.
"""
from __future__ import annotations

from jask import numpy as jnp_disk
from jask.api.sinks import persist, to_numpy, to_zarr, update_
from jask.hijax import compat
from jask.hijax.array import DiskArray, DiskArrayType
from jask.hijax.grad import CotangentSum
from jask.hijax.make_op import make_op
from jask.linalg.transpose import transpose

BINARY = {"add": "add", "sub": "subtract", "mul": "multiply", "truediv": "true_divide",
          "floordiv": "floor_divide", "mod": "remainder", "pow": "power", "eq": "equal", "ne": "not_equal",
          "lt": "less", "le": "less_equal", "gt": "greater", "ge": "greater_equal", "and": "bitwise_and",
          "or": "bitwise_or", "xor": "bitwise_xor", "lshift": "left_shift", "rshift": "right_shift"}
REFLECTED = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift", "rshift")
UNARY = {"neg": "negative", "pos": "positive", "abs": "abs", "invert": "invert"}
METHODS = ("sum", "mean", "max", "min", "prod", "var", "std", "argmax", "argmin", "astype", "any", "all", "clip",
           "round", "ravel")
# traced_scalar <op> x under jit/grad reaches x's _r<op>
DEFERRED = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift", "rshift")
COMPARISONS = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


def _method(fn):
    """``fn`` as a method (a callable object, as some ops are, would not bind ``self``)."""
    return lambda self, *args, **kwargs: fn(self, *args, **kwargs)


def _reflected(fn):
    return lambda self, other: fn(other, self)


def jnp_refusal(name: str) -> TypeError:
    """The error for a DiskArray handed to a ``jax.numpy`` function, naming the jask way to do it."""
    ours = f"Use jask.numpy.{name}, or run" if name in vars(jnp_disk) else "Run"
    return TypeError(
        f"jax.numpy.{name} cannot take a DiskArray: jax.numpy has no hook to hand it to jask, and converting it "
        f"would read the whole array into memory. {ours} the jnp code through jask.on_disk(fn) (for optax: "
        "jask.optim.on_disk(optax.adam(...)) and jask.optim.apply_updates); "
        "np.asarray(x) or jask.materialize(x) read a small array into memory on purpose")


# the jnp and lax functions that convert an argument to an array (where a DiskArray must be refused)
JNP_CONVERSIONS = ("_arraylike", "_arraylike_asarray", "_check_jax_array_protocol", "_convert_element_type")


def _refuse_jnp(tracer):
    raise jnp_refusal(compat.jnp_function_name())


def _jax_array_probe(aval):
    """A traced DiskArray's ``__jax_array__``, read by jnp functions' arraylike check: a conversion that refuses.

    A jax array's operators read it too (``jnp.float32(3) * x`` asks whether to
    convert ``x``); for them there is none, so Python reaches DiskArray's reflected operator.
    """
    return compat.aval_method(_refuse_jnp) if compat.called_by_jax(JNP_CONVERSIONS) else None


def _flatten(self, order="C"):
    """``x.flatten()``: as ``x.ravel()`` (arrays are immutable, so no copy is needed)."""
    return jnp_disk.ravel(self, order)


def _matrix_transpose(self):
    """``x.mT``: the last two axes swapped, as on jax arrays."""
    if self.ndim < 2:
        raise ValueError(f"x.mT needs an array of at least 2 dimensions, got shape {self.shape}")
    return jnp_disk.swapaxes(self, -1, -2)


def _itemsize(self):
    return self.dtype.itemsize


def _no_attribute(self, name):
    """An unknown attribute: say that DiskArrays do not support it, not a bare AttributeError.

    A property that raised AttributeError lands here too (``sharding``'s refusal naming the
    transform): raise its own error again, not this one."""
    attr = next((vars(k)[name] for k in type(self).__mro__ if name in vars(k)), None)
    if isinstance(attr, property):
        return attr.fget(self)
    if name.startswith("_"):
        raise AttributeError(f"'DiskArray' object has no attribute {name!r}")
    raise AttributeError(f"DiskArray.{name} is not supported on DiskArrays (they have the operators, jask.numpy's "
                         "functions and the methods sum mean max min prod var std argmax argmin any all astype "
                         "clip round reshape transpose squeeze ravel flatten, T mT itemsize); use "
                         f"jask.numpy functions, or np.asarray(x) for a small array in memory")


def _sharding(self):
    """No sharding. ``lax.full_like`` (behind ``jnp.zeros_like``) reads it to build the array in memory: refused."""
    if compat.jax_caller() == "full_like":
        raise jnp_refusal(compat.jnp_function_name("zeros_like"))
    raise AttributeError("a DiskArray has no sharding")


_sum_cotangents = make_op(CotangentSum, name="add")
_AVAL_SHARDING = DiskArrayType.sharding   # the hi-type's refusal (vmap, jacfwd, device placement)


def _traced_sharding(aval):
    """The same refusal under ``jit``, naming the jnp function when it is ``jnp.zeros_like`` and kin."""
    if compat.jax_caller() == "full_like":
        raise jnp_refusal(compat.jnp_function_name("zeros_like"))
    return _AVAL_SHARDING.fget(aval)


def _array(self, dtype=None, copy=None):
    if compat.jax_caller() is not None:    # jnp.asarray(x), optax.apply_updates: would read x whole, silently
        raise jnp_refusal(compat.jnp_function_name("asarray"))
    out = to_numpy(self)
    return out if dtype is None else out.astype(dtype)


def _to_zarr(self, path, overwrite: bool = False, chunks=None, compressors=None, shards=None,
             resume: bool = False) -> None:
    """Write this array to a new Zarr v3 store at ``path`` (atomic: complete or absent)."""
    to_zarr(self, path, overwrite=overwrite, chunks=chunks, compressors=compressors, shards=shards, resume=resume)


def _update(self, new_value, resume: bool = False) -> DiskArray:
    """Overwrite this array with ``new_value`` (same shape and dtype), atomically."""
    update_(self, new_value, resume=resume)
    return self


def _persist(self, resume: bool = False) -> DiskArray:
    """Compute now into scratch storage; returns the stored array (see :func:`jask.persist`)."""
    return persist(self, resume=resume)


def install() -> None:
    """Set the operators and methods on DiskArray and DiskArrayType (idempotent)."""
    for short, name in BINARY.items():
        fn = getattr(jnp_disk, name)
        setattr(DiskArray, f"__{short}__", _method(fn))
        setattr(DiskArrayType, f"_{short}", staticmethod(_method(fn)))
        if short in REFLECTED:
            setattr(DiskArray, f"__r{short}__", _reflected(fn))
            setattr(DiskArrayType, f"_r{short}", staticmethod(_reflected(fn)))
    for short, name in UNARY.items():
        fn = getattr(jnp_disk, name)
        setattr(DiskArray, f"__{short}__", _method(fn))
        setattr(DiskArrayType, f"_{short}", staticmethod(_method(fn)))
    matmul = jnp_disk.matmul   # jnp's promotion; in-memory NumPy/JAX operands on either side
    DiskArray.__matmul__, DiskArray.__rmatmul__ = _method(matmul), _reflected(matmul)
    DiskArrayType._matmul, DiskArrayType._rmatmul = staticmethod(_method(matmul)), staticmethod(_reflected(matmul))
    DiskArray.__getitem__ = _method(jnp_disk._getitem)
    DiskArrayType._getitem = staticmethod(_method(jnp_disk._getitem))
    DiskArray.__array_ufunc__ = None   # NumPy operands defer to our reflected operators instead of reading us whole
    for name, fn in (("reshape", jnp_disk._reshape_method), ("transpose", jnp_disk._transpose_method),
                     ("squeeze", jnp_disk.squeeze)):
        setattr(DiskArray, name, _method(fn))
        setattr(DiskArrayType, name, compat.aval_method(_method(fn)))
    DiskArray.T = property(_method(transpose))
    DiskArrayType.T = compat.aval_property(_method(transpose))
    DiskArray.mT = property(_matrix_transpose)
    DiskArrayType.mT = compat.aval_property(_matrix_transpose)
    DiskArray.itemsize = property(_itemsize)
    DiskArrayType.itemsize = compat.aval_property(_itemsize)
    DiskArray.flatten = _flatten
    DiskArrayType.flatten = compat.aval_method(_flatten)
    DiskArray.__getattr__ = DiskArrayType.__getattr__ = _no_attribute   # a traced array asks its type
    for name in METHODS:
        fn = getattr(jnp_disk, name)
        setattr(DiskArray, name, _method(fn))
        setattr(DiskArrayType, name, compat.aval_method(_method(fn)))
    DiskArray.__array__ = _array
    DiskArray.sharding = property(_sharding)
    DiskArrayType.sharding = property(_traced_sharding)
    DiskArrayType.__jax_array__ = property(_jax_array_probe)
    for name in ("real", "conj", "conjugate"):   # jask stores no complex dtypes: the array itself
        setattr(DiskArray, name, property(lambda self: self) if name == "real" else (lambda self: self))
    DiskArray.imag = property(jnp_disk.zeros_like)
    DiskArray.to_zarr = _to_zarr
    DiskArray.update_ = _update
    DiskArray.persist = _persist
    for name, fn in (("to_zarr", _to_zarr), ("update_", _update), ("persist", _persist)):
        setattr(DiskArrayType, name, compat.aval_method(fn))   # traced: the calls' own "not inside jit" errors
    DiskArrayType.vspace_add = lambda self, x, y: _sum_cotangents(x, y)   # two tangents of one value
    for name in DEFERRED:
        compat.defer_reflected_operator(DiskArrayType, name)
    for name, mirror in COMPARISONS.items():   # traced_scalar < x is x > traced_scalar
        compat.defer_reflected_operator(DiskArrayType, name, f"_{mirror}")


install()
