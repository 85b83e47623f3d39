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


class TileReach:
    """What pulling one given tile of a node evaluates: :func:`leaves_and_ops` following the index maps.

    A tile may reach less than the whole fused tree: a padded piece of a
    ``concatenate`` has no entries (a zero tile, nothing read) at the tiles of
    the other pieces, so each output tile reads one piece where the tree has
    them all. ``entries(node, block)`` is the node's index map at ``block``.
    """

    def __init__(self, fused_ids, live, entries):
        self.fused_ids, self.live, self.entries = fused_ids, live, entries

    def __call__(self, node: OpNode, block) -> tuple[list, list]:
        """Distinct leaf inputs and op nodes evaluated while pulling tile ``block`` of ``node``."""
        leaves, ops, seen = {}, {id(node): node}, set()
        stack = [(node, tuple(block))]
        while stack:
            current, at = stack.pop()
            if (id(current), at) in seen:
                continue
            seen.add((id(current), at))
            positions = self.live(current)
            for entry in self.entries(current, at):
                for p in positions:
                    inp = current.inputs[p].resolved()
                    if isinstance(inp, OpNode) and id(inp) in self.fused_ids:
                        ops[id(inp)] = inp
                        stack.append((inp, tuple(entry[p])))
                    elif not isinstance(inp, ScalarNode):
                        leaves[id(inp)] = inp
        return list(leaves.values()), list(ops.values())


def nbytes(node: Node) -> int:
    return int(np.prod(node.shape, dtype=np.int64)) * node.dtype.itemsize
