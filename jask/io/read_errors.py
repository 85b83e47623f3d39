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
