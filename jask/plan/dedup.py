"""Equal op applications below a plan's roots computed once: their consumers read one of them.

Two nodes are equal when they apply the same op (its class and arguments: ``OpSpec`` equality) to equal
inputs at every position the op's forward reads (``live``): an input it only keeps for its gradient may
differ. ``logsumexp`` keeps a stop-gradient copy of itself as such an input, so a softmax gradient's
forward computed the same reduction twice (its result and that copy, 256 MiB more read at 8192^2); a
user's repeated subexpression (``x - x.mean()`` written twice) is another case. jnp under ``jit`` gets
this from XLA; jask's graph is its own.

Of each set of equal nodes the first in post-order is kept. Consumers are rewired onto it in place
(``node.inputs``): equal nodes hold the same value, so every graph that reads either reads the same numbers.
Roots stay (they are the run's results), computed on their own where an equal node came first. A node merged
away takes the stored result of the node it equals once that is stored (``OpNode.stands_for``): whoever still
holds it directly (a gradient's residual, outside this run's graph) then reads that instead of recomputing
it. Custom ops,
whose ``forward`` may read its inputs as it likes, and nodes that know which of their inputs are not
differentiated (a loss's ``fixed_inputs``) are never merged.
"""
from __future__ import annotations

from jask.graph.op import CustomOp


def merge_equal_nodes(order, prepared, live, root_ids, stored_later=frozenset()) -> dict:
    """Rewire the consumers in ``order`` (post-order: producers first) of equal nodes onto the first of them.

    Roots keep their own node, except those in ``stored_later`` (nodes a run stores only to scratch for a
    later one, :func:`jask.exec.driver.store_with_next_run`): such a root equal to an earlier node is
    replaced by that node, which then stands for it. Returns ``{id(root): replacement}`` for those."""
    kept = {}           # id(node) -> the first node equal to it in post-order (itself for that one)
    first = {}          # key -> that first node
    for node in order:
        key = _key(node, live(node), kept, prepared)
        if key is not None:
            kept[id(node)] = first.setdefault(key, node)
    # the first of each set in post-order: no other node it is rewired into can be among its inputs (equal nodes
    # may read each other through inputs their forward ignores: logsumexp reads its own detached copy)
    replaced = {}
    for node in order:
        inputs = tuple(kept.get(id(i.resolved()), i) for i in node.inputs)
        if any(a is not b for a, b in zip(inputs, node.inputs)):
            node.inputs = inputs
        k = kept.get(id(node), node)
        if k is node or (id(node) in root_ids and id(node) not in stored_later):
            continue                    # a root is computed in this run: it keeps its inputs
        k.stands_for(node)
        if id(node) in root_ids:
            replaced[id(node)] = k
    return replaced


def _key(node, positions, kept, prepared):
    """What makes two applications equal (inputs by the first node equal to them), or None where they are
    never merged."""
    if isinstance(prepared[id(node)].op, CustomOp) or getattr(node, "fixed_inputs", None) is not None:
        return None
    inputs = []
    for p in positions:
        i = node.inputs[p].resolved()
        inputs.append((p, id(kept.get(id(i), i))))
    key = (node.spec, node.shape, str(node.dtype), tuple(inputs))
    try:
        hash(key)
    except TypeError:
        return None
    return key
