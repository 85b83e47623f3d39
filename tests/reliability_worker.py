"""Child processes for tests/test_reliability.py: storage scenarios killed at fault points, and readers.

Usage:
  python reliability_worker.py serve
      A zygote: imports jask once, then for each JSON request line on stdin
      ({"scenario", "dir", "scratch", "fault" or "record", optionally "durability" and, with
      "fault", "trace"}) forks a child that runs the scenario (armed with ``fault``, e.g. ``*:7``,
      each point passed appended to the file ``trace``; or recording every fault point into the
      file ``record``), waits for it and prints one JSON line {"pid", "signal", "code"}. Forking
      saves the 2 s jax import per kill point; the zygote itself never starts JAX's backend or
      touches scratch.
      A request {"read", "scratch", "seconds", "out", optionally "stop"} instead
      forks a reader (as ``read`` below, writing to files ``out`` + ".ready" and
      ``out``; with ``stop``, reading until that file exists) and answers {"pid"}
      at once, without waiting for it.
  python reliability_worker.py run SCENARIO DIR SCRATCH
      Run one scenario in this process (``JASK_FAULT`` in the environment arms it).
  python reliability_worker.py read PATH SCRATCH SECONDS
      Read PATH in a loop (``np.asarray`` and ``jask.sum`` alternately), each
      time opening it afresh; print "ready" after the first read, then one JSON
      line: per read, ["values", distinct values], ["sum", total] or ["error", message].

The scenarios are small (8x8 float32, tile 4: 4 tiles per array) and use
small integer values, so every result is exact in float32 and the parent can
compare with NumPy bit for bit. :func:`make_inputs` writes a scenario's
starting arrays and :func:`expected` gives, per array, its old and new value.
"""
import atexit
import json
import os
import sys
import traceback

import numpy as np

SHAPE = (8, 8)
TILE = 4


def _ints(seed):
    return np.random.default_rng(seed).integers(-8, 9, SHAPE).astype(np.float32)


A, B, W, O, P1, P2 = (_ints(s) for s in range(6))

# scenario -> {array file: (old value or None when absent, new value)}
_EXPECTED = {
    "chain": {"out.zarr": (None, (2 * A + B) ** 2 - A)},
    "overwrite": {"out.zarr": (O, A * A + B)},
    "update": {"w.zarr": (W, 3 * W + A)},
    "update-fallback": {"w.zarr": (W, 3 * W + A)},
    "optim": {"p1.zarr": (P1, P1 - 0.5 * (P1 - A)), "p2.zarr": (P2, P2 - 0.5 * (P2 - B))},
    "optim-group": {"p1.zarr": (P1, P1 - 0.5 * (P1 - A)), "p2.zarr": (P2, P2 - 0.5 * (P2 - B))},
}
SCENARIOS = tuple(_EXPECTED)
RESUME_TILE = 2       # "resume", "resume-update", "resume-persist" (not in SCENARIOS): to_zarr(2a + b) /
#                       w.update_(3w + a) / persist(2a + b, resume=True) then to_zarr(c * c - a): 16 tiles each


def expected(scenario):
    """``{file: (old, new)}`` for the arrays a scenario writes (old None: the path did not exist)."""
    return _EXPECTED[scenario]


def make_inputs(scenario, folder):
    """Write the scenario's inputs (``a``, ``b``) and the old values of the arrays it replaces, with zarr."""
    import zarr
    os.makedirs(folder, exist_ok=True)
    arrays = {"a.zarr": A, "b.zarr": B}
    if scenario == "resume-update":
        arrays["w.zarr"] = W
    elif scenario in ("resume-group", "optim-state", "optim-state-resume"):
        arrays.update({"p1.zarr": P1, "p2.zarr": P2})
    elif scenario != "resume":
        arrays.update({name: old for name, (old, _) in expected(scenario).items() if old is not None})
    edge = RESUME_TILE if scenario.startswith("resume") else TILE
    for name, value in arrays.items():
        z = zarr.create_array(os.path.join(folder, name), shape=SHAPE, dtype=np.float32, chunks=(edge, edge),
                              compressors=None, fill_value=0)
        z[...] = value


def group_step(jask, p, a, b, resume):
    """The "optim" step as one update_all (the parent reruns it to resume "resume-group")."""
    p1, p2 = jask.from_zarr(p("p1.zarr"), mode="r+"), jask.from_zarr(p("p2.zarr"), mode="r+")
    jask.update_all({"p1": p1, "p2": p2}, {"p1": p1 - (p1 - a) * 0.5, "p2": p2 - (p2 - b) * 0.5}, resume=resume)


STATE_STEPS = 3     # "optim-state" (not in SCENARIOS): Adam steps, parameters and state checkpointed together


def adam_state_steps(jask, p, a, b, resume=False):
    """Adam on p1, p2 (gradients p1 - a, p2 - b) with its state checkpointed in ``ckpt``, continued from
    there when it exists, until the state's count is :data:`STATE_STEPS` (each step resumable with ``resume``)."""
    import jask.optim
    params = {"p1": jask.from_zarr(p("p1.zarr"), mode="r+"), "p2": jask.from_zarr(p("p2.zarr"), mode="r+")}
    opt = jask.optim.adam(0.1)
    ckpt = p("ckpt")
    state = jask.optim.load_state(opt.init(params), ckpt) if os.path.exists(ckpt) else \
        jask.optim.checkpoint_state(opt.init(params), ckpt)
    while int(state.count) < STATE_STEPS:
        updates, state = opt.update({"p1": params["p1"] - a, "p2": params["p2"] - b}, state, params)
        jask.optim.update_params(params, jask.optim.apply_updates(params, updates), state=state, state_path=ckpt,
                                 resume=resume)


def run_scenario(scenario, folder):
    """The jask calls of one scenario; each writes one or two arrays through the storage seam."""
    import jask
    p = lambda name: os.path.join(folder, name)  # noqa: E731
    a, b = jask.from_zarr(p("a.zarr")), jask.from_zarr(p("b.zarr"))
    if scenario == "chain":
        c = (a * 2.0 + b).persist()                       # a scratch store
        jask.to_zarr(c * c - a, p("out.zarr"))            # a lazy chain into a new path
    elif scenario == "overwrite":
        jask.to_zarr(jask.square(a) + b, p("out.zarr"), overwrite=True)
    elif scenario in ("update", "update-fallback"):
        if scenario == "update-fallback":
            from jask.io import exchange
            exchange.USE_EXCHANGE = False                    # the two-rename swap
        w = jask.from_zarr(p("w.zarr"), mode="r+")
        w.update_(w * 3.0 + a)
    elif scenario == "optim":                             # two parameters updated one after the other
        p1, p2 = jask.from_zarr(p("p1.zarr"), mode="r+"), jask.from_zarr(p("p2.zarr"), mode="r+")
        g1, g2 = p1 - a, p2 - b
        p1.update_(p1 - g1 * 0.5)
        p2.update_(p2 - g2 * 0.5)
    elif scenario == "optim-group":                       # the same step as one group commit (update_all)
        group_step(jask, p, a, b, resume=False)
    elif scenario == "resume":                            # killed, then continued by the parent
        jask.config.update("tile", RESUME_TILE)
        jask.to_zarr(a * 2.0 + b, p("out.zarr"), resume=True)
    elif scenario == "resume-persist":                    # a resumable persist, then a write reading it
        jask.config.update("tile", RESUME_TILE)
        c = jask.persist(a * 2.0 + b, resume=True)
        jask.to_zarr(c * c - a, p("out.zarr"))
    elif scenario == "resume-group":
        jask.config.update("tile", RESUME_TILE)
        group_step(jask, p, a, b, resume=True)
    elif scenario in ("optim-state", "optim-state-resume"):
        adam_state_steps(jask, p, a, b, resume=scenario == "optim-state-resume")
    elif scenario == "resume-update":
        jask.config.update("tile", RESUME_TILE)
        w = jask.from_zarr(p("w.zarr"), mode="r+")
        w.update_(w * 3.0 + a, resume=True)
    else:
        raise SystemExit(f"unknown scenario {scenario}")


def _setup(scratch):
    import jask
    jask.config.update("tile", TILE)
    jask.set_memory_budget("64MB", scratch_dir=scratch)


class _Traced:
    """Appends each fault point to a file as it fires, then calls the trigger: what a kill run passed,
    up to the point that killed it, survives the SIGKILL (each line is one ``write``)."""

    def __init__(self, path, trigger):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.trigger = trigger

    def __call__(self, point, info):
        os.write(self.fd, (json.dumps([point, info.get("path")]) + "\n").encode())
        self.trigger(point, info)


def _child(req) -> int:
    from jask.io import faults
    _setup(req["scratch"])
    if req.get("durability"):
        import jask
        jask.config.update("durability", req["durability"])
    recorder = None
    if req.get("record"):
        recorder = faults.arm(faults.Recorder())
    elif req.get("fault"):
        trigger = faults.parse(req["fault"])
        faults.arm(_Traced(req["trace"], trigger) if req.get("trace") else trigger)
    run_scenario(req["scenario"], req["dir"])
    faults.disarm()
    if recorder is not None:
        with open(req["record"], "w") as f:
            json.dump(recorder.points, f)
    return 0


def serve():
    import jask  # noqa: F401  (imported once here; forked children inherit it)
    detached = set()
    for line in sys.stdin:
        for pid in list(detached):
            if os.waitpid(pid, os.WNOHANG)[0]:
                detached.discard(pid)
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = read_loop(req["read"], req["scratch"], req["seconds"], req["out"], req.get("stop")) \
                    if "read" in req \
                    else _child(req)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                atexit._run_exitfuncs()   # this child's scratch folder goes, as at a normal exit
                os._exit(code)
        if "read" in req:
            detached.add(pid)
            print(json.dumps({"pid": pid}), flush=True)
            continue
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"pid": pid, "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                          "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None}), flush=True)


def _publish(text, path):
    with open(path + ".part", "w") as f:
        f.write(text)
    os.rename(path + ".part", path)


MIN_READS = 8   # a loaded machine may be slow: read at least this often, however long it takes


def read_loop(path, scratch, seconds, out=None, stop=None) -> int:
    """Read ``path`` afresh in a loop for ``seconds`` after the first read (or, given ``stop``, until
    that file exists, ``seconds`` at most: a writer slow to start, e.g. compiling on a TPU, still meets
    the reads), and at least ``MIN_READS`` times; report to stdout or ``out``."""
    import time
    import jask
    _setup(scratch)
    jask.config.update("tile", 8)
    results = []
    t_end = None

    def reading() -> bool:
        if t_end is None or len(results) < MIN_READS:
            return True
        return not (stop and os.path.exists(stop)) and time.monotonic() < t_end

    while reading():
        try:
            x = jask.from_zarr(path)
            if len(results) % 2:
                results.append(["sum", float(jask.sum(x))])
            else:
                results.append(["values", np.unique(np.asarray(x)).tolist()])
        except Exception as e:     # reported, not fatal: the parent fails the test with it
            results.append(["error", f"{type(e).__name__}: {e}"])
        if t_end is None:
            if out:
                _publish("ready", out + ".ready")
            else:
                print("ready", flush=True)
            t_end = time.monotonic() + seconds
    if out:
        _publish(json.dumps(results), out)
    else:
        print(json.dumps(results), flush=True)
    return 0


def main():
    mode = sys.argv[1]
    if mode == "serve":
        serve()
    elif mode == "run":
        _setup(sys.argv[4])
        run_scenario(sys.argv[2], sys.argv[3])
    elif mode == "read":
        read_loop(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
