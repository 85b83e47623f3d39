"""``make_op``: from five per-tile methods to a public op that works under jit and grad.

Architecture notes
------------------
*Values.* A :class:`~jask.hijax.array.DiskArray` is a hijax value of type
``DiskArrayType(shape, dtype)``. Its lowered form is a single int32 handle, so
under ``jax.jit`` the traced graph holds handles and scalars, never a tensor
of an array's shape, and a jitted function compiles once per shape and dtype.

*Ops are lazy.* Calling an op binds an :class:`OpPrimitive`. Its ``expand``
(run eagerly, or when ``jit`` lowers) calls :func:`jask.hijax.runtime.host_call`:
eagerly the host function runs at once, under tracing it becomes an ordered
``io_callback``. Either way the host function only adds an ``OpNode`` to the
lazy tile graph (:mod:`jask.graph.nodes`). Work happens at sinks: an op whose
output is a scalar (``sum``), ``materialize``, ``to_zarr``, ``update_``,
``persist``. The executor (:mod:`jask.exec.driver`) plans the whole graph
below a sink, fuses single-use producers into their consumers, and pulls
output tiles through the per-tile kernels (:mod:`jask.kernels`).

*Gradients.* ``OpPrimitive.vjp_fwd`` keeps the inputs as residuals. Its
``vjp_bwd`` binds a second hi-primitive, :class:`BackwardPrimitive`, because the
body of a VJP rule is inlined into the gradient graph and must itself be a
callback, not traced tile math. The backward node of input ``i`` is an ordinary
lazy op, :class:`GradOp`: for each tile of input ``i`` its ``index_map`` lists
every (output tile, entry) that read that tile, found by tabulating the forward
``index_map`` on the host once per tiling, and its ``forward_block`` is the
forward op's ``backward_block``. Contributions to one input tile (``dot``'s dA
sums over output columns) are folded by ``combine`` inside the tile loop, never
by read-modify-write on disk. Gradients are therefore lazy DiskArrays too, and
fuse with whatever consumes them (an optimizer update).

*Lifetimes.* Scratch stores belong to their ``Store`` objects and are deleted
when no node refers to them. Nodes created inside a compiled call are pinned
until the call has finished (``runtime.safe_point``).
"""
from __future__ import annotations

import inspect

import jax
import numpy as np

from jask.graph.nodes import OpSpec, StoredNode
from jask.graph.op import BlockParallelOp, CustomOp, _Op
from jask.hijax import compat, runtime
from jask.hijax.array import DiskArray, is_disk_array, type_of, zeros_node
from jask.hijax.contract_checks import check_forward_block, check_index_map
from jask.hijax.primitives import OpPrimitive, call_time_inputs, output_type


def freeze(value):
    """Make keyword arguments hashable so ops can key caches: lists and NumPy arrays become (nested)
    tuples, a 0-d NumPy array its NumPy scalar, a dict its sorted items."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, np.ndarray):
        return value[()] if value.ndim == 0 else freeze(value.tolist())
    try:
        hash(value)
    except TypeError:
        raise TypeError(f"op keyword argument {value!r} must be hashable (a number, string or tuple)") from None
    return value


def _call_checker(name, cls):
    """A check of the number of arrays and the keywords a call passes, read once from the op's methods.

    Without it a wrong call fails inside ``output_shape`` or ``from_inputs``
    with a message about those methods instead of about the public function.
    """
    shape_params = list(inspect.signature(cls.output_shape).parameters.values())[1:]  # drop self
    n_arrays = None if any(p.kind is p.VAR_POSITIONAL for p in shape_params) else len(shape_params)
    custom = cls.from_inputs.__func__ is not _Op.from_inputs.__func__
    if custom:
        params = list(inspect.signature(cls.from_inputs).parameters.values())
        params = [p for p in params if p.kind is not p.VAR_POSITIONAL][n_arrays or 0:]
    elif cls.__init__ is object.__init__:
        params = []
    else:
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    open_ended = any(p.kind is p.VAR_KEYWORD for p in params)
    accepted = sorted(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))

    def check(n_inputs, kwargs):
        if n_arrays is not None and n_inputs != n_arrays:
            hint = f"; pass its parameters by keyword ({', '.join(accepted)})" if n_inputs > n_arrays and accepted \
                else ""
            raise TypeError(f"{name} takes {n_arrays} DiskArray argument{'s' * (n_arrays != 1)}, "
                            f"got {n_inputs}{hint}")
        unknown = sorted(set(kwargs) - set(accepted))
        if unknown and not open_ended:
            takes = f"keyword arguments: {', '.join(accepted)}" if accepted else "no keyword arguments"
            raise TypeError(f"{name} got unexpected keyword argument{'s' * (len(unknown) > 1)} "
                            f"{', '.join(map(repr, unknown))}; it takes {takes}")

    return check


def is_scalar_operand(x) -> bool:
    """A 0-d JAX or NumPy value, concrete or traced (Python numbers are baked into ops instead)."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic, compat.Tracer)) and np.shape(x) == () \
        and not is_disk_array(x)


def _input_type(x):
    if is_disk_array(x):
        return type_of(x)
    return compat.ShapedArray((), np.dtype(x.dtype))


def _check_inputs(name, inputs, scalars_ok=False):
    for pos, x in enumerate(inputs):
        if scalars_ok and is_scalar_operand(x):
            continue
        if not is_disk_array(x) and compat.is_traced(x):
            raise TypeError(f"{name} expects DiskArray inputs; argument {pos} is a traced in-memory value of shape "
                            f"{np.shape(x)} (inside jit or grad), which a DiskArray op takes only as a 0-d scalar. "
                            "Pass it as a DiskArray: jask.from_numpy(value) outside jit and grad (its gradient then "
                            "comes back as a DiskArray)")
        if not is_disk_array(x):
            raise TypeError(f"{name} expects DiskArray inputs; argument {pos} is {type(x).__name__}. "
                            "Wrap in-memory data with jask.from_numpy")
        node = x._node if isinstance(x, DiskArray) else None
        if node is not None:
            _check_alive(name, node)


def _check_alive(name, node):
    r = node.resolved()
    if isinstance(r, StoredNode) and r.store.deleted():   # a pinned user store may be renamed, not gone
        raise FileNotFoundError(f"{name}: the Zarr store {r.store.path} backing an input was deleted")


def empty_result(name, cls, out):
    """An op's result when an input is empty (a 0-size axis), computed without running anything.

    An empty result is the storage-free zero node of its shape. A non-empty one
    (a sum over an empty axis) is the op's identity ``cls.empty_value``: any value
    for a scalar result, only 0 for an array result (the zeros node; another value
    is refused). Ops without one (max) refuse, as jnp does. Nothing depends on the
    inputs' values, so the gradient is the zero (empty) gradient.
    """
    if out.size == 0:
        return DiskArray(node=zeros_node(out.shape, out.dtype))
    value = getattr(cls, "empty_value", None)
    if value is None:
        raise ValueError(f"{name} of an empty array has no identity: its result of shape {out.shape} has no value")
    if out.shape == ():
        return jax.numpy.full((), value, out.dtype)
    if value != 0:
        raise NotImplementedError(f"{name} over an empty axis: an array result filled with its identity "
                                  f"empty_value={value!r} is not supported (only 0, the zeros node)")
    return DiskArray(node=zeros_node(out.shape, out.dtype))


_CONTRACT_CHECKED: set = set()


def _check_contract(name, spec, op, tiled, out_shape, tile):
    """The index_map and forward_block checks, once per op and tiling (tracing ``forward_block`` costs ~1 ms)."""
    key = (spec, tuple(tiled), out_shape, tile)
    if key in _CONTRACT_CHECKED:
        return
    check_index_map(name, op, tiled, out_shape, tile)
    check_forward_block(name, op, tiled, out_shape, tile)
    if len(_CONTRACT_CHECKED) > 4096:
        _CONTRACT_CHECKED.clear()
    _CONTRACT_CHECKED.add(key)


def make_op(cls, doc: str | None = None, name: str | None = None):
    """Turn a :class:`BlockParallelOp` subclass into a public function.

    The function takes DiskArrays positionally; keyword arguments go to
    ``cls.from_inputs``. It works eagerly, under ``jax.jit`` and under
    ``jax.grad``, and never materializes an array.
    """
    if not (isinstance(cls, type) and issubclass(cls, (BlockParallelOp, CustomOp))):
        raise TypeError(f"make_op expects a BlockParallelOp or CustomOp subclass, got {cls!r}")
    op_name = name or cls.__name__.lower()
    check_call = _call_checker(op_name, cls)

    def op(*inputs, **kwargs):
        scalars_ok = getattr(cls, "scalar_operands", False)
        check_call(len(inputs), kwargs)
        _check_inputs(op_name, inputs, scalars_ok)
        if scalars_ok:
            inputs = tuple(x if is_disk_array(x) or compat.is_traced(x) else jax.numpy.asarray(x) for x in inputs)
        if not any(compat.is_traced(x) for x in inputs):
            runtime.safe_point()
        spec = OpSpec(cls, tuple(sorted((k, freeze(v)) for k, v in kwargs.items())), op_name)
        types = [_input_type(x) for x in inputs]
        tiled, tile = call_time_inputs(types)
        built = spec.build(tiled)
        out = output_type(spec, built, types)
        if any(t.size == 0 for t in types) or out.size == 0:
            return empty_result(op_name, cls, out)
        if issubclass(cls, CustomOp):
            if out.shape == ():
                raise NotImplementedError(f"{op_name}: a CustomOp's output has at least one axis (its output_shape "
                                          "returned ()); return shape (1,) and index the result")
        else:
            _check_contract(op_name, spec, built, tiled, out.shape, tile)
        return OpPrimitive(spec, types, out)(*inputs)

    op.__name__ = op.__qualname__ = op_name
    op.__doc__ = doc or cls.__doc__
    op.op_class = cls
    return op
