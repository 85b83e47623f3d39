"""The hi-primitives behind every ``make_op`` op: applying an op, and its backward pass.

``OpPrimitive.expand`` (run eagerly, or when ``jit`` lowers) calls
:func:`jask.hijax.runtime.host_call`, whose host function only adds an
``OpNode`` to the lazy graph (or runs it at once, if the output is a scalar).
``OpPrimitive.vjp_bwd`` binds :class:`BackwardPrimitive`, because the body of a
VJP rule is inlined into the gradient graph and must itself be a callback, not
traced tile math; its host function adds one lazy gradient node per input
(:mod:`jask.hijax.grad`).
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jask.exec.driver import run
from jask.graph.nodes import OpNode, OpSpec
from jask.graph.op import TiledInput, _Op
from jask.graph.tiling import block_shape
from jask.hijax import compat, runtime
from jask.hijax.array import DiskArrayType, is_disk_array
from jask.hijax import unit_grads
from jask.hijax.grad import gradient_node
from jask.hijax.residuals import keep_output, keep_small_residuals
from jask.plan.tiling import default_tile


def call_time_inputs(types):
    """The inputs as ``from_inputs`` sees them at the default tiling, and that tile edge."""
    biggest = max(types, key=lambda t: t.size)
    tile = default_tile(biggest.shape, biggest.dtype.itemsize)
    blocks = [tuple(max(b, 1) for b in block_shape(t.shape, tile)) for t in types]   # an empty axis: one block
    return [TiledInput(t.shape, t.dtype, b) for t, b in zip(types, blocks)], tile


def call_time_op(spec: OpSpec, types):
    """Build the op for the default tiling, to validate inputs and learn the output shape."""
    return spec.build(call_time_inputs(types)[0])


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
    if any(d < 0 for d in shape):
        raise ValueError(f"{spec.name}.output_shape returned {shape}, with a negative length")
    dtype = np.dtype(op.output_dtype(*dtypes))
    if shape == ():
        return compat.ShapedArray((), dtype)
    return DiskArrayType(shape, dtype)


class OpPrimitive(compat.HiPrimitive):
    """One application of a BlockParallelOp (or CustomOp) to DiskArrays."""

    def __init__(self, spec: OpSpec, in_types, out_type, loss: bool = False, fixed: tuple[int, ...] = ()):
        self.in_avals = tuple(in_types)
        self.out_aval = out_type
        self.params = dict(spec=spec, signature=(tuple(in_types), out_type), loss=loss, fixed=fixed)
        super().__init__()

    def expand(self, *args):
        (out,) = runtime.host_call(ApplyOp(self.spec, self.loss, self.fixed), (self.out_aval,),
                                   [runtime.ref_of(a, t) for a, t in zip(args, self.in_avals)],
                                   _array_flags(self.in_avals))
        return out

    def vjp_fwd(self, nzs_in, *args):
        # the node learns which inputs are not differentiated (no unit gradient for them: unit_grads);
        # a scalar under differentiation: its run also computes small weights' unit gradients
        fixed = tuple(i for i, nz in enumerate(nzs_in) if not nz)
        scalar = self.out_aval.shape == ()
        out = OpPrimitive(self.spec, self.in_avals, self.out_aval, loss=scalar, fixed=fixed)(*args)
        if not scalar:
            out = keep_output(out, self.in_avals, self.out_aval, nzs_in)
        return out, keep_small_residuals(args, self.in_avals)

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
        refs = [runtime.ref_of(g)] + [runtime.ref_of(a, t) for a, t in zip(args, self.in_avals[1:])]
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
    loss: bool = False      # differentiated: small inputs' unit gradients share the run (unit_grads)
    fixed: tuple[int, ...] = ()     # under differentiation: the inputs that are not differentiated

    def __call__(self, *inputs):
        nodes = tuple(runtime.as_node(i) for i in inputs)
        types = [DiskArrayType(n.shape, n.dtype) for n in nodes]
        out = output_type(self.spec, call_time_op(self.spec, types), types)
        node = OpNode(self.spec, nodes, out.shape, out.dtype)
        if self.fixed:
            node.fixed_inputs = frozenset(self.fixed)
        if out.shape == ():
            return (unit_grads.run_loss(node),) if self.loss else run([node])
        return (node,)


@dataclasses.dataclass(frozen=True)
class ApplyBackward:
    """Host function: the lazy gradient nodes of one op application."""

    spec: OpSpec
    wanted: tuple[int, ...]

    def __call__(self, g, *inputs):
        nodes = tuple(runtime.as_node(x) for x in (g, *inputs))
        grads = [self._gradient(nodes, i, unit_grads.cotangent_scale(self.spec, nodes)) for i in self.wanted]
        # a scalar operand's gradient is a reduction over every tile: computed now, returned as a value
        scalars = [n for n in grads if n.shape == ()]
        values = dict(zip(map(id, scalars), run(scalars))) if scalars else {}
        return tuple(values.get(id(n), n) for n in grads)

    def _gradient(self, nodes, i, scale):
        """Input ``i``'s gradient: computed in the loss's pass if the walk has it, else a lazy node."""
        if scale is None:
            return gradient_node(self.spec, i, nodes)
        known = unit_grads.known_contribution(nodes, i, scale)
        return known if known is not None else unit_grads.tag_through(gradient_node(self.spec, i, nodes), i, scale)


def _inexact(aval) -> bool:
    return jax.numpy.issubdtype(aval.dtype, jax.numpy.inexact)


def _array_flags(avals) -> list[bool]:
    """Per input: a DiskArray (passed as a handle) or a scalar operand (passed by value)."""
    return [isinstance(a, DiskArrayType) for a in avals]
