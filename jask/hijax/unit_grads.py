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
an intermediate once the cotangent of each of its uses is known (consumers come
before producers): a value used twice, as the logits of a softmax cross-entropy
(``logsumexp(z) - sum(z * y)``), gets the sum of its uses' unit cotangents, and
the backward's sum of those uses (a :class:`~jask.hijax.grad.CotangentSum` of
tagged parts) is known to be ``g`` times it. Anything else gets the ordinary lazy
gradient: a big input's gradient, a value a custom op also uses. In a
``jax.distributed`` run the processes share the loss's pass (each its share of
the entries, every member's partials gathered and folded alike everywhere).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import threading
import weakref

import jax.numpy as jnp
import numpy as np

from jask.exec.driver import run_sharing_pass
from jask.graph.nodes import OpNode, ScalarNode, StoredNode
from jask.graph.op import CustomOp
from jask.hijax.grad import CotangentSum, cotangent_sum_node, gradient_node
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
    through: dict               # (place, input position) -> the place of that input
    units: dict                 # (place, input position) -> unit contribution (NumPy)
    uses: dict = dataclasses.field(default_factory=dict)   # place -> its uses' (place, position)s

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
    """The walk below ``root`` and its candidates ``[(op key, position), unit contribution node]``.

    Consumers come before producers (the reverse of ``collect``'s post-order), so a node is reached once
    every use that sends it a cotangent is known; it is walked when all of those are walked ops."""
    order, edges = collect([root])
    small = max(recompute_bytes(root) // SMALL_SHARE, 1)
    walk, candidates = _Walk([], {}, {}, {}), []
    places, counter = {id(root): 0}, itertools.count(1)
    parts = collections.defaultdict(list)        # id(node) -> the unit cotangents its walked uses send
    parts[id(root)].append(ScalarNode(np.ones((), root.dtype)))
    flows, walked = {id(root)}, set()            # nodes a nonzero cotangent reaches; nodes walked
    for node in reversed(order):
        uses = [(c, p) for c, p in edges[id(node)] if id(c) in flows and p in _differentiated(c)]
        if node is not root:
            if not uses:
                continue
            flows.add(id(node))
            if any(id(c) not in walked for c, _ in uses):
                continue                             # part of its cotangent comes from outside the walk
        place = places[id(node)]
        walk.uses[place] = frozenset((places[id(c)], p) for c, p in uses)
        walk.keys[place] = op_key(node.spec, node.inputs)
        walk.refs += [weakref.ref(n) for n in node.inputs if not isinstance(n, ScalarNode)]
        if issubclass(node.spec.cls, CustomOp):
            continue
        walked.add(id(node))
        cotangent = functools.reduce(cotangent_sum_node, parts.pop(id(node)))
        for i in _differentiated(node):
            inp = node.inputs[i]
            r = inp.resolved()
            if isinstance(inp, OpNode) and inp.result is None:
                walk.through[(place, i)] = places.setdefault(id(inp), next(counter))
                parts[id(inp)].append(gradient_node(node.spec, i, (cotangent, *node.inputs)))
            elif isinstance(r, StoredNode) and nbytes(r) <= small:
                candidates.append(((place, i), gradient_node(node.spec, i, (cotangent, *node.inputs))))
    return walk, candidates


def _differentiated(node: OpNode) -> list:
    """Input positions a cotangent of ``node`` flows to: inexact array inputs that ``jax.grad`` differentiates
    (``OpPrimitive.vjp_fwd`` marks the others ``fixed_inputs``), none from an integer or bool output."""
    if not jnp.issubdtype(node.dtype, jnp.inexact):
        return []
    skip = {*getattr(node.spec.cls, "nondiff_inputs", ()), *getattr(node, "fixed_inputs", ())}
    return [i for i, inp in enumerate(node.inputs) if i not in skip and inp.shape != ()
            and jnp.issubdtype(inp.dtype, jnp.inexact)]     # bfloat16 too


def cotangent_scale(spec, nodes):
    """``(g, walk, place)`` when the cotangent ``nodes[0]`` of this op application is ``g`` times the unit
    cotangent of the op node at ``place`` in a walk (the loss's own ``g``, or a tagged gradient node)."""
    g, key = nodes[0], op_key(spec, nodes[1:])
    if isinstance(g, ScalarNode):
        with _lock:
            walk = _walks.get(key)
        return (g.value, walk, 0) if walk is not None and walk.alive() else None
    scale = getattr(g, "unit_scale", None) or _summed(g)
    return scale if scale is not None and scale[1].keys.get(scale[2]) == key else None


def _summed(g):
    """``(g, walk, place)`` when ``g`` sums tagged parts from every use of the node at ``place``."""
    parts = _parts(g)
    return parts[0] if parts is not None and parts[1] == parts[0][1].uses.get(parts[0][2]) else None


def _parts(g):
    """``((g, walk, place), uses)`` when ``g`` is a tagged part or a sum of distinct ones of one node."""
    part = getattr(g, "unit_part", None)
    if part is not None:
        return part[:3], frozenset({part[3]})
    if not (isinstance(g, OpNode) and g.spec.cls is CotangentSum and len(g.inputs) == 2):
        return None
    a, b = (_parts(i) for i in g.inputs)
    if a is None or b is None or a[0][1] is not b[0][1] or a[0][2] != b[0][2] or a[0][0] != b[0][0] or a[1] & b[1]:
        return None
    return a[0], a[1] | b[1]


def known_contribution(nodes, i, scale):
    """Input ``i``'s gradient contribution, stored, when the walk computed its unit one; else None."""
    g, walk, place = scale
    unit = walk.units.get((place, i))
    if unit is None:
        return None
    return store_value((np.asarray(g, unit.dtype) * unit).astype(unit.dtype, copy=False), tag="grad")


def tag_through(node: OpNode, i, scale) -> OpNode:
    """``node`` (input ``i``'s lazy gradient), marked where the walk went through that input: as ``g`` times
    its unit cotangent (its only use), or as the part of it this use sends (summed by JAX with the others)."""
    g, walk, place = scale
    child = walk.through.get((place, i))
    uses = walk.uses.get(child)
    if uses is not None and len(uses) == 1:
        node.unit_scale = (g, walk, child)
    elif uses is not None:
        node.unit_part = (g, walk, child, (place, i))
    return node
