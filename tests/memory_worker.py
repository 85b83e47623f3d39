"""Subprocess body for the memory tests: run one workload, print peak RSS growth as JSON.

Usage: python memory_worker.py WORKLOAD DATA_DIR BUDGET N
Run WORKLOAD=make first: it writes two N x N float32 stores chunk by chunk in its own
process, so the measuring process's lifetime peak RSS only reflects the workload.
"""
import json
import os
import sys
import threading

import numpy as np
import zarr


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def rss_now() -> int:
    return _status("VmRSS")


def has_hwm() -> bool:
    try:
        _status("VmHWM")
        return True
    except RuntimeError:
        return False


class RssSampler:
    """The highest VmRSS seen every millisecond, for kernels without VmHWM.

    gVisor (the lent TPU machine) has no VmHWM, and ``ru_maxrss`` there holds
    the TPU runtime's transient 13.8 GB of opening the chip, which would hide
    any growth of the workload. Sampling can miss a spike shorter than a
    millisecond; tiles live far longer than that.
    """

    def __init__(self):
        self.peak = rss_now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, rss_now())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, rss_now())


def peak_rss() -> int:
    """This process's own peak RSS: VmHWM, not ``getrusage().ru_maxrss``, since Linux carries
    ru_maxrss across fork+exec (a child of a large pytest process would report the parent's
    footprint as its own peak)."""
    return _status("VmHWM")


def make(path, n, chunk, seed):
    z = zarr.create_array(path, shape=(n, n), dtype="float32", chunks=(chunk, chunk), compressors=None)
    rng = np.random.default_rng(seed)
    for i in range(0, n, chunk):
        z[i:i + chunk, :] = rng.standard_normal((min(chunk, n - i), n), dtype=np.float32)
    return path


def make_tall(path, rows):
    """A (rows, 64) float32 array in zstd chunks of (16384, 64), 4 MiB each decoded."""
    if os.path.exists(path):
        return
    z = zarr.create_array(path, shape=(rows, 64), dtype="float32", chunks=(16384, 64))
    rng = np.random.default_rng(3)
    for i in range(0, rows, 16384):
        z[i:i + 16384] = rng.standard_normal((min(16384, rows - i), 64), dtype=np.float32)


def main():
    workload, data_dir, budget, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    import jax
    import jask
    import jask.numpy
    jask.set_memory_budget(budget, scratch_dir=os.path.join(data_dir, "scratch"))
    a_path = os.path.join(data_dir, "a.zarr")
    b_path = os.path.join(data_dir, "b.zarr")
    if workload == "make":
        make(a_path, n, 512, 0)
        make(b_path, n, 512, 1)
        return
    if workload == "make_tall":
        make_tall(os.path.join(data_dir, "t.zarr"), n * n // 64)
        return
    a, b = jask.from_zarr(a_path), jask.from_zarr(b_path)
    # warm up compilation on a tiny array so the baseline includes JAX's own footprint
    small = jask.from_numpy(np.ones((8, 8), np.float32))
    float(jask.sum(jask.square(small - small)))
    np.asarray(jax.jit(jax.grad(lambda x, y: jask.sum(jask.square(x - y))))(small, small))
    from jask.exec import events
    stats = events.Stats()
    events.listeners.append(stats)
    base = rss_now()
    sampler = None if has_hwm() else RssSampler()
    if workload == "sum":
        value = float(jask.sum(a))
    elif workload == "grad":
        f = jax.jit(jax.grad(lambda x, y: jask.sum(jask.square(x - y)), argnums=(0, 1)))
        da, db = f(a, b)
        da, db = jask.persist(da, db)
        value = float(jask.sum(da)) + float(jask.sum(db))
    elif workload == "mean0":     # a reduction with a consumer (the scale): it held all of a in one window
        value = float(np.asarray(jask.numpy.mean(a, axis=0)).sum())
    elif workload == "add":
        (a + b).to_zarr(os.path.join(data_dir, "c.zarr"), overwrite=True)
        value = 0.0
    elif workload == "softmax":   # logsumexp over axis 0 (one pass), then exp(a - it) written: 2 passes, was 3
        import jask.nn
        jask.nn.softmax(a, axis=0).to_zarr(os.path.join(data_dir, "s.zarr"), overwrite=True)
        value = float(np.asarray(jask.nn.logsumexp(a, axis=1)).sum())
    elif workload == "slices":    # strided output tiles span several input tiles: all held at once, some read twice
        a[::2, ::3].to_zarr(os.path.join(data_dir, "c.zarr"), overwrite=True)
        value = float(jask.sum(a[1::2, 5:8000:3])) + float(jask.sum(a[::-3, -2::-2]))
    elif workload == "grad_wide":  # a's gradient (as big as a) through a @ w; w's (a loss pass of row blocks of a)
        w = jask.from_numpy(np.random.default_rng(2).standard_normal((n, 64), dtype=np.float32))
        loss = lambda x, v: jask.sum(jask.square(x @ v))
        jax.grad(loss)(a, w).to_zarr(os.path.join(data_dir, "c.zarr"), overwrite=True)
        value = float(np.asarray(jax.grad(loss, argnums=1)(a, w)).sum())
    elif workload == "reshape":   # merges axes across tiles: planning enumerated every element of each output tile
        jask.numpy.reshape(a, (n // 2, 2 * n)).to_zarr(os.path.join(data_dir, "r.zarr"), overwrite=True)
        value = 0.0
    elif workload == "concat":    # each output tile reads one piece's tile (the plan charged both pieces)
        jask.numpy.concatenate([a, b], axis=1).to_zarr(os.path.join(data_dir, "c.zarr"), overwrite=True)
        value = 0.0
    elif workload == "small_tiles_zstd":   # tiles of 2048 rows in zstd chunks of 16384: decoded 8 times each
        import subprocess                    # built in a child, so this process's peak is the workload's
        subprocess.run([sys.executable, __file__, "make_tall", data_dir, budget, str(n)], check=True)
        jask.config.update("tile", 2048)
        (jask.from_zarr(os.path.join(data_dir, "t.zarr")) + 0.0).to_zarr(os.path.join(data_dir, "c.zarr"),
                                                                         overwrite=True)
        value = 0.0
    else:
        raise SystemExit(f"unknown workload {workload}")
    peak = peak_rss() if sampler is None else sampler.stop()
    print(json.dumps(dict(workload=workload, growth=peak - base, base=base,
                          peak_from="VmHWM" if sampler is None else "VmRSS sampled each ms", after=rss_now() - base,
                          projected=stats.peak_projected_bytes, budget=jask.config.config.memory_budget,
                          array_bytes=a.nbytes, bytes_read=stats.bytes_read, backend=jask.kernels.backend_name(),
                          bytes_written=stats.bytes_written, value=value)))


if __name__ == "__main__":
    main()
