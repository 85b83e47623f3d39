"""All kernel calls of one window as ONE compiled program, on the ``xla`` backend.

A window holds several calls when it computes several nodes: a fused producer used by
more than one consumer, ragged edge tiles (a program shape each), the members of a
one-pass group (a loss and its weights' gradients) and their shared products. Run one
by one, each call is a dispatch, each compiles on its own (on a TPU v5e ~3 s per
program of the grad benchmark), and a value passed from one call to the next is
written to memory between them. Joined, XLA sees the whole window: a value used only
inside it (``X @ W1`` of the two-layer MSE) never leaves the program, the same tile
read by several calls is one argument, and a window is one call, as the executor's
invariant asks.

At most :data:`MAX_JOINED_CALLS` calls are joined into one program (a window of more runs
several), so a program's size stays bounded as each call's is (``MAX_WINDOW_ENTRIES``).

Only the ``xla`` backend's per-tile programs (:func:`jask.kernels.xla.window_tiles_program`)
are joined: a Pallas window is one ``pallas_call`` per program shape, and its stacks
are built per call.
"""
from __future__ import annotations

import jax
import numpy as np

from jask.kernels import xla
from jask.exec.devices import calling_on
from jask.exec.program_cache import Charged

MAX_JOINED_CALLS = 16


class _Recipe:
    """Where each argument of each call comes from: an outside array, or an earlier call's result."""

    def __init__(self):
        self.outside = []         # arrays passed in, each once
        self._where = {}          # (value key, dtype) -> index into outside
        self.made = {}            # value key -> (call index, result index) of this window's results
        self.calls = []           # per call: (carried, maybe, ((kind, a, b, dtype), ...))
        self.present = []         # every call's accumulator-present flags, in call order

    def outside_arg(self, key, make):
        if key not in self._where:
            self._where[key] = len(self.outside)
            self.outside.append(make())
        return ("outside", self._where[key], 0, None)

    def structure(self):
        return tuple(self.calls)


def _plan(runner, calls, values, operand):
    """The recipe of ``calls``: each operand an outside array or an earlier call's result, cast as needed."""
    recipe = _Recipe()
    for c, call in enumerate(calls):
        store = runner.acc if id(call.node) in runner.stage_ids else values
        args = []
        for j, row_keys in enumerate(call.rows):
            dtype = np.dtype(call.spec.leaf_dtypes[j])
            for k in row_keys:
                if k in recipe.made:
                    args.append(("made", *recipe.made[k], dtype))
                else:
                    args.append(recipe.outside_arg(
                        (k, dtype), lambda k=k, d=dtype: operand(runner._value(k, values), d, runner.device)))
        keys = [("tile", id(call.node), t) for t in call.tiles]
        carried, maybe, present = runner.slots(call, keys, lambda key: key in recipe.made or key in store)
        for i in carried:
            if keys[i] in recipe.made:
                args.append(("made", *recipe.made[keys[i]], None))
            elif keys[i] in store:
                args.append(recipe.outside_arg((keys[i], None), lambda key=keys[i]: store[key]))
            else:
                zeros = runner.placeholder(call)   # one per shape and dtype: the same array for every call
                args.append(recipe.outside_arg(("placeholder", id(zeros)), lambda zeros=zeros: zeros))
        recipe.calls.append((carried, maybe, tuple(args)))
        recipe.present.extend(present)
        for i, key in enumerate(keys):
            recipe.made[key] = (c, i)
    return recipe


def _compile(calls, recipe, identity_op):
    bodies = [xla.window_tiles_program(identity_op(call.program), call.spec, call.table, call.valid, carried, maybe)
              for call, (carried, maybe, _) in zip(calls, recipe.calls)]
    wiring, at = [], 0
    for _, maybe, args in recipe.calls:
        wiring.append((args, at, at + len(maybe)))
        at += len(maybe)

    def program(*outside):
        results = []
        for body, (args, start, stop) in zip(bodies, wiring):
            flat = []
            for kind, a, b, dtype in args:
                if kind == "outside":
                    flat.append(outside[a])
                else:
                    x = results[a][b]
                    flat.append(x if dtype is None or x.dtype == dtype else x.astype(dtype))
            if stop > start:
                flat.append(outside[-1][start:stop])   # this call's present flags
            results.append(body(*flat))
        return results

    return jax.jit(program)


def run_joined(runner, calls, values, cache, operand, identity_op):
    """Run ``calls`` (one window's, in dependency order) as one program; store their tiles as ``_call`` does.

    Returns the list of each call's results.
    """
    recipe = _plan(runner, calls, values, operand)
    key = ("xla-joined", tuple((call.program.key(), call.spec, call.table.tobytes(), call.valid.tobytes())
                               for call in calls), recipe.structure())
    program = cache.get(key)
    if program is None:
        program = Charged(_compile(calls, recipe, identity_op), cache, key)
        cache.put(key, program)
    flags = [np.array(recipe.present, np.bool_)] if recipe.present else []
    with calling_on(runner.device):
        outs = program(*recipe.outside, *flags)
    for call, out in zip(calls, outs):
        store = runner.acc if id(call.node) in runner.stage_ids else values
        for i, t in enumerate(call.tiles):
            store[("tile", id(call.node), t)] = out[i]
    runner.count(kernel_calls=1, devices=frozenset(outs[0][0].devices()))
    return outs
