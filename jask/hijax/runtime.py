"""Crossing between traced JAX code and host-side graph building.

Every op's hijax ``expand`` calls :func:`host_call`. With concrete arguments
(eager mode) the host function runs directly; under tracing it is staged as an
ordered ``io_callback`` whose arguments are int32 handles and scalars, so the
compiled program never carries array data. Host functions are frozen
dataclasses: hashable and value-equal, so identical ops reuse compiled code.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses

import jax
import numpy as np

from jask.exec.devices import in_callback, inside_callback
from jask.graph.nodes import Node, ScalarNode, handles
from jask.hijax.array import DiskArray, DiskArrayType
from jask.hijax import compat
from jask.hijax.compat import is_traced


def safe_point() -> None:
    """Release nodes pinned by finished compiled calls.

    Called on the user's thread at op calls and sinks, never inside a callback.
    ``jax.effects_barrier`` first waits for any dispatched computation that may
    still look handles up.
    """
    if handles.young and not in_callback():
        jax.effects_barrier()
        handles.release_young()


@dataclasses.dataclass(frozen=True)
class TracedCall:
    """Adapter run inside ``io_callback``: handles in, nodes to the host function, handles out."""

    fn: object
    array_in: tuple[bool, ...]
    array_out: tuple[bool, ...]
    constants: tuple[tuple[int, Node], ...] = ()

    def __call__(self, *args):
        with inside_callback():
            args = list(args)
            for pos, node in self.constants:
                args.insert(pos, node)
            resolved = [a if isinstance(a, Node) else handles.lookup(a) if is_arr else np.asarray(a)
                        for a, is_arr in zip(args, self.array_in)]
            outs = self.fn(*resolved)
            return tuple(np.int32(handles.handle_of(o, pin=True)) if is_arr else np.asarray(o)
                         for o, is_arr in zip(outs, self.array_out))


def host_call(fn, out_avals, args, array_in):
    """Run ``fn`` on host values; returns a tuple with one entry per ``out_avals``.

    ``args`` holds, per input, a Node (eager), a traced int32 handle, or a scalar.
    ``out_avals`` holds the DiskArray type (a node comes back) or a ShapedArray
    (a value comes back) of each output.
    """
    array_out = tuple(isinstance(a, DiskArrayType) for a in out_avals)
    if not any(is_traced(a) for a in args):
        # concrete arguments inside a jit trace (closed-over DiskArrays): the host function's own JAX calls
        # (its window programs) must run now, not be staged into the outer program: on a thread of its own,
        # whose trace context is clean
        outs = _untraced(fn, args) if compat.tracing() else fn(*args)
        return tuple(DiskArray(node=o) if is_arr else jax.numpy.asarray(o, dtype=a.dtype)
                     for o, a, is_arr in zip(outs, out_avals, array_out))
    results = [jax.ShapeDtypeStruct((), np.int32) if is_arr else jax.ShapeDtypeStruct(a.shape, a.dtype)
               for a, is_arr in zip(out_avals, array_out)]
    # A concrete DiskArray closed over by a traced function is a constant of the
    # compiled program, like any closed-over JAX array: the callback holds its node.
    constants = tuple((i, a) for i, a in enumerate(args) if isinstance(a, Node))
    traced_args = [a for a in args if not isinstance(a, Node)]
    outs = jax.experimental.io_callback(TracedCall(fn, tuple(array_in), array_out, constants),
                                        tuple(results), *traced_args, ordered=True)
    return tuple(DiskArray(aval=a, handle=o) if is_arr else o
                 for o, a, is_arr in zip(outs, out_avals, array_out))


def _untraced(fn, args):
    """``fn(*args)`` on another thread (JAX's trace context is per thread), its exception raised here."""
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jask-untraced") as pool:
        return pool.submit(fn, *args).result()


def ref_of(x, aval=None):
    """What a host function receives for one argument: a Node, a traced handle, or a scalar.

    A Python number (the primal ``jax.grad`` passes eagerly for ``grad(f)(2.0)``) comes as a
    NumPy scalar of its ``aval``'s dtype, not NumPy's float64."""
    if isinstance(x, DiskArray):
        return x._node if x._node is not None else x._handle
    if aval is not None and isinstance(x, (bool, int, float, complex)):
        return np.asarray(x, aval.dtype)
    return x


def as_node(x) -> Node:
    """Host side: a resolved argument as a graph node (scalars become ScalarNodes)."""
    return x if isinstance(x, Node) else ScalarNode(x)
