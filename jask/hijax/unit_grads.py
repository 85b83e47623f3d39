"""A scalar loss's gradients for small weights, computed in the loss's own pass over the data.

``jit(value_and_grad)`` of ``sum((X @ w - y) ** 2)`` read X twice: the loss pass,
then the backward's pass for ``w``'s gradient. The backward is linear in the
loss's cotangent ``g``, so each contribution to a weight's gradient is ``g``
times its contribution for ``g = 1`` (its *unit* contribution), and for a small
weight that is a reduction to a few tiles over the same tiles of X as the loss.

So when an op with a scalar output runs under differentiation
(``OpPrimitive.vjp_fwd``), :func:`run_loss` walks the graph below it, builds the
unit contributions of every small stored input that ``jax.grad`` differentiates
(the same lazy gradient nodes the backward would build, with ``g = 1``; an op's
``vjp_fwd`` marks the inputs it is not differentiated for as its node's
``fixed_inputs``, so a constant W of ``A @ W`` costs no reduction) and has the
planner join them to the loss's pass (:func:`jask.exec.driver.run_sharing_pass`); they come back as
small in-memory arrays. The backward's host functions then ask
:func:`cotangent_scale` whether the cotangent they got is ``g`` times a unit
cotangent of that walk, and :func:`known_contribution` answers a small input's
contribution as ``g`` times the stored one, with no pass. The walk goes through
an intermediate only where it has a single use (a cotangent summed from several
uses is a new node, never tagged), so anything else gets the ordinary lazy
gradient: a big input's gradient, a sum of uses, a custom op. In a
``jax.distributed`` run the processes share the loss's pass (each its share of
the entries, every member's partials gathered and folded alike everywhere).
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
import weakref

import jax.numpy as jnp
import numpy as np

from jask.exec.driver import run_sharing_pass
from jask.graph.nodes import OpNode, ScalarNode, StoredNode
from jask.graph.op import CustomOp
from jask.hijax.grad import gradient_node
from jask.hijax.residuals import recompute_bytes
from jask.hijax.sinks import store_value
from jask.plan.walk import collect, nbytes

# A stored input gets a unit contribution when it is at most this share of what the loss reads: its
# gradient is then a small reduction, and computing it in the loss pass costs no read.
SMALL_SHARE = 16
KEPT_LOSSES = 8     # walks kept for a backward still to come (each holds only small arrays)


@dataclasses.dataclass
class _Walk:
    """What one loss's walk found: the uses whose cotangent is a known multiple, and unit contributions.

    It holds weak references to the nodes whose ids its keys use: while they live, no other node has
    their ids, and it keeps no store alive.
    """

    refs: list                  # weak references to every node an op key names
    keys: dict                  # place in the walk (0: the loss) -> op key of the op node there
    through: dict               # (place, input position) -> the place of that single-use input
    units: dict                 # (place, input position) -> unit contribution (NumPy)

    def alive(self) -> bool:
        return all(r() is not None for r in self.refs)


_walks: collections.OrderedDict = collections.OrderedDict()     # root op key -> _Walk
_lock = threading.Lock()


def op_key(spec, inputs) -> tuple:
    """An op application's identity, alike in the forward graph and in its backward's arguments."""
    return spec, tuple(("scalar", str(n.dtype), n.value.item()) if isinstance(n, ScalarNode) else id(n)
                       for n in inputs)


def run_loss(node: OpNode):
    """The scalar ``node``'s value, with the unit contributions of its small inputs computed in its pass."""
    walk, candidates = _walk(node)
    value, got = run_sharing_pass(node, [c for _, c in candidates])
    if got:
        walk.units = {k: got[id(c)] for k, c in candidates if id(c) in got}
        with _lock:
            for key in [k for k, w in _walks.items() if not w.alive()]:
                del _walks[key]
            _walks[op_key(node.spec, node.inputs)] = walk
            while len(_walks) > KEPT_LOSSES:
                _walks.popitem(last=False)
    return value


def _walk(root: OpNode):
    """The walk below ``root`` and its candidates ``[(op key, position), unit contribution node]``."""
    _, edges = collect([root])
    small = max(recompute_bytes(root) // SMALL_SHARE, 1)
    walk, candidates = _Walk([], {}, {}, {}), []
    places = itertools.count(1)
    stack = [(root, ScalarNode(np.ones((), root.dtype)), 0)]
    while stack:
        node, cotangent, place = stack.pop()
        walk.keys[place] = op_key(node.spec, node.inputs)
        walk.refs += [weakref.ref(n) for n in node.inputs if not isinstance(n, ScalarNode)]
        if issubclass(node.spec.cls, CustomOp):
            continue
        # inputs jax.grad does not differentiate (OpPrimitive.vjp_fwd) need no unit gradient
        skip = {*getattr(node.spec.cls, "nondiff_inputs", ()), *getattr(node, "fixed_inputs", ())}
        for i, inp in enumerate(node.inputs):
            r = inp.resolved()
            if i in skip or r.shape == () or not jnp.issubdtype(r.dtype, jnp.inexact):   # bfloat16 too
                continue
            if isinstance(inp, OpNode) and inp.result is None and len(edges[id(inp)]) == 1:
                walk.through[(place, i)] = child = next(places)
                stack.append((inp, gradient_node(node.spec, i, (cotangent, *node.inputs)), child))
            elif isinstance(r, StoredNode) and nbytes(r) <= small:
                candidates.append(((place, i), gradient_node(node.spec, i, (cotangent, *node.inputs))))
    return walk, candidates


def cotangent_scale(spec, nodes):
    """``(g, walk, place)`` when the cotangent ``nodes[0]`` of this op application is ``g`` times the unit
    cotangent of the op node at ``place`` in a walk (the loss's own ``g``, or a tagged gradient node)."""
    g, key = nodes[0], op_key(spec, nodes[1:])
    if isinstance(g, ScalarNode):
        with _lock:
            walk = _walks.get(key)
        return (g.value, walk, 0) if walk is not None and walk.alive() else None
    scale = getattr(g, "unit_scale", None)
    return scale if scale is not None and scale[1].keys.get(scale[2]) == key else None


def known_contribution(nodes, i, scale):
    """Input ``i``'s gradient contribution, stored, when the walk computed its unit one; else None."""
    g, walk, place = scale
    unit = walk.units.get((place, i))
    if unit is None:
        return None
    return store_value((np.asarray(g, unit.dtype) * unit).astype(unit.dtype, copy=False), tag="grad")


def tag_through(node: OpNode, i, scale) -> OpNode:
    """``node`` (input ``i``'s lazy gradient), marked as ``g`` times its unit cotangent where the walk
    went through that input (a single use)."""
    g, walk, place = scale
    child = walk.through.get((place, i))
    if child is not None:
        node.unit_scale = (g, walk, child)
    return node
