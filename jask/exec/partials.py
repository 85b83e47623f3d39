"""Tiles of a reduction split between devices: each device's partial kept until all have theirs.

A pass spread over several devices (:func:`jask.exec.schedule.spread`) gives
each device a contiguous share of the pass. A reduction tile cut by a share
boundary (the single tile of a ``sum``, a ``dot`` tile whose K entries cross
it) is finished by every share holding some of its entries, each with a
partial on its own device. The partials are combined here, in share order, on
the first share's device: a copy per partial and one small fold, measured
cheaper than a collective for these few tile-sized values (see DESIGN.md).
"""
from __future__ import annotations

from collections import Counter

import jax


class Partials:
    """Hands out finished tiles; one listed as done by several shares waits for all of them."""

    def __init__(self, sched, devices, combine_of):
        """``sched``: ``[(share, Window)]``; ``combine_of(node)``: the jitted fold of ``node``'s op."""
        self.waiting = Counter((id(node), idx) for _, w in sched for node, idx in w.done)
        self.devices = devices
        self.combine_of = combine_of
        self.parts: dict = {}

    def finished(self, share, tiles):
        """Yield ``(node, idx, tile)`` of ``tiles`` (share ``share`` finished them) that are now complete."""
        for node, idx, tile in tiles:
            key = (id(node), idx)
            self.waiting[key] -= 1
            if self.waiting[key] == 0 and key not in self.parts:
                yield node, idx, tile
                continue
            if tile is not None:
                self.parts.setdefault(key, []).append((share, tile))
            if self.waiting[key] == 0:
                yield node, idx, self._combine(node, self.parts.pop(key, []))

    def _combine(self, node, parts):
        if not parts:
            return None
        parts.sort(key=lambda p: p[0])    # share order: the same sum every run
        device = self.devices[parts[0][0]]
        return fold_in_order((part if k == 0 else jax.device_put(part, device) for k, (_, part) in enumerate(parts)),
                             self.combine_of(node))


def fold_in_order(parts, combine):
    """``parts`` folded left to right with ``combine``, skipping missing ones (None); None if all are.

    The one fold of partials in a fixed order (shares, processes), so every run adds alike.
    """
    acc = None
    for part in parts:
        if part is not None:
            acc = part if acc is None else combine(acc, part)
    return acc
