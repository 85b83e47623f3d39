"""Telling store URLs (``s3://``, ``gs://``, ``memory://``, ``file://``) from local paths.

:func:`parse` returns a local path for plain paths and ``file://`` URLs (so
they keep the direct reader) and a :class:`Location` for object stores. A
string that looks like a URL but is not one jask can open (``s3:/x``,
``ftp://x``) is refused with :class:`StoreURLError` before anything is read,
instead of being taken for a local folder named ``s3:``.

The error classes of remote stores live here too, so every layer can name them.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

# scheme -> the package that speaks it (None: built into fsspec)
SCHEMES = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "memory": None}
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(/*)(.*)$", re.DOTALL)
_KNOWN = "s3://, gs://, memory://, file:// or a local path"


class StoreURLError(ValueError):
    """A store URL jask cannot use (typo, unknown scheme, missing package); ``url`` names it."""

    def __init__(self, message: str, url: str):
        super().__init__(message)
        self.url = url


class RemoteStoreError(OSError):
    """A remote store could not be reached or used; ``url`` names it."""

    def __init__(self, message: str, url: str):
        super().__init__(message)
        self.url = url


class RemoteAccessError(RemoteStoreError, PermissionError):
    """The store refused the credentials (wrong key or secret, or no permission)."""


class BucketNotFoundError(RemoteStoreError, FileNotFoundError):
    """The bucket (or memory root) named in the URL does not exist."""


@dataclass(frozen=True)
class Location:
    """A store on an object store: ``url`` without trailing slash; ``bucket`` and ``key`` split from it."""

    scheme: str
    bucket: str
    key: str

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.bucket}" + (f"/{self.key}" if self.key else "")

    def child(self, name: str) -> "Location":
        """The location ``name`` below this one."""
        return Location(self.scheme, self.bucket, f"{self.key}/{name}" if self.key else name)

    def __str__(self) -> str:
        return self.url


def is_url(value) -> bool:
    """Whether ``value`` is a string that names a scheme (``x://`` or a known ``s3:``-like prefix)."""
    if not isinstance(value, str):
        return False
    m = _URL.match(value)
    return bool(m) and (m.group(2) == "//" or m.group(1).lower() in SCHEMES or m.group(1).lower() == "file")


def parse(path_or_url, what: str = "store") -> "str | Location":
    """A local absolute path, or the :class:`Location` of a URL; :class:`StoreURLError` for bad URLs.

    ``what`` names the call in error messages (``"to_zarr"``).
    """
    if isinstance(path_or_url, Location):
        return path_or_url
    value = os.fspath(path_or_url)
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    if not value:          # os.path.abspath("") would be the working directory
        raise ValueError(f"{what}: the path is empty; name the Zarr array's folder (or a store URL)")
    if not is_url(value):
        return os.path.abspath(value)
    scheme, slashes, rest = _URL.match(value).groups()
    scheme = scheme.lower()
    if scheme != "file" and scheme not in SCHEMES:
        raise StoreURLError(f"{what}: unknown store URL scheme {scheme!r} in {value!r}; use {_KNOWN}", value)
    if slashes != "//" and not (scheme == "file" and slashes in ("/", "///")):
        raise StoreURLError(f"{what}: malformed store URL {value!r}: expected '{scheme}://' "
                            f"followed by the {'path' if scheme == 'file' else 'bucket and path'}", value)
    if scheme == "file":
        host, _, path = rest.partition("/") if slashes == "//" else ("", "", rest)
        if host not in ("", "localhost"):
            raise StoreURLError(f"{what}: file URL {value!r} names host {host!r}; a local file URL "
                                "is file:///absolute/path", value)
        return os.path.abspath("/" + path)
    parts = [p for p in rest.split("/") if p]
    if not parts:
        raise StoreURLError(f"{what}: store URL {value!r} names no bucket", value)
    if any(p in (".", "..") for p in parts):
        raise StoreURLError(f"{what}: store URL {value!r} has '.' or '..' in its path", value)
    return Location(scheme, parts[0], "/".join(parts[1:]))
