"""``on_disk(fn)``: run a function written with ``jax.numpy``/``lax`` (an optax transformation) on DiskArrays.

``jax.numpy`` has no dispatch hook for other array types, so ``jnp.sqrt`` cannot
take a DiskArray. As ``jax.experimental.sparse.sparsify`` does for sparse
arrays, :func:`on_disk` traces ``fn`` abstractly, with a shape-and-dtype
placeholder for each DiskArray argument (no data is read), and then evaluates
the traced program one primitive at a time: a primitive with a DiskArray
operand becomes the matching lazy tiled op (any elementwise primitive through
:class:`jask.ops.elementwise.Elementwise`, whose tiles run that very primitive),
and everything else is bound as JAX would. An array the program builds from a
single value with the shape of one of the DiskArray arguments (``jnp.zeros_like(p)``:
optimizer moments; a norm of shape ``(1,)`` broadcast back, as ``optax.safe_norm``
does) becomes a lazy constant DiskArray, not an array in memory.
Works eagerly and under ``jit``.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np

from jask.hijax import compat
from jask.hijax.array import is_disk_array, type_of
from jask.ops import contract, creation, elementwise, reductions, shape as shape_ops

# lax primitives that map equal-shaped operands (or 0-d ones) to one output of that shape, elementwise
ELEMENTWISE = frozenset("""
abs acos acosh add and asin asinh atan atan2 atanh cbrt ceil clamp convert_element_type cos cosh div eq erf
erf_inv erfc exp exp2 expm1 floor ge gt integer_pow is_finite le lgamma digamma log log1p logistic lt max min
mul ne neg nextafter not or pow reduce_precision rem round rsqrt select_n sign sin sinh sqrt square sub tan
tanh xor copy copy_p
""".split())

REDUCTIONS = {"reduce_sum": reductions.sum, "reduce_max": reductions.max, "reduce_min": reductions.min,
              "reduce_prod": reductions.prod, "argmax": reductions.argmax, "argmin": reductions.argmin}


@dataclasses.dataclass(frozen=True)
class BoundPrimitive:
    """``primitive.bind(*operands, **params)`` as a hashable, value-equal tile function."""

    primitive: object
    params: tuple

    def __call__(self, *operands):
        return self.primitive.bind(*operands, **dict(self.params))


def _freeze(params):
    return tuple(sorted(params.items()))


# primitives that call a sub-jaxpr exactly once on their operands, so evaluating the body once is exact
CALLS = frozenset("""
jit pjit closed_call core_call remat remat2 checkpoint custom_jvp_call custom_vjp_call custom_vjp_call_jaxpr
""".split())


def _sub_jaxpr(params):
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        if key in params:
            return params[key]
    return None


def _is_jaxpr(v):
    return hasattr(v, "eqns") or (hasattr(v, "jaxpr") and hasattr(v, "consts"))


def _higher_order(params):
    """Whether any parameter holds a jaxpr (a loop, branch or mapped body: scan, while, cond, shard_map)."""
    return any(_is_jaxpr(v) or (isinstance(v, (tuple, list)) and any(_is_jaxpr(b) for b in v))
               for v in params.values())


def _literal(v):
    """A jaxpr literal as a 0-d JAX value of its exact dtype (a scalar operand, never re-promoted)."""
    return jax.numpy.asarray(v.val, dtype=v.aval.dtype)


class _Evaluator:
    """Evaluates a jaxpr whose inputs may be DiskArrays; ``disk_shapes``: shapes built lazily, not in memory."""

    def __init__(self, name, disk_shapes):
        self.name, self.disk_shapes = name, frozenset(disk_shapes)

    def run(self, closed, *args):
        jaxpr, consts = compat.jaxpr_and_consts(closed)
        env = {}
        read = lambda v: _literal(v) if isinstance(v, compat.Literal) else env[v]   # noqa: E731
        env.update(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, args))
        for eqn in jaxpr.eqns:
            outs = self.apply(eqn, [read(v) for v in eqn.invars])
            outs = outs if eqn.primitive.multiple_results else [outs]
            env.update(zip(eqn.outvars, outs))
        return [read(v) for v in jaxpr.outvars]

    def apply(self, eqn, args):
        prim, params = eqn.primitive, eqn.params
        if not any(is_disk_array(a) for a in args):
            out_aval = eqn.outvars[0].aval if len(eqn.outvars) == 1 else None
            if (prim.name == "broadcast_in_dim" and np.size(args[0]) == 1 and out_aval is not None
                    and tuple(out_aval.shape) in self.disk_shapes):   # one value (optax's safe_norm: a (1,) norm)
                return creation.full(out_aval.shape, jax.numpy.reshape(args[0], ()), out_aval.dtype)
            return compat.bind_equation(eqn, *args)
        if prim.name in CALLS and _sub_jaxpr(params) is not None:
            return self.run(_sub_jaxpr(params), *args)
        if _higher_order(params):
            raise NotImplementedError(
                f"jask.on_disk({self.name}): the JAX primitive {prim.name!r} (a loop, branch or mapped body: "
                "lax.scan, fori_loop, while_loop, cond, shard_map) has a DiskArray operand; on_disk evaluates each "
                "primitive once, so it cannot run a loop body. Write the loop outside on_disk: call "
                "jax.lax.fori_loop/scan/while_loop/cond under jax.jit with the DiskArrays as carries, and use "
                "jask.on_disk (or jask.numpy) inside the loop body")
        if prim.name in ELEMENTWISE:
            if prim.name in ("copy", "copy_p"):
                return args[0]
            return elementwise.lift(BoundPrimitive(prim, _freeze(params)), prim.name)(*args)
        return self.structural(prim.name, params, args, eqn.outvars[0].aval)

    def structural(self, name, params, args, out_aval):
        """Primitives that move or reduce data, each mapped to its jask op."""
        x = args[0]
        if name in REDUCTIONS:
            axes = tuple(params["axes"])
            out = REDUCTIONS[name](x, axis=axes[0] if name in ("argmax", "argmin") else axes)
        elif name == "squeeze":
            out = shape_ops.squeeze(x, tuple(params["dimensions"]))
        elif name == "reshape":
            out = shape_ops.reshape(x, tuple(params["new_sizes"]))
        elif name == "transpose":
            out = shape_ops.transpose(x, tuple(params["permutation"]))
        elif name == "broadcast_in_dim":
            dims, shape = tuple(params["broadcast_dimensions"]), tuple(params["shape"])
            kept = [1] * len(shape)
            for axis, d in zip(dims, type_of(x).shape):
                kept[axis] = d
            out = creation.broadcast_to(shape_ops.reshape(x, tuple(kept)), shape)
        elif name == "dot_general" and not params["dimension_numbers"][1][0]:
            (lhs, rhs), _ = params["dimension_numbers"]
            out = contract.tensordot(x, args[1], axes=(tuple(lhs), tuple(rhs)))
        else:
            raise NotImplementedError(
                f"jask.on_disk({self.name}): the JAX primitive {name!r} on a DiskArray operand is not supported "
                "(elementwise primitives, reductions, reshapes, transposes, broadcasts, jit calls (not loops) and "
                "contractions without batch axes are); compute that step with jask.numpy")
        if is_disk_array(out):
            if type_of(out).dtype != out_aval.dtype:
                out = elementwise.astype(out, out_aval.dtype)
        elif out.dtype != out_aval.dtype:     # a full reduction's JAX scalar (jnp.sum(x_int8, dtype=int8))
            out = jax.numpy.asarray(out).astype(out_aval.dtype)
        return out


def _placeholder(x):
    return jax.ShapeDtypeStruct(type_of(x).shape, type_of(x).dtype) if is_disk_array(x) else x


def on_disk(fn):
    """``fn`` (written with ``jax.numpy``/``lax``), accepting DiskArrays anywhere in its arguments.

    Each primitive that touches a DiskArray becomes a lazy tiled op, so nothing
    of a DiskArray's size is held in memory; results are lazy DiskArrays (and
    JAX values for what depends on no DiskArray). With no DiskArray argument it
    is ``fn`` itself. Example: ``jask.on_disk(optax.apply_updates)(params, updates)``.
    """
    name = getattr(fn, "__name__", type(fn).__name__)

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        leaves, treedef = jax.tree.flatten((args, kwargs), is_leaf=is_disk_array)
        if not any(is_disk_array(x) for x in leaves):
            return fn(*args, **kwargs)
        arrays = [i for i, x in enumerate(leaves) if is_disk_array(x) or _is_array(x)]

        def flat(*values):
            full = list(leaves)
            for i, v in zip(arrays, values):
                full[i] = v
            a, k = jax.tree.unflatten(treedef, full)
            return fn(*a, **k)

        closed, out_shape = jax.make_jaxpr(flat, return_shape=True)(*[_placeholder(leaves[i]) for i in arrays])
        disk_shapes = {type_of(x).shape for x in leaves if is_disk_array(x)}
        outs = _Evaluator(name, disk_shapes).run(closed, *[leaves[i] for i in arrays])
        return jax.tree.unflatten(jax.tree.structure(out_shape), outs)

    return wrapped


def _is_array(x):
    """Array arguments are traced; Python numbers and other leaves stay static, as ``fn`` may use them for shapes."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic)) or compat.is_traced(x)

