"""jask's own key in a Zarr array's attributes, and the metadata a replacement keeps.

jask records what it knows about an array it wrote under ``attributes["jask"]``
(a dict: ``dense``, ``dtype``, ``optimizer_state``). Another tool may use that
name for something else (a string, a version number): such a value is not
jask's, so it reads as no jask attributes at all.

``update_`` builds a whole new array in place of the old one; the new array
keeps what users set on the old one (their attributes, dimension names,
codecs, fill value, chunk key encoding): :func:`carried_over`.
"""
from __future__ import annotations

from zarr.codecs import ShardingCodec

KEY = "jask"


def jask_attributes(array) -> dict:
    """``attributes["jask"]`` of a zarr ``array`` when it is jask's (a dict); else an empty dict."""
    attrs = getattr(array, "attrs", None)
    value = attrs.get(KEY) if attrs is not None and hasattr(attrs, "get") else None
    return value if isinstance(value, dict) else {}


def is_dense(array) -> bool:
    """Whether jask wrote every chunk of ``array`` (a missing chunk file is then damage)."""
    return bool(jask_attributes(array).get("dense", False))


def attributes_for(jask_entries: dict, like=None) -> dict:
    """The attributes of a new array jask writes: ``like``'s user attributes (if given) and jask's entries.

    A ``like`` whose ``"jask"`` attribute is not jask's keeps it as it is, and
    the new array then carries no jask entries (it reads as not dense).
    """
    user = dict(like.attrs) if like is not None else {}
    if KEY in user and not isinstance(user[KEY], dict):
        return user
    user[KEY] = dict(jask_entries)
    return user


def carried_over(like) -> dict:
    """``zarr.create_array`` arguments that make a new array keep ``like``'s metadata (a Zarr v3 array).

    Codecs, fill value, dimension names and chunk key encoding; attributes go
    through :func:`attributes_for`. A sharded array's whole sharding codec is kept
    (inner codecs, index codecs and where the index lies), given as the
    serializer of ``chunks`` the size of its shards, as zarr takes it.
    """
    if like is None:
        return {}
    meta = like.metadata
    kept = {"filters": like.filters, "compressors": like.compressors, "serializer": like.serializer,
            "fill_value": meta.fill_value}
    if getattr(meta, "zarr_format", 3) != 3:
        return kept
    kept["dimension_names"] = meta.dimension_names
    kept["chunk_key_encoding"] = meta.chunk_key_encoding
    codecs = tuple(meta.codecs)
    if like.shards is not None and isinstance(codecs[-1], ShardingCodec):
        kept.update(chunks=tuple(like.shards), shards=None, filters=codecs[:-1], serializer=codecs[-1],
                    compressors=())
    return kept


def new_array(entries: dict, chunks, shards=None, compressors=None, like=None) -> dict:
    """``zarr.create_array`` arguments (all but the store, shape and dtype) for a new array jask writes:
    Zarr v3, every chunk written and marked so (``dense``), ``like``'s metadata (else ``compressors`` and
    fill value 0; a sharded ``like``'s codec stands for ``chunks`` and ``shards``), jask's ``entries`` (the
    stored dtype, a checkpoint's link) under its key."""
    kept = carried_over(like) or {"compressors": compressors, "fill_value": 0}
    return {"chunks": tuple(chunks), "shards": shards, "zarr_format": 3, "config": {"write_empty_chunks": True},
            **kept, "attributes": attributes_for({"dense": True, **entries}, like)}
