"""Checks on a write's layout arguments (``chunks``, ``shards``, ``compressors``), made before any tile is computed.

Each takes what zarr takes (an int for the same edge on every axis, one codec
or a list of them) and gives back one form, or raises naming the argument,
the call and what is wrong.
"""
from __future__ import annotations

import numbers

import zarr

from jask.io import dtypes


def block_edges(value, shape, call: str, name: str = "chunks") -> tuple[int, ...]:
    """``chunks`` / ``shards`` as a tuple of positive ints, one per axis of ``shape``; an int is that edge on
    every axis (as in zarr). Refuses floats (``4.5`` would be cut to 4), wrong lengths and edges below 1."""
    shape = tuple(shape)
    if _is_int(value):
        value = (value,) * len(shape)
    try:
        edges = tuple(value)
    except TypeError:
        raise TypeError(f"{call}: {name} must be an int or a tuple of ints (one per axis of shape {shape}), "
                        f"got {value!r}") from None
    for axis, edge in enumerate(edges):
        if not _is_int(edge):
            raise TypeError(f"{call}: {name} {edges!r} must hold whole numbers: axis {axis} has {edge!r} "
                            f"({type(edge).__name__})")
    edges = tuple(int(e) for e in edges)
    if len(edges) != len(shape) or any(e < 1 for e in edges):
        raise ValueError(f"{call}: {name} {edges} do not fit an array of shape {shape} "
                         "(one edge of at least 1 per axis)")
    return edges


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


_V3_NAMES = {"zstd": "ZstdCodec", "gzip": "GzipCodec", "blosc": "BloscCodec", "crc32c": "Crc32cCodec"}


def compressor_list(value, dtype, call: str = "to_zarr"):
    """``compressors`` as zarr takes them for a Zarr v3 array of ``dtype`` (one codec becomes a list of one),
    checked by zarr now; a numcodecs (Zarr v2) codec or anything zarr refuses raises naming ``compressors``."""
    if value is None:
        return None
    many = value if isinstance(value, (list, tuple)) or (isinstance(value, str) and value == "auto") else [value]
    for codec in ([] if isinstance(many, str) else many):
        module = type(codec).__module__
        if module.split(".")[0] == "numcodecs" and not module.startswith("numcodecs.zarr3"):   # (v3 wrappers: fine)
            v3 = _V3_NAMES.get(getattr(codec, "codec_id", ""), "")
            hint = f"zarr.codecs.{v3}(...)" if v3 else "a codec from zarr.codecs"
            raise TypeError(f"{call}: compressors={value!r} is a numcodecs (Zarr v2) codec; jask writes Zarr v3, "
                            f"whose codecs come from zarr.codecs: pass {hint}")
    try:
        zarr.create_array(zarr.storage.MemoryStore(), shape=(1,), dtype=dtypes.storage_dtype(dtype),
                          compressors=many)
    except Exception as e:   # zarr's own message names neither the argument nor the call
        cls = TypeError if isinstance(e, TypeError) else ValueError
        raise cls(f"{call}: compressors={value!r} is not a Zarr v3 compressor (e.g. zarr.codecs.ZstdCodec(), "
                  f"or a list of them): {e}") from e
    return many if isinstance(many, str) else list(many)
