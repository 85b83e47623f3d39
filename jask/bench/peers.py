"""The systems a workload runs on, behind one small interface.

A workload module maps each system name to a :class:`Runner` subclass (or to a
string saying why that system cannot do the work). The harness drives every
runner the same way, in a subprocess of its own::

    runner.imports()            # heavy imports, before the memory baseline
    runner.setup()              # open stores (or, for jnp, load them into RAM)
    runner.run()                # one timed repetition; called warm-up + --repeat times
    runner.check()              # numbers that must agree between systems (untimed)
    runner.cleanup()

The base classes here hold what is specific to a system rather than to a
workload: jask's budget, tile and scratch settings and its counters; Dask's
threaded scheduler; Cubed's ``Spec``; in-memory loading for ``jnp``; the
per-tile loop of the naive baseline; and the raw-I/O and memory-bandwidth
limits.
"""
from __future__ import annotations

import importlib.util
import itertools
import math
import os
import shutil

import numpy as np

from jask.bench import data, harness

# Display order of systems in tables and plots; ``limit`` systems are physical bounds, not peers.
SYSTEMS = ("jask", "dask", "dask-manual", "cubed", "jnp", "naive-loop", "raw-io", "memcpy")
DESCRIPTIONS = {
    "jask": "jask (this repo), eager or jit as the workload says, tile edge = store chunk edge",
    "dask": "dask.array, threaded scheduler (one thread per core), same stores and chunks",
    "dask-manual": "dask.array with the gradient (and Adam update) derived by hand: Dask has no autodiff",
    "cubed": "Cubed, threads executor, allowed_mem = the jask budget, same stores and chunks",
    "jnp": "jax.numpy in RAM: inputs loaded before timing, timed region is compute only; its peak RSS includes the loaded inputs (results.json also has the peak of the runs alone)",
    "naive-loop": "per-tile loop: zarr read of a tile, the jitted block function, write/accumulate; no overlap",
    "raw-io": "physical limit: sequential readinto of the same chunk files (plus writing the output bytes)",
    "memcpy": "physical limit for page-cache runs: copying the same number of bytes in RAM",
}
LIMITS = ("raw-io", "memcpy")


def available(system: str) -> str | None:
    """None if ``system`` can run here, else why not (shown in the tables)."""
    module = {"dask": "dask.array", "dask-manual": "dask.array", "cubed": "cubed"}.get(system)
    if module and importlib.util.find_spec(module.split(".")[0]) is None:
        return f"not installed (pip install {module.split('.')[0]})"
    return None


class Runner:
    """One system doing one workload. Subclasses override :meth:`run` and usually :meth:`setup`."""

    warmup = True                   # whether the harness runs one untimed repetition first
    checks = True                   # whether :meth:`check` gives numbers to compare
    check_after_first_run = False   # check the state after run 1 (for workloads whose state advances)

    def __init__(self, task: harness.Task):
        self.task = task
        self.params = task.params
        self.paths = task.paths

    def imports(self) -> None:
        """Import what the system needs (before the memory baseline is taken)."""

    def setup(self) -> None:
        """Prepare inputs (inside the memory measurement, outside the timing)."""

    def run(self):
        raise NotImplementedError

    def check(self) -> dict | None:
        """Numbers that must agree with every other system's (see :func:`data.agree`)."""
        return None

    def cache_paths(self) -> list[str]:
        """Files and folders whose pages are dropped (cold) or read (warm) before each repetition."""
        return [p for p in self.paths.values() if p] + [self.task.work_dir]

    def counters(self) -> dict:
        """System-specific counters of the repetition that just ran (jask's executor statistics)."""
        return {}

    def cleanup(self) -> None:
        """Delete outputs; the harness deletes ``work_dir`` afterwards anyway."""

    # helpers
    def out_path(self, name: str = "out.zarr") -> str:
        return os.path.join(self.task.work_dir, name)

    def chunks_of(self, shape) -> tuple[int, ...]:
        return tuple(min(self.task.tile, d) for d in shape)


# ---------------------------------------------------------------- jask

class StoreCheck:
    """Mixin for workloads whose result is a Zarr array: summarize it so systems can be compared."""

    def check(self):
        return {"out": data.summarize_store(self.out_path())}


class JaskRunner(Runner):
    """jask with the task's budget, backend and tile edge; scratch under the task's work dir."""

    def imports(self):
        import jax
        import jax.numpy as jnp

        import jask
        import jask.optim  # noqa: F401
        self.jask, self.jax, self.jnp = jask, jax, jnp
        jnp.zeros(1).block_until_ready()
        from jask.exec import events
        self._events = events
        try:
            from jask.api.observe import Profile as _Stats   # Stats plus io_wait_seconds where counted
        except ImportError:
            _Stats = jask.Stats
        self._stats_cls = _Stats
        self._stats = None

    def setup(self):
        jask = self.jask
        scratch = os.path.join(self.task.work_dir, "scratch")
        os.makedirs(scratch, exist_ok=True)
        jask.set_memory_budget(self.task.budget, scratch_dir=scratch, allow_tmpfs=self.task.allow_tmpfs)
        jask.config.update("tile", int(self.task.tile))
        jask.config.update("backend", self.task.backend)
        mmap_word = getattr(self.task, "read_mmap", "auto")
        jask.config.update("read_mmap", jask.config.parse_read_mmap(mmap_word, "--read_mmap"))
        n = int(getattr(self.task, "devices", 1))
        if n > 1:
            have = self.jax.devices()
            if len(have) < n:
                raise RuntimeError(f"--devices asks for {n} devices but this process has {len(have)}: {have}")
            jask.config.update("devices", have[:n])

    def run(self):
        stats = self._stats_cls()
        self._events.listeners.append(stats)
        try:
            return self.step()
        finally:
            self._events.listeners.remove(stats)
            self._stats = stats

    def step(self):
        raise NotImplementedError

    def counters(self):
        s = self._stats
        if s is None:
            return {}
        keep = ("tiles", "kernel_calls", "bytes_read", "bytes_written", "io_seconds", "compute_seconds",
                "io_wait_seconds", "plans", "peak_projected_bytes")
        return {k: getattr(s, k) for k in keep if hasattr(s, k)}


# ---------------------------------------------------------------- dask and cubed

class DaskRunner(Runner):
    """dask.array on the threaded scheduler (as many threads as cores)."""

    def imports(self):
        import dask
        import dask.array as da
        dask.config.set(scheduler="threads", num_workers=os.cpu_count())
        self.da = da

    def open(self, name):
        return self.da.from_zarr(self.paths[name])

    def store(self, arrays, paths):
        """Compute ``arrays`` in one pass into new uncompressed stores chunked like the inputs."""
        targets = [data.create_store(p, a.shape, self.chunks_of(a.shape), a.dtype) for a, p in zip(arrays, paths)]
        self.da.store(list(arrays), targets, lock=False)


class CubedRunner(Runner):
    """Cubed on its threads executor, with ``allowed_mem`` set to the jask budget."""

    def imports(self):
        import cubed
        import cubed.array_api as xp
        self.cubed, self.xp = cubed, xp

    def setup(self):
        from jask.config import parse_bytes
        work = os.path.join(self.task.work_dir, "cubed")
        os.makedirs(work, exist_ok=True)
        self.spec = self.cubed.Spec(work_dir=work, allowed_mem=parse_bytes(self.task.budget),
                                    reserved_mem=0, executor_name="threads")

    def open(self, name):
        return self.cubed.from_zarr(self.paths[name], spec=self.spec)

    def store(self, arrays, paths):
        targets = [data.create_store(p, a.shape, self.chunks_of(a.shape), a.dtype) for a, p in zip(arrays, paths)]
        self.cubed.store(list(arrays), targets)


# ---------------------------------------------------------------- in memory

class JnpRunner(Runner):
    """jax.numpy on arrays loaded into RAM during setup; the timed run is compute only."""

    def imports(self):
        import jax
        import jax.numpy as jnp
        self.jax, self.jnp = jax, jnp
        jnp.zeros(1).block_until_ready()

    def load(self, name):
        arr = data.read_store(self.paths[name])
        out = self.jnp.asarray(arr)
        del arr
        return out.block_until_ready()

    def cache_paths(self):
        return []  # nothing is read during the timed runs


class NaiveLoopRunner(Runner):
    """Per tile: zarr read (a fresh array), the jitted block function, write or accumulate; no overlap."""

    def imports(self):
        import jax
        import jax.numpy as jnp
        import zarr
        self.jax, self.jnp, self.zarr = jax, jnp, zarr
        jnp.zeros(1).block_until_ready()

    def open(self, name):
        return self.zarr.open_array(self.paths[name], mode="r")

    def regions(self, shape):
        chunks = self.chunks_of(shape)
        for idx in itertools.product(*[range(math.ceil(d / c)) for d, c in zip(shape, chunks)]):
            yield tuple(slice(i * c, min((i + 1) * c, d)) for i, c, d in zip(idx, chunks, shape))


# ---------------------------------------------------------------- physical limits

class RawIORunner(Runner):
    """Sequential ``readinto`` of every chunk file of the inputs, then writing ``write_bytes`` to a new file.

    Subclasses (or the workload) set ``inputs`` (names in ``paths``) and ``write_bytes``.
    """

    warmup = False
    checks = False
    inputs: tuple = ()
    write_bytes = 0

    def run(self):
        files = [f for name in (self.inputs or tuple(self.paths)) for f in data.data_files(self.paths[name])]
        data.raw_read(files)
        if self.write_bytes:
            data.raw_write(self.out_path("raw-out.bin"), self.write_bytes)

    def cleanup(self):
        path = self.out_path("raw-out.bin")
        if os.path.exists(path):
            os.remove(path)


class MemcpyRunner(Runner):
    """Copy ``nbytes`` through RAM (256 MiB source and destination, reused): memory bandwidth."""

    checks = False
    nbytes = 0

    def setup(self):
        n = max(1, min(self.nbytes, 256 * 2**20) // 4)
        self.src = np.ones(n, np.float32)
        self.dst = np.zeros_like(self.src)   # touched, so no run pays page faults

    def run(self):
        left = self.nbytes
        while left > 0:
            n = min(left // 4, self.src.size) or 1
            np.copyto(self.dst[:n], self.src[:n])
            left -= 4 * n

    def cache_paths(self):
        return []


def remove(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
