"""Running a sink's computation: plan it, execute it, hand each root to its sink.

A sink calls :func:`run` with one or more root nodes; :func:`make_plan` plans
them (:mod:`jask.plan.planner`, given what each plan would read), and the
:class:`~jask.exec.executor.Executor` computes each stage window by window.
"""
from __future__ import annotations

import gc
import itertools
import threading
import weakref

import jax
import numpy as np

from jask import kernels
from jask.exec import events, multihost
from jask.exec.devices import compute_device, compute_devices
from jask.exec.executor import Executor, pass_devices, region_bytes, usable_devices, window_limit
from jask.exec.run_windows import kernels_cache
from jask.exec.schedule import spread, window_input_bytes
from jask.exec.sinks import MemorySink, ScratchSink
from jask.graph.nodes import Node, OpNode, StoredNode
from jask.graph.op import CustomOp
from jask.graph.tiling import grid, region
from jask.io import malloc
from jask.plan.memory import human_bytes
from jask.plan.planner import Plan, plan
from jask.plan.walk import nbytes


RELEASE_AFTER_BYTES = 16 << 20     # after a run projected at this or more, return freed memory (run())


def make_plan(roots, stored_later=()) -> Plan:
    """The plan :func:`run` would execute for ``roots`` (the planner, told what each plan reads), with
    ``stored_later`` among them: stored to scratch only for a later run (:func:`store_with_next_run`)."""
    return plan(roots, lambda p: planned_io(p)[0], stored_later)


def explain(nodes) -> str:
    """The plan a sink would run for these nodes: tile edge, stages, fused ops, projected memory, I/O."""
    p = make_plan(nodes)
    read, written, n_windows, largest = _planned(p)
    devices = pass_devices(p, compute_devices())
    where = str(devices[0]) if len(devices) == 1 else f"{len(devices)} devices ({', '.join(map(str, devices))})"
    return (p.describe(largest) + f"\n  {n_windows} window{'s' * (n_windows != 1)} of at most "
            f"{human_bytes(largest)} (limit {human_bytes(window_limit(p, len(devices)))}) on {where} "
            f"({kernels.backend_name()} kernels); reads {human_bytes(read)}, writes {human_bytes(written)}")


def planned_io(p: Plan) -> tuple[int, int, int]:
    """Bytes the plan reads from stored arrays and writes for its stages, and its windows (from its schedule).

    A custom op's ``forward`` reads as it likes: counted as reading each input once. A root already
    stored is read once by its sink (a copy writes no computed bytes: ``Stats.bytes_written`` counts none)."""
    return _planned(p)[:3]


def _planned(p: Plan) -> tuple[int, int, int, int]:
    """:func:`planned_io`, and the largest window's projected bytes: windows grow to their limit, so a
    pass holds that, not the plan's projection of one tile."""
    read = sum(nbytes(r.resolved()) for r in p.roots if not isinstance(r.resolved(), OpNode))
    written = n_windows = largest = 0
    n = len(pass_devices(p, compute_devices()))
    limit, batch = window_limit(p, n), window_input_bytes(compute_device())
    for group in p.groups:
        if isinstance(p.prepared[id(group[0])].op, CustomOp):
            read += sum(nbytes(i.resolved()) for i in group[0].inputs)
            written += nbytes(group[0])
            continue
        indices = itertools.product(*map(range, grid(group[0].shape, p.tile)))
        for _, w in spread(p, group, indices, limit, batch, n):
            n_windows += 1
            largest = max(largest, w.projected)
            read += sum(region_bytes(store, reg) for _, (store, reg) in w.reads)
        written += sum(nbytes(n) for n in group if n.shape != ())
    return read, written, n_windows, largest


_deferred: list = []          # weak references to nodes the next run stores too (store_with_next_run)
_deferred_lock = threading.Lock()


def store_with_next_run(nodes, optional: bool = False) -> None:
    """Have the next :func:`run`, whatever it computes, also store ``nodes`` to scratch, in its plan.

    For values needed later that the next computation reads anyway (an
    optimizer's moments, read again by the parameter update): stored in the
    same pass instead of one of their own. A node dropped meanwhile is skipped.
    ``optional``: only a saving (a gradient's residual), which a run that shares
    a loss's pass with its gradients (:func:`run_sharing_pass`) drops.
    """
    with _deferred_lock:
        _deferred.extend((weakref.ref(n), optional) for n in nodes)


def _take_deferred(roots, drop_optional: bool = False) -> list[OpNode]:
    taken = set(id(r.resolved()) for r in roots)
    out = []
    with _deferred_lock:
        refs = _deferred[:]
        _deferred.clear()
    for ref, optional in refs:
        n = ref()
        if (isinstance(n, OpNode) and n.result is None and n.shape != () and id(n) not in taken
                and not (optional and drop_optional)):
            taken.add(id(n))
            out.append(n)
    return out


def run_sharing_pass(root, extras):
    """Compute the scalar ``root`` and, in its pass, those of the small ``extras`` the planner joins to it.

    ``extras`` are small reductions (the unit gradients of :mod:`jask.hijax.unit_grads`); one the
    planner would compute in a pass of its own is left out, and with none left this is ``run([root])``.
    Returns the root's value and ``{id(extra): NumPy array}`` of those computed. Optional deferred
    stores (residuals a shared pass makes unneeded) are dropped from a shared run.
    """
    kept = list(extras)
    while kept:
        try:
            p = make_plan([root, *kept])
        except ValueError:    # over the budget together: the root alone
            kept = []
            break
        group = next(g for g in p.groups if any(m is root.resolved() for m in g))
        joined = [e for e in kept if any(m is e.resolved() for m in group)]
        if len(joined) == len(kept):
            break
        can = [e for e in kept if p.joins_a_pass(e, root)]
        kept = can if len(can) < len(kept) else joined   # first drop what cannot join at all
    if not kept:
        return run([root])[0], {}
    values = run([root, *kept], lambda n, tile: MemorySink(n, tile), drop_optional=True)
    return values[0], {id(e): v for e, v in zip(kept, values[1:])}


def run(roots, make_sinks=None, drop_optional: bool = False):
    """Compute ``roots``; returns one result per root.

    Scalar roots (shape ``()``) return a NumPy scalar. Other roots are written by
    the sink ``make_sinks(root, tile)`` returns (default: scratch, after which the
    root node stands for its stored result). Nodes passed to
    :func:`store_with_next_run` are stored in the same plan.
    """
    roots = list(roots)
    extra = _take_deferred(roots, drop_optional)
    p = None
    try:
        p = make_plan(roots + extra, extra)
        # Inside jit this runs in io_callback, whose default device is the host CPU: name ours.
        devices = usable_devices()
        with jax.default_device(devices[0]):
            return _run(p, roots, make_sinks, devices)
    except BaseException:
        store_with_next_run([n for n in extra if n.result is None])   # still wanted (as required, now)
        raise
    finally:
        if p is not None and p.projected_bytes >= RELEASE_AFTER_BYTES:
            # Reference cycles a run leaves (plan closures and what they reach) held ~190 MB
            # after a 4096^2 dot until the collector ran; the young generations take ~1 ms.
            # Then freed tiles in the middle of the heap go back to the system.
            gc.collect(1)
            malloc.release_free_memory()


def _run(p: Plan, roots, make_sinks, devices=None):
    for listener in events.listeners:
        listener.saw_plan(p)
    ex = Executor(p, devices)
    many = multihost.processes()[1] > 1     # a jax.distributed run: passes shared between processes
    root_ids = {id(r.resolved()): i for i, r in enumerate(roots)}
    results = [None] * len(roots)
    for i, r in enumerate(roots):
        rr = r.resolved()
        if not isinstance(rr, OpNode):
            if rr.shape == () and make_sinks is None:
                results[i] = np.asarray(ex.tile_of(rr, ()))
            elif make_sinks is not None:
                sink = make_sinks(r, p.tile)
                results[i] = _copy(ex, rr, multihost.unshared(sink) if many else sink)
            else:
                results[i] = rr
    for group in _groups(p, many):
        node = group[0]
        i = root_ids.get(id(node))
        if p.one_pass(group):
            _one_pass(p, ex, group, root_ids, results, make_sinks, many)
            continue
        if node.shape == () and i is not None:
            try:
                results[i] = _scalar(p, ex, group, many)
                events.count(tiles=1)
            except Exception as e:
                e.add_note(f"while computing {p.prepared[id(node)].name} {node.dtype} scalar")
                raise
            if make_sinks is not None:    # a 0-d array written somewhere (to_zarr, update_): one tile
                results[i] = _write_scalar(make_sinks(node, p.tile), results[i])
            continue
        sinks = [make_sinks(n, p.tile) if (id(n) in root_ids and make_sinks is not None)
                 else ScratchSink(n, p.tile) for n in group]
        share, exchange, tiles = (0, 1), None, None
        try:
            if many:
                sinks, share, exchange, tiles = multihost.wrap_sinks(p, group, sinks, p.tile)
            ex.compute(group, sinks, share, exchange, tiles)
        except BaseException:
            for sink in sinks:
                sink.abort()
            raise
        for k, (n, sink) in enumerate(zip(group, sinks)):
            try:
                out = sink.finish()
            except BaseException:
                # the rest never reach their paths; ones already committed stay (each is atomic alone)
                for rest in sinks[k + 1:]:
                    rest.abort()
                raise
            if id(n) in root_ids:
                results[root_ids[id(n)]] = out
            readable = getattr(out, "readable", None)     # committed after the run: later groups read it here
            if readable is not None:
                p.stored_aside[id(n)] = StoredNode(readable())
    return results


def _groups(p: Plan, many: bool) -> list:
    """The plan's groups; in a multi-process run a one-pass group whose outputs are too big to gather
    (:func:`multihost.gatherable`) runs member by member (each process folds a member's partial as
    for a lone reduction)."""
    if not many:
        return p.groups
    return [part for g in p.groups
            for part in ([[n] for n in g] if p.one_pass(g) and not multihost.gatherable(g) else [g])]


def _one_pass(p: Plan, ex: Executor, group, root_ids, results, make_sinks, many: bool) -> None:
    """Reductions to a few tiles each, computed in one pass: scalar roots to ``results``, the rest to sinks.

    In a multi-process run each process computes its share of the pass's entries for every member;
    each member's partials are then gathered and folded in process order (every process gets the
    same values, and only process 0 writes a user path)."""
    sinks = {id(n): (make_sinks(n, p.tile) if id(n) in root_ids and make_sinks is not None
                     else ScratchSink(n, p.tile)) for n in group if n.shape != () or id(n) not in root_ids}
    if many:
        sinks = {k: multihost.unshared(s) for k, s in sinks.items()}
    try:
        if many:
            mine = list(ex.run_windows(group, [()], multihost.processes(), cast=False))
            tiles = itertools.chain.from_iterable(
                multihost.gather_tiles(p, node, p.tile, [t for t in mine if t[0] is node]) for node in group)
        else:
            tiles = ex.run_windows(group, [()])
        for node, idx, tile in tiles:
            if id(node) in sinks:
                sinks[id(node)].write(region(idx, node.shape, p.tile), np.asarray(tile))
            else:
                results[root_ids[id(node)]] = np.asarray(tile)
            events.count(tiles=1)
    except BaseException:
        for sink in sinks.values():
            sink.abort()
        raise
    for node in group:
        if id(node) in sinks:
            out = sinks[id(node)].finish()
            if id(node) in root_ids:
                results[root_ids[id(node)]] = out


def _scalar(p: Plan, ex: Executor, group, many: bool):
    """A scalar root's value; in a multi-process run each process folds its share, then all fold alike."""
    if not many:
        ((_, _, value),) = ex.run_windows(group, [()])
        return np.asarray(value)
    node = group[0]
    got = list(ex.run_windows(group, [()], multihost.processes(), cast=False))   # folded in the acc dtype
    value = multihost.fold_scalar(np.asarray(got[0][2]) if got else None,
                                  kernels_cache.combine(p.prepared[id(node)].op), node.dtype)
    return np.zeros((), node.dtype) if value is None else np.asarray(value, node.dtype)


def _write_scalar(sink, value):
    """Hand a computed 0-d result to its sink as the array's one tile."""
    try:
        sink.write((), np.asarray(value))
    except BaseException:
        sink.abort()
        raise
    return sink.finish()


def _copy(ex: Executor, node: Node, sink):
    """Stream an already stored (or zero) node into a sink, tile by tile."""
    try:
        for idx in itertools.product(*map(range, grid(node.shape, ex.tile))):
            sink.write(region(idx, node.shape, ex.tile), np.asarray(ex.tile_of(node, idx)))
            events.count(tiles=1)
    except BaseException:
        sink.abort()
        raise
    return sink.finish()
