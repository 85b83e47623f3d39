"""Passes shared between the processes of a ``jax.distributed`` run (many hosts, one store).

Every process runs the same program and plans the same passes. A pass whose
outputs can be shared is cut into one contiguous share per process
(:func:`jask.exec.schedule.spread`): each process reads only its share's tiles.

* A scalar root (a ``sum``, a loss): each process folds its partial; the
  partials are gathered (``process_allgather``) and folded in process order,
  so every process gets the same value.
* An output to a user path (``to_zarr``, ``update_``): process 0 creates the
  hidden staging folder, every process writes its own tiles into it, and after
  a barrier process 0 commits it (the usual atomic rename); a second barrier
  lets the others open the committed array.

Other passes (scratch stages, in-memory results, custom ops, sharded outputs,
and user-path outputs whose tiles a share boundary would cut) run whole in
every process, as in a single-process run; of those, only process 0 writes a
user path. See DESIGN.md.
"""
from __future__ import annotations

import itertools

import jax
import numpy as np

from jask.graph.tiling import block_shape, grid
from jask.io import dtypes, faults
from jask.io.store import open_existing
from jask.io.writer import make_chunk_writer

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
    """``value`` (this process's partial, or None) folded with every other process's, in process order."""
    here = np.zeros((), dtype) if value is None else np.asarray(value, dtype)
    flags = _collective("gather the partial results of a scalar", _mh().process_allgather,
                        np.int32(value is not None))
    parts = _collective("gather the partial results of a scalar", _mh().process_allgather, here)
    acc = None
    for flag, part in zip(np.asarray(flags).reshape(-1), np.asarray(parts)):
        if flag:
            acc = part if acc is None else np.asarray(combine(acc, part))
    return acc


def wrap_sinks(plan, group, sinks, tile):
    """``(sinks, share)`` for a group in a multi-process run: user paths made shared, and this process's
    share of the pass, or ``(0, 1)`` when every process computes the whole group."""
    from jask.exec.sinks import PathSink
    index, count = processes()
    split = shares_path_outputs(plan, group, sinks, tile)
    wrapped = [SharedPathSink(s, str(next(_sink_numbers)), shared=split) if isinstance(s, PathSink) else s
               for s in sinks]
    return wrapped, ((index, count) if split else (0, 1))


def shares_path_outputs(plan, group, sinks, tile) -> bool:
    """Whether ``group`` can be cut between processes: every sink a user path in chunk files of one
    tile each (a chunk spanning two processes' tiles would be written by both), and no output
    tile's entries cut by a process boundary."""
    from jask.exec.schedule import cuts_a_tile
    from jask.exec.sinks import PathSink
    _, count = processes()
    if not all(isinstance(s, PathSink) and s.pending.array.shards is None
               and tuple(s.pending.array.chunks) == block_shape(n.shape, tile) for n, s in zip(group, sinks)):
        return False
    indices = list(itertools.product(*map(range, grid(group[0].shape, tile))))
    return not cuts_a_tile(plan, group, indices, count)


class SharedPathSink:
    """A :class:`~jask.exec.sinks.PathSink` written by every process, committed once by process 0.

    ``shared=False``: the pass runs whole everywhere and only process 0 writes.
    """

    def __init__(self, sink, key: str, shared: bool = True):
        self.sink, self.key, self.shared = sink, key, shared
        self.index, _ = processes()
        self.counts_io = shared or self.index == 0     # bytes this process writes
        self.writer = self.array = None
        path = _collective(f"share the staging folder of {sink.pending.final_path}", _broadcast_text,
                           sink.pending.tmp_path if self.index == 0 else "")
        if self.index != 0:
            sink.pending.abort()            # its own staging folder is not used
            if shared:
                import zarr
                self.array = zarr.open_array(path, mode="r+")
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
        barrier(f"jask-written-{self.key}", f"finish writing {path} (it keeps its old version)")
        out = self.sink.finish() if self.index == 0 else None
        barrier(f"jask-committed-{self.key}", f"confirm the commit of {path}")
        if out is None:
            out = open_existing(self.sink.pending.final_path, "r+" if self.sink.writable else "r")
        return out

    def abort(self):
        self.sink.abort()


def _broadcast_text(text: str) -> str:
    raw = text.encode()
    if len(raw) > PATH_BYTES:
        raise ValueError(f"staging path longer than {PATH_BYTES} bytes: {text[:200]}...")
    buf = np.zeros(PATH_BYTES, np.uint8)
    buf[:len(raw)] = np.frombuffer(raw, np.uint8)
    out = np.asarray(_mh().broadcast_one_to_all(buf))
    return bytes(out[out != 0]).decode()
