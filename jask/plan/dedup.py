"""Equal op applications below a plan's roots computed once: their consumers read the first of them.

Two nodes are equal when they apply the same op (its class and arguments: ``OpSpec`` equality) to the same
inputs at every position the op's forward reads (``live``): an input it only keeps for its gradient may
differ. ``logsumexp`` keeps a stop-gradient copy of itself as such an input, so a softmax gradient's
forward computed the same reduction twice (its result and that copy, 256 MiB more read at 8192^2); a
user's repeated subexpression (``x - x.mean()`` written twice) is another case. jnp under ``jit`` gets
this from XLA; jask's graph is its own.

Consumers are rewired in place (``node.inputs``): equal nodes hold the same value, so every graph that
reads either reads the same numbers. Roots keep their node (they are the run's results; later equal nodes
read them), as do custom ops,
whose ``forward`` may read its inputs however it likes, and nodes that know which of their inputs are not
differentiated (a loss's ``fixed_inputs``).
"""
from __future__ import annotations

from jask.graph.nodes import OpNode
from jask.graph.op import CustomOp


def merge_equal_nodes(order, prepared, live, root_ids) -> int:
    """Rewire the consumers in ``order`` (post-order: producers first) of every node equal to an earlier one
    onto that one; returns how many nodes were merged away."""
    first, same_as = {}, {}
    for node in order:
        inputs = tuple(same_as.get(id(i.resolved()), i) for i in node.inputs)
        if any(a is not b for a, b in zip(inputs, node.inputs)):
            node.inputs = inputs
        if isinstance(prepared[id(node)].op, CustomOp) or getattr(node, "fixed_inputs", None) is not None:
            continue
        key = _key(node, live(node))
        if key is None:
            continue
        kept = first.setdefault(key, node)
        if kept is not node and id(node) not in root_ids:    # a root stays, but later equal nodes read it
            same_as[id(node)] = kept
    return len(same_as)


def _key(node: OpNode, positions):
    """What makes two applications equal, or None where the op's arguments cannot be compared."""
    try:
        key = (node.spec, node.shape, str(node.dtype), tuple((p, id(node.inputs[p].resolved())) for p in positions))
        hash(key)
    except TypeError:
        return None
    return key
