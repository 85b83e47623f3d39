"""Passes shared between the processes of a ``jax.distributed`` run (many hosts, one store).

Every process runs the same program and plans the same passes. A pass whose
outputs can be shared is cut into one contiguous share per process
(:func:`jask.exec.schedule.spread`): each process reads only its share's tiles.

* A scalar root (a ``sum``, a loss): each process folds its partial; the
  partials are gathered (``process_allgather``) and folded in process order,
  so every process gets the same value.
* An output to a local user path (``to_zarr``, ``update_``) in one-tile
  chunks: process 0 creates the hidden staging folder, every process writes
  its own tiles into it, and after a barrier process 0 commits it (the usual
  atomic rename); a second barrier lets the others open the committed array.
  Where an even split would cut an output tile (a contraction's tile of
  several entries), the pass is dealt by whole tiles instead, as below.
  An output to a store URL alike: process 0 creates the new version prefix,
  every process writes its tiles into it through zarr's store, and process 0's
  one pointer PUT commits it; a lost process leaves the pointer, and so the
  old version (process 0 deletes the new prefix).
* An output in files of several tiles (chunks of many tiles, or shards): the
  same, but the pass is cut on file boundaries (:mod:`jask.exec.block_shares`),
  so each chunk or shard file is written whole by one process; a layout of a
  single file (one shard) leaves nothing to share: process 0 alone writes it
  (gathered when small, below, else computed whole everywhere).
* A scratch stage (an intermediate the next pass reads): the same, in a store
  in process 0's scratch folder that every process reads: pinned on a local
  disk (one host), or with a release marker per process in a bucket (any hosts).
* A small output that cannot be written so (in memory, or a single tile a
  share boundary cuts; a gradient of weights): each process computes its share, the
  whole output is gathered and folded alike in every process (in the
  accumulator dtype, cast once), and each writes it to its own sink (a user
  path: process 0 alone).

Other passes (in-memory results of large arrays, custom ops and their gradients, large
outputs of a single file, local scratch stages across hosts) run whole in every process, as in a
single-process run; of those, only process 0 writes a user path. See DESIGN.md.
"""
from __future__ import annotations

import itertools
import os

import jax
import numpy as np

from jask.config import config
from jask.exec.events import count
from jask.exec.partials import fold_in_order
from jask.exec.block_shares import process_tiles
from jask.exec.shares import cuts_a_tile, tile_units
from jask.graph.nodes import OpNode, StoredNode
from jask.graph.op import CustomOp
from jask.graph.tiling import block_at, block_shape, grid, region
from jask.io import dtypes, faults
from jask.io.remote import RemotePendingStore, VersionWriter, last_reader_deletes, open_store
from jask.io.store import PendingStore
from jask.io.writer import make_chunk_writer
from jask.kernels.window import widen_dtype

PATH_BYTES = 4096     # longest staging path process 0 can hand the others
_sink_numbers = itertools.count()   # names barriers alike in every process (all run the same passes)


def processes() -> tuple[int, int]:
    """``(this process's index, process count)``; ``(0, 1)`` outside a ``jax.distributed`` run."""
    return jax.process_index(), jax.process_count()


def _mh():
    from jax.experimental import multihost_utils
    return multihost_utils


class ProcessLostError(RuntimeError):
    """A collective between the processes of a run failed: most often one of them stopped."""


def _collective(what: str, fn, *args):
    """``fn(*args)``, a collective call alone (validate local values before it: an error raised by one
    process only would leave the others waiting), any failure reported as a lost process."""
    try:
        return fn(*args)
    except Exception as e:   # noqa: BLE001 -- gloo, the coordination service: all mean the run is broken
        raise ProcessLostError(f"jask: process {jax.process_index()} of {jax.process_count()} could not "
                               f"{what}: another process of the jax.distributed run failed or stopped "
                               f"({type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]})") from e


def barrier(name: str, what: str = "reach a barrier") -> None:
    """Wait until every process reached ``name``."""
    _collective(f"{what} ({name})", _mh().sync_global_devices, name)


def fold_scalar(value, combine, dtype):
    """``value`` (this process's partial, or None) folded with every other process's, in process order.

    Folded in the accumulator dtype (float32 for bf16/f16 ``dtype``), like partials within a
    process; the caller casts the result (None when no process had a partial) once.
    """
    acc_dtype = widen_dtype(dtype)
    # one collective, not two (each costs ~1.7 ms on loopback): [has a partial, partial] in the
    # accumulator dtype, where 0 and 1 are exact for every dtype (bool included)
    here = np.zeros(2, acc_dtype)
    if value is not None:
        here[0], here[1] = 1, np.asarray(value, acc_dtype)
    rows = np.asarray(_collective("gather the partial results of a scalar", _mh().process_allgather, here))
    return fold_in_order((row[1] if row[0] else None for row in rows.reshape(-1, 2)),
                         lambda acc, part: np.asarray(combine(acc, part)))


def wrap_sinks(plan, group, sinks, tile):
    """``(sinks, share, exchange, tiles)`` for a group in a multi-process run.

    ``share`` is this process's share of the pass, or ``(0, 1)`` when every
    process computes the whole group; ``exchange``, when not None, turns the
    tiles of this process's share into every tile of the group (small outputs
    that cannot be shared so, such as an in-memory result or tiles a process
    boundary cuts: gathered and folded alike everywhere). ``tiles``, when not
    None, lists the only output tiles this process computes: whole chunk or
    shard files of every output (:mod:`jask.exec.block_shares`).
    """
    from jask.exec.sinks import PathSink, ScratchSink
    index, count = processes()
    if isinstance(plan.prepared[id(group[0])].op, CustomOp):
        return [unshared(s) for s in sinks], (0, 1), None, None     # no index map to share by: run whole
    indices = list(itertools.product(*map(range, grid(group[0].shape, tile))))
    units = tile_units(plan, group, indices)
    on_one_host = one_host()     # a collective: asked in every process alike
    # a local scratch stage is shared on one host only; one in a bucket, across hosts
    scratch_ok = all(getattr(s, "adopt", True) and (isinstance(s.pending, RemotePendingStore)
                                                    or (on_one_host and isinstance(s.pending, PendingStore)))
                     for s in sinks if type(s) is ScratchSink)
    blocks = [_file_block(s) if type(s) is PathSink else
              block_shape(n.shape, tile) if type(s) is ScratchSink and scratch_ok and _one_tile_chunks(s, n, tile)
              else None for n, s in zip(group, sinks)]
    if all(b is not None for b in blocks):
        even = all(_one_tile_chunks(s, n, tile) for n, s in zip(group, sinks)) and not cuts_a_tile(units, count)
        # otherwise whole files (a tile, when an even split would cut one between two processes)
        mine = None if even else process_tiles(group[0].shape, tile, blocks, units, index, count)
        if even or mine is not None:
            wrapped = [SharedPathSink(s, _next_key()) if isinstance(s, PathSink) else shared_scratch(s, tile)
                       for s in sinks]
            return wrapped, ((index, count) if mine is None else (0, 1)), None, mine
    wrapped = [unshared(s) for s in sinks]
    if gatherable(group) and len(group) == 1:
        return wrapped, (index, count), lambda tiles: gather_tiles(plan, group[0], tile, tiles), None
    return wrapped, (0, 1), None, None


def gatherable(group) -> bool:
    """Whether every process may hold the outputs of ``group`` and each other process's copy of them
    (what :func:`gather_tiles` holds, by process_allgather): at most an eighth of the budget."""
    size = sum(int(np.prod(n.shape)) * widen_dtype(n.dtype).itemsize for n in group)
    return processes()[1] * size <= config.memory_budget // 8


def unshared(sink):
    """``sink`` for a pass every process runs whole: a user path is written by process 0 alone."""
    from jask.exec.sinks import PathSink
    return SharedPathSink(sink, _next_key(), shared=False) if isinstance(sink, PathSink) else sink


_hosts: dict = {}


def one_host() -> bool:
    """Whether every process runs on this host (asked once per run, all processes together).

    Shared scratch stages live in process 0's scratch folder; the sweep of stale
    scratch folders (:func:`jask.io.scratch.remove_stale`) judges them by pid,
    which means nothing on another host, so stages are shared only on one host.
    """
    if "one" not in _hosts:
        import socket
        import zlib
        mine = np.uint32(zlib.crc32(socket.gethostname().encode()))
        every = np.asarray(_collective("compare host names", _mh().process_allgather, mine))
        _hosts["one"] = bool((every == mine).all())
    return _hosts["one"]


def _next_key() -> str:
    return str(next(_sink_numbers))


def _file_block(sink):
    """The shape of one file (a shard, else a chunk) of the store ``sink`` writes, when the processes
    can write it together: a local folder or a store URL's new version; None otherwise (a
    ``memory://`` URL, which each process holds in its own memory)."""
    pending = getattr(sink, "pending", None)
    remote = isinstance(pending, RemotePendingStore) and pending.location.scheme != "memory"
    if not (isinstance(pending, PendingStore) or remote):
        return None
    return tuple(pending.array.chunks if pending.array.shards is None else pending.array.shards)


def _one_tile_chunks(sink, node, tile) -> bool:
    """Whether ``sink`` writes such a store (:func:`_file_block`) in unsharded chunks of one tile each."""
    pending = getattr(sink, "pending", None)
    return (_file_block(sink) is not None and pending.array.shards is None
            and tuple(pending.array.chunks) == block_shape(node.shape, tile))


def gather_tiles(plan, node, tile, tiles):
    """Every tile of a small output: each process's tiles (partials where a boundary cut one),
    gathered and folded in process order, so every process writes the same values.

    ``tiles`` come uncast (partials in the accumulator dtype): they are folded in it and
    cast to the output dtype once.
    """
    from jask.exec.run_windows import kernels_cache
    full = np.zeros(node.shape, widen_dtype(node.dtype))
    held = np.zeros(grid(node.shape, tile), np.int32)
    for _, idx, t in tiles:
        full[region(idx, node.shape, tile)] = np.asarray(t)
        held[idx] = 1
    what = f"gather the tiles of {plan.prepared[id(node)].name} {node.shape}"
    fulls = np.asarray(_collective(what, _mh().process_allgather, full))
    helds = np.asarray(_collective(what, _mh().process_allgather, held))
    combine = kernels_cache.combine(plan.prepared[id(node)].op)
    for idx in itertools.product(*map(range, held.shape)):
        reg = region(idx, node.shape, tile)
        acc = fold_in_order((fulls[p][reg] if helds[p][idx] else None for p in range(helds.shape[0])),
                            lambda acc, part: np.asarray(combine(acc, part)))
        yield node, idx, (np.zeros(block_at(node.shape, idx, tile), node.dtype) if acc is None
                          else np.asarray(acc, node.dtype))


def shared_scratch(local, tile):
    """A scratch stage written by every process into one store, which every process then reads.

    Process 0 places it in its scratch folder, which the others must see. On a
    local disk (only when every process runs on one host, :func:`one_host`) it
    goes under a *retired* name, and every process pins it, so the last process
    to let go deletes it (:mod:`jask.io.pins`), never one still reading. In a
    bucket (a scratch URL, any hosts) each process leaves a release marker when
    it lets go, and the one that finds every marker deletes it
    (:func:`jask.io.remote.last_reader_deletes`).
    """
    from jask.exec.sinks import PathSink
    from jask.io import scratch
    local.abort()                                   # the per-process store is not used
    key = _next_key()
    index, count = processes()
    if isinstance(local.pending, RemotePendingStore):
        url = _broadcast_text("share a scratch stage's URL",
                              f"{scratch.process_dir()}/shared-{key}.zarr" if index == 0 else "")
        sink = PathSink(local.node, tile, url, storage_options=scratch.storage_options())
        return SharedPathSink(sink, key, adopt=local.node, readers=count)
    final = os.path.join(scratch.process_dir(), f".shared-{key}.zarr.jask-old-shared")
    path = _broadcast_text("share a scratch stage's path", final if index == 0 else "")
    return SharedPathSink(PathSink(local.node, tile, path), key, adopt=local.node)


class SharedPathSink:
    """A :class:`~jask.exec.sinks.PathSink` written by every process, committed once by process 0.

    Process 0's pending store is the one written: a local staging folder, or a
    store URL's new version prefix (the others write into it through
    :class:`~jask.io.remote.VersionWriter`, and process 0's one pointer PUT commits it).
    ``shared=False``: the pass runs whole everywhere and only process 0 writes.
    """

    def __init__(self, sink, key: str, shared: bool = True, adopt=None, readers: int = 0):
        self.sink, self.key, self.shared, self.adopt, self.readers = sink, key, shared, adopt, readers
        self.index, _ = processes()
        self.counts_io = shared or self.index == 0     # bytes this process writes
        self.writer = self.array = None
        if self.index != 0:
            sink.pending.abort()            # its own staging folder is not used
        if shared and isinstance(sink.pending, RemotePendingStore):
            pending = sink.pending
            url = _broadcast_text(f"share the new version of {pending.final_path}",
                                  f"{pending.final_path}/{pending.version}" if self.index == 0 else "")
            if self.index != 0:
                self.writer = VersionWriter(url, pending.storage_options)
        elif shared:
            path = _broadcast_text(f"share the staging folder of {sink.pending.final_path}",
                                   sink.pending.tmp_path if self.index == 0 else "")
            if self.index != 0:
                import zarr
                # every chunk is stored, even one of zeros (a dense reader takes a missing one for damage)
                self.array = zarr.open_array(path, mode="r+").with_config({"write_empty_chunks": True})
                self.writer = make_chunk_writer(self.array, path)

    def write(self, reg, tile):
        if self.index == 0:
            self.sink.write(reg, tile)
        elif self.shared:
            block = dtypes.to_storage(np.asarray(tile))
            if faults.hook is not None:     # the same fault points as the staging store's own writes
                faults.fire("before_tile_write", path=self.sink.pending.final_path, region=reg)
            if self.writer is not None:
                self.writer.write(tuple(reg), block)
            else:
                self.array[tuple(reg)] = block

    def finish(self):
        if self.writer is not None:
            self.writer.finish()           # this process's chunks are on disk
        path = self.sink.pending.final_path
        try:
            barrier(f"jask-written-{self.key}", f"finish writing {path} (it keeps its old version)")
        except BaseException:
            self.abort()                   # process 0: the staging folder or new version goes
            raise
        out = self.sink.finish() if self.index == 0 else None
        barrier(f"jask-committed-{self.key}", f"confirm the commit of {path}")
        if out is None:   # a local folder or a store URL (remote pending stores name it final_path too)
            out = open_store(self.sink.pending.final_path, "r+" if self.sink.writable else "r",
                             getattr(self.sink.pending, "storage_options", None))
        if self.adopt is None:
            return out
        # a shared scratch stage: pinned in every process before any may let go (the last one deletes it)
        barrier(f"jask-opened-{self.key}", f"open the shared scratch stage {path}")
        if self.readers:          # a stage in a bucket: the last process to let go deletes it
            last_reader_deletes(out, self.index, self.readers)
        stored = StoredNode(out)
        if isinstance(self.adopt, OpNode):
            self.adopt.set_result(stored)
        if self.index != 0:
            count(arrays_written=1)                  # process 0's PathSink counted its own
        return stored

    def abort(self):
        self.sink.abort()


_TOO_LONG = 0xFF   # a first byte UTF-8 never has: process 0's text did not fit


def _broadcast_text(what: str, text: str) -> str:
    """Process 0's ``text``, in every process. A text too long to send fails in every process alike
    (a ``ValueError`` after the broadcast), never in process 0 alone while the others wait."""
    raw = text.encode()
    buf = np.zeros(PATH_BYTES, np.uint8)
    if len(raw) > PATH_BYTES:
        buf[0] = _TOO_LONG
    else:
        buf[:len(raw)] = np.frombuffer(raw, np.uint8)
    out = np.asarray(_collective(what, _mh().broadcast_one_to_all, buf))
    if out[0] == _TOO_LONG:
        raise ValueError(f"jask: could not {what}: process 0's path is longer than {PATH_BYTES} bytes"
                         + (f": {text[:200]}..." if text else ""))
    return bytes(out[out != 0]).decode()
