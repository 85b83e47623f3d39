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

import zarr
from zarr.core.buffer import default_buffer_prototype
from zarr.core.buffer.cpu import Buffer
from zarr.core.sync import sync
from zarr.storage import WrapperStore

from jask.io import backends, metadata
from jask.io.reader import MissingChunkError
from jask.io.urls import Location, RemoteStoreError, StoreURLError

POINTER = "zarr.json"
ORPHAN_AGE_S = 24 * 3600   # a version this old that no pointer names is a killed writer's: swept at commit
_METADATA = (POINTER, ".zarray", ".zattrs", ".zgroup")


def new_version_name() -> str:
    """A fresh version prefix: creation time in ms (sorts in time order) and a random token."""
    return f"v-{int(time.time() * 1000):013d}-{secrets.token_hex(4)}"


def read_key(root, key: str):
    """The bytes of one object (a zarr Buffer), or None when it is missing."""
    return sync(root.get(key, prototype=default_buffer_prototype()))


def read_pointer(root, location: Location, what: str) -> str | None:
    """The current version at the URL: ``"v-..."``, ``""`` for a plain Zarr array, None when there is none.

    The first request to the store: bad credentials raise
    :class:`RemoteAccessError`, a missing bucket :class:`BucketNotFoundError`.
    """
    try:
        raw = read_key(root, POINTER)
        if raw is None:
            if read_key(root, ".zarray") is not None:
                return ""
            backends.check_bucket(root, location, what)
            return None
    except (RemoteStoreError, StoreURLError):
        raise
    except Exception as e:
        raise backends.named_error(e, f"{what}: reading {location.url}", location.url) from e
    doc = json.loads(raw.to_bytes())
    if doc.get("node_type") == "array":
        return ""
    marker = (doc.get("attributes") or {}).get("jask")
    current = marker.get("current") if isinstance(marker, dict) else None
    if doc.get("node_type") == "group" and isinstance(current, str) and current.startswith("v-"):
        return current
    raise ValueError(f"{what}: {location.url} holds a Zarr {doc.get('node_type', 'node')} that is not "
                     "an array jask wrote (no attributes.jask.current); open the array inside it instead")


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


def open_version(root, version: str, mode: str, url: str, fill_missing: bool = False):
    """Open the array of ``version`` (``""``: the plain array at the root) through a :class:`DenseStore`
    (``fill_missing``: missing chunks read as the fill value all the same)."""
    state = {"dense": False, "url": f"{url}/{version}" if version else url}
    array = zarr.open_array(DenseStore(backends.version_store(root, version), state), mode=mode)
    state["dense"] = metadata.is_dense(array) and not fill_missing
    return array


REMOVE_ATTEMPTS = 3   # a busy server may drop a request; what still fails is swept as an orphan later


def remove_prefix(root, prefix: str) -> None:
    """Delete every key under ``prefix`` (``""``: the whole URL); best effort, as at exit or in a finalizer."""
    for attempt in range(REMOVE_ATTEMPTS):
        try:
            sync(root.delete_dir(prefix))
            return
        except Exception:
            time.sleep(0.05 * (attempt + 1))


def remove_version(root, version: str) -> None:
    """Delete a replaced version: its prefix, or a plain array's own keys (never the pointer or a ``v-`` prefix)."""
    if version:
        remove_prefix(root, version)
        return
    try:
        keys = [k for k in list_keys(root) if k not in (POINTER,) and not k.startswith("v-")]
        for key in keys:
            sync(root.delete(key))
    except Exception:
        pass


def list_keys(root, prefix: str = "") -> list[str]:
    """Every key under ``prefix`` (``""``: all of ``root``)."""
    async def collect():
        return [k async for k in (root.list_prefix(prefix) if prefix else root.list())]
    return sync(collect())


def list_children(root) -> list[str]:
    """The names directly under ``root`` (prefixes and keys), without trailing slashes."""
    async def collect():
        return [name.rstrip("/") async for name in root.list_dir("")]
    return sync(collect())


def version_age_s(name: str) -> float | None:
    """Seconds since the version ``name`` was started, or None when ``name`` is no version prefix."""
    parts = name.split("-")
    if len(parts) != 3 or parts[0] != "v" or not parts[1].isdigit():
        return None
    return time.time() - int(parts[1]) / 1000


def sweep_orphans(root, keep) -> list[str]:
    """Delete version prefixes older than :data:`ORPHAN_AGE_S` other than ``keep``; returns their names.

    Younger ones may be another writer's work in progress, so they stay.
    """
    def orphan(name):
        age = version_age_s(name)
        return age is not None and age > ORPHAN_AGE_S and name not in keep
    return remove_children(root, orphan)


def remove_children(root, dead) -> list[str]:
    """Delete each name directly under ``root`` for which ``dead(name)`` holds; returns those names
    (none when ``root`` cannot be listed: a sweep is best effort)."""
    try:
        names = list_children(root)
    except Exception:
        return []
    gone = [name for name in names if dead(name)]
    for name in gone:
        remove_prefix(root, name)
    return gone

