"""All kernel calls of one window as ONE compiled program.

A window holds several calls when it computes several nodes: a fused producer used by
more than one consumer, ragged edge tiles (a program shape each), the members of a
one-pass group (a loss and its weights' gradients) and their shared products. Run one
by one, each call is a dispatch, each compiles on its own (on a TPU v5e ~3 s per
program of the grad benchmark), and a value passed from one call to the next is
written to memory between them. Joined, XLA sees the whole window: a value used only
inside it (``X @ W1`` of the two-layer MSE) never leaves the program, the same tile
read by several calls is one argument, and a window is one call, as the executor's
invariant asks.

Every member takes its tiles as separate arguments. On ``xla`` a member is
:func:`jask.kernels.xla.window_tiles_program`; on a Pallas backend it is the member's
``pallas_call`` with its tiles stacked inside the program
(:func:`jask.kernels.window.stacked_tiles_program`), or the xla program where the
platform cannot run that kernel (the ``xla`` fallback). So on a TPU a one-pass group's
window is one program holding one kernel per member.

At most :data:`MAX_JOINED_CALLS` calls are joined into one program (a window of more runs
several), so a program's size stays bounded as each call's is (``MAX_WINDOW_ENTRIES``).
"""
from __future__ import annotations

import warnings

import jax
import numpy as np

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
        store = runner.store_of(call, values)
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


def _compile(calls, recipe, bodies):
    """The joined program: each call's body (``bodies[c](carried, maybe)``) fed as the recipe says."""
    bodies = [body(carried, maybe) for body, (carried, maybe, _) in zip(bodies, recipe.calls)]
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


def run_joined(runner, calls, values, kernels, operand):
    """Run ``calls`` (one window's, in dependency order) as one program; store their tiles as ``_call`` does.

    Returns the list of each call's results, or None where a Pallas platform's compiler refused the
    joined program at its first call (the caller then runs the calls one by one, which finds the
    member it refuses; see ``Kernels.run_stacked``).
    """
    backend, cache = runner.backend, kernels.programs
    hows = tuple(kernels.how(backend, call) for call in calls)
    recipe = _plan(runner, calls, values, operand)
    key = ("joined", backend.name, hows,
           tuple((call.program.key(), call.spec, call.table.tobytes(), call.valid.tobytes()) for call in calls),
           recipe.structure())
    entry = cache.get(key)
    if entry is None:
        bodies = [kernels.body(backend, call, how) for call, how in zip(calls, hows)]
        entry = (Charged(_compile(calls, recipe, bodies), cache, key), "joined")
        cache.put(key, entry)
    if entry[1] == "refused":
        return None
    flags = [np.array(recipe.present, np.bool_)] if recipe.present else []
    try:
        with calling_on(runner.device):
            outs = entry[0](*recipe.outside, *flags)
    except Exception as err:   # noqa: BLE001 -- a platform compiler's refusal, as in Kernels.run_stacked
        if backend.interpret or "stacked" not in hows or key in kernels.proven:
            raise
        cache.put(key, (None, "refused"), 0)
        warnings.warn(f"jask: the {backend.name} backend could not compile a joined window program "
                      f"({type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}); its calls run one "
                      "by one", RuntimeWarning, stacklevel=3)
        return None
    kernels.proven.add(key)
    for call, out in zip(calls, outs):
        store = runner.store_of(call, values)
        for i, t in enumerate(call.tiles):
            store[("tile", id(call.node), t)] = out[i]
    runner.count(kernel_calls=1, window_programs=len(calls), xla_fallback_calls=hows.count("fallback"),
                 devices=frozenset(outs[0][0].devices()))
    return outs
