"""Where a Zarr array's chunks lie on disk, shared by the tile reader and the chunk writers.

:class:`ChunkLayout` says whether a store's chunks can be read and written as
raw bytes (one uncompressed chunk per file, or uncompressed inner chunks in
shard files) or must go through zarr; :func:`covering` lists the chunks a
region touches.
"""
from __future__ import annotations

import math
import sys

import numpy as np
from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec

MAX_UINT64 = np.uint64(2**64 - 1)   # a shard index entry of an absent inner chunk


def describe_region(region) -> str:
    return "[" + ", ".join(f"{s.start}:{s.stop}" for s in region) + "]"


def chunk_files(array) -> tuple:
    """The grid of an array's chunk files: its shards, or its chunks when it is not sharded."""
    return tuple(array.chunks if getattr(array, "shards", None) is None else array.shards)


class ChunkLayout:
    """What :class:`TileReader` needs to know about a store's on-disk layout.

    ``mode`` is ``"chunk"`` (one uncompressed chunk per file), ``"shard"``
    (uncompressed inner chunks in sharded files) or ``"zarr"`` (let zarr decode).
    """

    def __init__(self, array):
        self.array = array
        self.mode = "zarr"
        self.dtype = np.dtype(array.dtype)
        self.shape = tuple(array.shape)
        self.outer = chunk_files(array)
        self.chunk = tuple(array.chunks)
        meta = array.metadata
        if getattr(meta, "zarr_format", 2) != 3 or not self.shape or self.dtype.kind not in "biuf":
            return
        if self.dtype.byteorder == ">" or (self.dtype.itemsize > 1 and sys.byteorder != "little"):
            return

        def raw(codecs):
            return (len(codecs) == 1 and isinstance(codecs[0], BytesCodec)
                    and (self.dtype.itemsize == 1 or getattr(codecs[0].endian, "value", codecs[0].endian)
                         in ("little", None)))

        codecs = tuple(meta.codecs)
        self.encode_key = meta.encode_chunk_key
        if raw(codecs):
            self.mode = "chunk"
        elif len(codecs) == 1 and isinstance(codecs[0], ShardingCodec) and raw(tuple(codecs[0].codecs)):
            sharding = codecs[0]
            idx = tuple(sharding.index_codecs)
            if not (raw(idx[:1]) and all(isinstance(c, Crc32cCodec) for c in idx[1:]) and len(idx) <= 2):
                return
            self.mode = "shard"
            self.per_shard = tuple(s // c for s, c in zip(self.outer, self.chunk))
            self.index_crc = len(idx) == 2
            self.index_bytes = 16 * math.prod(self.per_shard) + (4 if self.index_crc else 0)
            self.index_at_end = getattr(sharding.index_location, "value", sharding.index_location) == "end"


def covering(region, chunk):
    """Chunk coordinates (C order) of the chunks of edge ``chunk`` that ``region`` touches."""
    ranges = [range(s.start // c, -(-s.stop // c)) for s, c in zip(region, chunk)]
    if not ranges:
        yield ()
        return
    for coords in np.ndindex(*[len(r) for r in ranges]):
        yield tuple(r[i] for r, i in zip(ranges, coords))


def check_shards(shape, chunks, shards) -> None:
    """Refuse a shard shape that does not hold a whole number of chunks per axis."""
    if len(shards) != len(shape) or any(s < 1 for s in shards):
        raise ValueError(f"shards {tuple(shards)} do not fit an array of shape {tuple(shape)}")
    if any(s % c for s, c in zip(shards, chunks)):
        raise ValueError(f"shards {tuple(shards)} must be whole multiples of chunks {tuple(chunks)} "
                         "along every axis")
