"""``make_op``: from five per-tile methods to a public op that works under jit and grad.

Architecture notes
------------------
*Values.* A :class:`~jask.base.array.DiskArray` is a hijax value of type
``DiskArrayType(shape, dtype)``. Its lowered form is a single int32 handle, so
under ``jax.jit`` the traced graph holds handles and scalars, never a tensor
of an array's shape, and a jitted function compiles once per shape and dtype.

*Ops are lazy.* Calling an op binds an :class:`OpPrimitive`. Its ``expand``
(run eagerly, or when ``jit`` lowers) calls :func:`jask.base.runtime.host_call`:
eagerly the host function runs at once, under tracing it becomes an ordered
``io_callback``. Either way the host function only adds an ``OpNode`` to the
lazy tile graph (:mod:`jask.base.graph`). Work happens at sinks: an op whose
output is a scalar (``sum``), ``materialize``, ``to_zarr``, ``update_``,
``persist``. The executor (:mod:`jask.base.executor`) plans the whole graph
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

import dataclasses
import inspect
from collections import defaultdict

import jax
import numpy as np

from jask.base import compat, runtime
from jask.base.array import DiskArray, DiskArrayType, is_disk_array, type_of
from jask.base.graph import OpNode, OpSpec, StoredNode
from jask.base.op import BlockParallelOp, CustomOp, TiledInput, _Op


def freeze(value):
    """Make keyword arguments hashable (lists become tuples) so ops can key caches."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, np.ndarray):
        return tuple(value.tolist())
    try:
        hash(value)
    except TypeError:
        raise TypeError(f"op keyword argument {value!r} must be hashable (a number, string or tuple)") from None
    return value


def call_time_op(spec: OpSpec, types):
    """Build the op for the default tiling, to validate inputs and learn the output shape."""
    from jask.base.executor import block_shape, default_tile
    biggest = max(types, key=lambda t: t.size)
    tile = default_tile(biggest.shape, biggest.dtype.itemsize)
    return spec.build([TiledInput(t.shape, t.dtype, block_shape(t.shape, tile)) for t in types])


def output_type(spec: OpSpec, op, types):
    """The op's output type, with errors that name the op and the offending shapes and dtypes."""
    dtypes = [t.dtype for t in types]
    wide = [d for d in dtypes if d.itemsize == 8]
    if wide and not jax.config.jax_enable_x64:
        raise TypeError(f"{spec.name} got a {wide[0]} input while 64-bit JAX is off, so it would be "
                        "computed in 32 bits; enable jax_enable_x64 or convert the array")
    if len(set(dtypes)) > 1 and type(op).output_dtype is _Op.output_dtype:
        raise TypeError(f"{spec.name} got mismatched dtypes {', '.join(d.name for d in dtypes)}; "
                        "jask does not promote implicitly: convert the inputs to one dtype")
    shape = op.output_shape(*[t.shape for t in types])
    try:
        shape = tuple(int(d) for d in shape)
    except TypeError:
        raise TypeError(f"{spec.name}.output_shape must return a tuple of ints, got {shape!r}") from None
    dtype = np.dtype(op.output_dtype(*dtypes))
    if shape == ():
        return compat.ShapedArray((), dtype)
    return DiskArrayType(shape, dtype)


class OpPrimitive(compat.HiPrimitive):
    """One application of a BlockParallelOp (or CustomOp) to DiskArrays."""

    def __init__(self, spec: OpSpec, in_types, out_type):
        self.in_avals = tuple(in_types)
        self.out_aval = out_type
        self.params = dict(spec=spec, signature=(tuple(in_types), out_type))
        super().__init__()

    def expand(self, *args):
        (out,) = runtime.host_call(ApplyOp(self.spec), (self.out_aval,),
                                   [runtime.ref_of(a) for a in args], _array_flags(self.in_avals))
        return out

    def vjp_fwd(self, nzs_in, *args):
        return self(*args), args

    def vjp_bwd(self, res, g, *accums):
        if not _inexact(self.out_aval):   # as in JAX: nothing flows back through bool/int outputs
            return
        skip = getattr(self.spec.cls, "nondiff_inputs", ())
        wanted = tuple(i for i, acc in enumerate(accums)
                       if compat.wants_grad(acc) and _inexact(self.in_avals[i]) and i not in skip)
        if not wanted or compat.is_zero_cotangent(g):
            return
        prim = BackwardPrimitive(self.spec, self.in_avals, self.out_aval, wanted)
        grads = prim(g, *res)
        for i, grad in zip(wanted, grads):
            accums[i].accum(grad)

    def batch(self, axis_data, args, dims):
        raise NotImplementedError(f"jax.vmap of jask.{self.spec.name} is not supported")

    def jvp(self, primals, tangents):
        raise NotImplementedError(f"forward-mode differentiation (jvp) of jask.{self.spec.name} is "
                                  "not supported; use jax.grad")


class BackwardPrimitive(compat.HiPrimitive):
    """Gradients of one op application for the inputs in ``wanted``: lazy GradOp nodes."""

    def __init__(self, spec, in_types, out_type, wanted):
        self.in_avals = (out_type, *in_types)
        self.out_aval = tuple(in_types[i] for i in wanted)
        self.params = dict(spec=spec, wanted=wanted, signature=(tuple(in_types), out_type))
        super().__init__()

    def expand(self, g, *args):
        refs = [runtime.ref_of(g)] + [runtime.ref_of(a) for a in args]
        return runtime.host_call(ApplyBackward(self.spec, self.wanted), self.out_aval, refs,
                                 [is_disk_array(g)] + _array_flags(self.in_avals[1:]))

    def vjp_fwd(self, nzs_in, *args):
        raise NotImplementedError(f"second-order gradients of jask.{self.spec.name} are not supported")

    def batch(self, axis_data, args, dims):
        raise NotImplementedError(f"jax.vmap of the gradient of jask.{self.spec.name} is not supported")


@dataclasses.dataclass(frozen=True)
class ApplyOp:
    """Host function: add the op's node to the graph (and run it, if its output is a scalar)."""

    spec: OpSpec

    def __call__(self, *inputs):
        from jask.base.executor import run
        nodes = tuple(runtime.as_node(i) for i in inputs)
        types = [DiskArrayType(n.shape, n.dtype) for n in nodes]
        out = output_type(self.spec, call_time_op(self.spec, types), types)
        node = OpNode(self.spec, nodes, out.shape, out.dtype)
        if out.shape == ():
            return run([node])
        return (node,)


@dataclasses.dataclass(frozen=True)
class ApplyBackward:
    """Host function: the lazy gradient nodes of one op application."""

    spec: OpSpec
    wanted: tuple[int, ...]

    def __call__(self, g, *inputs):
        from jask.base.executor import run
        nodes = tuple(runtime.as_node(x) for x in (g, *inputs))
        grad_cls = CustomGradOp if issubclass(self.spec.cls, CustomOp) else GradOp
        grads = [OpNode(OpSpec(grad_cls, (("forward", self.spec), ("wrt", i)), name=f"grad[{self.spec.name}]"),
                        nodes, nodes[1 + i].shape, nodes[1 + i].dtype)
                 for i in self.wanted]
        # a scalar operand's gradient is a reduction over every tile: computed now, returned as a value
        scalars = [n for n in grads if n.shape == ()]
        values = dict(zip(map(id, scalars), run(scalars))) if scalars else {}
        return tuple(values.get(id(n), n) for n in grads)


class GradOp(BlockParallelOp):
    """Gradient of a forward op with respect to input ``wrt``, itself a block-parallel op.

    Inputs are ``(d_out, *forward_inputs)``. ``index_map`` is the forward map
    inverted for input ``wrt`` (tabulated once per tiling); each entry carries
    the output tile and the forward entry that read this input tile.
    """

    def __init__(self, forward_op, wrt, table, unused_inputs=frozenset()):
        self.forward_op, self.wrt, self.table = forward_op, wrt, table
        self.unused_inputs = unused_inputs

    @classmethod
    def from_inputs(cls, d_out, *inputs, forward, wrt):
        from jask.base.executor import grid
        op = forward.build(list(inputs))
        table = defaultdict(list)
        out_grid = d_out.grid
        for out_idx in np.ndindex(*out_grid):
            for entry in op.index_map(out_idx):
                blocks = tuple(tuple(int(i) for i in b) for b in entry)
                table[blocks[wrt]].append((tuple(out_idx), *blocks))
        specs = [jax.ShapeDtypeStruct(t.block_shape, t.dtype) for t in (d_out, *inputs)]
        unused = compat.unused_arguments(lambda *xs: op.backward_block(*xs)[wrt], specs)
        return cls(op, wrt, dict(table), unused)

    def forward_block(self, d_out_block, *input_blocks):
        grads = self.forward_op.backward_block(d_out_block, *input_blocks)
        return grads[self.wrt].astype(input_blocks[self.wrt].dtype)

    def index_map(self, in_idx):
        return self.table.get(tuple(in_idx), [])

    def combine(self, acc, partial):
        return acc + partial

    def backward_block(self, d_out_block, *input_blocks):
        raise NotImplementedError("second-order gradients are not supported")

    def output_shape(self, d_shape, *input_shapes):
        return input_shapes[self.wrt]

    def output_dtype(self, *dtypes):
        return dtypes[1 + self.wrt]


class CustomGradOp(CustomOp):
    """Gradient of a CustomOp for input ``wrt``: runs its ``backward`` and keeps that input's tiles."""

    def __init__(self, forward_op, wrt):
        self.forward_op, self.wrt = forward_op, wrt

    @classmethod
    def from_inputs(cls, d_out, *inputs, forward, wrt):
        return cls(forward.build(list(inputs)), wrt)

    def forward(self, algo, d_out, *inputs):
        self.forward_op.backward(_OneGradient(algo, self.wrt), inputs, d_out)

    def output_shape(self, d_shape, *input_shapes):
        return input_shapes[self.wrt]

    def output_dtype(self, *dtypes):
        return dtypes[1 + self.wrt]


class _OneGradient:
    """The algo a CustomOp's ``backward`` sees: ``write(idx, block, wrt=i)`` keeps only input ``wrt``."""

    def __init__(self, algo, wrt):
        self._algo, self._wrt = algo, wrt

    def __getattr__(self, name):
        return getattr(self._algo, name)

    def write(self, idx, block, wrt=0):
        if wrt == self._wrt:
            self._algo.write(idx, block)


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
            raise TypeError(f"{name} takes {n_arrays} DiskArray argument{'s' * (n_arrays != 1)}, "
                            f"got {n_inputs}")
        unknown = sorted(set(kwargs) - set(accepted))
        if unknown and not open_ended:
            takes = f"keyword arguments: {', '.join(accepted)}" if accepted else "no keyword arguments"
            raise TypeError(f"{name} got unexpected keyword argument{'s' * (len(unknown) > 1)} "
                            f"{', '.join(map(repr, unknown))}; it takes {takes}")

    return check


def _inexact(aval) -> bool:
    return jax.numpy.issubdtype(aval.dtype, jax.numpy.inexact)


def _array_flags(avals) -> list[bool]:
    """Per input: a DiskArray (passed as a handle) or a scalar operand (passed by value)."""
    return [isinstance(a, DiskArrayType) for a in avals]


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
        _check_inputs(op_name, inputs, scalars_ok)
        check_call(len(inputs), kwargs)
        if scalars_ok:
            inputs = tuple(x if is_disk_array(x) or compat.is_traced(x) else jax.numpy.asarray(x) for x in inputs)
        if not any(compat.is_traced(x) for x in inputs):
            runtime.safe_point()
        spec = OpSpec(cls, tuple(sorted((k, freeze(v)) for k, v in kwargs.items())), op_name)
        types = [_input_type(x) for x in inputs]
        out = output_type(spec, call_time_op(spec, types), types)
        return OpPrimitive(spec, types, out)(*inputs)

    op.__name__ = op.__qualname__ = op_name
    op.__doc__ = doc or cls.__doc__
    op.op_class = cls
    return op
