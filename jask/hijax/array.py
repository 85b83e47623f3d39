"""``DiskArray``: a Zarr-backed array that JAX treats as a value of its own type.

``DiskArrayType`` is a hijax type holding only static facts (shape, dtype); its
lowered value is one int32 handle into :data:`jask.graph.nodes.handles`. So
``jit`` compiles once per shape and dtype whatever store backs an array, and a
compiled program never holds a tensor of the array's shape.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jask.exec.devices import host_handle_device
from jask.graph.nodes import Node, OpNode, StoredNode, ZerosNode, handles
from jask.graph.tiling import block_shape
from jask.hijax import compat
from jask.plan.tiling import default_tile


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

    # scan/fori_loop/cond carries: no shard_map manual axes
    mat = compat.NO_MANUAL_AXES

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
        raise NotImplementedError(
            "a DiskArray cannot be split or stacked along a leading axis by jax.lax.scan: neither scanned over "
            "as xs (loop over row ranges, x[i:j], or jask.batches, in a Python loop) nor stacked per iteration, "
            "which jax.grad through a scan/fori_loop/while_loop carrying a DiskArray needs for its residuals "
            "(take the gradient inside the loop body, as an SGD loop does, or loop in Python with update_). "
            "Carrying DiskArrays through a loop without differentiating the loop works")


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

    def __bool__(self):
        raise TypeError("the truth value of a DiskArray is ambiguous; materialize it first")

    def __iter__(self):
        raise TypeError("iterating over a DiskArray would read it tile by tile into memory; "
                        "use jask.materialize for small arrays")

    def __reduce__(self):
        raise TypeError("DiskArrays cannot be pickled; save with to_zarr and reopen with jask.from_zarr")

    def __copy__(self) -> DiskArray:
        """Another array with this value, sharing its storage (as copying a jax.Array is cheap).

        Values are immutable and ``update_`` rebinds only its target (readers of
        the old value keep it), so the copy keeps today's value whatever happens
        to this array later: a snapshot, without writing anything.
        """
        return DiskArray(self._node, aval=self._aval, handle=self._handle)

    def __deepcopy__(self, memo) -> DiskArray:
        return self.__copy__()


compat.register_hitype(DiskArray, lambda x: x._aval)
# Operators, methods (``x + y``, ``x.sum()``, ``np.asarray(x)``) and the tangent sum ``vspace_add`` are ops
# and sinks, layers above this one: jask.api.methods installs them on DiskArray and DiskArrayType.
