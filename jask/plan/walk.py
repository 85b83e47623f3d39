"""Walking the lazy graph below a plan's roots: post-order stages, consumers, what one tile pulls."""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from jask.graph.nodes import Node, OpNode, ScalarNode


def collect(roots, live=None):
    """Post-order list of pending OpNodes below ``roots`` and, per node, the (consumer, position) edges.

    ``live(node)`` gives the input positions to follow (default: all).
    """
    order, edges, seen = [], defaultdict(list), set()
    stack = [(r.resolved(), False) for r in roots]
    while stack:
        node, expanded = stack.pop()
        if not isinstance(node, OpNode) or node.result is not None:
            continue
        if expanded:
            if id(node) not in seen:
                seen.add(id(node))
                order.append(node)
            continue
        if id(node) in seen:
            continue
        stack.append((node, True))
        positions = live(node) if live else range(len(node.inputs))
        for p in positions:
            inp = node.inputs[p].resolved()
            edges[id(inp)].append((node, p))
            if isinstance(inp, OpNode) and inp.result is None and id(inp) not in seen:
                stack.append((inp, False))
    return order, edges


def leaves_and_ops(node: OpNode, fused_ids, live):
    """Distinct leaf inputs and op nodes evaluated while pulling one tile of ``node``."""
    leaves, ops, stack, seen = [], [node], [node], {id(node)}
    while stack:
        current = stack.pop()
        for p in live(current):
            inp = current.inputs[p].resolved()
            if id(inp) in seen:
                continue
            seen.add(id(inp))
            if isinstance(inp, OpNode) and id(inp) in fused_ids:
                ops.append(inp)
                stack.append(inp)
            elif not isinstance(inp, ScalarNode):
                leaves.append(inp)
    return leaves, ops


def nbytes(node: Node) -> int:
    return int(np.prod(node.shape, dtype=np.int64)) * node.dtype.itemsize
