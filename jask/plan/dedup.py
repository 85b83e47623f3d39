"""Equal op applications below a plan's roots computed once: their consumers read one of them.

Two nodes are equal when they apply the same op (its class and arguments: ``OpSpec`` equality) to equal
inputs at every position the op's forward reads (``live``): an input it only keeps for its gradient may
differ. ``logsumexp`` keeps a stop-gradient copy of itself as such an input, so a softmax gradient's
forward computed the same reduction twice (its result and that copy, 256 MiB more read at 8192^2); a
user's repeated subexpression (``x - x.mean()`` written twice) is another case. jnp under ``jit`` gets
this from XLA; jask's graph is its own.

Of each set of equal nodes the first in post-order is kept. Consumers are rewired onto it in place
(``node.inputs``): equal nodes hold the same value, so every graph that reads either reads the same numbers.
Roots stay (they are the run's results), computed on their own where an equal node came first. Custom ops,
whose ``forward`` may read its inputs as it likes, and nodes that know which of their inputs are not
differentiated (a loss's ``fixed_inputs``) are never merged.
"""
from __future__ import annotations

from jask.graph.op import CustomOp


def merge_equal_nodes(order, prepared, live, root_ids) -> int:
    """Rewire the consumers in ``order`` (post-order: producers first) of equal nodes onto the first of them
    (roots keep their own node); returns how many nodes were merged away."""
    group_of, members = {}, {}          # id(node) -> its set's number; number -> nodes, in order
    keys = {}
    for node in order:
        key = _key(node, live(node), group_of, prepared)
        if key is None:
            continue
        number = keys.setdefault(key, len(keys))
        group_of[id(node)] = number
        members.setdefault(number, []).append(node)
    # the first of each set in post-order: no other node it is rewired into can be among its inputs (equal nodes
    # may read each other through inputs their forward ignores: logsumexp reads its own detached copy)
    kept = {number: nodes[0] for number, nodes in members.items()}
    for node in order:
        inputs = tuple(kept[group_of[id(i.resolved())]] if id(i.resolved()) in group_of else i
                       for i in node.inputs)
        if any(a is not b for a, b in zip(inputs, node.inputs)):
            node.inputs = inputs
    return sum(1 for number, nodes in members.items() for n in nodes
               if n is not kept[number] and id(n) not in root_ids)


def _key(node, positions, group_of, prepared):
    """What makes two applications equal (inputs by their set's number), or None where they are never merged."""
    if isinstance(prepared[id(node)].op, CustomOp) or getattr(node, "fixed_inputs", None) is not None:
        return None
    inputs = []
    for p in positions:
        i = node.inputs[p].resolved()
        inputs.append((p, ("set", group_of[id(i)]) if id(i) in group_of else ("node", id(i))))
    key = (node.spec, node.shape, str(node.dtype), tuple(inputs))
    try:
        hash(key)
    except TypeError:
        return None
    return key
