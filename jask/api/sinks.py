"""Sinks: the calls that make the lazy graph run (materialize, to_zarr, update_, persist)."""
from __future__ import annotations

import math
import os

import jax
import numpy as np

from jask.api.errors import OverBudgetError
from jask.api.resumable import persist_resumable
from jask.config import config
from jask.exec.driver import run
from jask.exec.progress import fmt_bytes
from jask.exec.sinks import MemorySink, PathSink, ScratchSink
from jask.graph.nodes import StoredNode
from jask.hijax import compat, runtime
from jask.hijax.array import DiskArray, is_disk_array, type_of
from jask.hijax.sinks import MaterializePrimitive, PersistPrimitive
from jask.io.arguments import block_edges, compressor_list
from jask.io.destinations import check_destination
from jask.io import metadata
from jask.io.groups import commit_group
from jask.io.remote import RemoteStore, exists, resolve
from jask.io.urls import Location


def _require(name, x):
    if not is_disk_array(x):
        raise TypeError(f"{name} expects a DiskArray, got {type(x).__name__}")


def to_numpy(x: DiskArray) -> np.ndarray:
    """Compute ``x`` into host memory (the whole array: meant for small results)."""
    _require("np.asarray", x)
    if compat.is_traced(x) or x._node is None:
        raise TypeError("cannot convert a traced DiskArray to NumPy inside jit; use jask.materialize")
    if x.size == 0:
        return np.zeros(x.shape, x.dtype)
    runtime.safe_point()
    (out,) = run([x._node], lambda node, tile: MemorySink(node, tile))
    return np.asarray(out)


def materialize(x, allow_over_budget: bool = False) -> jax.Array:
    """Compute a DiskArray into one in-memory ``jax.Array``.

    The only call that builds a whole array in memory, so use it for results
    that fit. Works eagerly and under ``jit``. An array larger than the memory
    budget raises :class:`~jask.api.errors.OverBudgetError` before anything is
    computed, unless ``allow_over_budget=True`` says that is meant.
    """
    _require("materialize", x)
    nbytes = math.prod(x.shape) * np.dtype(x.dtype).itemsize
    if nbytes > config.memory_budget and not allow_over_budget:
        raise OverBudgetError(
            f"materialize: the {np.dtype(x.dtype)} array of shape {tuple(x.shape)} takes {fmt_bytes(nbytes)}, "
            f"more than the memory budget of {fmt_bytes(config.memory_budget)}; pass "
            "materialize(x, allow_over_budget=True) to build it in memory anyway, raise the budget with "
            "jask.set_memory_budget(...), or keep it on disk (jask.to_zarr, or reduce it first)",
            nbytes, config.memory_budget)
    if not compat.is_traced(x):
        runtime.safe_point()
    return MaterializePrimitive(type_of(x))(x)


def _check_resume(call: str, resume: bool) -> None:
    """Refuse ``resume=True`` in a ``jax.distributed`` run: every process would claim the killed write's
    folder, and one that is not process 0 would delete it (see jask/exec/DESIGN.md)."""
    if resume and jax.process_count() > 1:
        raise ValueError(f"{call}: resume=True is not supported in a multi-process (jax.distributed) run "
                         f"({jax.process_count()} processes); drop resume=True")


def _check_shared_destination(call: str, where) -> None:
    """Refuse a ``memory://`` destination in a ``jax.distributed`` run: each process has its own
    memory store, so the array process 0 commits is invisible to the others, which then fail."""
    if isinstance(where, Location) and where.scheme == "memory" and jax.process_count() > 1:
        raise ValueError(f"{call}: {where.url} is a memory:// URL, which lives in one process's memory, and this "
                         f"run has {jax.process_count()} processes; write to a local path or an s3:// or "
                         "gs:// URL every process can reach")


def to_zarr(x, path, overwrite: bool = False, chunks=None, compressors=None, shards=None,
            storage_options=None, resume: bool = False) -> None:
    """Write ``x`` to a Zarr v3 array at ``path`` (a folder or a store URL); it appears only once complete.

    An existing ``path`` is refused unless ``overwrite=True``, in which case the
    old array stays readable until the new one is complete, and arrays already
    open on it keep their old values. Only a Zarr array is ever replaced: a file
    or another folder at ``path`` is refused before anything is computed.
    An empty folder at ``path`` is written into. ``chunks`` (and ``shards``) is
    a tuple of ints, one per axis, or one int for every axis; ``compressors``
    one Zarr v3 codec (``zarr.codecs.ZstdCodec()``) or a list of them.
    ``shards`` writes the sharded layout (a shard file per ``shards`` block of
    ``chunks``-sized tiles), the fastest to stream. On an object store
    (``s3://``, ``gs://``, ``memory://``) the array is a version committed by one
    pointer object (``jask/io/DESIGN.md``); ``storage_options`` go to
    s3fs/gcsfs (credentials, ``endpoint_url``).

    ``resume=True`` makes a killed write to a local folder resumable: it records
    each chunk as it lands, and a later ``to_zarr`` of the same array to the
    same path with ``resume=True`` continues it, computing only the tiles not
    yet on disk (uncompressed, unsharded arrays; otherwise it starts afresh). A
    write without it removes what a killed one left, warning first
    (``RuntimeWarning``: how many chunks it had done) when that was resumable.
    """
    _require("to_zarr", x)
    if compat.is_traced(x):
        raise TypeError("to_zarr cannot run inside jit; return the DiskArray and write it afterwards")
    _check_resume("to_zarr", resume)
    where = resolve(path, storage_options, "to_zarr")
    _check_shared_destination("to_zarr", where)
    if not isinstance(where, Location):
        check_destination(where, overwrite)
    elif exists(where, storage_options) and not overwrite:
        raise FileExistsError(f"to_zarr: {where} already exists; pass overwrite=True to replace it")
    if chunks is not None:
        chunks = block_edges(chunks, x.shape, "to_zarr")
    if shards is not None:
        shards = block_edges(shards, x.shape, "to_zarr", "shards")
    compressors = compressor_list(compressors, x.dtype, "to_zarr")
    runtime.safe_point()
    run([x._node], lambda node, tile: PathSink(
        node, tile, where, overwrite=overwrite, chunks=chunks, compressors=compressors, shards=shards,
        storage_options=storage_options, resume=resume))


def rechunk(x, chunks, shards=None) -> DiskArray:
    """A copy of ``x`` in scratch storage with the given chunk (and shard) layout.

    Use it to turn a store with awkward chunks into the layout jask streams
    fastest: chunks the size of the tiles, grouped into shards read sequentially.
    """
    _require("rechunk", x)
    if compat.is_traced(x):
        raise TypeError("rechunk cannot run inside jit")
    chunks = block_edges(chunks, x.shape, "rechunk")
    if shards is not None:
        shards = block_edges(shards, x.shape, "rechunk", "shards")
    runtime.safe_point()
    (stored,) = run([x._node], lambda node, tile: ScratchSink(
        node, tile, chunks=chunks, shards=shards, adopt=False))
    return DiskArray(node=stored)


CHECKPOINT = "optimizer_state"   # ``jask`` attribute of a store committed with an optimizer checkpoint: its folder


def checkpoint_of(target) -> str | None:
    """The optimizer checkpoint folder ``target``'s store is committed together with, if that folder still exists.

    ``jask.optim.update_params(..., state=, state_path=)`` writes it into every
    store of its group (parameters and state leaves). Committing one of them
    alone would leave the checkpoint a step behind, so that is refused.
    """
    array = getattr(getattr(target._node.resolved(), "store", None), "array", None)
    link = metadata.jask_attributes(array).get(CHECKPOINT) if array is not None else None
    return link if isinstance(link, str) and os.path.isdir(link) else None


def _check_update(target, new_value, call: str = "update_", checkpoint: str | None = None) -> None:
    if not isinstance(target, DiskArray) or target._node is None:
        raise TypeError(f"{call} must be called eagerly on a DiskArray (not inside jit)")
    _require(call, new_value)
    if compat.is_traced(new_value) or new_value._node is None:
        raise TypeError(f"{call} needs a concrete new value; call it outside jit with the jitted step's result")
    if new_value.shape != target.shape or new_value.dtype != target.dtype:
        raise ValueError(f"{call}: new value has shape {new_value.shape} and dtype {new_value.dtype}, "
                         f"but the array has shape {target.shape} and dtype {target.dtype}")
    linked = checkpoint_of(target)
    if linked is not None and linked != checkpoint:
        raise ValueError(f"{call}: {target._node.resolved().store.path} is committed together with the optimizer "
                         f"state checkpointed at {linked}; commit it with jask.optim.update_params(params, "
                         f"new_params, state=new_state, state_path={linked!r}) so that parameters and state stay "
                         f"at one step (or remove {linked} to stop checkpointing)")


def update_(target: DiskArray, new_value, resume: bool = False) -> None:
    """Replace ``target``'s contents with ``new_value``, keeping its type (so ``jit`` does not retrace).

    The new value is computed completely before anything is replaced. For a
    user store opened with ``mode="r+"`` the folder is swapped atomically: a
    crash leaves the old or the new array, never a mix, and a disk-full or I/O
    error leaves the old one (the ``OSError`` names the array and path). On an
    object store the new version is committed by replacing one pointer object.
    Arrays open on the old value, here or in other processes, keep reading
    the old value; lazy arrays computed from it too. (On an object store, only
    in this process: elsewhere a read of the deleted old version raises
    ``MissingChunkError`` naming it, never a mix.) ``resume=True`` on a local
    user store works as in :func:`to_zarr`: a killed update continues where it stopped
    (without it, a killed resumable update's partial folder is removed with a ``RuntimeWarning``).
    """
    _check_update(target, new_value)
    _check_resume("update_", resume)
    old = target._node.resolved()
    runtime.safe_point()
    if isinstance(old, StoredNode) and not old.store.owned:
        if not old.store.writable:
            raise ValueError(f"update_: the store at {old.store.path} was opened read-only; "
                             "open it with jask.from_zarr(path, mode='r+') to update it")
        old_store = old.store
        _check_shared_destination("update_", getattr(old_store, "location", None))
        (store,) = run([new_value._node], lambda node, tile: PathSink(
            node, tile, old_store.path, overwrite=True, writable=True, chunks=old_store.chunks,
            shards=old_store.shards, storage_options=getattr(old_store, "storage_options", None),
            resume=resume, like=old_store.array, call="update_"))
        target._node = StoredNode(store)
        return
    # Stored values are immutable, so the target may share the new value's storage.
    (stored,) = run([new_value._node])
    target._node = stored


def structure_mismatch(targets, new_values, names=("the targets", "the new values")) -> str | None:
    """How two pytrees of DiskArrays differ in structure (key paths only one of them has), or None if they match."""
    if jax.tree.structure(targets, is_leaf=is_disk_array) == jax.tree.structure(new_values, is_leaf=is_disk_array):
        return None
    paths = [[jax.tree_util.keystr(k) or "the root"
              for k, _ in jax.tree_util.tree_flatten_with_path(t, is_leaf=is_disk_array)[0]]
             for t in (targets, new_values)]
    said = []
    for name, mine, other in ((names[0], *paths), (names[1], *paths[::-1])):
        only = [p for p in mine if p not in other]
        if only:
            said.append(f"only in {name}: {', '.join(only[:3])}{', ...' if len(only) > 3 else ''}")
    return "; ".join(said) or f"{names[0]} are a {jax.tree.structure(targets, is_leaf=is_disk_array)}, " \
        f"{names[1]} a {jax.tree.structure(new_values, is_leaf=is_disk_array)}"


def update_all(targets, new_values, resume: bool = False) -> None:
    """Replace several arrays' contents at once (an optimizer step's parameters): after a crash, all old or all new.

    ``targets`` and ``new_values`` are matching pytrees (lists, dicts) of
    DiskArrays, each pair as in :func:`update_`. The new values are computed in
    one pass; only once all are complete are they committed, as one group
    (:mod:`jask.io.groups`): a process killed between two of the commits leaves
    a log that the next ``from_zarr``/write of any of the paths (or
    ``jask.cleanup_scratch()``) uses to finish them all, so a rerun never sees
    half a step. ``resume=True`` continues a killed step's computation (as in
    :func:`update_`). Targets must be user stores in local folders opened with
    ``mode="r+"``; scratch targets are simply updated afterwards.
    """
    commit_together(targets, new_values, resume)


def commit_together(targets, new_values, resume: bool = False, checkpoint: str | None = None) -> None:
    """:func:`update_all`; with ``checkpoint`` (an optimizer checkpoint's folder, :mod:`jask.optim_state`)
    every store of the group records it, and stores that recorded it may be committed."""
    ts = jax.tree.leaves(targets, is_leaf=is_disk_array)
    vs = jax.tree.leaves(new_values, is_leaf=is_disk_array)
    mismatch = structure_mismatch(targets, new_values)
    if mismatch is not None:
        raise ValueError(f"update_all: targets and new_values differ in structure: {mismatch} "
                         f"({len(ts)} and {len(vs)} arrays)")
    _check_resume("update_all", resume)
    group, rest = [], []
    for t, v in zip(ts, vs):
        _check_update(t, v, "update_all", checkpoint)
        old = t._node.resolved()
        (group if isinstance(old, StoredNode) and not old.store.owned else rest).append((t, v))
    stores = [t._node.resolved().store for t, _ in group]
    for st in stores:
        if isinstance(st, RemoteStore) or not st.writable:
            raise ValueError(f"update_all: the store at {st.path} must be a local folder opened with "
                             "jask.from_zarr(path, mode='r+')")
    paths = [st.path for st in stores]
    if len(set(paths)) != len(paths):
        raise ValueError("update_all: the same array is a target twice")
    runtime.safe_point()
    if group:
        target_of = {}                                 # each new value's node -> the store it replaces
        for st, (_, v) in zip(stores, group):
            if target_of.setdefault(id(v._node.resolved()), st) is not st:
                raise ValueError("update_all: one new value for two targets; pass a copy (e.g. v + 0.0) for "
                                 "the second")

        def sink(node, tile):
            st = target_of[id(node.resolved())]
            return PathSink(node, tile, st.path, overwrite=True, writable=True, chunks=st.chunks,
                            shards=st.shards, resume=resume, defer_commit=True, like=st.array,
                            attributes={CHECKPOINT: checkpoint} if checkpoint else None)
        pendings = run([v._node for _, v in group], sink)
        committed = commit_group(pendings, lambda p: p.commit(owned=False, replace=True, writable=True),
                                 power=config.durability == "power")
        for (t, _), store in zip(group, committed):
            t._node = StoredNode(store)
    for t, v in rest:
        update_(t, v)


def persist(*arrays, defer: bool = False, resume: bool = False):
    """Compute lazy arrays into scratch storage in one pass, and return the stored arrays.

    Use it for values that later steps read many times, such as optimizer
    moments, so each step does not recompute a growing chain. Shared inputs of
    the arrays are computed once. Works under ``jit``; its gradient is the identity.

    Parameters
    ----------
    defer : bool
        Store them with the next computation that runs, whatever it is (an
        ``update_``, a scalar, ``np.asarray``), in its pass, instead of now:
        when that computation reads these arrays too (parameters updated from
        the moments), the inputs are read once for both. The arrays returned
        are still lazy, and stand for their stored copies once that pass has run.
    resume : bool
        Make the pass resumable (eagerly only, not under ``jit``; not with
        ``defer``): each array is stored under a name derived from what it
        computes (its ops, parameters and input arrays, :mod:`jask.api.resumable`),
        so when the process is killed, the same ``persist(..., resume=True)``
        in a new process continues the partial store, computing only the
        missing tiles, or takes over the complete one. Needs inputs read from
        user stores (``from_zarr``); what killed processes leave is kept a week
        (``jask.io.resumable_scratch.KEEP_SECONDS``) or until ``jask.cleanup_scratch()``.
    """
    for x in arrays:
        _require("persist", x)
    if resume:
        _check_resume("persist", resume)
        if any(compat.is_traced(x) or x._node is None for x in arrays):
            raise TypeError("persist(..., resume=True) runs eagerly only, not inside jit: call it on the "
                            "jitted function's result, or drop resume=True inside the function")
        if defer:
            raise ValueError("persist: resume=True cannot be combined with defer=True (a deferred store "
                             "runs inside the next pass, which resumes as a whole)")
        runtime.safe_point()
        persist_resumable([x._node for x in arrays])
        out = tuple(DiskArray(node=x._node.resolved()) for x in arrays)
        return out[0] if len(arrays) == 1 else out
    if not any(compat.is_traced(x) for x in arrays):
        runtime.safe_point()
    out = PersistPrimitive([type_of(x) for x in arrays], defer=bool(defer))(*arrays)
    return out[0] if len(arrays) == 1 else out
