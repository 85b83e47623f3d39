"""Processes of a ``jax.distributed`` run share a pass: each reads and writes only its share.

The test starts N processes on loopback (``jax.distributed.initialize`` with a
coordinator on 127.0.0.1, gloo CPU collectives), each running the same jask
program over stores the test wrote, and stops them. Each prints JSON with its
results and bytes read and written; the assertions are here. Targets (issue 16):
the bytes read summed over the processes equal one process's bytes (no tile read
twice), every process gets the same scalar results, and an output store is
written once, by its tiles' owners, and committed once; on a store URL (a moto S3
server on loopback) too, by one pointer PUT, which a lost process never reaches.
"""
import json
import os
import socket
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
import zarr

import jask
from jask.bench import s3server

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TILE = 4
SHAPES = {"X": (32, 24), "Y": (32, 24), "W": (16, 12), "T": (32, 8), "S": (16, 12)}

WORKER = textwrap.dedent("""
    import json, os, sys
    import numpy as np, jax, zarr
    pid, n, port, root = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=n, process_id=pid)
    import jask, jask.numpy
    jask.config.update("tile", TILE)
    X, Y, T = (jask.from_zarr(os.path.join(root, f"{k}.zarr")) for k in "XYT")
    def update_and_die(W):                     # process 1 dies at its first tile write of update_
        from jask.io import faults
        def die(point, info):
            if point == "before_tile_write" and pid == 1:
                os._exit(9)
        try:
            with faults.armed(die):
                W.update_(W * 2.0 + 1.0)
            print("FINISHED", flush=True)
        except Exception as e:
            print("ERROR " + type(e).__name__ + ": " + str(e), flush=True)
        os._exit(0)                            # JAX's own shutdown would wait for the lost process
    if sys.argv[5:] == ["devices"]:            # and each process spreads its share over its local devices
        jask.config.update("devices", "all")
        assert len(jax.local_devices()) == 2 and len(jax.devices()) == 2 * n, jax.devices()
    elif sys.argv[5:6] == ["s3"]:              # outputs to store URLs on the S3 server at argv[6]
        opts = {"key": "testing", "secret": "testing", "endpoint_url": sys.argv[6],
                "client_kwargs": {"region_name": "us-east-1"}}
        base, out = sys.argv[7], {}
        with jask.profile() as p:
            jask.to_zarr(X * 2.0 + 1.0, base + "/out.zarr", storage_options=opts)
        out["to_zarr"] = [p.bytes_read, p.bytes_written, p.tiles]
        with jask.profile() as p:              # shards of 3 x 2 tiles: each process writes whole shards
            jask.to_zarr(X * 2.0 + 1.0, base + "/sharded.zarr", shards=(3 * TILE, 2 * TILE), storage_options=opts)
        out["sharded"] = [p.bytes_read, p.bytes_written, p.tiles]
        for name in ("W", "K"):                # copies of a stored array: process 0 writes them
            jask.to_zarr(jask.from_zarr(os.path.join(root, "W.zarr")), f"{base}/{name}.zarr", storage_options=opts)
        from jask.io import backends
        backends.USE_OBSTORE = False           # to_zarr went through obstore, update_ goes through s3fs
        W = jask.from_zarr(base + "/W.zarr", mode="r+", storage_options=opts)
        with jask.profile() as p:
            W.update_(W * 2.0 + 1.0)
        out["update"] = [p.bytes_read, p.bytes_written, p.tiles]
        out["W_after"] = np.asarray(W).tolist()
        import gc                              # a scratch stage in the bucket: one store, written by halves
        jask.config.update("scratch_storage_options", opts)
        jask.config.update("scratch_dir", base + "-scratch")
        with jask.profile() as p:
            staged = jask.persist(X * 2.0 + 1.0)
            out["stage_sum"] = float(jask.sum(staged))
        out["stage"] = [p.bytes_read, p.bytes_written, staged._node.resolved().store.path]
        del staged, p
        gc.collect()                           # each process lets go; the last one deletes the stage
        print("RESULT" + json.dumps(out), flush=True)
        update_and_die(jask.from_zarr(base + "/K.zarr", mode="r+", storage_options=opts))
    elif len(sys.argv) > 5:                      # "kill": W in one-tile chunks, S in shards of 2 x 2 tiles
        update_and_die(jask.from_zarr(os.path.join(root, sys.argv[6] + ".zarr"), mode="r+"))
    out = {}
    with jask.profile() as p:
        out["sum"] = float(jask.sum(X))
        out["sum_jit"] = float(jax.jit(jask.sum)(X))
    out["sum_read"] = p.bytes_read
    # one tile of integers below zero: one process holds the only partial, the others none (a fold
    # that took a missing partial for 0 would give 0)
    out["one_tile_max"] = int(jask.numpy.max(jask.from_numpy(-np.arange(5, 9, dtype=np.int32))))
    with jask.profile() as p:
        ((X - Y) * 3.0 + X).to_zarr(os.path.join(root, "out.zarr"))
    out["ew_read"], out["ew_written"] = p.bytes_read, p.bytes_written
    # outputs in files of several tiles: each process writes whole chunk or shard files (the shard files
    # each writes are recorded); a single shard is written whole by process 0
    from jask.io.writer import ShardWriter
    label, shards_written, append = [None], {}, ShardWriter._append_bytes
    def recording(self, shard, data):
        shards_written.setdefault(label[0], set()).add(tuple(int(c) for c in shard))
        return append(self, shard, data)
    ShardWriter._append_bytes = recording
    S = jask.from_zarr(os.path.join(root, "S.zarr"), mode="r+")   # shards of 2 x 2 tiles, edge ones 2 x 1
    for name, write in (("big_chunks", lambda: (X * 2.0).to_zarr(os.path.join(root, "big_chunks.zarr"),
                                                                 chunks=(2 * TILE, 2 * TILE))),
                        ("sharded", lambda: jask.to_zarr(X * 2.0 + 1.0, os.path.join(root, "sharded.zarr"),
                                                         shards=(3 * TILE, 2 * TILE))),
                        ("S", lambda: S.update_(S * 2.0 + 1.0)),
                        ("zeros", lambda: jask.to_zarr(X - X, os.path.join(root, "zeros.zarr"), shards=(
                            2 * TILE, 2 * TILE), compressors=[zarr.codecs.ZstdCodec()])),   # shards of zeros
                        ("one_shard", lambda: jask.to_zarr(S * 3.0, os.path.join(root, "one_shard.zarr"),
                                                           shards=SHAPES["S"]))):
        label[0] = name
        budget = jask.config.config.memory_budget   # one shard too big to gather (over 1/8 of the budget):
        if name == "one_shard":                     # computed whole everywhere
            jask.set_memory_budget(8000)
        with jask.profile() as p:
            write()
        jask.set_memory_budget(budget)
        out[name] = [p.bytes_read, p.bytes_written, p.tiles]
    ShardWriter._append_bytes = append
    out["S_after"] = np.asarray(S).tolist()
    out["shards_written"] = {k: sorted(v) for k, v in shards_written.items()}
    W = jask.from_zarr(os.path.join(root, "W.zarr"), mode="r+")
    with jask.profile() as p:
        W.update_(W * 2.0 + 1.0)
    out["update_read"], out["update_written"] = p.bytes_read, p.bytes_written
    A = jask.from_numpy(np.arange(12 * 16, dtype=np.float32).reshape(12, 16) / 100)
    with jask.profile() as p:                   # 3 x 3 output tiles of 4 entries each: an even split cuts one
        (A @ W).to_zarr(os.path.join(root, "cut.zarr"))
    out["cut_written"] = p.bytes_written
    out["W_after"] = np.asarray(W).tolist()
    w = jask.from_numpy(np.ones((24, 8), np.float32) / 10)
    with jask.profile() as p:
        loss, g = jax.jit(jax.value_and_grad(lambda w: jask.sum(jask.square(X @ w - T))))(w)
        g = np.asarray(g)
    out["loss"], out["grad"], out["grad_read"] = float(loss), g.tolist(), p.bytes_read
    # a small weight: its gradient is computed in the loss's pass, shared between the processes
    w1, y1 = jask.from_numpy(np.full((24, 1), 0.1, np.float32)), jask.from_numpy(np.asarray(T)[:, :1].copy())
    from jask.io import faults
    seen = faults.Recorder()
    with faults.armed(seen):
        loss, g = jax.jit(jax.value_and_grad(lambda w: jask.sum(jask.square(X @ w - y1))))(w1)
        g = np.asarray(g)
    x_tiles = sum(1 for point, path in seen.points if point == "before_tile_read"
                  and os.path.realpath(path or "") == os.path.realpath(os.path.join(root, "X.zarr")))
    out["small_loss"], out["small_grad"], out["small_x_tiles"] = float(loss), g.tolist(), x_tiles
    # a custom op (and its gradient, a custom op too) has no index map: it runs whole in every process
    from jask.base import CustomOp
    from jask.base.base_algo import make_op
    class CumSum0(CustomOp):
        def output_shape(self, a_shape):
            return a_shape
        def forward(self, algo, a, rev=False):
            rows, cols = algo.grid(a)
            for j in range(cols):
                carry = 0.0
                for i in (reversed(range(rows)) if rev else range(rows)):
                    t = np.asarray(algo.read(a, (i, j)))
                    t = np.cumsum(t[::-1], axis=0)[::-1] if rev else np.cumsum(t, axis=0)
                    algo.write((i, j), t + carry, **({"wrt": 0} if rev else {}))
                    carry = (t + carry)[0 if rev else -1]
        def backward(self, algo, inputs, d_out):
            self.forward(algo, d_out, rev=True)
    cumsum0 = make_op(CumSum0)
    with jask.profile() as p:
        cumsum0(X).to_zarr(os.path.join(root, "cumsum.zarr"))
    out["cumsum_written"] = p.bytes_written
    out["cumsum_grad"] = np.asarray(jax.grad(lambda a: jask.sum(cumsum0(a) * Y))(X)).tolist()
    # partials are folded across processes in float32, cast to bfloat16 once: tiles summing to 256, 1
    # | 256, 2.5 give 257 + 258.5 -> 516 (each process's partial cast first: 256 + 258 = 514 -> 512)
    b = np.zeros((4 * TILE, TILE), np.float32)
    b[:TILE], b[TILE, 0], b[2 * TILE:3 * TILE], b[3 * TILE, 0] = 16, 1, 16, 2.5
    out["bf16_sum"] = float(jask.sum(jask.from_numpy(b.astype(jax.numpy.bfloat16))))
    try:
        X.to_zarr(os.path.join(root, "resumed.zarr"), resume=True)
        out["resume"] = "ran"
    except ValueError as e:
        out["resume"] = str(e)
    try:                                        # another process's devices are not this one's to compute on
        jask.config.update("devices", jax.devices())
        out["foreign_devices"] = "accepted"
    except ValueError as e:
        out["foreign_devices"] = str(e)
    from jask.exec import multihost             # a path only process 0 finds too long fails everywhere
    try:
        multihost._broadcast_text("share a long path", "x" * 5000 if pid == 0 else "")
        out["long_path"] = "ran"
    except Exception as e:
        out["long_path"] = type(e).__name__
    print("RESULT" + json.dumps(out), flush=True)
""").replace("TILE", str(TILE)).replace("SHAPES", repr(SHAPES))


def _free_port() -> int:
    try:
        s = socket.socket()
    except OSError as e:   # the lent TPU machine's sandbox has no IPv4 sockets at all
        pytest.skip(f"jax.distributed needs loopback TCP, and this machine has no IPv4 sockets ({e})")
    with s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(tmp_path, n, *extra, devices=1):
    rng = np.random.default_rng(0)
    data = {}
    for name, shape in SHAPES.items():
        data[name] = rng.standard_normal(shape).astype(np.float32)
        # S uncompressed: its update_ keeps its codecs, and jask's own shard writer (whose files the
        # workers record) writes uncompressed shards
        z = zarr.create_array(str(tmp_path / f"{name}.zarr"), shape=shape, chunks=(TILE, TILE), dtype="float32",
                              shards=(2 * TILE, 2 * TILE) if name == "S" else None,
                              compressors=None if name == "S" else "auto")
        z[:] = data[name]
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, JAX_PLATFORMS="cpu", JASK_BACKEND="xla", JASK_SCRATCH_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    env.pop("XLA_FLAGS", None)
    if devices > 1:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, str(script), str(i), str(n), str(port), str(tmp_path), *extra],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n)]
    outs = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=240)
            if extra[0:1] in (("kill",), ("s3",)):
                outs.append((p.returncode, stdout, stderr))
                continue
            lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT")]
            assert p.returncode == 0 and lines, stdout[-2000:] + stderr[-3000:]
            outs.append(json.loads(lines[0][len("RESULT"):]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return data, outs


def check(data, outs, n, tmp_path, devices=1):
    X, Y, W, T = (data[k] for k in "XYWT")
    tile = TILE * TILE * 4
    # every process gets the same scalars, and they are right
    for key in ("sum", "sum_jit", "loss", "one_tile_max"):
        assert len({o[key] for o in outs}) == 1, (key, [o[key] for o in outs])
    assert outs[0]["one_tile_max"] == -5, outs[0]["one_tile_max"]
    np.testing.assert_allclose(outs[0]["sum"], X.sum(dtype=np.float64), rtol=1e-5, atol=1e-4)
    w = np.ones((24, 8), np.float32) / 10
    np.testing.assert_allclose(outs[0]["loss"], np.sum(np.square(X @ w - T), dtype=np.float64), rtol=1e-5)
    want_g = 2 * X.T @ (X @ w - T)
    for o in outs:
        np.testing.assert_allclose(np.array(o["grad"]), want_g, rtol=1e-4, atol=1e-4)
    # no tile read twice: the shares add up to one process's bytes, each within a tile of 1/n
    for key, whole in (("sum_read", 2 * X.nbytes), ("ew_read", X.nbytes + Y.nbytes),
                       ("ew_written", X.nbytes), ("update_read", W.nbytes), ("update_written", W.nbytes)):
        got = [o[key] for o in outs]
        assert sum(got) == whole, (key, got, whole)
        assert all(abs(g - whole / n) <= 2 * tile for g in got), (key, got, whole)   # two arrays: a tile each
    check_files(data, outs, n, tmp_path)
    # an output whose tiles an even split would cut between processes: shared by whole tiles
    W_new = W * np.float32(2) + np.float32(1)                # (after the update_ above it)
    got = [o["cut_written"] for o in outs]
    assert sum(got) == 9 * tile and all(0 < g <= (9 // n + 1) * tile and g % tile == 0 for g in got), got
    A = np.arange(12 * 16, dtype=np.float32).reshape(12, 16) / 100
    np.testing.assert_allclose(zarr.open_array(str(tmp_path / "cut.zarr"), mode="r")[:], A @ W_new,
                               rtol=1e-5, atol=1e-4)
    # the shared output store holds every process's tiles: one process's result bit for bit
    jask.config.update("tile", TILE)
    jask.config.update("backend", "xla")
    x, y, w_, t = (jask.from_numpy(data[k]) for k in "XYWT")
    # jit(value_and_grad): every pass is shared. Each share boundary (n x devices shares) costs at
    # most one more read of the small operands (w twice, the T-sized residual) and of one block
    # column of X (the gradient's output tiles of one X column split between two shares).
    with jask.profile() as p:
        _, g1 = jax.jit(jax.value_and_grad(lambda w: jask.sum(jask.square(x @ w - t))))(jask.from_numpy(w))
        np.asarray(g1)
    boundary, shares = 2 * w.nbytes + T.nbytes + X.shape[0] * TILE * 4, n * devices
    got = [o["grad_read"] for o in outs]
    assert p.bytes_read < sum(got) <= p.bytes_read + (shares - 1) * boundary, (got, p.bytes_read)
    assert max(got) < p.bytes_read, (got, p.bytes_read)
    # a weight small next to X: its gradient comes from the loss's pass, whose entries the processes share;
    # each tile of X is read once, by one process
    w1, y1 = np.full((24, 1), 0.1, np.float32), T[:, :1]
    want_loss, want_g1 = np.sum(np.square(X @ w1 - y1), dtype=np.float64), 2 * X.T @ (X @ w1 - y1)
    got = [o["small_x_tiles"] for o in outs]
    assert sum(got) == (32 // TILE) * (24 // TILE) and max(got) < sum(got), got
    for o in outs:
        np.testing.assert_allclose(o["small_loss"], want_loss, rtol=1e-5)
        np.testing.assert_allclose(np.array(o["small_grad"]), want_g1, rtol=1e-4, atol=1e-4)
    one_ew, one_w = np.asarray((x - y) * 3.0 + x), np.asarray(w_ * 2.0 + 1.0)
    out = zarr.open_array(str(tmp_path / "out.zarr"), mode="r")[:]
    np.testing.assert_array_equal(out, one_ew)
    np.testing.assert_allclose(out, (X - Y) * np.float32(3.0) + X, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "W.zarr"), mode="r")[:], one_w)
    np.testing.assert_allclose(one_w, W * 2 + 1, rtol=1e-6)
    for o in outs:
        np.testing.assert_array_equal(np.array(o["W_after"], np.float32), one_w)
    # custom ops run whole everywhere; only process 0 writes the user path
    assert [o["cumsum_written"] for o in outs] == [X.nbytes] + [0] * (n - 1)
    np.testing.assert_allclose(zarr.open_array(str(tmp_path / "cumsum.zarr"), mode="r")[:], np.cumsum(X, 0),
                               rtol=1e-5, atol=1e-4)
    for o in outs:
        np.testing.assert_allclose(np.array(o["cumsum_grad"]), np.cumsum(Y[::-1], 0)[::-1], rtol=1e-5, atol=1e-4)
        assert o["bf16_sum"] == 516.0, o["bf16_sum"]
        assert "resume=True is not supported in a multi-process" in o["resume"], o["resume"]
        assert o["long_path"] == "ValueError", o["long_path"]
        assert "must belong to this process" in o["foreign_devices"], o["foreign_devices"]
    assert not os.path.exists(tmp_path / "resumed.zarr")
    left = [f for f in os.listdir(tmp_path) if ".jask-" in f]
    assert not left, f"staging folders left behind: {left}"


def check_files(data, outs, n, tmp_path):
    """Outputs in files of several tiles: each file written whole by one process, the pass cut on file
    boundaries (so each process reads, computes and writes whole files), the results numpy's."""
    X, S = data["X"], data["S"]
    tile = TILE * TILE * 4
    # (tiles along each axis, tiles per file along each axis) of each output
    layouts = {"big_chunks": ((8, 6), (2, 2)), "sharded": ((8, 6), (3, 2)), "S": ((4, 3), (2, 2)),
               "zeros": ((8, 6), (2, 2))}
    for name, (grid, per_file) in layouts.items():
        got = [o[name] for o in outs]              # [bytes read, bytes written, tiles] per process
        assert sum(g[2] for g in got) == grid[0] * grid[1], (name, got)
        assert all(g[0] == g[1] == g[2] * tile for g in got), (name, got)   # its own tiles only
        if name in ("sharded", "S"):              # shard files written, per process: disjoint, all of them
            files = [{tuple(f) for f in o["shards_written"].get(name, [])} for o in outs]
            assert set().union(*files) == set(np.ndindex(*[-(-g // f) for g, f in zip(grid, per_file)])), files
            assert sum(map(len, files)) == len(set().union(*files)), (name, files)
            sizes = [sum(np.prod([min(f, g - c * f) for c, g, f in zip(k, grid, per_file)]) for k in fs)
                     for fs in files]
            assert [g[2] for g in got] == sizes, (name, got, sizes)
        # 12 chunks (or shards) of 4 tiles; 9 shards of 6, 6, 6, 6, 6, 6, 4, 4, 4 tiles (cut after the 4th: an even
        # split of the tiles in C order would cut the 2nd row of shards); 4 shards of 4, 2, 4, 2 tiles
        if n == 2:
            assert [g[2] for g in got] == [grid[0] * grid[1] // 2] * 2, (name, got)
    # a single shard is one piece, too big to gather: the pass runs whole everywhere, process 0 alone writes
    assert [o["one_shard"] for o in outs] == [[S.nbytes, S.nbytes, 12]] + [[S.nbytes, 0, 12]] * (n - 1), outs
    assert [o["shards_written"].get("one_shard", []) for o in outs] == [[[0, 0]]] + [[]] * (n - 1), outs
    one = np.float32(1)
    # every file is there (compressed, all zeros: a dense reader takes a missing one for damage)
    assert sum(len(fs) for _, _, fs in os.walk(tmp_path / "zeros.zarr" / "c")) == 12
    np.testing.assert_array_equal(np.asarray(jask.from_zarr(str(tmp_path / "zeros.zarr"))), X * 0)
    for name, want in (("big_chunks", X * 2), ("sharded", X * 2 + one), ("S", S * 2 + one),
                       ("one_shard", (S * 2 + one) * np.float32(3))):
        np.testing.assert_array_equal(zarr.open_array(str(tmp_path / f"{name}.zarr"), mode="r")[:], want)
    for o in outs:
        np.testing.assert_array_equal(np.array(o["S_after"], np.float32), S * 2 + one)


@pytest.mark.slow
def test_two_processes_share_every_pass(tmp_path):
    data, outs = run_processes(tmp_path, 2)
    check(data, outs, 2, tmp_path)


@pytest.mark.slow
def test_four_processes_share_every_pass(tmp_path):
    data, outs = run_processes(tmp_path, 4)
    check(data, outs, 4, tmp_path)


@pytest.mark.slow
def test_two_processes_of_two_devices_each_share_every_pass(tmp_path):
    data, outs = run_processes(tmp_path, 2, "devices", devices=2)
    check(data, outs, 2, tmp_path, devices=2)


@pytest.mark.parametrize("name", ["W", "S"])   # one-tile chunks; shards of 2 x 2 tiles
def test_a_process_killed_mid_pass_leaves_the_old_store_and_a_named_error(tmp_path, name):
    data, outs = run_processes(tmp_path, 2, "kill", name)
    (rc0, out0, err0), (rc1, _, _) = outs
    assert rc1 == 9, "process 1 was to die at its first tile write"
    assert "ERROR ProcessLostError" in out0 and f"{name}.zarr" in out0 and "old version" in out0, out0 + err0[-2000:]
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / f"{name}.zarr"), mode="r")[:], data[name])
    left = [f for f in os.listdir(tmp_path) if ".jask-" in f]
    assert not left, f"staging folders left behind: {left}"


MOTO_MISSING = s3server.moto_missing()


@pytest.mark.slow
@pytest.mark.skipif(MOTO_MISSING is not None, reason=f"S3 tests: {MOTO_MISSING}")
def test_two_processes_share_store_url_outputs_and_a_lost_one_leaves_the_old_version(tmp_path):
    """to_zarr and update_ to s3:// URLs (a moto server on loopback): each process writes its half of the
    tiles into process 0's new version, one pointer PUT commits it; then process 1 dies mid-update_."""
    server = s3server.S3Server()
    try:
        server.make_bucket("jask-mh")
        data, outs = run_processes(tmp_path, 2, "s3", server.endpoint, "s3://jask-mh/run")
        (rc0, out0, err0), (rc1, out1, err1) = outs
        results = [json.loads(next(ln for ln in o.splitlines() if ln.startswith("RESULT"))[len("RESULT"):])
                   for o in (out0, out1)]
        X, W = data["X"], data["W"]
        # each process read and wrote exactly its half of the tiles: 48 of X, 12 of W
        assert [r["to_zarr"] for r in results] == [[X.nbytes // 2, X.nbytes // 2, 24]] * 2, results
        assert [r["update"] for r in results] == [[W.nbytes // 2, W.nbytes // 2, 6]] * 2, results
        assert [r["sharded"] for r in results] == [[X.nbytes // 2, X.nbytes // 2, 24]] * 2, results
        opts = server.storage_options()
        for name in ("out", "sharded"):
            got = np.asarray(jask.from_zarr(f"s3://jask-mh/run/{name}.zarr", storage_options=opts))
            np.testing.assert_array_equal(got, X * np.float32(2) + np.float32(1))
        want_w = W * np.float32(2) + np.float32(1)
        np.testing.assert_array_equal(np.asarray(jask.from_zarr("s3://jask-mh/run/W.zarr", storage_options=opts)),
                                      want_w)
        for r in results:
            np.testing.assert_array_equal(np.array(r["W_after"], np.float32), want_w)
        # a scratch stage in the bucket is shared across processes (as across hosts): one URL in process
        # 0's scratch folder, each process writes half and reads half, and the last to let go deletes it
        assert results[0]["stage"][2] == results[1]["stage"][2], results
        assert results[0]["stage"][2].startswith("s3://jask-mh/run-scratch/jask-"), results
        assert [r["stage"][:2] for r in results] == [[X.nbytes, X.nbytes // 2]] * 2, results
        assert results[0]["stage_sum"] == results[1]["stage_sum"]
        np.testing.assert_allclose(results[0]["stage_sum"], (X * 2.0 + 1.0).sum(dtype=np.float64), rtol=1e-5)
        left = server.client().list_objects_v2(Bucket="jask-mh", Prefix="run-scratch/").get("Contents", [])
        assert sorted(o["Key"].split("/")[-1] for o in left) == ["heartbeat", "heartbeat"], \
            [o["Key"] for o in left]          # the stage is gone; the killed processes' folders keep heartbeats

        def versions(name):
            listed = server.client().list_objects_v2(Bucket="jask-mh", Prefix=f"run/{name}.zarr/v-")
            return {o["Key"].split("/")[2] for o in listed.get("Contents", [])}
        assert len(versions("out")) == 1, versions("out")    # process 1's own new version was deleted at once
        # process 1 died at its first tile write of K's update_: process 0 names the lost process and the
        # URL, K keeps its old version, and process 0 deleted the new version it had begun
        assert rc1 == 9 and rc0 == 0, (rc0, rc1, "process 1 was to die at its first tile write", err1[-2000:])
        assert "ERROR ProcessLostError" in out0 and "s3://jask-mh/run/K.zarr" in out0 and "old version" in out0, \
            out0 + err0[-2000:]
        k = jask.from_zarr("s3://jask-mh/run/K.zarr", storage_options=opts)
        np.testing.assert_array_equal(np.asarray(k), W)
        assert versions("K") == {k._node.resolved().store.version}
    finally:
        server.stop()
