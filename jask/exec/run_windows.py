"""Running a schedule's windows: one kernel call each (its programs joined), partials folded, tiles handed out.

Tiles read from disk arrive from the prefetcher in the schedule's read order
(already on the compute device where that is not the host). Every call runs on
its compute device explicitly: operands are placed there, or, for host tiles on
a CPU device, passed as they are with that device as JAX's default for the
call. So inside ``jit`` (where ``io_callback`` makes the host CPU JAX's default
device) the tile math still runs where the user asked.
"""
from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from jask.plan.fusion import FusedTileOp, _is_plain, _Same
from jask.kernels import xla
from jask.kernels.legality import WindowNotLegal
from jask.kernels.window import fold_partial, stacked_tiles_program, widen_dtype
from jask.exec.devices import calling_on
from jask.exec.joined_window import MAX_JOINED_CALLS, run_joined
from jask.exec.program_cache import Charged, ProgramCache


STRUCT_BYTES = 1024   # what the program cache charges for a remembered partial tile's shape
# A Pallas window of one program also runs as a joined window (jask.exec.joined_window): its tiles go
# to the device one by one and are stacked there, instead of stacked on the host first (a host copy of
# every tile) and sent as one array.
STACK_ON_DEVICE = True


def _identity_op(program):
    return program.root_op if _is_plain(program) else FusedTileOp(program)


class Kernels:
    """Window programs and fold functions of one backend, compiled once per program shape."""

    def __init__(self):
        self._programs = ProgramCache()   # bounded in bytes (jask.exec.program_cache); fold functions and
        # joined windows (jask.exec.joined_window) count against the same bound
        self.proven: set = set()   # stacked and joined programs whose first call compiled and ran

    @property
    def programs(self) -> ProgramCache:
        """The program cache (a test may swap ``_programs``; this always names the one in use)."""
        return self._programs

    def program(self, backend, call, carried=(), maybe=()):
        """``(program, how)``: the backend's window program over stacks (``"stacked"``), or the xla
        program over separate tiles (``"tiles"``; ``"fallback"`` where a Pallas backend cannot run
        this window on its platform). The xla program bakes in the window's index table, so it is
        cached per table; a Pallas program takes the table as an operand."""
        if not backend.separate_tiles:
            key = self._stacked_key(backend, call)
            entry = self._programs.get(key)
            if entry is None:
                try:
                    entry = (Charged(backend.compile_window(_identity_op(call.program), call.spec),
                                     self._programs, key), "stacked")
                except WindowNotLegal:
                    entry = (None, "refused")
                self._remember(key, entry)
            if entry[1] == "stacked":
                return entry
        key = ("xla-tiles", call.program.key(), call.spec, call.table.tobytes(), call.valid.tobytes(), carried, maybe)
        entry = self._programs.get(key)
        if entry is None:
            fn = xla.compile_window_tiles(_identity_op(call.program), call.spec, call.table, call.valid, carried, maybe)
            entry = (Charged(fn, self._programs, key), "tiles" if backend.separate_tiles else "fallback")
            self._remember(key, entry)
        return entry

    def how(self, backend, call) -> str:
        """How ``call`` runs inside a joined window: ``"tiles"`` (xla), ``"stacked"`` (the Pallas kernel), or
        ``"fallback"`` (xla, where the platform cannot run the kernel: planned so, or refused at a call)."""
        if backend.separate_tiles:
            return "tiles"
        entry = self._programs.get(self._stacked_key(backend, call))
        if entry is not None and entry[1] == "refused":
            return "fallback"
        return "stacked" if self._joinable(backend, call) is not None else "fallback"

    def body(self, backend, call, how):
        """``make(carried, maybe)``: ``call``'s program over separate tiles, run as ``how`` says (:meth:`how`)."""
        op = _identity_op(call.program)
        if how == "stacked":
            run = self._joinable(backend, call)
            return lambda carried, maybe: stacked_tiles_program(run, op, call.spec, call.table, call.valid,
                                                                carried, maybe)
        return lambda carried, maybe: xla.window_tiles_program(op, call.spec, call.table, call.valid, carried, maybe)

    def _joinable(self, backend, call):
        """The backend's window program of ``call`` to trace into a joined program, or None where the
        platform cannot run it (:class:`WindowNotLegal`). Kept apart from the programs called on their own:
        it is never compiled by itself, so it holds no executable."""
        key = ("joinable", *self._stacked_key(backend, call))
        entry = self._programs.get(key)
        if entry is None:
            try:
                entry = (backend.compile_window(_identity_op(call.program), call.spec),)
            except WindowNotLegal:
                entry = (None,)
            self._programs.put(key, entry, STRUCT_BYTES)
        return entry[0]

    def run_stacked(self, backend, call, program, args):
        """``program(*args)``, or None after refusing the program where its first call fails to compile.

        Legality planning (``jask.kernels.legality``) predicts what Mosaic and Triton
        accept, but their compilers can still refuse a kernel the plan allowed (on a
        TPU v5e: batched ``dot`` gradients). A program's first call is where it
        compiles, so an error there sends this program shape to the xla fallback for
        the rest of the process, with one warning naming the op and the error.
        Errors of later calls, and every error in interpret mode (CPU, where CI must
        see kernel bugs), are real failures and propagate.
        """
        key = self._stacked_key(backend, call)
        if key in self.proven or backend.interpret:
            return program(*args)
        try:
            out = program(*args)
        except Exception as err:   # noqa: BLE001 -- any compiler's refusal; the xla program's own errors propagate
            self._remember(key, (None, "refused"))
            name = getattr(call.program.root_op, "label", type(call.program.root_op).__name__)
            warnings.warn(f"jask: the {backend.name} backend could not compile the window program of {name} "
                          f"({type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}); this program shape runs "
                          "on the xla backend instead", RuntimeWarning, stacklevel=2)
            return None
        self.proven.add(key)
        return out

    @staticmethod
    def _stacked_key(backend, call):
        return (backend.name, call.program.key(), call.spec)

    def _remember(self, key, entry) -> None:
        if entry[0] is None:
            self._programs.put(key, entry, 0)   # a refusal holds no program
        else:
            self._programs.put(key, entry)      # charged its real bytes at its first call

    def acc_struct(self, call):
        """Shape and dtype of one of ``call``'s partial tiles (its block result, widened as the fold widens it)."""
        key = ("acc-struct", call.program.key(), call.spec)
        struct = self._programs.get(key)
        if struct is None:
            out = jax.eval_shape(_identity_op(call.program).forward_block, *call.spec.leaf_structs)
            struct = jax.ShapeDtypeStruct(out.shape, widen_dtype(out.dtype))
            self._programs.put(key, struct, STRUCT_BYTES)
        return struct

    def combine(self, root_op):
        key = _Same(root_op)
        fn = self._programs.get(key)
        if fn is None:
            fn = Charged(jax.jit(lambda acc, part: fold_partial(root_op, acc, part)), self._programs, key)
            self._programs.put(key, fn)
        return fn


kernels_cache = Kernels()


def _stack(values, dtype, device):
    """One operand of a call: the values of one leaf position stacked along a new leading axis."""
    if all(isinstance(v, np.ndarray) for v in values):
        host = values[0][None] if len(values) == 1 else np.stack(values)
        if host.dtype != dtype:
            host = host.astype(dtype)
        return jax.device_put(host, device)
    parts = [jax.device_put(jnp.asarray(v), device) for v in values]
    out = parts[0][None] if len(parts) == 1 else jnp.stack(parts)
    return out if out.dtype == dtype else out.astype(dtype)


def _operand(value, dtype, device):
    """One tile as an argument of an xla window program running on ``device``, in the leaf's dtype.

    A host tile already in the leaf's dtype goes to a CPU device's program as it is: the
    jitted call's own C++ path takes an aligned array without a copy, where a ``device_put``
    first cost ~110 us per tile in Python and dispatch (~300 us while the previous window
    ran), half the main thread's samples in a 4 MiB-tile pass (``sum`` of 512 MiB, 2026-12-06).
    Like a ``device_put``, the call holds the array until its program has run, so a pooled
    read buffer is not reused under it.
    """
    if device.platform == "cpu" and isinstance(value, np.ndarray) and value.dtype == dtype:
        return value
    x = jax.device_put(value, device)
    return x if x.dtype == dtype else x.astype(dtype)


@dataclasses.dataclass
class WindowRunner:
    """Executes windows of one pass; ``acc`` carries partial stage tiles from one window to the next."""

    backend: object
    device: object
    stage_ids: set
    count: object
    acc: dict = dataclasses.field(default_factory=dict)
    in_flight: list = dataclasses.field(default_factory=list)   # the previous window's kernel outputs
    finishing: set = dataclasses.field(default_factory=set)     # value keys of the stage tiles this window finishes
    placeholders: dict = dataclasses.field(default_factory=dict)   # (shape, dtype) -> zeros on the device
    kept: dict = dataclasses.field(default_factory=dict)   # value key -> a tile read earlier, for a later window

    def run(self, window, take_read):
        """Compute one window; returns ``[(node, idx, tile)]`` for its finished stage tiles.

        ``take_read(key)`` returns the next prefetched tile, which must be ``key``.
        """
        values = {key: self.kept.pop(key) for key in window.kept}
        for key, (tile_key, _) in zip(window.read_keys, window.reads):
            values[key] = take_read(tile_key)
        self.kept.update((key, values[key]) for key in window.keep)
        for key, (kind, node, shape) in window.constants.items():
            values[key] = np.asarray(node.value) if kind == "scalar" else np.zeros(shape, node.dtype)
        self.finishing = {("tile", id(node), idx) for node, idx in window.done}
        if len(window.calls) > 1 or (STACK_ON_DEVICE and not self.backend.separate_tiles):
            # the window is one program (jask.exec.joined_window)
            outputs = []
            for at in range(0, len(window.calls), MAX_JOINED_CALLS):
                calls = window.calls[at:at + MAX_JOINED_CALLS]
                outs = run_joined(self, calls, values, kernels_cache, _operand)
                outputs += outs if outs is not None else [self._call(call, values) for call in calls]
        else:
            outputs = [self._call(call, values) for call in window.calls]
        # JAX dispatches asynchronously and each call holds its input tiles until it has run: without a
        # wait, a pass whose results are not read back (a reduction) queues every window and its tiles
        # (a 0.5 GiB grad held 440 MiB over a 138 MiB projection). Wait for the window before this one:
        # at most two windows in flight, the next one's reads overlapping this one's kernels.
        jax.block_until_ready(self.in_flight)
        self.in_flight = outputs
        finished = []
        for node, idx in window.done:
            key = ("tile", id(node), idx)
            tile = self.acc.pop(key, None)
            if tile is None:
                tile = values.get(key)
            finished.append((node, idx, tile))
        return finished

    def _call(self, call, values):
        store = self.store_of(call, values)
        keys = [("tile", id(call.node), t) for t in call.tiles]
        carried, maybe, present = self.slots(call, keys, lambda key: key in store)
        program, how = kernels_cache.program(self.backend, call, carried, maybe)
        out = None
        if how == "stacked":
            stacks = [_stack([self._value(k, values) for k in row_keys], np.dtype(call.spec.leaf_dtypes[j]),
                             self.device) for j, row_keys in enumerate(call.rows)]
            out = kernels_cache.run_stacked(self.backend, call, program, (
                stacks, jax.device_put(call.table, self.device), jax.device_put(call.valid, self.device)))
            if out is None:   # refused by the platform's compiler: from now on the xla program
                program, how = kernels_cache.program(self.backend, call, carried, maybe)
            else:
                carried = ()   # a Pallas program folds nothing in: partials are combined below
                devices = out.devices()
        if out is None:
            args = [_operand(self._value(k, values), np.dtype(call.spec.leaf_dtypes[j]), self.device)
                    for j, row_keys in enumerate(call.rows) for k in row_keys]
            args += [store[keys[i]] if keys[i] in store else self.placeholder(call) for i in carried]
            args += [present] if maybe else []
            with calling_on(self.device):   # host tiles go where the call runs
                out = program(*args)
            devices = out[0].devices()
        self.count(kernel_calls=1, window_programs=1, xla_fallback_calls=int(how == "fallback"),
                   devices=frozenset(devices))
        combine = kernels_cache.combine(call.program.root_op)
        # Partials stay in the accumulator dtype; a consumer's stack casts them to the node's dtype.
        for i, key in enumerate(keys):
            part = out[i]
            store[key] = part if (key not in store or i in carried) else combine(store[key], part)
        return out

    def store_of(self, call, values):
        """Where ``call``'s output tiles go: the carried partials of a stage node, else this window's values."""
        return self.acc if id(call.node) in self.stage_ids else values

    def slots(self, call, keys, has):
        """``(carried, maybe, present)``: the output tiles whose accumulator the call takes, those of them that
        may be absent, and whether each of those is there (``has(key)``).

        A stage node's tile takes a slot when it has a partial or is not finished in this window, so
        every window of a reduction that spans windows has the same slots (one compiled program); its
        first window passes a placeholder (:meth:`placeholder`) with ``present`` False.
        """
        stage = id(call.node) in self.stage_ids
        carried, maybe, present = [], [], []
        for i, key in enumerate(keys):
            there = has(key)
            if there or (stage and key not in self.finishing):
                carried.append(i)
                if stage:
                    maybe.append(i)
                    present.append(there)
        return tuple(carried), tuple(maybe), np.array(present, np.bool_)

    def placeholder(self, call):
        """Zeros shaped as ``call``'s partial tile, on this runner's device, made once per shape and dtype."""
        struct = kernels_cache.acc_struct(call)
        key = (struct.shape, np.dtype(struct.dtype))
        if key not in self.placeholders:
            self.placeholders[key] = jax.device_put(np.zeros(struct.shape, struct.dtype), self.device)
        return self.placeholders[key]

    def _value(self, key, values):
        if key in values:
            return values[key]
        return self.acc[key]   # an earlier lockstep member's tile of this index
