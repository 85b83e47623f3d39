"""Zarr v3 stores behind jask arrays, and atomic commits onto paths.

Every store jask writes is first built under a hidden sibling name and only
renamed onto its final path once complete, so a crash leaves either nothing or
a whole array. Replacing an existing path (``to_zarr(..., overwrite=True)``,
``update_``) swaps the complete new folder with the old one in one atomic
``renameat2(RENAME_EXCHANGE)`` (the path never goes missing), renames the old
folder to its ``-old-`` sibling and only then drops it. Where the filesystem
cannot exchange, it moves the old folder aside and renames the new one in;
:func:`jask.io.recovery.recover` finishes or rolls back such a swap when its process died.

Readers see one version. A user store (not scratch) is opened through a
:class:`~jask.io.pins.Pin`: a directory file descriptor holding a shared ``flock``, through
which metadata and every chunk are read, so a reader keeps reading the version
it opened while another process swaps the path under it. A replaced folder is
deleted only by whoever gets the exclusive lock on it: the committing process
when no one reads it, otherwise the last reader to let go of it, or the next
:func:`~jask.io.recovery.recover` of its path.

Fault injection (:mod:`jask.io.faults`) fires at each step of a write and a commit.
"""
from __future__ import annotations

import os
import weakref

import numpy as np
import zarr

from jask.io import dtypes, durable, exchange, faults, metadata, scratch
from jask.io.owners import released_token, sibling as _sibling
from jask.io.layout import check_shards, describe_region
from jask.io.pins import Pin, drop_retired, folder_deleted, remove_tree
from jask.io.recovery import recover, sweep
from jask.io.resume import ChunkJournal, claim, progress, warn_before_removing
from jask.io.writer import ChunkFileWriter, make_chunk_writer


def describe_array(shape, dtype, path) -> str:
    """How error messages name an array: dtype, shape and path."""
    return f"the {np.dtype(dtype)} array of shape {tuple(shape)} at {path}"


def _io_error(err: OSError, what: str) -> OSError:
    """An ``OSError`` of the same errno (and subclass) whose message says what was being done."""
    if err.errno:
        return OSError(err.errno, f"{what} failed: {err.strerror or err}")
    return OSError(f"{what} failed: {err}")


class Store:
    """One Zarr v3 array on disk.

    Parameters
    ----------
    path : str
        Folder of the Zarr array.
    array : zarr.Array
        The opened array (for a pinned store, opened through ``pin.root``:
        keep the store, or its pin, alive while using it).
    owned : bool
        Whether jask created it as scratch; owned stores are deleted once no
        array refers to them.
    writable : bool
        Whether ``update_`` may replace its contents.
    pin : Pin, optional
        Holds the folder of a user store; ``array`` is then opened through
        ``pin.root``, so it reads the version it opened even after the path is
        replaced by another process.
    """

    def __init__(self, path: str, array, owned: bool, writable: bool = False, pin: "Pin | None" = None):
        self.path = os.path.abspath(path)
        self.array = array
        self.owned = owned
        self.writable = writable
        self.fill_missing = False      # from_zarr(missing_chunks="fill"): even a jask array's missing chunks
        self._pin = pin
        self._folder = _Folder(self.path) if owned else None
        _open_stores.setdefault(self.path, weakref.WeakSet()).add(self)

    @property
    def root(self) -> str:
        """Where to read files from: the pinned folder of a user store, else ``path``."""
        return self._pin.root if self._pin is not None else self.path

    def deleted(self) -> bool:
        """Whether the folder this store reads was deleted (a pinned one may be renamed meanwhile)."""
        return folder_deleted(self._pin, self.path)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    @property
    def dtype(self) -> np.dtype:
        """The dtype tiles are computed in (bfloat16 for a uint16 array marked so: :mod:`jask.io.dtypes`)."""
        return dtypes.logical_dtype(self.array, self.path)

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
        if self.deleted():
            raise FileNotFoundError(f"the Zarr store at {self.path} was deleted while still in use")
        return dtypes.to_logical(np.asarray(self.array[region]), self.dtype)

    def _adopt(self, aside: str, folder: "_Folder") -> None:
        """Follow this store's folder to ``aside``, where a replacement moved it.

        A pinned store keeps reading through its pin, and the folder is deleted
        by the last pin let go of (here or in another process); an unpinned one
        shares ``folder``, removed with the last store holding it.
        """
        self.path = aside
        if self._pin is None or not self._pin.root.startswith("/proc/"):
            self.array = zarr.open_array(self.path, mode="r")
        if self._pin is None:
            self._folder = folder
        self.owned = True
        self.writable = False
        _open_stores.setdefault(self.path, weakref.WeakSet()).add(self)


def _removed_if_empty(path: str) -> bool:
    """Remove ``path`` if it is an empty folder (a new array goes there: ``rmdir`` fails on anything else)."""
    try:
        os.rmdir(path)
    except OSError:
        return False
    return True


class _Folder:
    """Ownership of a folder shared by several Store objects: removed once none refers to it."""

    def __init__(self, path: str):
        self.path = path
        weakref.finalize(self, remove_tree, path)


_open_stores: dict[str, weakref.WeakSet] = {}


def _move_open_stores(path: str, aside: str) -> bool:
    """Make every open Store on ``path`` follow its old contents to ``aside``.

    Arrays are values: an array opened before ``path`` was replaced keeps
    reading what it opened. Returns whether an unpinned store now owns the
    folder (pinned ones leave its deletion to :func:`~jask.io.pins.drop_retired` and their pins).
    """
    stores = [st for st in _open_stores.pop(path, ()) if st.path == path]
    folder = _Folder(aside) if any(st._pin is None for st in stores) else None
    for st in stores:
        st._adopt(aside, folder)
    return folder is not None


class PendingStore:
    """A store being written under a hidden name; :meth:`commit` makes it visible.

    ``like``: the array this one replaces (``update_``), whose metadata it keeps
    (:func:`jask.io.metadata.carried_over`). Every chunk is written, even all-zero ones, and the array is marked
    ``attributes["jask"]["dense"]``, so readers can tell a missing chunk file
    (damage) from an unwritten one. With ``shards``, the array uses the Zarr v3
    sharding codec: ``shards`` is the shape of one shard file (the unit of disk
    I/O) and ``chunks`` its inner chunks (the tiles). Uncompressed chunks and
    shards are written by :mod:`jask.io.writer` straight from the tiles (shards
    by appending, instead of zarr-python rewriting a shard for every tile).
    """

    def __init__(self, final_path: str, shape, dtype, chunks, compressors=None, shards=None, resume=False,
                 attributes=None, like=None):
        self.final_path = os.path.abspath(final_path)
        self.what = describe_array(shape, dtype, self.final_path)
        os.makedirs(os.path.dirname(self.final_path), exist_ok=True)
        # A user store (not in the scratch dir): its path is recorded and swept, and with durability
        # "power" it is synced; scratch stores die with their process, whoever commits them and how.
        self._user = user = not scratch.in_scratch(self.final_path)
        if user:                                       # note the path, sweep what killed writers left
            scratch.record_target(self.final_path)
            if not resume:
                warn_before_removing(self.final_path)
            recover(self.final_path, keep_resumable=resume)
        early = durable.start_writeback if user and durable.mode() == "power" else None
        self.tmp_path = _sibling(self.final_path, "tmp")
        self._finished = self._synced = self._kept = False     # complete(), keep()
        shards = None if shards is None else tuple(int(s) for s in shards)
        if shards is not None:
            check_shards(shape, chunks, shards)
        self._finalizer = weakref.finalize(self, remove_tree, self.tmp_path)
        try:
            entries = {**dtypes.dtype_attributes(dtype), **(attributes or {})}
            self.array = zarr.create_array(self.tmp_path, shape=tuple(shape), dtype=dtypes.storage_dtype(dtype),
                                           **metadata.new_array(entries, chunks, shards, compressors, like))
            self._writer = make_chunk_writer(self.array, self.tmp_path, on_written=early)
            self._journal = None                         # resume=True: chunks on disk (jask.io.resume)
            if resume and isinstance(self._writer, ChunkFileWriter):
                if claim(self.final_path, self.tmp_path):
                    self.array = zarr.open_array(self.tmp_path, mode="r+")
                    self._writer = make_chunk_writer(self.array, self.tmp_path, on_written=early)
                self._journal = ChunkJournal(self.tmp_path, self._writer.lay)
            if faults.hook is not None:
                faults.fire("after_create", path=self.final_path)
        except BaseException as e:
            self._finalizer()
            if isinstance(e, OSError):
                raise _io_error(e, f"creating {self.what}") from e
            raise

    def write(self, region: tuple[slice, ...], block) -> None:
        """Write one region; not thread-safe (one writer at a time, e.g. a :class:`jask.io.writer.WriteBehind`).

        An ``OSError`` (disk full, I/O error) is raised again as one of the same
        errno naming the region, the array and its path.
        """
        block = dtypes.to_storage(block)  # bfloat16 tiles go to disk as their uint16 bits
        try:
            if faults.hook is not None:
                faults.fire("before_tile_write", path=self.final_path, region=region)
            if self._writer is not None:
                self._writer.write(tuple(region), block)
            else:
                self.array[region] = block
            if self._journal is not None:
                self._journal.record(region)
            if faults.hook is not None:
                faults.fire("after_tile_write", path=self.final_path, region=region)
        except OSError as e:
            raise _io_error(e, f"writing region {describe_region(region)} of {self.what}") from e

    def done(self, region) -> bool:
        """Whether ``region`` is already on disk in a resumed write (its tile need not be computed)."""
        return self._journal is not None and self._journal.covers(region)

    def abort(self) -> None:
        """Remove the hidden folder (idempotent; a no-op once committed or kept)."""
        self._finalizer()

    def release(self) -> tuple[str, int, int] | None:
        """After a failed ``resume=True`` write: keep its journaled folder for a later ``resume=True`` write,
        as a kill would, renamed as an ended process's (:func:`jask.io.owners.released_token`); returns
        ``(folder, chunks done, chunks in all)``. None, having removed it, when no chunk is journaled."""
        if self._journal is None or not self._journal.done or not self._finalizer.alive:
            self.abort()
            return None
        kept = _sibling(self.final_path, "tmp", released_token())
        try:
            os.rename(self.tmp_path, kept)
        except OSError:
            self.abort()
            return None
        self._finalizer.detach()
        return (kept, *progress(kept))

    def readable(self) -> Store:
        """The complete array, read where it is written, before its commit: later stages of the same
        run read an ``update_all`` value there (the commit comes after the run)."""
        self.complete(power=False)
        return Store(self.tmp_path, self.array, owned=False)

    def keep(self) -> None:
        """Never remove the new folder from now on, even when the commit fails: a group commit past its
        commit point (:mod:`jask.io.groups`) needs it for the recovery that finishes the group."""
        self._kept = True
        self._finalizer.detach()

    def complete(self, power: bool) -> None:
        """Finish the writes (last chunks, shard indexes) and with ``power`` fsync the folder; each once."""
        if self._writer is not None and not self._finished:
            self._writer.finish()
        self._finished = True
        if power and not self._synced:
            if self._journal is not None:           # before the sync: no journal survives a power cut
                self._journal.remove()
            durable.sync_tree(self.tmp_path, self.final_path)
            self._synced = True

    def commit(self, owned: bool, replace: bool = False, writable: bool = False) -> Store:
        """Make the complete array visible at its final path; returns it opened.

        Until the swap (fault point ``after_swap``) a failure removes the new
        folder and leaves the path as it was; an ``OSError`` is raised again
        naming the array and path. (Past that point the new array is in place;
        only the old folder's disposal is left.) With durability ``"power"`` a
        user store's files and folders are fsynced before the swap and its parent
        folder after it (:mod:`jask.io.durable`). A replaced folder lives on for
        arrays still open on it, in this process or another.
        """
        pin = None
        power = self._user and durable.mode() == "power"   # scratch dies with its process: never synced
        try:
            self.complete(power)
            if faults.hook is not None:
                faults.fire("before_commit", path=self.final_path)
            if self._journal is not None:               # complete: a committed array carries no journal
                self._journal.remove()
            exists = os.path.lexists(self.final_path) and not _removed_if_empty(self.final_path)
            if exists and not replace:
                raise FileExistsError(f"{self.final_path} already exists; pass overwrite=True to replace it")
            pin = None if owned else Pin(self.tmp_path)   # the new folder, wherever it is renamed
            old_aside = self._swap(pinned=pin is not None) if exists else self._rename_in()
        except BaseException as e:
            if pin is not None:
                pin.release()
            self.abort()
            if isinstance(e, OSError) and not isinstance(e, FileExistsError):
                raise _io_error(e, f"committing {self.what}") from e
            raise
        if old_aside is not None:
            if faults.hook is not None:
                faults.fire("after_retire", path=self.final_path)
            if not _move_open_stores(self.final_path, old_aside):
                drop_retired(old_aside)
            sweep(self.final_path)
        if power:
            try:
                durable.sync_parent(self.final_path)
            except OSError as e:
                if pin is not None:
                    pin.release()
                raise _io_error(e, f"{self.what} is in place, but syncing its folder (durability 'power')") from e
        if faults.hook is not None:
            faults.fire("after_commit", path=self.final_path)
        array = zarr.open_array(pin.root if pin is not None else self.final_path,
                                mode="r+" if writable else "r")
        return Store(self.final_path, array, owned=owned, writable=writable, pin=pin)

    def _rename_in(self) -> None:
        os.rename(self.tmp_path, self.final_path)
        self._finalizer.detach()
        if faults.hook is not None:
            faults.fire("after_swap", path=self.final_path)
        return None

    def _swap(self, pinned: bool) -> str:
        """Put the new folder at the final path, the old one at an ``-old-`` sibling (returned); ``pinned``:
        the caller's pin on the new folder keeps it locked through a two-rename swap."""
        final = self.final_path
        if exchange.swap_names(self.tmp_path, final):
            self._finalizer.detach()             # the -tmp- name now holds the old array
            if faults.hook is not None:
                faults.fire("after_swap", path=final)
            aside = _sibling(final, "old")
            os.rename(self.tmp_path, aside)
            return aside
        ready = _sibling(final, "new")           # no RENAME_EXCHANGE here: two renames
        try:   # locked until the second rename: recovery leaves a held -new- alone (no flock: the pid decides)
            hold = None if pinned else Pin(self.tmp_path)
        except OSError:
            hold = None
        try:
            return self._two_renames(ready)
        finally:
            if hold is not None:
                hold.release()

    def _two_renames(self, ready: str) -> str:
        final = self.final_path
        os.rename(self.tmp_path, ready)
        if not self._kept:
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, remove_tree, ready)
        if faults.hook is not None:
            faults.fire("after_new_ready", path=final)
        aside = _sibling(final, "old")
        os.rename(final, aside)
        try:
            if faults.hook is not None:
                faults.fire("after_old_aside", path=final)
            os.rename(ready, final)
        except BaseException:
            os.rename(aside, final)              # put the old array back; recover() would, too
            raise
        self._finalizer.detach()
        if faults.hook is not None:
            faults.fire("after_swap", path=final)
        return aside
