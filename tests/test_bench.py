"""CI check of the benchmark suite: ``python -m jask.bench --quick`` completes and every system agrees.

Times are never asserted (CI machines are noisy); what is asserted is that the
suite runs end to end, covers every workload, and that all systems that ran a
workload computed the same result.
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from jask.bench import harness, workloads

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("dask") is None,
                       reason="dask is not installed: pip install -e '.[bench]' to run the benchmark suite check"),
]


def _env() -> dict:
    """This environment with the repository first on the children's import path."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))


def test_quick_suite_completes_and_systems_agree(tmp_path):
    out = tmp_path / "out"
    env = _env()
    proc = subprocess.run(
        [sys.executable, "-m", "jask.bench", "--quick", f"--out={out}", f"--data_dir={tmp_path / 'data'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    with open(out / "results.json") as f:
        results = json.load(f)["results"]
    assert {e["workload"] for e in results} == set(workloads.NAMES)
    errors = [(e["workload"], e["system"], e["error"]) for e in results if "error" in e]
    assert not errors, errors
    for e in results:
        assert "median_s" in e or e.get("skipped"), e["system"]   # ran, or says why not

    for name in workloads.NAMES:
        ran = [e for e in results if e["workload"] == name and "median_s" in e]
        assert any(e["system"] == "jask" for e in ran), name
        checked = [e for e in ran if e.get("check") is not None]
        assert len(checked) >= 2, f"{name}: fewer than two systems to compare"
        differ = [(e["system"], e.get("deviation")) for e in checked if e.get("agrees") is not True]
        assert not differ, f"{name}: results differ from {checked[0].get('checked_against')}: {differ}"

    assert (out / "results.md").read_text().count("| jask |") == len(workloads.NAMES)
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "sum-throughput.png").exists() and (out / "sum-memory.png").exists()
    data = tmp_path / "data"
    assert not data.exists() or not os.listdir(data), "benchmark stores were left behind"


def _bench(tmp_path, *args, timeout=600):
    env = _env()
    return subprocess.run([sys.executable, "-m", "jask.bench", f"--out={tmp_path / 'out'}",
                           f"--data_dir={tmp_path / 'data'}", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


def test_rounds_alternate_one_and_two_processes_and_pool_their_runs(tmp_path):
    """``--rounds=2 --repeat=2``: every system's entry holds the 4 timed runs of its two rounds, and the
    2-process run (its processes start each run together) computes the sum one process does."""
    problem = harness.loopback_problem()
    if problem is not None:   # the lent TPU machine's sandbox; the refusal itself is the next test's
        pytest.skip(f"--processes=1,2 needs loopback TCP for jax.distributed: {problem}")
    proc = _bench(tmp_path, "--workload=sum", "--gib=0.004", "--cache=warm", "--peers=raw-io", "--repeat=2",
                  "--warmup=0", "--rounds=2", "--processes=1,2", "--budget=16MB", "--tile=64")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(tmp_path / "out" / "results.json") as f:
        run = json.load(f)
    assert run["meta"]["rounds"] == 2
    entries = {e["system"]: e for e in run["results"]}
    assert set(entries) == {"jask", "jask-2proc", "raw-io"}, set(entries)
    for name, e in entries.items():
        assert "error" not in e, (name, e.get("error"))
        assert e["runs"] == 4 and len(e["raw"]["times"]) == 4, (name, e["runs"])
    one, two = entries["jask"]["check"]["sum"], entries["jask-2proc"]["check"]["sum"]
    assert two == pytest.approx(one, rel=1e-6), (one, two)   # partials fold in another order


def test_rounds_need_one_subprocess_per_system(tmp_path):
    proc = _bench(tmp_path, "--workload=sum", "--rounds=2", "--isolate=system", timeout=120)
    assert proc.returncode != 0 and "--rounds alternates one subprocess per system" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("flag, says", [("--workload=foo", "--workload takes names among"),
                                        ("--gib=-1", "--gib takes sizes in GiB above 0"),
                                        ("--budget=lots", "cannot parse memory size 'lots'")])
def test_bad_flags_are_one_usage_line(tmp_path, flag, says):
    """Tracebacks from inside a run before (``--gib=-1`` even ran, as "-1024 MiB")."""
    proc = _bench(tmp_path, flag, timeout=120)
    assert proc.returncode != 0 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "data").exists()


def test_processes_refused_up_front_where_loopback_tcp_is_refused(tmp_path):
    """The lent TPU machine's sandbox refuses IPv4 sockets: ``--processes=1,2`` then stops before writing
    any data, naming the flag and the cause, instead of a traceback from the first child's start."""
    breaks_sockets = ("import errno, runpy, socket, sys\n"
                      "class Refused(socket.socket):\n"
                      "    def __init__(self, *a, **k):\n"
                      "        raise OSError(errno.EAFNOSUPPORT, 'Address family not supported by protocol')\n"
                      "socket.socket = Refused\n"
                      "sys.argv = ['jask.bench'] + sys.argv[1:]\n"
                      "runpy.run_module('jask.bench', run_name='__main__')\n")
    env = _env()
    data = tmp_path / "data"
    proc = subprocess.run([sys.executable, "-c", breaks_sockets, "--workload=sum", "--gib=0.004", "--processes=1,2",
                           f"--out={tmp_path / 'out'}", f"--data_dir={data}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "--processes=1,2: jax.distributed processes talk over loopback TCP" in proc.stderr, proc.stderr[-2000:]
    assert "Address family not supported" in proc.stderr
    assert not any(p.is_file() for p in data.rglob("*")), list(data.rglob("*"))


def test_a_slow_warm_up_leaves_the_timed_runs_their_time_cap(tmp_path, monkeypatch):
    """The warm-up run (compilation) is not counted against --time_cap: a warm-up longer than the cap
    still leaves every timed run that fits in it (it left one on a TPU, where compiling took 20-40 s)."""
    import types

    from jask.bench import harness, peers

    class Slow(peers.Runner):
        checks = False

        def run(self):
            self.calls = getattr(self, "calls", 0) + 1
            if self.calls == 1:
                import time
                time.sleep(0.3)

        def cache_paths(self):
            return []

    monkeypatch.setattr(workloads, "get", lambda name: types.SimpleNamespace(SYSTEMS={"slow": Slow}))
    task = harness.Task("slow", "tiny", {}, "slow", {}, str(tmp_path), cache="warm", repeat=4, time_cap=0.2)
    result = harness.measure(task)
    assert result["first_s"] >= 0.3 and len(result["times"]) == 4, result


def test_warming_the_cache_skips_a_file_another_process_deleted(tmp_path, monkeypatch):
    """A multi-process run's work folder holds the other processes' scratch, deleted as they free it:
    warming skips a file gone between listing and opening; the raw-read peer still fails on one."""
    from jask.bench import data
    kept = tmp_path / "kept.bin"
    kept.write_bytes(b"x" * 1000)
    gone = str(tmp_path / "gone.bin")
    monkeypatch.setattr(data, "_files_under", lambda paths: [gone, str(kept)])
    data.warm_cache([str(tmp_path)])
    assert data.raw_read([str(kept)]) == 1000
    with pytest.raises(FileNotFoundError):
        data.raw_read([gone, str(kept)])
