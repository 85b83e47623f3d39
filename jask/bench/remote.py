"""Remote-store benchmark: ``sum`` of an array in an S3 bucket against the server's raw GET rate.

    python -m jask.bench --store=s3 --remote_mib=256 --budget=256MB

Starts a moto S3 server on loopback (:mod:`jask.bench.s3server`, its own
process), writes a float32 array of ``--remote_mib`` MiB into a bucket with
``jask.to_zarr``, and then, in this one process and run:

* raw GET: every chunk object fetched whole, by boto3 one after another, by
  s3fs concurrently (``cat`` of all keys) and by obstore 4 at a time; the
  fastest is the limit;
* store layers: the same chunks through zarr's ``FsspecStore`` (what jask uses)
  and, when obstore is installed, zarr's ``ObjectStore``, two threads of
  region reads as jask's prefetcher does;
* jask: ``float(jask.sum(x))`` of ``jask.from_zarr("s3://...")``, through
  obstore (the default where installed) and through the fsspec route
  (``jask.io.backends.USE_OBSTORE`` off while opening).

All are timed round-robin, ``--remote_repeat`` rounds, medians reported.

Prints one line per measurement and the ratio jask / raw GET, and writes
``remote.json`` into ``--out``.
"""
from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from absl import flags

from jask.bench import harness

FLAGS = flags.FLAGS
flags.DEFINE_integer("remote_mib", 256, "--store=s3: size of the array in MiB.")
flags.DEFINE_integer("remote_repeat", 3, "--store=s3: timed runs per measurement (the median is reported).")

MiB = 2**20
COLS = 16384
BUCKET = "jask-bench"


def _rounds(fns: dict, nbytes: int, repeat: int) -> dict:
    """Rate (bytes/s, median) of each zero-argument ``fns`` entry, measured round-robin.

    One untimed warm-up call each, then ``repeat`` rounds calling every entry
    once: all see the same server state and machine load (this machine is shared).
    """
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: dict(rate=nbytes / statistics.median(t), times=t) for name, t in times.items()}


def _write_array(jask, server, mib, scratch):
    """A ``mib`` MiB float32 array at s3://BUCKET/x.zarr written by jask; returns (url, expected sum)."""
    import zarr
    rows = max(1, mib * MiB // (4 * COLS))
    slab = max(1, min(rows, 16 * MiB // (4 * COLS)))
    local = zarr.create_array(os.path.join(scratch, "x-src.zarr"), shape=(rows, COLS), chunks=(slab, COLS),
                              dtype="float32", compressors=None, fill_value=0)
    rng, total = np.random.default_rng(0), 0.0
    for start in range(0, rows, slab):
        block = rng.standard_normal((min(slab, rows - start), COLS), dtype=np.float32)
        local[start:start + len(block)] = block
        total += float(block.sum(dtype=np.float64))
    url = f"s3://{BUCKET}/x.zarr"
    jask.to_zarr(jask.from_zarr(os.path.join(scratch, "x-src.zarr")), url, overwrite=True,
                 storage_options=server.storage_options())
    return url, total


def _chunk_keys(server, prefix):
    pages = server.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", []) if "/c/" in o["Key"]]


def _raw_gets(server, keys) -> dict:
    """Every chunk object fetched whole: boto3 one after another, s3fs all at once."""
    import s3fs
    client = server.client()
    fs = s3fs.S3FileSystem(**server.storage_options())
    fns = {"raw GET boto3 sequential": lambda: [client.get_object(Bucket=BUCKET, Key=k)["Body"].read()
                                                for k in keys],
           "raw GET s3fs concurrent": lambda: fs.cat([f"{BUCKET}/{k}" for k in keys])}
    try:
        import obstore
        from obstore.store import S3Store
    except ImportError:
        return fns
    store = S3Store(BUCKET, endpoint=server.endpoint, access_key_id=server.key, secret_access_key=server.secret,
                    region="us-east-1", client_options={"allow_http": True})

    async def fetch_all(limit=4):
        gate = asyncio.Semaphore(limit)

        async def one(key):
            async with gate:
                await (await obstore.get_async(store, key)).bytes_async()
        await asyncio.gather(*(one(k) for k in keys))
    fns["raw GET obstore 4 at once"] = lambda: asyncio.run(fetch_all())
    return fns


def _store_layers(server, version_url, shape, chunk_rows) -> dict:
    """Chunk-row reads of the version's array through zarr's FsspecStore and ObjectStore, 2 threads."""
    import zarr
    from zarr.storage import FsspecStore
    stores = {"zarr FsspecStore": FsspecStore.from_url(version_url, storage_options=server.storage_options(),
                                                       read_only=True)}
    try:
        from obstore.store import S3Store
        from zarr.storage import ObjectStore
        bucket, _, prefix = version_url[len("s3://"):].partition("/")
        stores["zarr ObjectStore"] = ObjectStore(S3Store(
            bucket, prefix=prefix, endpoint=server.endpoint, access_key_id=server.key,
            secret_access_key=server.secret, region="us-east-1", client_options={"allow_http": True}),
            read_only=True)
    except ImportError:
        pass
    regions = [slice(r, min(r + chunk_rows, shape[0])) for r in range(0, shape[0], chunk_rows)]
    pool = ThreadPoolExecutor(2)

    def reader(arr):
        return lambda: list(pool.map(lambda r: arr[r], regions))
    return {name: reader(zarr.open_array(store, mode="r")) for name, store in stores.items()}


def run(out_dir: str, budget: str) -> dict:
    """The whole benchmark; returns (and writes to ``out_dir/remote.json``) its figures."""
    import tempfile

    import jask
    from jask.io import backends
    from jask.bench.s3server import S3Server, moto_missing
    missing = moto_missing()
    if missing:
        raise SystemExit(f"--store=s3 {missing}")
    jask.set_memory_budget(budget)
    server = S3Server()
    try:
        server.make_bucket(BUCKET)
        os.makedirs(harness.bench_dir("data"), exist_ok=True)
        with tempfile.TemporaryDirectory(dir=harness.bench_dir("data")) as scratch:
            t0 = time.perf_counter()
            url, expected = _write_array(jask, server, FLAGS.remote_mib, scratch)
            write_s = time.perf_counter() - t0
        x = jask.from_zarr(url, storage_options=server.storage_options())   # obstore where installed
        backends.USE_OBSTORE = False
        x_fsspec = jask.from_zarr(url, storage_options=server.storage_options())
        backends.USE_OBSTORE = True
        pointer = json.loads(server.client().get_object(Bucket=BUCKET, Key="x.zarr/zarr.json")["Body"].read())
        version = pointer["attributes"]["jask"]["current"]
        meta = json.loads(server.client().get_object(Bucket=BUCKET, Key=f"x.zarr/{version}/zarr.json")["Body"].read())
        chunks = meta["chunk_grid"]["configuration"]["chunk_shape"]
        keys = _chunk_keys(server, f"x.zarr/{version}/")
        nbytes = 4 * int(np.prod(x.shape))
        sums = []
        fns = {**_raw_gets(server, keys), **_store_layers(server, f"{url}/{version}", x.shape, chunks[0]),
               "jask sum": lambda: sums.append(float(jask.sum(x))),
               "jask sum, fsspec route": lambda: sums.append(float(jask.sum(x_fsspec)))}
        rates = _rounds(fns, nbytes, FLAGS.remote_repeat)
        with jask.profile() as prof:     # one more pass: the RSS growth the budget bounds
            sums.append(float(jask.sum(x)))
    finally:
        server.stop()
    limit = max(v["rate"] for k, v in rates.items() if k.startswith("raw GET"))
    result = dict(mib=FLAGS.remote_mib, budget=budget, chunks=chunks, chunk_objects=len(keys), bytes=nbytes,
                  write_s=write_s, rates=rates, jask_over_raw_get=rates["jask sum"]["rate"] / limit,
                  sum_ok=all(np.isclose(v, expected, rtol=1e-3) for v in sums), repeat=FLAGS.remote_repeat,
                  sum_rss_growth=prof.working_set_bytes, budget_bytes=jask.config.config.memory_budget,
                  cores=os.cpu_count(), load=os.getloadavg())
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "remote.json"), "w") as f:
        json.dump(result, f, indent=1)
    return result


def report(r: dict) -> str:
    lines = [f"remote sum: {r['mib']} MiB float32 in {r['chunk_objects']} chunk objects of "
             f"{r['bytes'] / r['chunk_objects'] / MiB:.0f} MiB on a loopback moto S3 server; budget {r['budget']}; "
             f"written by jask.to_zarr in {r['write_s']:.1f} s; median of {r['repeat']} round-robin rounds"]
    for name, m in r["rates"].items():
        lines.append(f"  {name:<26} {m['rate'] / 1e6:8.1f} MB/s")
    lines.append(f"  jask sum's RSS growth {r['sum_rss_growth'] / MiB:.0f} MiB (budget "
                 f"{r['budget_bytes'] / MiB:.0f} MiB)")
    lines.append(f"  jask sum / best raw GET = {r['jask_over_raw_get']:.2f} (target >= 0.5); sums "
                 f"{'ok' if r['sum_ok'] else 'WRONG'}; load {r['load'][0]:.2f} on {r['cores']} cores")
    return "\n".join(lines)
