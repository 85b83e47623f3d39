"""Zarr v3 stores behind jask arrays, and atomic commits onto paths.

Every store jask writes is first built under a hidden sibling name and only
renamed onto its final path once complete, so a crash leaves either nothing or
a whole array. Replacing an existing path (``to_zarr(..., overwrite=True)``,
``update_``) moves the old folder aside, renames the new one in, and only then
drops the old one; :func:`recover` finishes or rolls back a swap that a crash
interrupted.
"""
from __future__ import annotations

import glob
import os
import secrets
import shutil
import weakref

import numpy as np
import zarr

from jask.io.scratch import pid_alive


def _remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _sibling(path: str, kind: str) -> str:
    head, name = os.path.split(os.path.abspath(path))
    return os.path.join(head, f".{name}.jask-{kind}-{os.getpid()}-{secrets.token_hex(3)}")


class Store:
    """One Zarr v3 array on disk.

    Parameters
    ----------
    path : str
        Folder of the Zarr array.
    array : zarr.Array
        The opened array.
    owned : bool
        Whether jask created it as scratch; owned stores are deleted once no
        array refers to them.
    writable : bool
        Whether ``update_`` may replace its contents.
    """

    def __init__(self, path: str, array, owned: bool, writable: bool = False):
        self.path = os.path.abspath(path)
        self.array = array
        self.owned = owned
        self.writable = writable
        self._folder = _Folder(self.path) if owned else None
        _open_stores.setdefault(self.path, weakref.WeakSet()).add(self)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.array.dtype)

    @property
    def chunks(self) -> tuple[int, ...]:
        """Chunk shape (for a sharded array: the inner chunks, the kernel tiles)."""
        return tuple(self.array.chunks)

    @property
    def shards(self) -> tuple[int, ...] | None:
        """Shard shape (the unit of disk I/O), or None when the array is not sharded."""
        shards = getattr(self.array, "shards", None)
        return None if shards is None else tuple(shards)

    def read(self, region: tuple[slice, ...]) -> np.ndarray:
        """Read one region (a tile) into a fresh NumPy array."""
        if not os.path.isdir(self.path):
            raise FileNotFoundError(f"the Zarr store at {self.path} was deleted while still in use")
        return np.asarray(self.array[region])

    def _adopt(self, folder: "_Folder") -> None:
        """Point this store at a folder that was moved aside; the folder dies with its last store."""
        self.path = folder.path
        self.array = zarr.open_array(self.path, mode="r")
        self.owned = True
        self.writable = False
        self._folder = folder
        _open_stores.setdefault(self.path, weakref.WeakSet()).add(self)


class _Folder:
    """Ownership of a folder shared by several Store objects: removed once none refers to it."""

    def __init__(self, path: str):
        self.path = path
        weakref.finalize(self, _remove_tree, path)


_open_stores: dict[str, weakref.WeakSet] = {}


def _move_open_stores(path: str, aside: str) -> bool:
    """Make every open Store on ``path`` follow its old contents to ``aside``.

    Arrays are values: an array opened before ``path`` was replaced keeps
    reading what it opened. Returns whether any store adopted the folder.
    """
    stores = [st for st in _open_stores.pop(path, ()) if st.path == path]
    if not stores:
        return False
    folder = _Folder(aside)
    for st in stores:
        st._adopt(folder)
    return True


class PendingStore:
    """A store being written under a hidden name; :meth:`commit` makes it visible.

    Every chunk is written, even all-zero ones, and the array is marked
    ``attributes["jask"]["dense"]``, so readers can tell a missing chunk file
    (damage) from an unwritten one. With ``shards``, the array uses the Zarr v3
    sharding codec: ``shards`` is the shape of one shard file (the unit of disk
    I/O) and ``chunks`` its inner chunks (the tiles). Uncompressed chunks and
    shards are written by :mod:`jask.io.writer` straight from the tiles (shards
    by appending, instead of zarr-python rewriting a shard for every tile).
    """

    def __init__(self, final_path: str, shape, dtype, chunks, compressors=None, shards=None):
        self.final_path = os.path.abspath(final_path)
        os.makedirs(os.path.dirname(self.final_path), exist_ok=True)
        self.tmp_path = _sibling(self.final_path, "tmp")
        shards = None if shards is None else tuple(int(s) for s in shards)
        if shards is not None:
            check_shards(shape, chunks, shards)
        self.array = zarr.create_array(
            self.tmp_path, shape=tuple(shape), dtype=np.dtype(dtype), chunks=tuple(chunks),
            shards=shards, compressors=compressors, fill_value=0, zarr_format=3,
            config={"write_empty_chunks": True}, attributes={"jask": {"dense": True}})
        self._finalizer = weakref.finalize(self, _remove_tree, self.tmp_path)
        from jask.io.writer import make_chunk_writer
        self._writer = make_chunk_writer(self.array, self.tmp_path)

    def write(self, region: tuple[slice, ...], block) -> None:
        """Write one region; not thread-safe (one writer at a time, e.g. a :class:`jask.io.writer.WriteBehind`)."""
        if self._writer is not None:
            self._writer.write(tuple(region), np.asarray(block))
        else:
            self.array[region] = np.asarray(block)

    def abort(self) -> None:
        self._finalizer()

    def commit(self, owned: bool, replace: bool = False, writable: bool = False) -> Store:
        """Rename onto the final path; a replaced folder lives on for arrays still open on it."""
        if self._writer is not None:
            self._writer.finish()
        old_aside = None
        if os.path.exists(self.final_path):
            if not replace:
                self.abort()
                raise FileExistsError(f"{self.final_path} already exists; pass overwrite=True to replace it")
            ready = _sibling(self.final_path, "new")
            os.rename(self.tmp_path, ready)
            old_aside = _sibling(self.final_path, "old")
            os.rename(self.final_path, old_aside)
            os.rename(ready, self.final_path)
        else:
            os.rename(self.tmp_path, self.final_path)
        self._finalizer.detach()
        _fsync_dir(os.path.dirname(self.final_path))
        if old_aside is not None and not _move_open_stores(self.final_path, old_aside):
            _remove_tree(old_aside)
        array = zarr.open_array(self.final_path, mode="r+" if writable else "r")
        return Store(self.final_path, array, owned=owned, writable=writable)


def check_shards(shape, chunks, shards) -> None:
    """Refuse a shard shape that does not hold a whole number of chunks per axis."""
    if len(shards) != len(shape) or any(s < 1 for s in shards):
        raise ValueError(f"shards {tuple(shards)} do not fit an array of shape {tuple(shape)}")
    if any(s % c for s, c in zip(shards, chunks)):
        raise ValueError(f"shards {tuple(shards)} must be whole multiples of chunks {tuple(chunks)} "
                         "along every axis")


def recover(path: str) -> None:
    """Finish or undo a replacement of ``path`` that a crash interrupted.

    A ``-new-`` sibling is only ever a complete array, so it wins; otherwise the
    ``-old-`` sibling is put back. Leftover ``-tmp-`` siblings are incomplete and removed.
    """
    path = os.path.abspath(path)
    head, name = os.path.split(path)
    pattern = os.path.join(head, f".{glob.escape(name)}.jask-")
    if not os.path.exists(path):
        for kind in ("new", "old"):
            found = sorted(glob.glob(pattern + kind + "-*"))
            if found:
                os.rename(found[-1], path)
                break
    for leftover in glob.glob(pattern + "*"):
        pid = leftover.rsplit("-", 2)[-2]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            _remove_tree(leftover)


def open_existing(path: str, mode: str) -> Store:
    """Open a Zarr array at ``path`` without copying it, with clear errors for bad paths."""
    if mode not in ("r", "r+"):
        raise ValueError(f"from_zarr mode must be 'r' or 'r+', got {mode!r}")
    path = os.path.abspath(os.fspath(path))
    recover(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"from_zarr: no Zarr array at {path}")
    if not os.path.isdir(path):
        raise ValueError(f"from_zarr: {path} is a file, not a Zarr array folder")
    if not (os.path.exists(os.path.join(path, "zarr.json")) or os.path.exists(os.path.join(path, ".zarray"))):
        raise ValueError(f"from_zarr: {path} is not a Zarr array (no zarr.json or .zarray inside)")
    try:
        array = zarr.open_array(path, mode=mode)
    except Exception as e:  # zarr raises several types for malformed metadata
        raise ValueError(f"from_zarr: cannot open {path} as a Zarr array: {e}") from e
    return Store(path, array, owned=False, writable=(mode == "r+"))
