"""The lazy tile graph: nodes that say how to compute an array, tile by tile.

Ops never compute when called; they add an :class:`OpNode`. A sink
(``materialize``, ``to_zarr``, ``update_``, a scalar result such as ``sum``)
hands its node to :mod:`jask.exec.driver`, which plans and runs the graph.
Once an ``OpNode`` is computed it keeps only its stored result and lets go of
its inputs, so upstream scratch stores can be freed.
"""
from __future__ import annotations

import dataclasses
import itertools
import threading
import weakref
from typing import Any

import numpy as np


class Node:
    """Base of all graph nodes: an array's static facts."""

    shape: tuple[int, ...]
    dtype: np.dtype
    handle: int | None = None

    def __init__(self, shape, dtype):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def resolved(self) -> "Node":
        """The node to read from: a computed OpNode stands for its stored result."""
        return self


class StoredNode(Node):
    """An array that exists on disk."""

    def __init__(self, store):
        super().__init__(store.shape, store.dtype)
        self.store = store


class ScalarNode(Node):
    """A scalar operand (e.g. the traced factor of ``a * s``); every tile of it is the value."""

    def __init__(self, value):
        value = np.asarray(value)
        super().__init__((), value.dtype)
        self.value = value


class ZerosNode(Node):
    """An all-zero array that needs no storage (the zero gradient)."""


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """What to build an op from: its class and the keyword arguments for ``from_inputs``.

    Hashable and value-equal, so it can sit in hijax primitive params and in the
    io_callback host functions without forcing recompiles.
    """

    cls: type
    kwargs: tuple[tuple[str, Any], ...] = dataclasses.field(default=(), compare=False)
    name: str = dataclasses.field(default="", compare=False)
    # what equality and the hash go by: the kwargs, with floats by their bits (0.0 == -0.0 in Python, yet
    # 1 / (x * -0.0) is -inf: one spec for both gave the first's result to the second)
    identity: tuple = dataclasses.field(default=(), repr=False)

    def __post_init__(self):
        if not self.name:
            object.__setattr__(self, "name", self.cls.__name__.lower())
        object.__setattr__(self, "identity", _by_bits(self.kwargs))

    def build(self, tiled_inputs):
        """The op for these tiled inputs: one instance per (spec, tiling), shared by the call-time checks,
        the gradient and the planner (``from_inputs`` may enumerate every tile, as a regrouping reshape does)."""
        key = (self, tuple(tiled_inputs))
        with _BUILT_LOCK:
            op = _BUILT.get(key)
        if op is None:
            op = self.cls.from_inputs(*tiled_inputs, **dict(self.kwargs))
            with _BUILT_LOCK:
                _BUILT[key] = op
                while len(_BUILT) > _BUILT_SIZE:
                    _BUILT.pop(next(iter(_BUILT)))
        return op


_BUILT: dict = {}     # (OpSpec, tiled inputs) -> op, oldest first
_BUILT_SIZE = 256
_BUILT_LOCK = threading.Lock()


def _by_bits(value):
    """``value`` with every float (Python or NumPy) replaced by its type and bits, recursively through tuples."""
    if isinstance(value, tuple):
        return tuple(_by_bits(v) for v in value)
    if isinstance(value, (float, np.floating)):
        return (type(value).__name__, np.asarray(value).tobytes())
    return value


class OpNode(Node):
    """An op applied to input nodes, not yet computed."""

    def __init__(self, spec: OpSpec, inputs: tuple[Node, ...], shape, dtype):
        super().__init__(shape, dtype)
        self.spec = spec
        self.inputs = tuple(inputs)
        self.result: StoredNode | None = None
        self._equal: list | None = None     # weak references to nodes found equal to this one

    def resolved(self) -> Node:
        return self.result if self.result is not None else self

    def set_result(self, stored: StoredNode) -> None:
        self.result = stored
        self.inputs = ()
        for ref in self._equal or ():
            other = ref()
            if other is not None and other.result is None:
                other.set_result(stored)
        self._equal = None

    def stands_for(self, other: "OpNode") -> None:
        """``other`` holds the same values (:mod:`jask.plan.dedup`): it takes this node's stored result when
        there is one, so a later run that reaches ``other`` (a gradient's residual) reads it, not recomputes."""
        if self.result is not None:
            other.set_result(self.result)
        else:
            self._equal = (self._equal or []) + [weakref.ref(other)]


class HandleTable:
    """Maps the int32 handles that travel through compiled code back to nodes.

    Under ``jit`` a DiskArray is lowered to one int32; host callbacks turn it back
    into a node here. Entries are weak, so a node lives exactly as long as some
    array or downstream node refers to it. Nodes created inside a compiled call
    (intermediates no Python object holds) are also pinned in ``_young`` until
    the call is over; :func:`jask.hijax.runtime.safe_point` releases them.
    """

    def __init__(self):
        self._weak: weakref.WeakValueDictionary[int, Node] = weakref.WeakValueDictionary()
        self._young: dict[int, Node] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def handle_of(self, node: Node, pin: bool = False) -> int:
        with self._lock:
            if node.handle is None:
                node.handle = next(self._ids)
                if node.handle >= 2**31:
                    raise OverflowError("jask ran out of int32 array handles")
                self._weak[node.handle] = node
            if pin:
                self._young[node.handle] = node
            return node.handle

    def lookup(self, handle) -> Node:
        h = int(np.asarray(handle))
        node = self._weak.get(h)
        if node is None:
            raise RuntimeError(
                f"jask array handle {h} refers to an array that no longer exists; "
                "was a DiskArray captured by a jitted function and then deleted?")
        return node

    def release_young(self) -> int:
        with self._lock:
            n = len(self._young)
            self._young.clear()
            return n

    @property
    def young(self) -> int:
        return len(self._young)


handles = HandleTable()
