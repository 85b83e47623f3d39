"""``DiskArray``: a Zarr-backed array that JAX treats as a value of its own type.

``DiskArrayType`` is a hijax type holding only static facts (shape, dtype); its
lowered value is one int32 handle into :data:`jask.base.graph.handles`. So
``jit`` compiles once per shape and dtype whatever store backs an array, and a
compiled program never holds a tensor of the array's shape.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jask.base import compat
from jask.base.graph import Node, OpNode, StoredNode, ZerosNode, handles
from jask.exec.devices import host_handle_device


class UnsupportedTransform(NotImplementedError, AttributeError):
    """A JAX transformation DiskArrays do not support (vmap, jacfwd, hessian, device placement)."""


@dataclasses.dataclass(frozen=True)
class DiskArrayType(compat.HiType):
    """The JAX type of a DiskArray: shape and dtype, nothing that names a store."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def str_short(self, short_dtypes=False, **_):
        return f"DiskArray{{{self.dtype.name}{list(self.shape)}}}"

    # lowering: one int32 handle
    def lo_ty(self):
        return [compat.ShapedArray((), np.int32)]

    def lower_val(self, x):
        if x._node is None:
            return [x._handle]
        h = np.int32(handles.handle_of(x._node, pin=True))
        where = host_handle_device()
        return [h if where is None else jax.device_put(h, where)]

    def raise_val(self, h):
        if compat.is_traced(h):
            return DiskArray(aval=self, handle=h)
        return DiskArray(node=handles.lookup(h))

    # autodiff: a DiskArray's tangent is a DiskArray of the same type
    def to_tangent_aval(self):
        return self

    def vspace_zero(self):
        return DiskArray(node=zeros_node(self.shape, self.dtype))

    def vspace_add(self, x, y):
        from jask.linalg.add import add
        return add(x, y)

    @property
    def sharding(self):
        # An AttributeError too, so JAX's own ``hasattr(aval, "sharding")`` probes still see "no sharding".
        raise UnsupportedTransform("vmap over DiskArrays is not supported, nor are jax.jacfwd, jax.hessian "
                                  "or device placement of a DiskArray: use jax.grad (and batched jask.dot "
                                  "instead of vmap)")

    def dec_rank(self, size, spec):
        raise NotImplementedError("jax.vmap over DiskArrays is not supported; loop, or use batched jask.dot")

    inc_rank = dec_rank

    def leading_axis_spec(self):
        raise NotImplementedError("scanning over the leading axis of a DiskArray is not supported")

    # operators on traced DiskArrays (tracers forward ``x + y`` to ``aval._add(x, y)``), as jnp's
    _add = staticmethod(lambda x, y: _np("add", x, y))
    _radd = staticmethod(lambda x, y: _np("add", y, x))
    _sub = staticmethod(lambda x, y: _np("subtract", x, y))
    _rsub = staticmethod(lambda x, y: _np("subtract", y, x))
    _mul = staticmethod(lambda x, y: _np("multiply", x, y))
    _rmul = staticmethod(lambda x, y: _np("multiply", y, x))
    _truediv = staticmethod(lambda x, y: _np("true_divide", x, y))
    _rtruediv = staticmethod(lambda x, y: _np("true_divide", y, x))
    _floordiv = staticmethod(lambda x, y: _np("floor_divide", x, y))
    _rfloordiv = staticmethod(lambda x, y: _np("floor_divide", y, x))
    _mod = staticmethod(lambda x, y: _np("remainder", x, y))
    _pow = staticmethod(lambda x, y: _np("power", x, y))
    _rpow = staticmethod(lambda x, y: _np("power", y, x))
    _eq = staticmethod(lambda x, y: _np("equal", x, y))
    _ne = staticmethod(lambda x, y: _np("not_equal", x, y))
    _lt = staticmethod(lambda x, y: _np("less", x, y))
    _le = staticmethod(lambda x, y: _np("less_equal", x, y))
    _gt = staticmethod(lambda x, y: _np("greater", x, y))
    _ge = staticmethod(lambda x, y: _np("greater_equal", x, y))
    _neg = staticmethod(lambda x: _np("negative", x))
    _pos = staticmethod(lambda x: _np("positive", x))
    _abs = staticmethod(lambda x: _np("abs", x))
    _matmul = staticmethod(lambda x, y: _np("matmul", x, y))
    _rmatmul = staticmethod(lambda x, y: _np("matmul", y, x))
    _getitem = staticmethod(lambda x, key: _np("_getitem", x, key))
    T = compat.aval_property(lambda x: _transpose(x))
    reshape = compat.aval_method(lambda x, *shape, **k: _np("_reshape_method", x, *shape, **k))
    transpose = compat.aval_method(lambda x, *axes: _np("_transpose_method", x, *axes))
    squeeze = compat.aval_method(lambda x, *a, **k: _np("squeeze", x, *a, **k))
    sum = compat.aval_method(lambda x, *a, **k: _np("sum", x, *a, **k))
    mean = compat.aval_method(lambda x, *a, **k: _np("mean", x, *a, **k))
    max = compat.aval_method(lambda x, *a, **k: _np("max", x, *a, **k))
    min = compat.aval_method(lambda x, *a, **k: _np("min", x, *a, **k))
    prod = compat.aval_method(lambda x, *a, **k: _np("prod", x, *a, **k))
    var = compat.aval_method(lambda x, *a, **k: _np("var", x, *a, **k))
    std = compat.aval_method(lambda x, *a, **k: _np("std", x, *a, **k))
    argmax = compat.aval_method(lambda x, *a, **k: _np("argmax", x, *a, **k))
    argmin = compat.aval_method(lambda x, *a, **k: _np("argmin", x, *a, **k))
    astype = compat.aval_method(lambda x, dtype: _np("astype", x, dtype))


def _np(name, *args, **kwargs):
    """The ``jask.numpy`` function ``name``: operators and methods follow jnp (broadcasting, promotion)."""
    import jask.numpy
    return getattr(jask.numpy, name)(*args, **kwargs)


def _transpose(x):
    import jask
    return jask.transpose(x)


_zeros: dict = {}


def zeros_node(shape, dtype) -> ZerosNode:
    """The shared all-zero node of this shape and dtype (kept forever: it owns no storage)."""
    key = (tuple(shape), np.dtype(dtype))
    if key not in _zeros:
        _zeros[key] = ZerosNode(*key)
        handles.handle_of(_zeros[key])
    return _zeros[key]


def is_disk_array(x) -> bool:
    """True for a DiskArray or a tracer whose type is a DiskArray type."""
    if isinstance(x, DiskArray):
        return True
    return compat.is_traced(x) and isinstance(getattr(x, "aval", None), DiskArrayType)


def type_of(x) -> DiskArrayType:
    return x.aval if compat.is_traced(x) else x._aval


class DiskArray:
    """An array stored in Zarr, usable as a JAX value (``jit``, ``grad``).

    Values are immutable: ops return new arrays (computed lazily, at a sink).
    :meth:`update_` is the one in-place operation and commits atomically.
    """

    __slots__ = ("_aval", "_node", "_handle", "__weakref__")

    def __init__(self, node: Node | None = None, *, aval: DiskArrayType | None = None, handle=None):
        if node is not None:
            aval = DiskArrayType(node.shape, node.dtype)
        self._aval = aval
        self._node = node
        self._handle = handle

    # static facts
    shape = property(lambda self: self._aval.shape)
    dtype = property(lambda self: self._aval.dtype)
    ndim = property(lambda self: self._aval.ndim)
    size = property(lambda self: self._aval.size)
    nbytes = property(lambda self: self._aval.size * self._aval.dtype.itemsize)
    aval = property(lambda self: self._aval)

    @property
    def chunks(self) -> tuple[int, ...]:
        """Chunk shape of the backing store (for a lazy array: the chunks it will be written with)."""
        node = self._concrete().resolved()
        if isinstance(node, StoredNode):
            return node.store.chunks
        from jask.base.executor import block_shape, default_tile
        return block_shape(self.shape, default_tile(self.shape, self.dtype.itemsize))

    @property
    def path(self) -> str | None:
        """Folder of the backing Zarr store, or None while the array is still lazy."""
        node = self._concrete().resolved()
        return node.store.path if isinstance(node, StoredNode) else None

    def _concrete(self) -> Node:
        if self._node is None:
            raise TypeError("this DiskArray is traced (inside jit/grad); its storage is not accessible here")
        return self._node

    def __repr__(self):
        if self._node is None:
            return f"DiskArray(shape={self.shape}, dtype={self.dtype.name}, traced)"
        node = self._node.resolved()
        if isinstance(node, StoredNode):
            where = f"store={node.store.path!r}"
        elif isinstance(node, OpNode):
            where = f"lazy={node.spec.name}"
        else:
            where = "zeros"
        return f"DiskArray(shape={self.shape}, dtype={self.dtype.name}, chunks={self.chunks}, {where})"

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d DiskArray")
        return self.shape[0]

    # operators and methods, as jnp's; ``==`` is elementwise, so hashing stays by identity
    __add__ = lambda self, o: _np("add", self, o)
    __radd__ = lambda self, o: _np("add", o, self)
    __sub__ = lambda self, o: _np("subtract", self, o)
    __rsub__ = lambda self, o: _np("subtract", o, self)
    __mul__ = lambda self, o: _np("multiply", self, o)
    __rmul__ = lambda self, o: _np("multiply", o, self)
    __truediv__ = lambda self, o: _np("true_divide", self, o)
    __rtruediv__ = lambda self, o: _np("true_divide", o, self)
    __floordiv__ = lambda self, o: _np("floor_divide", self, o)
    __rfloordiv__ = lambda self, o: _np("floor_divide", o, self)
    __mod__ = lambda self, o: _np("remainder", self, o)
    __pow__ = lambda self, o: _np("power", self, o)
    __rpow__ = lambda self, o: _np("power", o, self)
    __eq__ = lambda self, o: _np("equal", self, o)
    __ne__ = lambda self, o: _np("not_equal", self, o)
    __lt__ = lambda self, o: _np("less", self, o)
    __le__ = lambda self, o: _np("less_equal", self, o)
    __gt__ = lambda self, o: _np("greater", self, o)
    __ge__ = lambda self, o: _np("greater_equal", self, o)
    __hash__ = object.__hash__
    __neg__ = lambda self: _np("negative", self)
    __pos__ = lambda self: _np("positive", self)
    __abs__ = lambda self: _np("abs", self)
    __matmul__ = lambda self, o: _np("matmul", self, o)
    __rmatmul__ = lambda self, o: _np("matmul", o, self)
    __getitem__ = lambda self, key: _np("_getitem", self, key)
    __array_ufunc__ = None   # NumPy operands defer to our reflected operators instead of reading us whole
    T = property(lambda self: _transpose(self))
    reshape = lambda self, *shape, **k: _np("_reshape_method", self, *shape, **k)
    transpose = lambda self, *axes: _np("_transpose_method", self, *axes)
    squeeze = lambda self, *a, **k: _np("squeeze", self, *a, **k)
    sum = lambda self, *a, **k: _np("sum", self, *a, **k)
    mean = lambda self, *a, **k: _np("mean", self, *a, **k)
    max = lambda self, *a, **k: _np("max", self, *a, **k)
    min = lambda self, *a, **k: _np("min", self, *a, **k)
    prod = lambda self, *a, **k: _np("prod", self, *a, **k)
    var = lambda self, *a, **k: _np("var", self, *a, **k)
    std = lambda self, *a, **k: _np("std", self, *a, **k)
    argmax = lambda self, *a, **k: _np("argmax", self, *a, **k)
    argmin = lambda self, *a, **k: _np("argmin", self, *a, **k)
    astype = lambda self, dtype: _np("astype", self, dtype)

    def __array__(self, dtype=None, copy=None):
        from jask.sinks import to_numpy
        out = to_numpy(self)
        return out if dtype is None else out.astype(dtype)

    def to_zarr(self, path, overwrite: bool = False, chunks=None, compressors=None, shards=None) -> None:
        """Write this array to a new Zarr v3 store at ``path`` (atomic: complete or absent)."""
        from jask.sinks import to_zarr
        to_zarr(self, path, overwrite=overwrite, chunks=chunks, compressors=compressors, shards=shards)

    def update_(self, new_value) -> "DiskArray":
        """Overwrite this array with ``new_value`` (same shape and dtype), atomically."""
        from jask.sinks import update_
        update_(self, new_value)
        return self

    def persist(self) -> "DiskArray":
        """Compute now into scratch storage; returns the stored array (see :func:`jask.persist`)."""
        from jask.sinks import persist
        return persist(self)

    def __bool__(self):
        raise TypeError("the truth value of a DiskArray is ambiguous; materialize it first")

    def __iter__(self):
        raise TypeError("iterating over a DiskArray would read it tile by tile into memory; "
                        "use jask.materialize for small arrays")

    def __reduce__(self):
        raise TypeError("DiskArrays cannot be pickled; save with to_zarr and reopen with jask.from_zarr")


compat.register_hitype(DiskArray, lambda x: x._aval)
for _name in ("add", "sub", "mul", "truediv", "pow"):  # traced_scalar <op> x under jit/grad reaches x's _r<op>
    compat.defer_reflected_operator(DiskArrayType, _name)
