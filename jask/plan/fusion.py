"""Fused per-tile programs: a consumer's kernel that computes its fused producers too.

When the planner fuses a producer into its consumer (see ``_should_fuse`` in
:mod:`jask.plan.planner`), one entry of the consumer's output tile needs a
tile of the producer first. Instead of dispatching one kernel per op,
:func:`entry_program` walks the fused producers below one entry, composing
index maps as it goes (the block the consumer asks of a producer is that
producer's output index, and the producer's own ``index_map`` of it names the
blocks below), and writes a straight-line program:

* ``leaves``: the distinct tiles the entry needs from outside the program, in
  the order they are first met: stored tiles, zero tiles, scalars, placeholders
  for inputs an op never reads, and tiles of fused producers that fold several
  entries themselves (a ``dot`` feeding an epilogue), which the executor
  computes with their own program;
* ``steps``: the single-entry producers, each applied to earlier leaves or
  steps and cast to its node's dtype (as a stored intermediate would be);
* the consumer's own ``forward_block`` on top.

:class:`FusedTileOp` wraps such a program as an ordinary op whose
``forward_block`` takes the leaf tiles, so every backend compiles the whole
chain as one kernel (one jitted function on ``xla``, one ``pallas_call`` on
``pallas``), compiled once per program shape and kept in a small cache.
A (node, block) reached twice within one entry is computed and read once.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from jask.graph.nodes import Node, OpNode, ScalarNode

LEAF, STEP = 0, 1        # where an operand of a step lives: the leaf list or an earlier step


def live_positions(node: OpNode, op) -> list[int]:
    """Input positions whose values the op reads (``op.unused_inputs`` lists the others)."""
    unused = getattr(op, "unused_inputs", ())
    return [p for p in range(len(node.inputs)) if p not in unused]


def entries_of(prep, node: OpNode, out_idx):
    """``prep.op.index_map(out_idx)`` checked and normalized to tuples of int tuples (``()`` for scalars)."""
    entries = prep.op.index_map(tuple(out_idx))
    try:
        entries = [tuple(tuple(int(i) for i in b) if not isinstance(inp.resolved(), ScalarNode) else ()
                         for b, inp in zip(e, node.inputs)) if len(e) == len(node.inputs) else None
                   for e in entries]
    except TypeError as err:
        raise ValueError(f"{prep.name}.index_map({tuple(out_idx)}) must return a list of tuples of "
                         f"block indices, got {entries!r}") from err
    if any(e is None for e in entries):
        raise ValueError(f"{prep.name}.index_map({tuple(out_idx)}) must give one block index per "
                         f"input ({len(node.inputs)}) in every entry")
    return entries


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One tile a fused program takes from outside.

    ``kind`` is ``"tile"`` (pulled with ``Executor.tile_of``: stored, zeros, a
    multi-entry producer, or a producer the window computes once for several
    consumers: ``Plan.shared_ids``), ``"scalar"`` (a traced scalar operand) or
    ``"placeholder"`` (zeros shaped like a block the op never reads).
    """

    node: Node
    block: tuple
    kind: str


@dataclasses.dataclass
class EntryProgram:
    """One entry of one output tile as a straight-line program over leaf tiles."""

    leaves: list[Leaf]
    steps: list[tuple]    # (op, operand refs, dtype, block shape, name) per fused single-entry producer
    root_op: object
    root_refs: tuple
    producers: int        # fused producers inlined (0: the consumer alone)

    def key(self):
        """What the compiled kernel depends on: the ops, how they are wired, the leaf count."""
        return (len(self.leaves), _Same(self.root_op), self.root_refs,
                tuple((_Same(op), refs, dtype.str, shape) for op, refs, dtype, shape, _ in self.steps))


def entry_program(p, node: OpNode, entry) -> EntryProgram:
    """The program computing one entry of ``node`` under plan ``p``, its fused producers inlined."""
    leaves, steps, slots = [], [], {}

    def operand(inp: Node, block, used: bool):
        inp = inp.resolved()
        if not used:
            return leaf(Leaf(inp, tuple(block), "placeholder"))
        if isinstance(inp, ScalarNode):
            return leaf(Leaf(inp, (), "scalar"))
        if isinstance(inp, OpNode) and id(inp) in p.fused_ids and id(inp) not in p.shared_ids:
            prep = p.prepared[id(inp)]
            inner = entries_of(prep, inp, block)
            if len(inner) == 1:
                key = (id(inp), tuple(block))
                if key not in slots:
                    refs = operands(inp, prep, inner[0])
                    shape = tuple(min((i + 1) * p.tile, d) - i * p.tile for i, d in zip(block, inp.shape))
                    steps.append((prep.op, refs, np.dtype(inp.dtype), shape, prep.name))
                    slots[key] = (STEP, len(steps) - 1)
                return slots[key]
        return leaf(Leaf(inp, tuple(block), "tile"))

    def leaf(lf: Leaf):
        key = (lf.kind, id(lf.node), lf.block)
        if key not in slots:
            leaves.append(lf)
            slots[key] = (LEAF, len(leaves) - 1)
        return slots[key]

    def operands(n: OpNode, prep, e):
        live = set(live_positions(n, prep.op))
        return tuple(operand(i, b, pos in live) for pos, (i, b) in enumerate(zip(n.inputs, e)))

    prep = p.prepared[id(node)]
    root_refs = operands(node, prep, entry)
    return EntryProgram(leaves, steps, prep.op, root_refs, len(steps))


class FusedTileOp:
    """A fused program as an op: ``forward_block(*leaf_tiles)`` runs the steps, then the consumer."""

    unused_inputs = ()

    def __init__(self, program: EntryProgram):
        self.steps = list(program.steps)
        self.root_op = program.root_op
        self.root_refs = program.root_refs

    @property
    def label(self) -> str:
        """How errors name this kernel: the fused ops in order, e.g. ``sub+square+sum``."""
        return "+".join([step[4] for step in self.steps] + [type(self.root_op).__name__.lower()])

    def forward_block(self, *leaves):
        done = []

        def value(ref):
            where, i = ref
            return leaves[i] if where == LEAF else done[i]

        for op, refs, dtype, shape, name in self.steps:
            out = jnp.asarray(op.forward_block(*map(value, refs)))
            if out.shape != shape:
                raise ValueError(f"{name}.forward_block produced a tile of shape {out.shape}, expected {shape}")
            done.append(out.astype(dtype))
        return self.root_op.forward_block(*map(value, self.root_refs))

    def combine(self, acc, partial):
        return self.root_op.combine(acc, partial)

    def reblocked(self, shape):
        """This program on blocks of ``shape``: for a pointwise program run on inner blocks of its tiles."""
        other = object.__new__(FusedTileOp)
        other.steps = [(op, refs, dtype, tuple(shape), name) for op, refs, dtype, _, name in self.steps]
        other.root_op, other.root_refs = self.root_op, self.root_refs
        return other


class _Same:
    """Hashes and compares an op by identity (user ops may define ``__eq__`` or be unhashable)."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return isinstance(other, _Same) and other.obj is self.obj


def _is_plain(program: EntryProgram) -> bool:
    """No producer inlined and each leaf feeds the op's positions in order: the op's own kernel will do."""
    return not program.steps and program.root_refs == tuple((LEAF, i) for i in range(len(program.leaves)))
