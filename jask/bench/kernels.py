"""Kernel benchmark: one op through a jask backend versus plain jnp, on the same in-memory data.

    python -m jask.bench.kernels --op=dot --n=4096 --block=512 --backend=xla --repeat=5

The jask side drives the kernel layer as the executor does -- the whole output
as one window program over stacked blocks, the entries from ``index_map`` --
but takes blocks from in-memory arrays instead of Zarr, so the figure is the
kernel layer's cost alone (``--path=jask`` times the whole pipeline from Zarr
stores). Prints per-op median and best wall time,
GFLOP/s (dot) or GB/s (the rest), the ratio to ``jax.jit`` of the same jnp
expression timed in the same run, and the same ratio in process CPU seconds
(steadier when other work shares the machine).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
import statistics
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from jask import kernels
from jask.graph.op import TiledInput

FLAGS = flags.FLAGS
flags.DEFINE_list("op", ["dot"], "ops to time: " + "dot, add, sub, mul, square, sum, transpose")
flags.DEFINE_integer("n", 4096, "arrays are n x n")
flags.DEFINE_integer("block", 512, "tile edge (blocks are block x block)")
flags.DEFINE_enum("backend", "xla", ["auto", *kernels.names()], "jask backend")
flags.DEFINE_integer("repeat", 5, "timed repetitions (after one warm-up)")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16", "float16"], "element dtype")
flags.DEFINE_enum("blocks_from", "jax", ["jax", "numpy"],
                  "window and tiles paths: slice blocks from the jax arrays jnp gets (the same in-memory data), "
                  "or from NumPy arrays, which adds a host copy per block as Zarr reads do")
flags.DEFINE_enum("path", "window", ["window", "tiles", "jask"],
                  "window: the whole array as one window program over stacked blocks (the Pallas "
                  "executor's form, one kernel call); tiles: the xla executor's form, the blocks as "
                  "separate arguments of one program (--backend=xla); jask: the full pipeline from Zarr stores")
flags.DEFINE_list("bands", ["on"], "on, off or both (--path=jask): whether a product's output tiles come in bands of "
                  "block rows, so windows hold rectangles of tiles (jask/exec/bands.py), or row-major")
flags.DEFINE_list("panels", ["on"], "on, off or both (on,off: side by side in one run): whether a window of plain "
                  "products filling a rectangle is multiplied as one product of panels (jask/kernels/panels.py)")


@dataclasses.dataclass(frozen=True)
class Case:
    """One benchmarked op: how to build it, its jnp twin and its work in flops or bytes."""

    make_op: Callable
    n_inputs: int
    ref: Callable
    public: str
    flops: Callable[[int], float] | None = None
    bytes_moved: Callable[[int, int], float] | None = None


def _cases():
    from jask.linalg.add import Add
    from jask.linalg.dot import Dot
    from jask.linalg.mul import MulArrays
    from jask.linalg.square import Square
    from jask.linalg.sub import Sub
    from jask.linalg.sum import Sum
    from jask.linalg.transpose import Transpose
    ew2 = lambda n, s: 3 * n * n * s  # noqa: E731 - read two, write one
    return {
        "dot": Case(Dot.from_inputs, 2, jnp.matmul, "dot", flops=lambda n: 2.0 * n ** 3),
        "add": Case(Add.from_inputs, 2, jnp.add, "add", bytes_moved=ew2),
        "sub": Case(Sub.from_inputs, 2, jnp.subtract, "sub", bytes_moved=ew2),
        "mul": Case(MulArrays.from_inputs, 2, jnp.multiply, "mul", bytes_moved=ew2),
        "square": Case(Square.from_inputs, 1, jnp.square, "square", bytes_moved=lambda n, s: 2 * n * n * s),
        "sum": Case(Sum.from_inputs, 1, jnp.sum, "sum", bytes_moved=lambda n, s: n * n * s),
        "transpose": Case(Transpose.from_inputs, 1, jnp.transpose, "transpose",
                          bytes_moved=lambda n, s: 2 * n * n * s),
    }


def _stack_blocks(x, block):
    """A 2-D array (or vector) cut into its blocks, row-major, stacked: ``(n_blocks, *block)``."""
    if x.ndim == 1:
        return x.reshape(-1, block[0])
    (r, c), (br, bc) = x.shape, block
    return x.reshape(r // br, br, c // bc, bc).transpose(0, 2, 1, 3).reshape(-1, br, bc)


def _unstack_blocks(out, shape, block):
    if len(shape) == 0:
        return out.reshape(())
    if len(shape) == 1:
        return out.reshape(shape)
    (r, c), (br, bc) = shape, block
    return out.reshape(r // br, c // bc, br, bc).transpose(0, 2, 1, 3).reshape(r, c)


def run_window_path(case: Case, inputs, block: int, backend_name: str, separate_tiles: bool = False):
    """The whole output as ONE window program (:mod:`jask.kernels.window`), as the executor runs a window.

    Inputs are cut into stacked blocks once, before timing, as the streaming
    layer hands a window to the kernel layer; the timed function is the one
    kernel call. Shapes must be multiples of the block (a window holds tiles
    of one shape). With ``separate_tiles`` the blocks are separate arguments of
    the xla program the executor runs (``xla.compile_window_tiles``).
    """
    from jask.kernels.window import WindowSpec
    for x in inputs:
        if any(d % block for d in x.shape):
            raise app.UsageError(f"--path=window needs --n to be a multiple of --block ({x.shape}, {block})")
    tiled = [TiledInput(x.shape, x.dtype, tuple(min(block, d) for d in x.shape)) for x in inputs]
    op = case.make_op(*tiled)
    out_shape = tuple(op.output_shape(*[x.shape for x in inputs]))
    out_dtype = np.dtype(op.output_dtype(*[x.dtype for x in inputs]))
    out_block = tuple(min(block, d) for d in out_shape)
    out_grid = tuple(math.ceil(d / b) for d, b in zip(out_shape, out_block))
    tiles = list(itertools.product(*map(range, out_grid)))
    entries = [op.index_map(idx) for idx in tiles]
    k = max(len(e) for e in entries)
    table = np.zeros((len(tiles), k, len(inputs)), np.int32)
    valid = np.zeros((len(tiles), k), bool)
    for i, ents in enumerate(entries):
        for kk, entry in enumerate(ents):
            valid[i, kk] = True
            for j, (blk, t) in enumerate(zip(entry, tiled)):
                table[i, kk, j] = np.ravel_multi_index(tuple(blk), t.grid)
    rows = tuple(int(np.prod(t.grid)) for t in tiled)
    direct = k == 1 and all((table[:, 0, j] == np.arange(len(tiles))).all() for j in range(len(inputs)))
    spec = WindowSpec(tuple(t.block_shape for t in tiled), tuple(np.dtype(t.dtype) for t in tiled), rows,
                      len(tiles), k, out_block, direct)
    stacks = jax.block_until_ready(
        jax.jit(lambda *xs: [_stack_blocks(x, t.block_shape) for x, t in zip(xs, tiled)])(*inputs))
    if separate_tiles:
        from jask.kernels.xla import compile_window_tiles
        if backend_name != "xla":
            raise app.UsageError("--path=tiles is the xla backend's program: use --backend=xla")
        program = compile_window_tiles(op, spec, table, valid)
        blocks = jax.block_until_ready([row for stack in stacks for row in stack])

        def compute():
            return program(*blocks)
    else:
        program = kernels.get_backend(backend_name).compile_window(op, spec)
        table_d, valid_d = jnp.asarray(table), jnp.asarray(valid)

        def compute():
            return program(stacks, table_d, valid_d)

    def assemble(out):
        out = np.stack([np.asarray(t) for t in out]) if isinstance(out, list) else np.asarray(out)
        return np.asarray(_unstack_blocks(out, out_shape, out_block)).astype(out_dtype)

    return compute, assemble


def run_jask_path(case: Case, inputs, block: int, backend_name: str):
    """The whole pipeline: Zarr stores in, the op, ``materialize`` out (scalars come back directly)."""
    import jask
    jask.config.update("backend", backend_name)
    jask.config.update("tile", block)
    arrays = [jask.from_numpy(x, chunks=tuple(min(block, d) for d in x.shape)) for x in inputs]
    fn = getattr(jask, case.public)

    def compute():
        return np.asarray(fn(*arrays))

    return compute, lambda out: out


def _time_interleaved(fns, repeat):
    """Wall and process-CPU seconds of each function, run alternately so background load hits both alike.

    CPU seconds (all threads of this process) are the steadier figure on a
    shared machine: time spent waiting for a core does not count.
    """
    for fn in fns:
        jax.block_until_ready(fn())  # warm-up: compiles
    times = [([], []) for _ in fns]
    for _ in range(repeat):
        for fn, (wall, cpu) in zip(fns, times):
            t0, c0 = time.perf_counter(), time.process_time()
            jax.block_until_ready(fn())
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return times


def bench_op(name: str, n: int, block: int, backend: str, repeat: int, dtype: str, path: str = "window",
             blocks_from: str = "jax") -> dict:
    """Time one op; returns the figures printed by ``main``."""
    case = _cases()[name]
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((n, n)).astype(jnp.dtype(dtype)) for _ in range(case.n_inputs)]
    ref_inputs = [jnp.asarray(x) for x in inputs]
    # the same matmul precision as jask's contractions (jask.config "precision", default highest):
    # otherwise a GPU's jnp would multiply float32 in TF32 and the ratio would compare different math
    from jask.kernels.window import contraction_precision
    prec = contraction_precision([dtype])

    def ref_fn(*xs):
        with jax.default_matmul_precision(prec):
            return case.ref(*xs)

    ref = jax.jit(ref_fn)
    runner = {"window": run_window_path, "jask": run_jask_path,
              "tiles": functools.partial(run_window_path, separate_tiles=True)}[path]
    data = ref_inputs if (path != "jask" and blocks_from == "jax") else inputs
    compute, assemble = runner(case, data, block, backend)
    (ref_times, ref_cpu), (times, cpu) = _time_interleaved([lambda: ref(*ref_inputs), compute], repeat)
    import jask
    with jask.profile() as prof:
        got = assemble(compute())
    want = np.asarray(ref(*ref_inputs))
    err = float(np.max(np.abs(np.asarray(got, np.float32) - np.asarray(want, np.float32))))
    med, ref_med = statistics.median(times), statistics.median(ref_times)
    if case.flops:
        rate, unit = case.flops(n) / med / 1e9, "GFLOP/s"
        ref_rate = case.flops(n) / ref_med / 1e9
    else:
        work = case.bytes_moved(n, jnp.dtype(dtype).itemsize)
        rate, unit, ref_rate = work / med / 1e9, "GB/s", work / ref_med / 1e9
    return dict(op=name, backend=backend, path=path, blocks_from=blocks_from, n=n, block=block, dtype=dtype,
                precision=prec,
                median_s=med, best_s=min(times), rate=rate, unit=unit,
                jnp_median_s=ref_med, jnp_rate=ref_rate, ratio=med / ref_med,
                cpu_s=statistics.median(cpu), jnp_cpu_s=statistics.median(ref_cpu),
                cpu_ratio=_ratio(statistics.median(cpu), statistics.median(ref_cpu)), max_abs_err=err,
                bytes_read=prof.bytes_read, windows=prof.windows)


def _ratio(a: float, b: float) -> float:
    """a / b, or NaN where ``b`` is 0 (jnp on an accelerator can spend no measurable host CPU time)."""
    return a / b if b > 0 else float("nan")


def main(argv):
    del argv
    print(f"jax {jax.__version__} on {jax.default_backend()} ({jax.device_count()} device(s)); "
          f"path={FLAGS.path}{', blocks from ' + FLAGS.blocks_from if FLAGS.path != 'jask' else ''}; median of {FLAGS.repeat} after a warm-up, "
          f"jnp and jask runs interleaved; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")
    from jask.exec import bands
    from jask.kernels import panels
    for name, values in (("panels", FLAGS.panels), ("bands", FLAGS.bands)):
        if not values or set(values) - {"on", "off"}:
            raise app.UsageError(f"--{name} takes on, off or on,off; got {','.join(values)!r}")
    min_side, min_rows = panels.MIN_SIDE, bands.MIN_ROWS
    for name, mode, band in itertools.product(FLAGS.op, FLAGS.panels, FLAGS.bands):
        if name not in _cases():
            raise app.UsageError(f"unknown --op {name!r}; choose from {sorted(_cases())}")
        panels.MIN_SIDE = min_side if mode == "on" else math.inf
        bands.MIN_ROWS = min_rows if band == "on" else math.inf
        r = bench_op(name, FLAGS.n, FLAGS.block, FLAGS.backend, FLAGS.repeat, FLAGS.dtype, FLAGS.path,
                     FLAGS.blocks_from)
        read = f", read {r['bytes_read'] / 2**20:.0f} MiB in {r['windows']} windows" if FLAGS.path == "jask" else ""
        print(f"{r['op']:>9} n={r['n']} block={r['block']} {r['dtype']} backend={r['backend']} "
              f"panels={mode}{' bands=' + band if FLAGS.path == 'jask' else ''} precision={r['precision']}{read}: "
              f"{r['median_s'] * 1e3:9.2f} ms (best {r['best_s'] * 1e3:.2f}) {r['rate']:8.2f} {r['unit']} | "
              f"jnp {r['jnp_median_s'] * 1e3:9.2f} ms {r['jnp_rate']:8.2f} {r['unit']} | "
              f"ratio {r['ratio']:.2f}x | cpu {r['cpu_s']:.2f} s vs {r['jnp_cpu_s']:.2f} s, "
              f"ratio {r['cpu_ratio']:.2f}x | max |err| {r['max_abs_err']:.2e}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    from jask import cli
    cli.run(main)
