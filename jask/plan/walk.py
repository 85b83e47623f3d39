"""Walking the lazy graph below a plan's roots: post-order stages, consumers, what one tile pulls."""
from __future__ import annotations

from collections import Counter, defaultdict

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

    def __call__(self, node: OpNode, block) -> tuple[list, list, dict]:
        """Distinct leaf inputs and op nodes evaluated while pulling tile ``block`` of ``node``, and per leaf id
        the most tiles of it that one entry of ``node`` holds at once: a fused producer with several entries
        per tile (a strided slice) puts every one of its input tiles in its consumer's entry, and a window
        holds at least one entry whole."""
        leaves, ops, held = {}, {id(node): node}, {}
        for top in self.entries(node, tuple(block)):
            tiles, seen, stack = set(), set(), [(node, top)]
            while stack:
                current, entry = stack.pop()
                for p in self.live(current):
                    inp, at = current.inputs[p].resolved(), tuple(entry[p])
                    if isinstance(inp, OpNode) and id(inp) in self.fused_ids:
                        ops[id(inp)] = inp
                        if (id(inp), at) not in seen:
                            seen.add((id(inp), at))
                            stack.extend((inp, e) for e in self.entries(inp, at))
                    elif not isinstance(inp, ScalarNode):
                        leaves[id(inp)] = inp
                        tiles.add((id(inp), at))
            for leaf_id, count in Counter(i for i, _ in tiles).items():
                held[leaf_id] = max(held.get(leaf_id, 0), count)
        return list(leaves.values()), list(ops.values()), held

    def one_tile_each(self, node: OpNode) -> bool:
        """Whether an entry of ``node`` holds at most one tile of each leaf, at every tile: no fused producer
        below it has several entries per tile (checked at its first tile), and no leaf or fused op is
        reached along two paths. Then a tile reaching every node below bounds all tiles."""
        paths, stack = Counter(), [node]
        while stack:
            current = stack.pop()
            for p in self.live(current):
                inp = current.inputs[p].resolved()
                if isinstance(inp, ScalarNode):
                    continue
                paths[id(inp)] += 1
                if isinstance(inp, OpNode) and id(inp) in self.fused_ids and paths[id(inp)] == 1:
                    if len(self.entries(inp, (0,) * inp.ndim)) > 1:
                        return False
                    stack.append(inp)
        return all(c == 1 for c in paths.values())


def nbytes(node: Node) -> int:
    return int(np.prod(node.shape, dtype=np.int64)) * node.dtype.itemsize
