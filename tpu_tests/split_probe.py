"""Process scaling without a coordinator, for machines with no TCP (the TPU VM's sandbox).

`jax.distributed` needs TCP (even on loopback), which the lent TPU machine's sandbox refuses, so
issue 16's multi-process bench cannot run there. This probe asks the part of that question the
cores answer: N independent processes each `jask.sum` a disjoint quarter, half or all of four
equal stores (same bytes in total), started together; against the same processes reading the
chunk files raw. Usage: python tpu_tests/split_probe.py DIR [GIB] [REPEAT]
"""
import os, subprocess, sys, time

import numpy as np

STORES = 4


def make(root, gib):
    import zarr
    rows = int(gib * 2**30 / 4 / 1024 / STORES)
    for i in range(STORES):
        p = os.path.join(root, f"x{i}.zarr")
        if not os.path.exists(p):
            z = zarr.create_array(p, shape=(rows, 1024), chunks=(1024, 1024), dtype="float32")
            for r in range(0, rows, 8192):
                z[r:r + 8192] = np.random.default_rng(r).standard_normal((min(8192, rows - r), 1024), dtype=np.float32)
    return [os.path.join(root, f"x{i}.zarr") for i in range(STORES)]


def child(mode, paths):
    """Waits for 'go' on stdin, runs its share once, prints seconds; until stdin closes."""
    if mode == "jask":
        import jask
        jask.set_memory_budget("64MB")
        xs = [jask.from_zarr(p) for p in paths]
        run = lambda: sum(float(jask.sum(x)) for x in xs)
    else:
        files = [os.path.join(d, f) for p in paths for d, _, fs in os.walk(p) for f in fs if "zarr" not in f]
        buf = bytearray(8 << 20)
        def run():
            n = 0
            for f in files:
                with open(f, "rb", buffering=0) as fh:
                    while (k := fh.readinto(buf)):
                        n += k
            return n
    run()
    print("ready", flush=True)
    for line in sys.stdin:
        t = time.perf_counter(); run(); print(time.perf_counter() - t, flush=True)


def main():
    root, gib = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 2
    repeat = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    paths = make(root, gib)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    base = {}
    for mode in ("raw", "jask"):
        for n in (1, 2, 4):
            share = STORES // n
            procs = [subprocess.Popen([sys.executable, __file__, "--child", mode, *paths[i * share:(i + 1) * share]],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) for i in range(n)]
            for p in procs:
                assert p.stdout.readline().strip() == "ready"
            walls = []
            for _ in range(repeat):
                t = time.perf_counter()
                for p in procs:
                    p.stdin.write("go\n"); p.stdin.flush()
                for p in procs:
                    p.stdout.readline()
                walls.append(time.perf_counter() - t)
            for p in procs:
                p.stdin.close(); p.wait()
            w = float(np.median(walls)); base.setdefault(mode, w)
            print(f"{mode:4s} processes={n}: median {w:.3f} s, {gib / w:.2f} GiB/s, {base[mode] / w:.2f}x one process,"
                  f" {base['raw'] / w:.2f}x one raw process", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3:])
    else:
        main()
