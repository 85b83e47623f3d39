"""The errors a tile read raises: which tile of which store, and whether it is missing or damaged."""
from __future__ import annotations


class TileReadError(RuntimeError):
    """Reading one tile failed; ``path``, ``tile`` and ``region`` say which.

    The original exception is ``__cause__``.
    """

    def __init__(self, message, path=None, tile=None, region=None):
        super().__init__(message)
        self.path, self.tile, self.region = path, tile, region


class MissingChunkError(TileReadError, FileNotFoundError):
    """A chunk (or the whole store) that must exist is not on disk."""


class CorruptChunkError(TileReadError, ValueError):
    """A chunk file is there but damaged: wrong size, bad shard index, or undecodable."""


def dense_hint(path: str, fill_value) -> str:
    """What a missing chunk of an array jask wrote (``attributes.jask.dense``) probably means, and what to do."""
    return (f"; jask wrote every chunk of this array, so a missing one is damage or a partial copy, unless "
            f"another Zarr tool wrote a chunk of fill values ({fill_value}) and so removed its file "
            "(zarr-python does, with its default write_empty_chunks=False). If the array was edited so, "
            f"read missing chunks as the fill value: jask.from_zarr({str(path)!r}, missing_chunks='fill')")


def failed_read(array, path, region, err) -> TileReadError:
    """The error for a read of ``region`` of the zarr ``array`` that a decoding library (zarr, TensorStore)
    failed with ``err``.

    The chunk files (the shards or chunks) under ``region`` are read again one by one,
    and the first that fails on its own is named: :class:`CorruptChunkError`, or a plain
    :class:`TileReadError` for an ``OSError``. When every one reads alone, the failure was not in
    the store's bytes (a fault in the reading code, or a passing one): a plain :class:`TileReadError`
    that says so, since calling a healthy store damaged sends the user to repair data that is fine.
    """
    from jask.io.layout import chunk_files, covering, describe_region
    cls = TileReadError if isinstance(err, OSError) else CorruptChunkError
    outer = chunk_files(array)
    if array.shape:
        for coords in covering(region, outer):
            whole = tuple(slice(c * n, min((c + 1) * n, d)) for c, n, d in zip(coords, outer, array.shape))
            try:
                array[whole]
            except Exception:   # noqa: BLE001 -- any failure of this chunk alone is this chunk's
                key = chunk_key(array, coords)
                where = f"chunk file {key}" if key is not None else f"the chunk at {tuple(coords)}"
                return cls(f"{where} of {path} cannot be read or decoded: {type(err).__name__}: {err}",
                           path=path, region=region)
    return TileReadError(f"region {describe_region(region)} of {path} could not be read: {type(err).__name__}: "
                         f"{err}; each of its chunks reads on its own, so the store's data is not damaged",
                         path=path, region=region)


def chunk_key(array, outer_coords):
    """The store key of the chunk (or shard) file at ``outer_coords``, or None where zarr cannot say."""
    meta = array.metadata
    return meta.encode_chunk_key(outer_coords) if hasattr(meta, "encode_chunk_key") else None
