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
