"""Dtypes Zarr cannot store natively, kept as a same-size storage dtype plus an attribute.

zarr 3.1 has no bfloat16 data type, so jask stores a bfloat16 array as
``uint16`` holding the same bits and records the real dtype in the array's
attributes: ``attributes["jask"]["dtype"] == "bfloat16"``. Tiles cross the
read/write boundary by ``ndarray.view`` (no copy, no rounding). Every other
dtype is stored as itself and gets no attribute. A big-endian array (Zarr v2
``'>f4'``) is computed in the same dtype in this machine's byte order.

A reader that does not know jask sees a ``uint16`` array and the attribute;
``z[...].view(ml_dtypes.bfloat16)`` recovers the values. Marking a ``uint16``
array written by other tools with that attribute makes jask read it as
bfloat16.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from jask.io import metadata

ATTRIBUTE = "dtype"  # key inside attributes["jask"]
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
_STORED_AS = {BFLOAT16: np.dtype(np.uint16)}
_BY_NAME = {d.name: d for d in _STORED_AS}


def is_stored_by_view(dtype) -> bool:
    """Whether ``dtype`` is one jask stores as another dtype's bits (bfloat16)."""
    return np.dtype(dtype) in _STORED_AS


def storage_dtype(dtype) -> np.dtype:
    """The dtype Zarr holds for arrays of ``dtype`` (``uint16`` for bfloat16, else ``dtype`` itself)."""
    dtype = np.dtype(dtype)
    return _STORED_AS.get(dtype, dtype)


def dtype_attributes(dtype) -> dict:
    """Entries for ``attributes["jask"]`` that record ``dtype`` when Zarr cannot (empty otherwise)."""
    return {ATTRIBUTE: np.dtype(dtype).name} if is_stored_by_view(dtype) else {}


def logical_dtype(array, path: str = "") -> np.dtype:
    """The dtype jask computes in for a zarr ``array``: the recorded one, else the stored one in this
    machine's byte order (JAX computes in no other; reads convert, :func:`to_logical`).

    Raises ``ValueError`` when the attribute names a dtype jask does not know,
    or one whose storage dtype is not what the array holds: viewing those
    bits as the recorded dtype would give wrong values.
    """
    stored = native(array.dtype)
    name = metadata.jask_attributes(array).get(ATTRIBUTE)
    if name is None:
        return stored
    where = f" at {path}" if path else ""
    logical = _BY_NAME.get(name)
    if logical is None:
        raise ValueError(f"the Zarr array{where} records jask dtype {name!r}, which jask does not know; "
                         f"known: {sorted(_BY_NAME)}")
    if stored != _STORED_AS[logical]:
        raise ValueError(f"the Zarr array{where} records jask dtype {name} but stores {stored}; "
                         f"{name} must be stored as {_STORED_AS[logical]}")
    return logical


def native(dtype) -> np.dtype:
    """``dtype`` in this machine's byte order (a Zarr v2 ``'>f4'`` array is computed as ``float32``)."""
    dtype = np.dtype(dtype)
    return dtype if dtype.isnative else dtype.newbyteorder("=")


def to_storage(block) -> np.ndarray:
    """``block`` as the bits Zarr stores (a view for bfloat16; unchanged otherwise)."""
    block = np.asarray(block)
    stored = storage_dtype(block.dtype)
    return block if stored == block.dtype else block.view(stored)


def to_logical(block: np.ndarray, dtype) -> np.ndarray:
    """A block read from storage, viewed as the array's logical ``dtype`` (no copy), or converted where only
    the byte order differs (a view would reinterpret the bytes)."""
    dtype = np.dtype(dtype)
    if block.dtype == dtype:
        return block
    return block.astype(dtype) if native(block.dtype) == dtype else block.view(dtype)
