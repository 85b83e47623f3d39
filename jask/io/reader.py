"""Reading one tile of a store into a buffer, by the fastest route its layout allows.

* :class:`TileReader` reads one region of one store into a NumPy buffer by
  the fastest route the store's layout allows. Uncompressed chunks (plain or
  inside shards) are read with ``preadv`` straight from the chunk file into the
  destination buffer: one system call and no decode, copy or allocation
  inside zarr. Compressed Zarr v3 chunks are decoded by TensorStore when it is installed (on its
  own thread pool); everything else (Zarr v2, 0-d arrays, no TensorStore) by zarr-python's
  ``get_basic_selection(out=...)``. Both decode whole chunks: in a pass, a tile covering part of
  a chunk is copied out of the chunk kept decoded (:mod:`jask.io.decoded_chunks`).
  :class:`jask.io.prefetch.Prefetcher` runs such reads ahead of the consumer.
* :meth:`TileReader.map_chunk` instead maps a whole uncompressed chunk file
  read-only (:mod:`jask.io.maps`): no copy at all from a warm page cache. The
  prefetcher uses it under the ``read_mmap`` setting.

Stores jask writes store every chunk (``attributes.jask.dense``), so a chunk
file that is missing there is damage and raises :class:`MissingChunkError`
(its message says how another Zarr tool's edit can cause it, and that
``from_zarr(..., missing_chunks="fill")`` reads such an array);
in other stores a missing chunk reads as the fill value, as Zarr specifies.
A chunk that is there but cannot be used (an uncompressed chunk or shard of
the wrong size, a shard index failing its checksum, a compressed chunk the
codec cannot decode) raises :class:`CorruptChunkError` naming the chunk key
and the store. Uncompressed chunks carry no checksum: garbage of the right
size reads as data.

User stores are read through their pinned folder (``store.root``, see
:class:`jask.io.pins.Pin`), so a read sees the version that was opened even
while another process replaces the path.
"""
from __future__ import annotations

import math
import os
import threading
import weakref
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from jask.io import dtypes, faults, leases, maps, metadata
from jask.io.buffers import aligned_empty
from jask.io.decoded_chunks import DecodedChunks
from jask.io.layout import MAX_UINT64, ChunkLayout, covering, describe_region
from jask.io.pins import folder_deleted, folder_emptied
from jask.io.read_errors import CorruptChunkError, MissingChunkError, TileReadError, chunk_key, dense_hint, failed_read

_INDEX_CACHE = 256  # shard indexes kept per reader (16 bytes per inner chunk each)


class TileKey(NamedTuple):
    """A prefetch key that names a tile in messages while telling apart arrays with the same tile index."""

    array: object
    tile: tuple


def prepare_read(region, out, dtype, path):
    """``region`` as a tuple and the buffer for it (``out`` checked, or a fresh aligned one); fires ``before_tile_read``."""
    region = tuple(region)
    shape = tuple(s.stop - s.start for s in region)
    if out is None:
        out = aligned_empty(shape, dtype)
    elif out.shape != shape or out.dtype != dtype:
        raise ValueError(f"read buffer of shape {out.shape} {out.dtype} does not fit region "
                         f"{describe_region(region)} of {path} ({dtype})")
    if faults.hook is not None:
        faults.fire("before_tile_read", path=path, region=region)
    return region, out


class TileReader:
    """Reads regions of one :class:`jask.io.store.Store` into NumPy buffers.

    Safe to call from several threads at once.
    """

    def __init__(self, store):
        self.array = store.array    # not the store itself: that would keep owned scratch alive
        self.path = store.path
        self.root = getattr(store, "root", store.path)   # where files are read: a user store's pinned folder
        self._pin = getattr(store, "_pin", None)          # ``root`` names the pin's descriptor: keep it open
        self.layout = ChunkLayout(store.array)
        self.dtype = dtypes.logical_dtype(store.array, store.path)  # layout.dtype is what is on disk
        # a missing chunk of a jask-written array is damage, unless the user opened it saying otherwise
        self.dense = metadata.is_dense(store.array) and not getattr(store, "fill_missing", False)
        self._indexes: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self._ts = _open_tensorstore(self.root, self.array) if self.layout.mode == "zarr" else None
        self._decoded = DecodedChunks(self.layout.shape, self.layout.chunk)   # used on the zarr route only
        self.whole_chunks = self._decoded if self.layout.mode == "zarr" else None   # reads decode whole chunks

    @property
    def mode(self) -> str:
        """``chunk`` or ``shard`` (direct reads), ``tensorstore`` or ``zarr`` (decoding libraries)."""
        return "tensorstore" if self._ts is not None else self.layout.mode

    def read(self, region, out: np.ndarray | None = None) -> np.ndarray:
        """Read ``region`` (a tuple of slices) into ``out`` (allocated when None) and return it.

        ``out`` and the result have the array's logical dtype (``self.dtype``);
        bfloat16 bits are read through a ``uint16`` view of the same buffer.
        """
        region, out = prepare_read(region, out, self.dtype, self.path)
        if folder_deleted(self._pin, self.path):
            self._deleted(region)
        raw = dtypes.to_storage(out)
        if self.layout.mode == "zarr":
            self._read_zarr(region, raw)
        else:
            self._read_direct(region, raw)
        return out

    # ------------------------------------------------------------ zarr route

    def _read_zarr(self, region, out):
        if self.dense and self.layout.shape:
            for coords in covering(region, self.layout.outer):
                self._require_file(coords)
        try:
            if out.ndim == 0:
                out[...] = self.array[()]
            else:       # in a pass, part of a chunk: that chunk is decoded once for all its tiles
                self._decoded.read(region, out, self._decode)
        except Exception as e:
            raise self._decode_error(region, e) from e

    def _decode(self, region, out):
        from zarr.core.buffer.cpu import NDBuffer
        if self._ts is not None:
            out[...] = self._ts[region].read().result()
            return
        self.array.get_basic_selection(region, out=NDBuffer.from_numpy_array(out))

    def _decode_error(self, region, err) -> TileReadError:
        """Name the chunk a failed zarr/TensorStore read choked on (see :func:`failed_read`)."""
        return failed_read(self.array, self.path, region, err)

    def _deleted(self, region=None):
        raise MissingChunkError(f"the Zarr store at {self.path} was deleted while still in use",
                                path=self.path, region=region)

    def _missing(self, key):
        """The error for a missing chunk file: the store's, where its whole folder went (``folder_emptied``)."""
        if folder_emptied(self._pin, self.path):
            self._deleted()
        raise MissingChunkError(f"chunk file {key} of {self.path} is missing{self._hint()}", path=self.path)

    def _hint(self) -> str:
        return dense_hint(self.path, self.array.fill_value) if self.dense else ""

    def _require_file(self, outer_coords):
        key = chunk_key(self.array, outer_coords)
        if key is not None and not os.path.exists(os.path.join(self.root, key)):
            self._missing(key)

    # ------------------------------------------------------------ direct route

    def _read_direct(self, region, out):
        lay = self.layout
        for coords in covering(region, lay.chunk):
            start = tuple(c * n for c, n in zip(coords, lay.chunk))
            inner = tuple(slice(max(s.start, b) - b, min(s.stop, b + n) - b)
                          for s, b, n in zip(region, start, lay.chunk))
            dest = out[tuple(slice(b + i.start - s.start, b + i.stop - s.start)
                             for s, b, i in zip(region, start, inner))]
            if lay.mode == "chunk":
                self._read_chunk_file(coords, inner, dest)
            else:
                self._read_inner_chunk(coords, inner, dest)

    def _open(self, key):
        """A descriptor of chunk or shard file ``key``, or None where it is missing and may be (a sparse store)."""
        try:
            if self._pin is not None:      # openat() on the pinned folder: no path lookup through /proc
                return os.open(key, os.O_RDONLY, dir_fd=self._pin.fd)
            return os.open(os.path.join(self.root, key), os.O_RDONLY)
        except FileNotFoundError:
            pass
        if self.dense or folder_emptied(self._pin, self.path):
            self._missing(key)
        return None

    def _read_chunk_file(self, coords, inner, dest):
        fd = self._open(self.layout.encode_key(coords))
        if fd is None:
            dest[...] = self.array.fill_value
            return
        try:
            nbytes = self._chunk_nbytes()
            size = os.fstat(fd).st_size
            if size != nbytes:
                raise CorruptChunkError(f"chunk file {self.layout.encode_key(coords)} of {self.path} has "
                                        f"{size} bytes, expected {nbytes} for an uncompressed chunk",
                                        path=self.path)
            _pread_chunk(fd, 0, self.layout.chunk, inner, dest)
        finally:
            os.close(fd)

    def map_chunk(self, region, lease_only: bool = False, min_bytes: int = 0) -> np.ndarray | None:
        """``region`` as a read-only view of its mapped chunk file, or None to :meth:`read` it instead.

        Only for an uncompressed, unsharded store, and a region that is one
        whole chunk (clipped at the array's edge, as an edge tile is), whose file
        is in the page cache (:func:`jask.io.maps.in_page_cache`). None also
        when the file is missing or is not exactly one chunk's bytes:
        :meth:`read` then fills it or raises its usual error. A missing chunk of
        a jask store raises :class:`MissingChunkError` here. The map is unmapped
        when the view and everything referring to its memory are gone.

        The file is mapped under a read lease where the kernel grants one
        (:mod:`jask.io.leases`: a writer truncating it in place then waits, and
        the tile keeps its bytes); ``lease_only`` maps nothing without one.
        Chunks smaller than ``min_bytes`` are read.
        """
        lay, region = self.layout, tuple(region)
        nbytes = self._chunk_nbytes() if lay.mode == "chunk" else 0
        if not nbytes or nbytes < min_bytes or len(region) != len(lay.chunk):
            return None
        coords = tuple(s.start // n for s, n in zip(region, lay.chunk))
        if any(s.start != c * n or s.stop != min((c + 1) * n, d)
               for s, c, n, d in zip(region, coords, lay.chunk, lay.shape)):
            return None
        if folder_deleted(self._pin, self.path):
            return None
        fd = self._open(lay.encode_key(coords))
        if fd is None:
            return None
        try:
            leased = leases.take(fd)   # first: from here on nobody changes the file in place under us
            if not leased and lease_only:
                return None
            # not in the page cache: one large read beats faulting a map in
            if os.fstat(fd).st_size != nbytes or not maps.in_page_cache(fd, nbytes):
                return None
            if faults.hook is not None:
                faults.fire("before_tile_read", path=self.path, region=region)
            mapped = maps.map_file(fd, nbytes)
            chunk = np.frombuffer(mapped, lay.dtype).reshape(lay.chunk)
            if leased:
                leases.watch(mapped, fd, chunk.ctypes.data, nbytes)
                fd = -1          # the watcher closes it once the map is gone
        finally:
            if fd >= 0:
                os.close(fd)
        return dtypes.to_logical(chunk[tuple(slice(0, s.stop - s.start) for s in region)], self.dtype)

    def _chunk_nbytes(self):
        return math.prod(self.layout.chunk) * self.layout.dtype.itemsize

    def _read_inner_chunk(self, coords, inner, dest):
        lay = self.layout
        shard = tuple(c // p for c, p in zip(coords, lay.per_shard))
        key = lay.encode_key(shard)
        fd = self._open(key)
        if fd is None:
            dest[...] = self.array.fill_value
            return
        try:
            index = self._index(shard, key, fd)
            offset, length = (int(v) for v in index[tuple(c % p for c, p in zip(coords, lay.per_shard))])
            if offset == int(MAX_UINT64):
                if self.dense:
                    raise MissingChunkError(f"inner chunk {tuple(coords)} is missing from shard {key} "
                                            f"of {self.path}{self._hint()}", path=self.path)
                dest[...] = self.array.fill_value
                return
            if length != self._chunk_nbytes():
                raise CorruptChunkError(f"inner chunk {tuple(coords)} in shard {key} of {self.path} has "
                                        f"{length} bytes, expected {self._chunk_nbytes()}", path=self.path)
            if offset + length > os.fstat(fd).st_size:
                raise CorruptChunkError(f"inner chunk {tuple(coords)} in shard {key} of {self.path} lies "
                                        f"past the end of the file (truncated shard)", path=self.path)
            _pread_chunk(fd, offset, lay.chunk, inner, dest)
        finally:
            os.close(fd)

    def _index(self, shard, key, fd):
        lay = self.layout
        with self._lock:
            hit = self._indexes.get(shard)
            if hit is not None and hit[0] == os.fstat(fd).st_mtime_ns:
                self._indexes.move_to_end(shard)
                return hit[1]
        mtime = os.fstat(fd).st_mtime_ns
        size = os.fstat(fd).st_size
        if size < lay.index_bytes:
            raise CorruptChunkError(f"shard {key} of {self.path} has {size} bytes, fewer than its index "
                                    f"({lay.index_bytes})", path=self.path)
        raw = os.pread(fd, lay.index_bytes, size - lay.index_bytes if lay.index_at_end else 0)
        if len(raw) != lay.index_bytes:
            raise OSError(f"short read of the index of shard {key} of {self.path}")
        body = raw[:16 * math.prod(lay.per_shard)]
        if lay.index_crc:
            import google_crc32c
            if google_crc32c.value(body) != int.from_bytes(raw[-4:], "little"):
                raise CorruptChunkError(f"shard {key} of {self.path} has a corrupt index (crc32c mismatch)",
                                        path=self.path)
        index = np.frombuffer(body, "<u8").reshape(lay.per_shard + (2,))
        with self._lock:
            self._indexes[shard] = (mtime, index)
            while len(self._indexes) > _INDEX_CACHE:
                self._indexes.popitem(last=False)
        return index


USE_TENSORSTORE = True   # read compressed Zarr v3 stores with TensorStore when it is installed


def _open_tensorstore(path, array):
    """A TensorStore view of a Zarr v3 array for compressed reads, or None (not installed, or not v3).

    TensorStore decodes chunks on its own thread pool, so one reader thread keeps both cores decoding;
    zarr-python decodes one chunk at a time here. Its chunk cache is off: it would count against no budget.
    """
    if not USE_TENSORSTORE or getattr(array.metadata, "zarr_format", 2) != 3 or not array.shape:
        return None
    try:
        import tensorstore as ts
    except ImportError:
        return None
    try:
        return ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": path},
                        "context": {"cache_pool": {"total_bytes_limit": 0}}},
                       read=True, open=True).result()
    except Exception:  # anything TensorStore cannot open, zarr-python still reads
        return None


def _pread_into(fd, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise OSError(f"unexpected end of file after {offset + done} bytes")
        done += n


BAND_WASTE = 4   # a band of whole chunk rows is read for a part when it is at most this many times the part


def _pread_chunk(fd, offset, chunk_shape, inner, dest):
    """Read the part ``inner`` of a C-order chunk stored at ``offset`` into ``dest``.

    Only the chunk's rows ``inner[0]`` are read: as one byte range when the part's other axes
    are whole, or when those rows are at most ``BAND_WASTE`` times the part (then copied out of
    a buffer of those rows), else row by row, each row's part read the same way. Reading the
    whole chunk for every part of it cost a tile of a store chunked more widely than the tiles
    16x its bytes and a chunk-sized buffer per reader thread (the demo at 2048 features, chunks
    of 8192 x 2048 float32, tiles of 1024 x 1024: 132 MiB held in a 61 MiB budget).
    """
    itemsize = dest.dtype.itemsize
    row = math.prod(chunk_shape[1:]) * itemsize
    r0, r1 = inner[0].start, inner[0].stop
    full_tail = all(i.start == 0 and i.stop == n for i, n in zip(inner[1:], chunk_shape[1:]))
    if full_tail and dest.flags.c_contiguous:
        # Whole chunk, or a run of its leading rows: one contiguous byte range.
        _pread_into(fd, memoryview(dest).cast("B"), offset + r0 * row)
        return
    if len(chunk_shape) == 1 or (r1 - r0) * row <= BAND_WASTE * dest.nbytes:
        band = aligned_empty((r1 - r0, *chunk_shape[1:]), dest.dtype)
        _pread_into(fd, memoryview(band).cast("B"), offset + r0 * row)
        dest[...] = band[(slice(None), *inner[1:])]
        return
    for i in range(r0, r1):
        _pread_chunk(fd, offset + i * row, chunk_shape[1:], inner[1:], dest[i - r0])


_readers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_readers_lock = threading.Lock()


def reader_for(store) -> TileReader:
    """The :class:`TileReader` of ``store`` (one, also when reader threads ask at once), kept as long as it lives."""
    with _readers_lock:
        r = _readers.get(store)
        if r is None or r.path != store.path or r.array is not store.array:
            make = getattr(store, "make_reader", None)   # a remote store reads through zarr (jask.io.remote)
            r = _readers[store] = make() if make is not None else TileReader(store)
    return r
