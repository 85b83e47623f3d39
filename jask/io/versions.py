"""The versioned layout of a jask array on an object store, and its commit pointer.

An object store has no rename, but replacing one object is atomic: a reader
gets the old object or the new one, whole. So an array at ``<url>`` is::

    <url>/zarr.json                 the pointer: a Zarr group whose attributes say
                                    {"jask": {"current": "v-<ms>-<token>"}}
    <url>/v-<ms>-<token>/...        a complete Zarr v3 array (one per version)

A writer fills a fresh ``v-`` prefix, then replaces the pointer (the commit),
then deletes the version it replaced. A reader reads the pointer once, at open,
and from then on only keys under that version's prefix, so it never mixes two
versions; other Zarr tools open the group and its ``current`` member. A plain
Zarr array at ``<url>`` (not written by jask) reads as version ``""``; replacing
it writes the pointer over its ``zarr.json`` and deletes its chunks afterwards.
"""
from __future__ import annotations

import json
import secrets
import time

from zarr.core.buffer import default_buffer_prototype
from zarr.core.buffer.cpu import Buffer
from zarr.core.sync import sync
from zarr.storage import FsspecStore, WrapperStore

from jask.io.reader import MissingChunkError
from jask.io.urls import SCHEMES, BucketNotFoundError, Location, RemoteAccessError, RemoteStoreError, StoreURLError

POINTER = "zarr.json"
_METADATA = (POINTER, ".zarray", ".zattrs", ".zgroup")


def new_version_name() -> str:
    """A fresh version prefix: creation time in ms (sorts in time order) and a random token."""
    return f"v-{int(time.time() * 1000):013d}-{secrets.token_hex(4)}"


def zarr_store(location: Location, storage_options, what: str) -> FsspecStore:
    """zarr's fsspec store rooted at the URL; ``storage_options`` go to s3fs/gcsfs as they are."""
    package = SCHEMES[location.scheme]
    if package is not None:
        try:
            __import__(package)
        except ImportError:
            raise StoreURLError(f"{what}: {location.scheme}:// URLs need the {package} package "
                                f"(pip install {package}) to open {location.url}", location.url) from None
    try:
        return FsspecStore.from_url(location.url, storage_options=dict(storage_options or {}))
    except Exception as e:
        raise named_error(e, f"{what}: opening {location.url}", location.url) from e


def named_error(err: BaseException, what: str, url: str) -> RemoteStoreError:
    """A :class:`RemoteStoreError` (access denied, missing bucket, other) saying what failed at which URL."""
    if isinstance(err, RemoteStoreError):
        return err
    if isinstance(err, PermissionError):
        return RemoteAccessError(f"{what}: access denied at {url} (check the credentials passed in "
                                 f"storage_options=...): {err}", url)
    return RemoteStoreError(f"{what} failed at {url}: {type(err).__name__}: {err}", url)


def _get(root, key: str):
    return sync(root.get(key, prototype=default_buffer_prototype()))


def read_pointer(root, location: Location, what: str) -> str | None:
    """The current version at the URL: ``"v-..."``, ``""`` for a plain Zarr array, None when there is none.

    The first request to the store: bad credentials raise
    :class:`RemoteAccessError`, a missing bucket :class:`BucketNotFoundError`.
    """
    try:
        raw = _get(root, POINTER)
        if raw is None:
            if _get(root, ".zarray") is not None:
                return ""
            _check_bucket(root, location, what)
            return None
    except (RemoteStoreError, StoreURLError):
        raise
    except Exception as e:
        raise named_error(e, f"{what}: reading {location.url}", location.url) from e
    doc = json.loads(raw.to_bytes())
    if doc.get("node_type") == "array":
        return ""
    current = ((doc.get("attributes") or {}).get("jask") or {}).get("current")
    if doc.get("node_type") == "group" and isinstance(current, str) and current.startswith("v-"):
        return current
    raise ValueError(f"{what}: {location.url} holds a Zarr {doc.get('node_type', 'node')} that is not "
                     "an array jask wrote (no attributes.jask.current); open the array inside it instead")


def _check_bucket(root, location: Location, what: str) -> None:
    if location.scheme == "memory":
        return
    try:
        sync(root.fs._info(location.bucket))
    except FileNotFoundError:
        raise BucketNotFoundError(f"{what}: bucket {location.bucket!r} of {location.url} does not exist",
                                  location.url) from None


def write_pointer(root, version: str) -> None:
    """The commit: one PUT replacing ``<url>/zarr.json`` with a group naming ``version``."""
    doc = {"zarr_format": 3, "node_type": "group", "attributes": {"jask": {"current": version}}}
    sync(root.set(POINTER, Buffer.from_bytes(json.dumps(doc).encode())))


class DenseStore(WrapperStore):
    """Raises :class:`MissingChunkError` for an absent chunk of an array jask wrote (every chunk is stored).

    zarr would read it as the fill value; here it is damage, or a version its
    writer retired while this reader still had it open.
    """

    def __init__(self, store, state: dict | None = None):
        super().__init__(store)
        self._state = state if state is not None else {"dense": False, "url": ""}

    def _with_store(self, store):
        return type(self)(store, self._state)

    async def get(self, key, prototype, byte_range=None):
        buf = await self._store.get(key, prototype, byte_range)
        if buf is None and self._state["dense"] and not key.endswith(_METADATA):
            url = self._state["url"]
            raise MissingChunkError(f"chunk {key} of {url} is missing (damaged, or deleted by a writer "
                                    "that replaced this version)", path=url)
        return buf


def version_store(root, version: str) -> FsspecStore:
    """A store rooted at ``version``'s prefix (``""``: the root itself).

    Rooted there, not a path below the root: zarr creates missing parent
    groups of a path, which would overwrite the pointer.
    """
    if not version:
        return root
    return FsspecStore(root.fs, read_only=root.read_only, path=f"{root.path.rstrip('/')}/{version}")


def open_version(root, version: str, mode: str):
    """Open the array of ``version`` (``""``: the plain array at the root) through a :class:`DenseStore`."""
    import zarr
    state = {"dense": False, "url": f"{_url(root)}/{version}" if version else _url(root)}
    array = zarr.open_array(DenseStore(version_store(root, version), state), mode=mode)
    state["dense"] = bool((array.attrs.get("jask") or {}).get("dense", False))
    return array


def _url(root) -> str:
    return root.fs.unstrip_protocol(root.path) if hasattr(root, "fs") else str(root)


def remove_prefix(root, prefix: str) -> None:
    """Delete every key under ``prefix`` (``""``: the whole URL); best effort, as at exit or in a finalizer."""
    try:
        sync(root.delete_dir(prefix))
    except Exception:
        pass


def remove_version(root, version: str) -> None:
    """Delete a replaced version: its prefix, or a plain array's own keys (never the pointer or a ``v-`` prefix)."""
    if version:
        remove_prefix(root, version)
        return
    try:
        keys = [k for k in _list(root) if k not in (POINTER,) and not k.startswith("v-")]
        for key in keys:
            sync(root.delete(key))
    except Exception:
        pass


def _list(root) -> list[str]:
    async def collect():
        return [k async for k in root.list()]
    return sync(collect())


class PlainRemover:
    """Deletes a replaced plain array's keys once no store holds this object."""

    def __init__(self, root):
        import weakref
        weakref.finalize(self, remove_version, root, "")
