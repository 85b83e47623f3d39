"""Which of zarr's stores carries a URL's bytes, and what its errors mean.

``s3://`` goes through zarr's :class:`~zarr.storage.ObjectStore` over obstore
(Rust, its own I/O threads) when obstore is installed and the
``storage_options`` translate: on the loopback S3 benchmark it reads 2-4x
faster than the fsspec route (notes in ``jask/io/DESIGN.md``). Everything else
(``gs://``, ``memory://``, s3 options obstore has no name for, credentials
only botocore's chain finds: ``~/.aws`` profiles) goes through
:class:`~zarr.storage.FsspecStore`, which hands ``storage_options`` to
s3fs/gcsfs unchanged. Either way the caller passes options the way s3fs takes them.
"""
from __future__ import annotations

import os

from zarr.core.sync import sync
from zarr.storage import FsspecStore

from jask.io.urls import SCHEMES, BucketNotFoundError, Location, RemoteAccessError, RemoteStoreError, StoreURLError

USE_OBSTORE = True   # read and write s3:// through obstore where possible (see the module docstring)

# s3fs option -> obstore S3 config key
_S3FS_NAMES = {"key": "access_key_id", "secret": "secret_access_key", "token": "session_token",
               "endpoint_url": "endpoint", "anon": "skip_signature"}
_CLIENT_KWARGS = {"region_name": "region", "endpoint_url": "endpoint"}
_ACCESS_ERRORS = ("PermissionDeniedError", "UnauthenticatedError")   # obstore's, by name: it is optional


def obstore_config(storage_options) -> dict | None:
    """obstore's S3 config for s3fs-style ``storage_options``, or None where they do not translate.

    None too when obstore would guess differently from s3fs: no credentials
    given or in ``AWS_ACCESS_KEY_ID`` (s3fs also reads ``~/.aws``), or no
    region or endpoint known (s3fs finds a bucket's region itself).
    """
    opts = dict(storage_options or {})
    config = {}
    for name, value in dict(opts.pop("client_kwargs", None) or {}).items():
        if name not in _CLIENT_KWARGS:
            return None
        config[_CLIENT_KWARGS[name]] = value
    for name, value in opts.items():
        if name not in _S3FS_NAMES:
            return None
        config[_S3FS_NAMES[name]] = value
    if not ({"access_key_id", "skip_signature"} & config.keys() or os.environ.get("AWS_ACCESS_KEY_ID")):
        return None
    region = config.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not (region or config.get("endpoint")):
        return None
    config.setdefault("region", region or "us-east-1")
    return config


def zarr_store(location: Location, storage_options, what: str):
    """zarr's store rooted at the URL: ObjectStore over obstore where it applies, else FsspecStore."""
    config = obstore_config(storage_options) if location.scheme == "s3" and USE_OBSTORE else None
    if config is not None:
        try:
            from obstore.store import S3Store
            from zarr.storage import ObjectStore
        except ImportError:
            config = None
        else:
            http = str(config.get("endpoint", "")).startswith("http://")
            return ObjectStore(S3Store(location.bucket, prefix=location.key or None, config=config,
                                       client_options={"allow_http": True} if http else None))
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


def version_store(root, version: str):
    """A store of the same kind rooted at ``version``'s prefix below ``root`` (``""``: ``root`` itself).

    Rooted there, not a path below the root: zarr creates missing parent
    groups of a path, which would overwrite the pointer.
    """
    if not version:
        return root
    if isinstance(root, FsspecStore):
        return FsspecStore(root.fs, read_only=root.read_only, path=f"{root.path.rstrip('/')}/{version}")
    from obstore.store import S3Store
    from zarr.storage import ObjectStore
    s3 = root.store
    config = {k: v for k, v in s3.config.items() if k != "bucket"}
    prefix = f"{s3.prefix}/{version}" if s3.prefix else version
    return ObjectStore(S3Store(s3.config["bucket"], prefix=prefix, config=config, client_options=s3.client_options),
                       read_only=root.read_only)


def check_bucket(root, location: Location, what: str) -> None:
    """Raise :class:`BucketNotFoundError` when the URL's bucket does not exist (a missing key reads as None)."""
    if location.scheme == "memory":
        return
    if isinstance(root, FsspecStore):
        try:
            sync(root.fs._info(location.bucket))
        except FileNotFoundError:
            raise BucketNotFoundError(f"{what}: bucket {location.bucket!r} of {location.url} does not exist",
                                      location.url) from None
        return
    import obstore
    try:
        obstore.list_with_delimiter(root.store)
    except Exception as e:
        if "NoSuchBucket" in str(e):
            raise BucketNotFoundError(f"{what}: bucket {location.bucket!r} of {location.url} does not exist",
                                      location.url) from None
        raise


def named_error(err: BaseException, what: str, url: str) -> RemoteStoreError:
    """A :class:`RemoteStoreError` (access denied, or other) saying what failed at which URL."""
    if isinstance(err, RemoteStoreError):
        return err
    if isinstance(err, PermissionError) or type(err).__name__ in _ACCESS_ERRORS:
        return RemoteAccessError(f"{what}: access denied at {url} (check the credentials passed in "
                                 f"storage_options=...): {err}", url)
    return RemoteStoreError(f"{what} failed at {url}: {type(err).__name__}: {err}", url)
