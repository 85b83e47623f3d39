"""Data helpers every workload shares: uncompressed Zarr v3 stores, their pages, checksums.

Writing and reading stores, dropping or warming their pages in the page cache,
the raw ``readinto``/write baselines, and the summaries whose agreement between
systems (:func:`agree`) says two results are the same.
"""
from __future__ import annotations

import glob
import math
import os

import numpy as np


# ---------------------------------------------------------------- stores

def create_store(path, shape, chunks, dtype=np.float32, shards=None):
    """A new, empty, uncompressed Zarr v3 array (replacing ``path``)."""
    import zarr
    return zarr.create_array(path, shape=tuple(int(s) for s in shape), chunks=tuple(int(c) for c in chunks),
                             shards=shards, dtype=np.dtype(dtype), compressors=None, fill_value=0,
                             zarr_format=3, overwrite=True)


def write_store(path, shape, tile, seed, scale=1.0, shift=0.0, layout="chunk"):
    """Write a float32 store of uniform values in ``[shift, shift + scale)`` with ``tile``-edge chunks.

    Data comes from a fixed random pool, offset per row slab, so writing is
    fast and every slab differs. ``layout="shard"`` puts each row of chunks in
    one shard file (the Zarr v3 sharding codec). Returns ``path``.
    """
    shape = tuple(int(s) for s in shape)
    chunks = tuple(min(tile, d) for d in shape)
    shards = (chunks[0],) + tuple(shape[1:]) if layout == "shard" else None
    z = create_store(path, shape, chunks, np.float32, shards=shards)
    rows = chunks[0]
    slab = rows * int(np.prod(shape[1:], dtype=np.int64))
    pool = (np.random.default_rng(seed).random(slab + 7919, dtype=np.float32) * np.float32(scale)
            + np.float32(shift))
    for s, start in enumerate(range(0, shape[0], rows)):
        n = min(rows, shape[0] - start)
        off = (s * 1009 + seed * 7) % 7919
        size = n * (slab // rows)
        z[start:start + n] = pool[off:off + size].reshape((n,) + shape[1:])
    return path


def read_store(path) -> np.ndarray:
    """The whole store as one NumPy array (only for arrays meant to fit in RAM)."""
    import zarr
    z = zarr.open_array(path, mode="r")
    out = np.empty(z.shape, z.dtype)
    rows = z.chunks[0] if z.ndim else 1
    for start in range(0, z.shape[0] if z.ndim else 1, rows):
        if z.ndim:
            out[start:start + rows] = z[start:start + rows]
        else:
            out[...] = z[...]
    return out


def data_files(path) -> list[str]:
    """Chunk or shard files of a store, in chunk-index order (metadata excluded)."""
    files = [f for f in glob.glob(os.path.join(path, "c", "**"), recursive=True) if os.path.isfile(f)]
    return sorted(files, key=lambda f: [int(p) if p.isdigit() else p for p in f.split(os.sep)])


def _files_under(paths):
    for p in paths:
        if os.path.isfile(p):
            yield p
        elif os.path.isdir(p):
            for root, _, names in os.walk(p):
                for name in names:
                    yield os.path.join(root, name)


def drop_cache(paths) -> None:
    """Evict every file under ``paths`` from the page cache (written back first by ``os.sync``)."""
    os.sync()
    for f in _files_under(paths):
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm_cache(paths) -> None:
    """Read every file under ``paths`` once, so the timed run finds them in the page cache.

    A file gone by the time it is opened is skipped: in a run of several processes the work folder
    holds the others' scratch stores, which they delete as their arrays are freed."""
    raw_read(list(_files_under(paths)), missing_ok=True)


def raw_read(files, bufsize=16 * 2**20, missing_ok=False) -> int:
    """Sequential ``readinto`` of ``files`` into one reused buffer; returns the bytes read."""
    view = memoryview(bytearray(bufsize))
    total = 0
    for f in files:
        try:
            fh = open(f, "rb", buffering=0)
        except FileNotFoundError:
            if missing_ok:
                continue
            raise
        with fh:
            while True:
                n = fh.readinto(view)
                if not n:
                    break
                total += n
    return total


def raw_write(path, nbytes, bufsize=16 * 2**20) -> int:
    """Write ``nbytes`` to a new file from one reused buffer (no fsync, as no system under test syncs data)."""
    view = memoryview(bytearray(bufsize))
    left = int(nbytes)
    with open(path, "wb", buffering=0) as w:
        while left > 0:
            left -= w.write(view[:min(left, bufsize)])
    return int(nbytes)


# ---------------------------------------------------------------- checks

N_SAMPLES = 8


def summarize(a) -> dict:
    """Checksums of an array: float64 sum, L1 and L2 norms and a few elements at fixed positions."""
    a = np.asarray(a)
    flat = a.reshape(-1)
    picks = np.linspace(0, flat.size - 1, N_SAMPLES).astype(np.int64) if flat.size else []
    a64 = flat.astype(np.float64)
    return {"sum": float(a64.sum()), "l1": float(np.abs(a64).sum()), "l2": float(np.sqrt((a64 * a64).sum())),
            "samples": [float(flat[i]) for i in picks]}


def summarize_store(path, minus=None) -> dict:
    """:func:`summarize` of a store (or of its difference from the store ``minus``), one row slab at a time."""
    import zarr
    z = zarr.open_array(path, mode="r")
    base = None if minus is None else zarr.open_array(minus, mode="r")
    rows = max(1, z.chunks[0]) if z.ndim else 1
    if z.ndim == 0 or z.nbytes <= 64 * 2**20:
        return summarize(z[...] if base is None else np.asarray(z[...]) - np.asarray(base[...]))
    s = l1 = l2 = 0.0
    for start in range(0, z.shape[0], rows):
        b = np.asarray(z[start:start + rows])
        if base is not None:
            b = b - np.asarray(base[start:start + rows])
        b = b.astype(np.float64)
        s += float(b.sum())
        l1 += float(np.abs(b).sum())
        l2 += float((b * b).sum())
    n = int(np.prod(z.shape))
    picks = [np.unravel_index(i, z.shape) for i in np.linspace(0, n - 1, N_SAMPLES).astype(np.int64)]
    samples = [float(z[i]) - (0.0 if base is None else float(base[i])) for i in picks]
    return {"sum": s, "l1": l1, "l2": math.sqrt(l2), "samples": samples}


def agree(a, b, rtol: float = 1e-3):
    """Whether two checks agree; returns (ok, largest relative deviation).

    Scalars compare relatively. Array summaries compare their sums relative
    to the L1 norm (so cancellation cannot fail an equal result), norms
    relatively, and sampled elements relative to the largest sample.
    """
    worst = 0.0
    if isinstance(a, dict) and isinstance(b, dict) and "l1" not in a:
        keys = sorted(set(a) & set(b))
        if not keys:
            return False, float("inf")
        for k in keys:
            ok, dev = agree(a[k], b[k], rtol)
            worst = max(worst, dev)
        return worst <= rtol, worst
    if isinstance(a, dict):
        scale = max(a["l1"], b["l1"], 1e-30)
        worst = max(abs(a["sum"] - b["sum"]) / scale, abs(a["l1"] - b["l1"]) / scale,
                    abs(a["l2"] - b["l2"]) / max(a["l2"], b["l2"], 1e-30))
        smax = max([abs(x) for x in a["samples"] + b["samples"]] + [1e-30])
        for x, y in zip(a["samples"], b["samples"]):
            worst = max(worst, abs(x - y) / smax)
        return worst <= rtol, worst
    a, b = float(a), float(b)
    worst = abs(a - b) / max(abs(a), abs(b), 1e-30)
    return worst <= rtol, worst
