"""Streaming I/O benchmark: jask passes against raw sequential reads of the same bytes.

Examples::

    python -m jask.bench.stream --op=sum --gib=4 --budget=256MB
    python -m jask.bench.stream --op=add --gib=2 --budget=256MB
    python -m jask.bench.stream --op=readers --gib=1 --layout=shard,chunk,zstd

``--gib`` is the size of each input array (``add`` reads two and writes one).
Every case is measured cold-ish (the store's pages dropped from the page cache
with ``posix_fadvise(DONTNEED)`` first) and warm (read once before), and the
raw baseline runs in the same process on the same files: ``readinto`` of every
chunk or shard file in order into one reused buffer (for ``add``, plus writing
the same number of bytes to a new file). Data lives under ``--dir``, which
must be a real disk (default ``bench-out/data``); it is deleted at the end unless
``--keep``. Peak RSS is split into the process's RSS when the pass began (the
runtime baseline plus inputs and caches) and the growth during the pass, which
is what the memory budget bounds.

``--op=batches`` times one epoch of ``jask.batches`` in order and shuffled, side by
side, with the chunks decoded (a compressed chunk decodes whole for any rows of it).

``--op=readers`` compares the ways of reading tiles side by side: direct
``preadv`` of uncompressed chunks (:class:`jask.io.reader.TileReader`),
zarr-python into a preallocated buffer and allocating, each with and without
the :class:`jask.io.prefetch.Prefetcher`, and TensorStore when it is installed.
"""
from __future__ import annotations

import glob
import os
import shutil
import sys
import time

import numpy as np
from absl import flags

from jask.bench import data, harness

FLAGS = flags.FLAGS
flags.DEFINE_enum("op", "sum", ["sum", "add", "dot", "readers", "batches"], "What to measure (dot: sum(x @ x), "
                  "a kernel much more expensive than its reads; batches: an epoch of jask.batches, in order and "
                  "shuffled).")
flags.DEFINE_float("gib", 2.0, "Size of each input array in GiB.")
flags.DEFINE_string("budget", "256MB", "jask memory budget.")
flags.DEFINE_string("dir", harness.bench_dir("data"), "Folder for the benchmark stores (a real disk, not tmpfs; "
                    "default: $JASK_BENCH_DIR/data, JASK_BENCH_DIR defaulting to bench-out).")
flags.DEFINE_list("layout", ["shard"], "Input layouts: shard (uncompressed, sharded), chunk "
                  "(uncompressed, one file per chunk), zstd (zstd-compressed chunks).")
flags.DEFINE_list("cache", ["cold", "warm"], "Page-cache states to measure: cold, warm.")
flags.DEFINE_integer("cols", 16384, "Columns of the 2-D test arrays.")
flags.DEFINE_integer("repeat", 3, "Runs per case and cache state (the median is reported).")
flags.DEFINE_integer("depth", 2, "Prefetch depth for --op=readers.")
flags.DEFINE_integer("threads", 2, "Reader threads for --op=readers.")
flags.DEFINE_integer("batch_size", 256, "Rows per batch for --op=batches.")
flags.DEFINE_bool("keep", False, "Keep the benchmark stores.")

GiB = 2**30


# ---------------------------------------------------------------- data

def _shape(gib, cols):
    rows = max(1, int(round(gib * GiB / (4 * cols))))
    return rows, cols


def make_store(path, shape, tile, layout, seed):
    """Write a float32 store of ``shape`` with ``tile``-edge chunks in ``layout``; returns its path."""
    from jask.io.store import PendingStore
    if os.path.exists(path):
        shutil.rmtree(path)
    chunks = (min(tile, shape[0]), min(tile, shape[1]))
    shards = (chunks[0], shape[1]) if layout == "shard" else None   # one shard per row of tiles
    compressors = None
    if layout == "zstd":
        from zarr.codecs import ZstdCodec
        compressors = [ZstdCodec(level=1)]
    pending = PendingStore(path, shape, np.float32, chunks, compressors=compressors, shards=shards)
    pool = np.random.default_rng(seed).standard_normal(chunks[0] * chunks[1] + 4099).astype(np.float32)
    n = 0
    for i in range(0, shape[0], chunks[0]):
        for j in range(0, shape[1], chunks[1]):
            reg = (slice(i, min(i + chunks[0], shape[0])), slice(j, min(j + chunks[1], shape[1])))
            size = (reg[0].stop - i) * (reg[1].stop - j)
            k = (n * 4099) % 4099
            pending.write(reg, pool[k:k + size].reshape(reg[0].stop - i, reg[1].stop - j))
            n += 1
    pending.commit(owned=False)
    return path


def data_files(path):
    files = [f for f in glob.glob(os.path.join(path, "c", "**"), recursive=True) if os.path.isfile(f)]
    return sorted(files, key=lambda f: [int(p) if p.isdigit() else p for p in f.split(os.sep)])


def drop_cache(paths):
    """Evict the files under ``paths`` from the page cache (they must be clean: written back first)."""
    os.sync()
    for p in paths:
        for f in glob.glob(os.path.join(p, "**"), recursive=True):
            if os.path.isfile(f):
                fd = os.open(f, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


# ---------------------------------------------------------------- raw baselines

def raw_read(paths, bufsize=16 * 2**20):
    """Sequential readinto of every data file of the stores; returns (seconds, bytes)."""
    files = [f for p in paths for f in data_files(p)]
    t0 = time.perf_counter()
    total = data.raw_read(files, bufsize)
    return time.perf_counter() - t0, total


def raw_read_write(paths, out_dir, nbytes_out, bufsize=16 * 2**20):
    """Read the stores as :func:`raw_read` does, and write ``nbytes_out`` bytes to a new file alongside."""
    buf = bytearray(bufsize)
    view = memoryview(buf)
    out = os.path.join(out_dir, "raw-out.bin")
    files = [f for p in paths for f in data_files(p)]
    total = written = 0
    t0 = time.perf_counter()
    with open(out, "wb", buffering=0) as w:
        for f in files:  # one output byte per len(paths) input bytes, like an elementwise op
            with open(f, "rb", buffering=0) as fh:
                while True:
                    n = fh.readinto(view)
                    if not n:
                        break
                    total += n
                    want = min(n // len(paths), nbytes_out - written)
                    if want > 0:
                        w.write(view[:want])
                        written += want
    seconds = time.perf_counter() - t0
    os.remove(out)
    return seconds, total, written


# ---------------------------------------------------------------- jask passes

def jask_pass(op, inputs, out_path):
    """One jask pass of ``op`` over the input stores; returns (seconds, profile)."""
    import jask
    xs = [jask.from_zarr(p) for p in inputs]
    with jask.profile() as p:
        t0 = time.perf_counter()
        if op == "sum":
            jask.sum(xs[0])
        elif op == "add":
            jask.to_zarr(jask.add(xs[0], xs[1]), out_path, overwrite=True)
        else:  # dot: a kernel far more expensive than its reads
            jask.sum(jask.dot(xs[0], xs[0]))
        seconds = time.perf_counter() - t0
    return seconds, p


def _row(label, seconds, nbytes, base=None, p=None):
    rate = nbytes / seconds / GiB
    line = f"  {label:<34} {seconds:7.3f} s  {rate:6.2f} GiB/s"
    if base is not None:
        line += f"  {100 * rate / base:5.1f}% of raw"
    if p is not None:
        line += (f"  io-wait {100 * p.io_wait_seconds / max(seconds, 1e-9):4.1f}%"
                 f"  peak RSS {p.peak_rss_bytes / 2**20:5.0f} MiB = entry {p.rss_at_entry_bytes / 2**20:.0f}"
                 f" + pass {p.working_set_bytes / 2**20:.0f} MiB")
    print(line, flush=True)
    return rate


def bench_op(op, layout, root):
    import jask
    from jask.plan.tiling import default_tile
    jask.set_memory_budget(FLAGS.budget, scratch_dir=os.path.join(root, "scratch"))
    if op == "dot":
        n = int(round((FLAGS.gib * GiB / 4) ** 0.5))
        shape = (n, n)
    else:
        shape = _shape(FLAGS.gib, FLAGS.cols)
    tile = default_tile(shape, 4)
    n_in = 2 if op == "add" else 1
    t0 = time.perf_counter()
    inputs = [make_store(os.path.join(root, f"in{i}-{layout}.zarr"), shape, tile, layout, i) for i in range(n_in)]
    out = os.path.join(root, f"out-{layout}.zarr")
    nbytes = shape[0] * shape[1] * 4
    print(f"{op} over {n_in} x {shape} float32 ({nbytes / GiB:.2f} GiB each), layout {layout}, "
          f"tile {tile}, budget {FLAGS.budget}; stores written in {time.perf_counter() - t0:.1f} s", flush=True)

    def run_raw():
        if op == "add":
            s, b, w = raw_read_write(inputs, root, nbytes)
            return b + w, s
        return raw_read(inputs)[::-1]

    seconds, p = jask_pass(op, inputs, out)  # compiles the kernels, outside the measurements
    moved = p.bytes_read + p.bytes_written
    for cache in FLAGS.cache:
        raws, runs = [], []
        for _ in range(FLAGS.repeat):
            # Dirty pages of the previous run are written back first (os.sync), so no run pays
            # for another's writes; each run's own writes are not synced inside its timing.
            drop_cache(inputs + [out]) if cache == "cold" else os.sync()
            b, s = run_raw()
            raws.append(b / s / GiB)
            drop_cache(inputs + [out]) if cache == "cold" else os.sync()
            runs.append(jask_pass(op, inputs, out))
        raw_rate = float(np.median(raws))
        s, p = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
        print(f" {cache} (median of {FLAGS.repeat}; raw runs {', '.join(f'{r:.2f}' for r in raws)} GiB/s, "
              f"jask runs {', '.join(f'{moved / r[0] / GiB:.2f}' for r in runs)} GiB/s):")
        if op != "dot":
            _row("raw readinto" + (" + write" if op == "add" else ""), moved / raw_rate / GiB, moved)
        _row(f"jask {op}", s, moved, raw_rate if op != "dot" else None, p)
        print("   ", str(p).replace("\n", "\n    "))
    for path in inputs + [out]:
        if not FLAGS.keep:
            shutil.rmtree(path, ignore_errors=True)


def bench_readers(layout, root):
    from zarr.core.buffer.cpu import NDBuffer

    from jask.plan.tiling import default_tile
    from jask.io.prefetch import Prefetcher
    from jask.io.buffers import aligned_empty
    from jask.io.reader import TileReader
    from jask.io.open_local import open_existing
    import jask
    jask.set_memory_budget(FLAGS.budget)
    shape = _shape(FLAGS.gib, FLAGS.cols)
    tile = default_tile(shape, 4)
    path = make_store(os.path.join(root, f"readers-{layout}.zarr"), shape, tile, layout, 0)
    store = open_existing(path, "r")
    nbytes = shape[0] * shape[1] * 4
    regions = [(slice(i, min(i + tile, shape[0])), slice(j, min(j + tile, shape[1])))
               for i in range(0, shape[0], tile) for j in range(0, shape[1], tile)]
    reader = TileReader(store)
    arr = store.array
    print(f"read routes over {shape} float32 ({nbytes / GiB:.2f} GiB), layout {layout}, "
          f"tiles {tile}x{tile}, {len(regions)} tiles", flush=True)

    def consume(it):
        for v in it:
            pass

    def zarr_out(reg):
        out = aligned_empty(tuple(s.stop - s.start for s in reg), np.float32)
        arr.get_basic_selection(reg, out=NDBuffer.from_numpy_array(out))
        return out

    routes = {
        "raw readinto (sequential files)": lambda: raw_read([path])[0],
        f"jask TileReader ({reader.mode}), 1 thread": lambda: consume(reader.read(r) for r in regions),
        f"jask {reader.mode} + Prefetcher(depth {FLAGS.depth}, {FLAGS.threads} thr)": lambda: consume(
            Prefetcher(((i, (store, r)) for i, r in enumerate(regions)), depth=FLAGS.depth,
                       threads=FLAGS.threads)),
        "zarr get_basic_selection(out=)": lambda: consume(zarr_out(r) for r in regions),
        "zarr a[region] (allocating)": lambda: consume(arr[r] for r in regions),
        f"zarr out= + Prefetcher(depth {FLAGS.depth}, {FLAGS.threads} thr)": lambda: consume(
            Prefetcher(((i, (lambda r=r: zarr_out(r))) for i, r in enumerate(regions)),
                       depth=FLAGS.depth, threads=FLAGS.threads)),
    }
    try:
        import tensorstore as ts
        tstore = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": path},
                          "context": {"cache_pool": {"total_bytes_limit": 0}}}, read=True).result()

        def ts_read(inflight):
            futures = []
            for r in regions:
                futures.append(tstore[r].read())
                if len(futures) >= inflight:
                    futures.pop(0).result()
            for f in futures:
                f.result()
        routes["tensorstore, 1 read in flight"] = lambda: ts_read(1)
        routes[f"tensorstore, {FLAGS.depth} reads in flight"] = lambda: ts_read(FLAGS.depth)
        routes["tensorstore, 8 reads in flight"] = lambda: ts_read(8)
    except ImportError:
        print("  (tensorstore is not installed: pip install tensorstore to compare it)")
    for cache in FLAGS.cache:
        print(f" {cache} (median of {FLAGS.repeat}, routes interleaved):")
        times = {name: [] for name in routes}
        for _ in range(FLAGS.repeat):
            for name, fn in routes.items():
                if cache == "cold":
                    drop_cache([path])
                else:
                    raw_read([path])
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        base = None
        for name, ts_ in times.items():
            rate = _row(name, float(np.median(ts_)), nbytes, base)
            base = base or rate
    if not FLAGS.keep:
        shutil.rmtree(path, ignore_errors=True)


def bench_batches(layout, root):
    """One epoch of ``jask.batches`` over a store, in order and shuffled, interleaved; decodes counted."""
    import jask
    from jask.io import decoded_chunks
    from jask.plan.tiling import default_tile
    jask.set_memory_budget(FLAGS.budget)
    shape = _shape(FLAGS.gib, FLAGS.cols)
    path = make_store(os.path.join(root, f"batches-{layout}.zarr"), shape, default_tile(shape, 4), layout, 0)
    x = jask.from_zarr(path)
    nbytes = shape[0] * shape[1] * 4
    print(f"an epoch of jask.batches over {shape} float32 ({nbytes / GiB:.2f} GiB), layout {layout}, chunks "
          f"{x.chunks}, batches of {FLAGS.batch_size} rows", flush=True)
    orders = {"in order": None, "shuffled": 0}
    for cache in FLAGS.cache:
        print(f" {cache} (median of {FLAGS.repeat}, in turn):")
        times, decodes = {k: [] for k in orders}, {}
        for _ in range(FLAGS.repeat):
            for name, seed in orders.items():
                drop_cache([path]) if cache == "cold" else raw_read([path])
                d0, t0 = decoded_chunks.live()["decodes"], time.perf_counter()
                for _ in jask.batches(x, batch_size=FLAGS.batch_size, shuffle=seed):
                    pass
                times[name].append(time.perf_counter() - t0)
                decodes[name] = decoded_chunks.live()["decodes"] - d0
        for name in orders:
            _row(f"{name}, {decodes[name]} chunks decoded", float(np.median(times[name])), nbytes)
    if not FLAGS.keep:
        shutil.rmtree(path, ignore_errors=True)


def main(argv):
    del argv
    root = os.path.abspath(FLAGS.dir)
    os.makedirs(root, exist_ok=True)
    from jask.io.scratch import filesystem_type
    if filesystem_type(root) in ("tmpfs", "ramfs"):
        sys.exit(f"--dir {root} is on {filesystem_type(root)}; use a folder on a real disk")
    import jask
    print(f"jask.bench.stream: {os.cpu_count()} cpus, data in {root}, budget {FLAGS.budget}, "
          f"runtime baseline RSS {jask.runtime_baseline() / 2**20:.0f} MiB", flush=True)
    for layout in FLAGS.layout:
        if FLAGS.op == "readers":
            bench_readers(layout, root)
        elif FLAGS.op == "batches":
            bench_batches(layout, root)
        else:
            bench_op(FLAGS.op, layout, root)
    if not FLAGS.keep:
        default = root == os.path.abspath(harness.bench_dir("data"))
        harness.remove_empty_dirs(os.path.join(root, "scratch"), root, *([os.path.dirname(root)] if default else []))


if __name__ == "__main__":
    from jask import cli
    cli.run(main)
