"""Probe for choosing the TPU matmul inner blocks (legality.Limits): the Pallas window program of an n x n
dot in 1024^2 tiles, with the plan's blocks and with forced (bm, bn, bk), against jnp at the same precision.

    python tpu_tests/matmul_probe.py [n]     (on the TPU; elsewhere it runs in interpret mode, slowly)

On a v5e, n=8192 (2026-12-06): plan (1024, 1024, 512) 0.88x jnp bf16 / 1.02x float32; (512, 512, 512)
0.76x / 1.00x; (1024, 1024, 1024) 0.97x / 0.90x. The gathered-stack program before it: 0.35x / 0.59x.
"""
import dataclasses, statistics, sys, time
import jax, jax.numpy as jnp, numpy as np
from jask.bench import kernels as kb
from jask.kernels import legality, pallas_window
from jask.kernels.window import WindowSpec, contraction_precision

def timeit(fn, repeat=5):
    jax.block_until_ready(fn())
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter(); jax.block_until_ready(fn()); ts.append(time.perf_counter() - t0)
    return statistics.median(ts)

n, block = int(sys.argv[1]) if len(sys.argv) > 1 else 8192, 1024
from jask.linalg.dot import Dot
from jask.graph.op import TiledInput
for dtype in ["bfloat16", "float32"]:
    rng = np.random.default_rng(0)
    xs = [jnp.asarray(rng.standard_normal((n, n)).astype(jnp.dtype(dtype))) for _ in range(2)]
    prec = contraction_precision([jnp.dtype(dtype)] * 2)
    with jax.default_matmul_precision(prec):
        ref = jax.jit(jnp.matmul)
        t_ref = timeit(lambda: ref(*xs))
        want = np.asarray(ref(*xs), np.float32)
    print(f"{dtype} jnp {t_ref*1e3:.2f} ms  {2*n**3/t_ref/1e12:.1f} TFLOP/s", flush=True)
    tiled = [TiledInput(x.shape, x.dtype, (block, block)) for x in xs]
    op = Dot.from_inputs(*tiled)
    g = n // block
    tiles = [(i, j) for i in range(g) for j in range(g)]
    table = np.zeros((len(tiles), g, 2), np.int32)
    for t, (i, j) in enumerate(tiles):
        for k in range(g):
            table[t, k] = (i * g + k, k * g + j)
    valid = np.ones((len(tiles), g), bool)
    spec = WindowSpec(((block, block),) * 2, (np.dtype(jnp.dtype(dtype)),) * 2, (g * g,) * 2, len(tiles), g, (block, block), False)
    stacks = [kb._stack_blocks(x, (block, block)) for x in xs]
    table_d, valid_d = jnp.asarray(table), jnp.asarray(valid)
    variants = [("plan", None, legality.LIMITS)]
    big = dataclasses.replace(legality.LIMITS, vmem_budget=96 << 20, vmem_limit=100 << 20)
    for inner in [(512, 512, 512), (1024, 1024, 256), (512, 1024, 512), (1024, 1024, 1024), (512, 512, 1024)]:
        variants.append((f"forced {inner}", inner, big))
    for label, inner, limits in variants:
        orig = legality.plan
        if inner:
            legality.plan = lambda *a, inner=inner, **k: legality.Plan("matmul", inner)
        try:
            prog = jax.jit(pallas_window.window_program(op, spec, "tpu", jax.default_backend() != "tpu", limits))
            t = timeit(lambda: prog(stacks, table_d, valid_d))
            out = np.asarray(kb._unstack_blocks(prog(stacks, table_d, valid_d).astype(jnp.float32), (n, n), (block, block)))
            err = float(np.max(np.abs(out - want)) / (np.max(np.abs(want)) + 1e-30))
            print(f"  {label:24s} {t*1e3:8.2f} ms  {t_ref/t:5.2f}x jnp  relerr {err:.1e}", flush=True)
        except Exception as e:
            print(f"  {label:24s} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
        finally:
            legality.plan = orig
