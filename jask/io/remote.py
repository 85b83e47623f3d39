"""Zarr arrays on object stores (``s3://``, ``gs://``, ``memory://``), read and written through zarr's stores.

Local paths (and ``file://`` URLs) keep :mod:`jask.io.store` and the direct
reader; :func:`open_store` and :func:`new_pending` send everything else here.
Bytes move through zarr's own stores (:mod:`jask.io.backends` picks
ObjectStore over obstore for s3://, else FsspecStore over s3fs, gcsfs or
fsspec's memory filesystem); ``storage_options`` are the ones s3fs and gcsfs
take (``key``, ``secret``, ``endpoint_url``, ``client_kwargs``, ...).

Object stores cannot rename, so a commit is one small object written last
(:mod:`jask.io.versions` has the layout): every write goes to a fresh version
prefix ``<url>/v-<time>-<token>/``, and ``<url>/zarr.json``, a Zarr group whose
attributes name the current version, is replaced only once that version is
complete. A reader resolves the pointer once, at open, and reads that version's
keys only, so it never sees a mix; a killed writer leaves the pointer, and so
the old version, as they were.
"""
from __future__ import annotations

import asyncio
import sys
import threading
import weakref

import numpy as np
import zarr
from zarr.core.buffer.cpu import Buffer, NDBuffer
from zarr.core.sync import sync

from jask.io import backends, dtypes, faults, metadata, versions
from jask.io.decoded_chunks import DecodedChunks
from jask.io.layout import check_shards, describe_region
from jask.io.read_errors import failed_read
from jask.io.reader import MissingChunkError, TileReadError, prepare_read
from jask.io.open_local import open_existing
from jask.io.store import PendingStore, Store, describe_array
from jask.io.urls import Location, RemoteStoreError, parse


def open_store(path_or_url, mode: str, storage_options=None, fill_missing: bool = False) -> Store:
    """``from_zarr``'s opener: a local path through :func:`open_existing`, a URL through the version pointer.
    ``fill_missing``: missing chunks read as the fill value even where jask wrote every chunk."""
    if mode not in ("r", "r+"):
        raise ValueError(f"from_zarr mode must be 'r' or 'r+', got {mode!r}")
    where = resolve(path_or_url, storage_options, "from_zarr")
    if not isinstance(where, Location):
        store = open_existing(where, mode)
        store.fill_missing = fill_missing
        return store
    root = backends.zarr_store(where, storage_options, "from_zarr")
    current = versions.read_pointer(root, where, "from_zarr")
    if current is None:
        raise FileNotFoundError(f"from_zarr: no Zarr array at {where.url}")
    try:
        array = versions.open_version(root, current, mode, where.url, fill_missing)
    except (RemoteStoreError, FileNotFoundError):
        raise
    except Exception as e:  # zarr raises several types for malformed metadata
        raise ValueError(f"from_zarr: cannot open {where.url} as a Zarr array: {e}") from e
    return RemoteStore(where, current, array, root, owned=False, writable=(mode == "r+"),
                       storage_options=storage_options)


def resolve(path_or_url, storage_options, what: str):
    """:func:`parse`, refusing ``storage_options`` for a local path (they would be silently ignored)."""
    where = parse(path_or_url, what)
    if storage_options and not isinstance(where, Location):
        raise ValueError(f"{what}: storage_options apply to store URLs (s3://, gs://, memory://), "
                         f"not to the local path {where}")
    return where


def new_pending(path_or_url, shape, dtype, chunks, compressors=None, shards=None, storage_options=None,
                what: str = "to_zarr", resume: bool = False, attributes=None, like=None):
    """A pending store at a local path (:class:`PendingStore`) or a URL (:class:`RemotePendingStore`);
    ``attributes``: more ``jask`` attributes, local stores only (an optimizer checkpoint's link);
    ``like``: the zarr array it replaces, whose metadata it keeps (``update_``)."""
    where = parse(path_or_url, what)
    if not isinstance(where, Location):
        return PendingStore(where, shape, dtype, chunks, compressors=compressors, shards=shards, resume=resume,
                            attributes=attributes, like=like)
    if resume:
        raise ValueError(f"{what}: resume=True works for local folders only, not for the store URL {where}")
    return RemotePendingStore(where, shape, dtype, chunks, compressors, shards, storage_options, what, like=like)


def exists(location: Location, storage_options=None, what: str = "to_zarr") -> bool:
    """Whether an array is at the URL (checking access and the bucket on the way)."""
    root = backends.zarr_store(location, storage_options, what)
    return versions.read_pointer(root, location, what) is not None


class RemoteStore(Store):
    """One Zarr array version on an object store; ``path`` is its URL (what messages and ``update_`` use).

    It reads the version resolved at open (``version``; ``""`` for a plain
    Zarr array not written by jask) for its whole life. An owned (scratch) store
    deletes its URL once freed; a replaced one is deleted once the last store
    of this process reading it is freed (see :func:`_retire`).
    """

    def __init__(self, location: Location, version, array, root, owned: bool, writable: bool = False,
                 storage_options=None):
        self.location = location
        self.path = location.url
        self.version = version
        self.array = array
        self.owned = owned
        self.writable = writable
        self.storage_options = storage_options
        self._pin = None
        self._root = root
        self._lifetime = _Remover(versions.remove_prefix, root, "") if owned else None   # scratch: all of it
        if not owned:                                            # scratch URLs are never replaced
            _open.setdefault(self.path, weakref.WeakSet()).add(self)

    def deleted(self) -> bool:
        return False

    def make_reader(self):
        """:func:`jask.io.reader.reader_for` asks the store for its reader: reads go through zarr here."""
        return RemoteTileReader(self)


REMOVE_WAIT_SECONDS = 5.0   # a finalizer's wait for its removal (see _remove_off_loop)


class _Remover:
    """Calls ``remove(*args)`` (deleting keys) once no :class:`RemoteStore` holds this object, or at exit."""

    def __init__(self, remove, *args):
        weakref.finalize(self, _remove_off_loop, remove, args)


def _remove_off_loop(remove, args) -> None:
    """``remove(*args)`` on a thread of its own, waited for up to ``REMOVE_WAIT_SECONDS`` where waiting can end.

    A finalizer fires on whatever thread the garbage collector runs on, and the blocking ``sync`` the
    removal uses cannot finish on some: zarr's I/O thread refuses it; inside this thread's own ``sync``
    wait the I/O loop waits for the future's lock this thread holds (a sweep's ``sync`` collected an older
    test's store); a server thread in this process serving the store (a loopback emulator) would have
    to answer the removal's own requests (a suite run hung there). So the removal always runs on its own
    thread, and the firing thread waits for it (a dropped version is gone when ``gc.collect()`` returns)
    only where it can, and never past the bound: the removal then finishes in the background.
    """
    try:
        worker = threading.Thread(target=remove, args=args, name="jask-remove-version", daemon=True)
        worker.start()
    except RuntimeError:       # interpreter shutdown (Python 3.12+ starts no new threads then): remove here
        remove(*args)
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        if not _inside_sync():
            worker.join(REMOVE_WAIT_SECONDS)


def _inside_sync() -> bool:
    """Whether this thread is inside zarr's blocking ``sync`` (a frame of it is on the stack)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is sync.__code__:
            return True
        frame = frame.f_back
    return False


_open: dict[str, weakref.WeakSet] = {}


def _retire(url: str, root, old_version) -> None:
    """After a commit replaced ``old_version`` at ``url``: delete it now, or once this process's readers let go.

    Stores already open on it keep reading it (arrays are values); readers in
    other processes find its keys gone and get :class:`MissingChunkError`, never
    new data under old metadata.
    """
    readers = [st for st in _open.get(url, ()) if st.version == old_version and not st.owned]
    if not readers:
        versions.remove_version(root, old_version)
        return
    holder = _Remover(versions.remove_version, root, old_version)
    for st in readers:
        st._lifetime, st.owned, st.writable = holder, True, False


RELEASED = ".released"   # under a shared scratch stage's URL: one key per process that let go of it


def last_reader_deletes(store: RemoteStore, index: int, readers: int) -> None:
    """``store`` is read by ``readers`` processes (any hosts): when this one (``index``) lets go it
    writes ``<url>/.released/<index>``; whichever process then lists all ``readers`` markers deletes
    the URL. Every process writes its marker before listing, so the last one to write sees them all
    (object stores list what was written before), and no marker is written while its process reads."""
    store.owned = False
    store._lifetime = _Remover(_release, store._root, index, readers)


def _release(root, index: int, readers: int) -> None:
    try:
        sync(root.set(f"{RELEASED}/{index}", Buffer.from_bytes(b"")))
        if len(versions.list_keys(root, f"{RELEASED}/")) >= readers:
            versions.remove_prefix(root, "")
    except Exception:     # best effort, as in any finalizer: the owner's scratch folder goes at its exit
        pass


class RemotePendingStore:
    """A new version being written under a fresh prefix; :meth:`commit` points the URL at it.

    Access to the store (credentials, bucket) is checked here, before any
    tile is computed. Same interface and fault points as :class:`PendingStore`.
    """

    def __init__(self, location: Location, shape, dtype, chunks, compressors=None, shards=None,
                 storage_options=None, what: str = "to_zarr", like=None):
        self.location = location
        self.final_path = location.url
        self.storage_options = storage_options
        self.what = describe_array(shape, dtype, self.final_path)
        self._call = what
        self._root = backends.zarr_store(location, storage_options, what)
        versions.read_pointer(self._root, location, what)     # access and bucket checks, nothing written yet
        shards = None if shards is None else tuple(int(s) for s in shards)
        if shards is not None:
            check_shards(shape, chunks, shards)
        self.version = versions.new_version_name()
        self._finalizer = weakref.finalize(self, versions.remove_prefix, self._root, self.version)
        try:
            self.array = zarr.create_array(
                backends.version_store(self._root, self.version), shape=tuple(shape), dtype=dtypes.storage_dtype(dtype),
                **metadata.new_array(dtypes.dtype_attributes(dtype), chunks, shards, compressors, like))
            if faults.hook is not None:
                faults.fire("after_create", path=self.final_path)
        except BaseException as e:
            self._finalizer()
            if isinstance(e, Exception):
                raise backends.named_error(e, f"{what}: creating {self.what}", self.final_path) from e
            raise

    def write(self, region, block) -> None:
        """Write one region (one writer at a time); a failure names the region, array and URL."""
        block = dtypes.to_storage(np.asarray(block))
        try:
            if faults.hook is not None:
                faults.fire("before_tile_write", path=self.final_path, region=region)
            self.array[tuple(region)] = block
            if faults.hook is not None:
                faults.fire("after_tile_write", path=self.final_path, region=region)
        except Exception as e:
            raise backends.named_error(
                e, f"writing region {describe_region(region)} of {self.what}", self.final_path) from e

    def abort(self) -> None:
        """Delete the new version's keys (idempotent; a no-op once committed)."""
        self._finalizer()

    def commit(self, owned: bool, replace: bool = False, writable: bool = False) -> Store:
        """Point the URL at the new version (one object written), then retire the old one.

        Before the pointer is written (fault point ``after_swap`` follows it) a
        failure deletes the new version and leaves the URL as it was. A pointer
        write that raises is checked by reading the pointer back: if it names
        the new version the commit goes on; if it cannot be read the new version
        is left (the URL may name it) and the error raised.
        """
        try:
            if faults.hook is not None:
                faults.fire("before_commit", path=self.final_path)
            previous = versions.read_pointer(self._root, self.location, self._call)
            if previous is not None and not replace:
                raise FileExistsError(f"{self.final_path} already exists; pass overwrite=True to replace it")
            try:
                versions.write_pointer(self._root, self.version)
            except BaseException:
                landed = self._pointer_landed()
                if landed is None:              # unknown: keep the version (swept as an orphan if unnamed)
                    self._finalizer.detach()
                if not landed:
                    raise
        except BaseException as e:
            self.abort()
            if isinstance(e, (OSError, RuntimeError)) and not isinstance(e, (FileExistsError, RemoteStoreError)):
                raise backends.named_error(e, f"committing {self.what}", self.final_path) from e
            raise
        self._finalizer.detach()
        if faults.hook is not None:
            faults.fire("after_swap", path=self.final_path)
        versions.sweep_orphans(self._root, keep={self.version, previous})
        if previous is not None:
            _retire(self.final_path, self._root, previous)
            if faults.hook is not None:
                faults.fire("after_retire", path=self.final_path)
        if faults.hook is not None:
            faults.fire("after_commit", path=self.final_path)
        array = versions.open_version(self._root, self.version, "r+" if writable else "r", self.final_path)
        return RemoteStore(self.location, self.version, array, self._root, owned=owned, writable=writable,
                           storage_options=self.storage_options)


    def _pointer_landed(self) -> bool | None:
        """After the pointer write raised: whether it landed anyway (a PUT applied whose reply was
        lost), so the new version is current and must not be deleted; None when the pointer cannot be read."""
        try:
            return versions.read_pointer(self._root, self.location, self._call) == self.version
        except Exception:
            return None


class VersionWriter:
    """Writes this process's tiles into a version another process of a ``jax.distributed`` run created.

    A pass shared between processes (:mod:`jask.exec.multihost`) writes one
    version: process 0's :class:`RemotePendingStore` creates it (metadata), the
    others write their own tiles into it through this, and process 0 alone
    commits it (or, when a process is lost, deletes it). So this never deletes
    anything. Same ``write`` as the local chunk writers.
    """

    def __init__(self, version_url: str, storage_options=None, what: str = "to_zarr"):
        self.url = version_url
        where = parse(version_url, what)
        if not isinstance(where, Location):
            raise ValueError(f"{what}: {version_url} is no store URL")
        root = backends.zarr_store(where, storage_options, what)
        try:     # every chunk is stored, even one of fill values: a reader takes a missing one for damage
            self.array = zarr.open_array(root, mode="r+").with_config({"write_empty_chunks": True})
        except Exception as e:
            raise backends.named_error(e, f"{what}: opening the new version {version_url}", version_url) from e

    def write(self, region, block) -> None:
        try:
            self.array[tuple(region)] = block
        except Exception as e:
            raise backends.named_error(e, f"writing region {describe_region(region)} of {self.url}",
                                       self.url) from e

    def finish(self) -> None:
        """Nothing is buffered: each write is one PUT per chunk."""


class RemoteTileReader:
    """Reads regions of a :class:`RemoteStore` through zarr, which fetches a region's chunks concurrently.

    :class:`jask.io.prefetch.Prefetcher` runs these reads ahead on its threads,
    so fetching overlaps compute. Same interface as :class:`jask.io.reader.TileReader`.
    zarr fetches and decodes a whole chunk for any part of it, so a tile smaller
    than its chunk goes through :mod:`jask.io.decoded_chunks` during a pass: one
    GET and one decode per chunk, not one per tile.
    """

    mode = "remote"

    def __init__(self, store: RemoteStore):
        self.array = store.array
        self.path = store.path
        self.dtype = dtypes.logical_dtype(store.array, store.path)
        self._decoded = DecodedChunks(self.array.shape, self.array.chunks)
        self.whole_chunks = self._decoded        # a chunk is fetched and decoded whole for any part of it

    def read(self, region, out: np.ndarray | None = None) -> np.ndarray:
        """Read ``region`` into ``out`` (allocated when None) and return it, as :meth:`TileReader.read`."""
        region, out = prepare_read(region, out, self.dtype, self.path)
        raw = dtypes.to_storage(out)
        try:
            if raw.ndim == 0:
                raw[...] = self.array[()]
            else:
                self._decoded.read(region, raw, self._fetch)
        except TileReadError:
            raise
        except FileNotFoundError as e:
            raise MissingChunkError(f"region {describe_region(region)} of {self.path} cannot be read: "
                                    f"{type(e).__name__}: {e}", path=self.path, region=region) from e
        except Exception as e:
            raise failed_read(self.array, self.path, region, e) from e
        return out

    def _fetch(self, region, out) -> None:
        self.array.get_basic_selection(region, out=NDBuffer.from_numpy_array(out))
