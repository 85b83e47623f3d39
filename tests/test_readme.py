"""A new user's first hour (issue 18): the README runs as written, and the command-line tools are quiet.

Every fenced ``python`` and ``sh`` block of README.md runs verbatim, top to
bottom, in one fresh working directory: the Python blocks in one interpreter
(as pasted into one session), the shell blocks with bash, in README order. A
block is left out only when the line before it says why
(``<!-- not run in tests: reason -->``): installing packages, the full test
suite, full-size benchmarks. It runs once, with ``$TMPDIR`` on tmpfs where the
machine has one (the default scratch folder must then move to the user cache
directory and nothing may be written to ``$TMPDIR``), else on disk.
"""
import dataclasses
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile

import jax
import pytest

from jask import cli
from jask.io import scratch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
SKIP = re.compile(r"^<!--\s*not run in tests:\s*(\S.*?)\s*-->$")
PROBE = "Unable to initialize backend"


@dataclasses.dataclass
class Block:
    lang: str
    code: str
    line: int
    skip: str | None


def readme_blocks(text: str) -> list[Block]:
    """The fenced code blocks of a Markdown text, each with the reason it is not run (or None)."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        reason = SKIP.match(before.strip())
        blocks.append(Block(m.group(1), "\n".join(body) + "\n", start + 1, reason and reason.group(1)))
        i += 1
    return blocks


def _env(**changes):
    """A fresh user's environment (JAX_PLATFORMS kept only where conftest pins children to the host)."""
    fresh = {"JASK_SCRATCH_DIR", "JASK_MEMORY_BUDGET", "JASK_BENCH_DIR"}
    if jax.default_backend() == "cpu":
        fresh.add("JAX_PLATFORMS")
    env = {k: v for k, v in os.environ.items() if k not in fresh}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    env.update(changes)
    return env


DRIVER = '''
import json, subprocess, sys
blocks = json.load(open(sys.argv[1]))
ns = {"__name__": "__main__"}
for b in blocks:
    print(f"=== README.md line {b['line']} ({b['lang']})", flush=True)
    if b["lang"] == "python":
        exec(compile(b["code"], f"README.md:{b['line']}", "exec"), ns)
    else:
        rc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", b["code"]]).returncode
        if rc:
            sys.exit(f"README.md line {b['line']}: shell block exited with status {rc}")
from jask.io.scratch import scratch_location
print("SCRATCH " + json.dumps(scratch_location()), flush=True)
'''


def test_readme_blocks_are_runnable_or_say_why_not():
    """Only python and sh blocks, no indented code blocks, and no Python block is ever skipped."""
    text = open(README).read()
    blocks = readme_blocks(text)
    assert {b.lang for b in blocks} <= {"python", "sh"}, [b.lang for b in blocks]
    assert not [b.line for b in blocks if b.skip and b.lang == "python"]
    skipped = [b for b in blocks if b.skip]
    assert len(skipped) <= 4, [(b.line, b.skip) for b in skipped]
    ran = [b for b in blocks if not b.skip]
    assert sum(b.lang == "python" for b in ran) >= 4 and sum(b.lang == "sh" for b in ran) >= 2
    outside = re.sub(r"```.*?```", "", text, flags=re.S)
    indented = re.findall(r"\n\n( {4}\S.*)", outside)
    assert not indented, f"indented code blocks are not run by this test; fence them: {indented}"


@pytest.mark.slow
def test_readme_runs_verbatim(tmp_path):
    """Every runnable block, in order, in an empty folder; afterwards the folder is empty again. $TMPDIR is
    on tmpfs where /dev/shm is one (the default scratch folder must then move to the user cache directory),
    else on disk (scratch goes under it); the scratch rules themselves are test_storage's."""
    work, cache = tmp_path / "work", tmp_path / "cache"
    work.mkdir()
    tmpdir_on = "tmpfs" if scratch.filesystem_type("/dev/shm") == "tmpfs" else "disk"
    tmp = tempfile.mkdtemp(prefix="jask-readme-", dir="/dev/shm") if tmpdir_on == "tmpfs" else str(tmp_path / "tmp")
    os.makedirs(tmp, exist_ok=True)
    blocks = [dataclasses.asdict(b) for b in readme_blocks(open(README).read()) if not b.skip]
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    (tmp_path / "driver.py").write_text(DRIVER)
    try:
        proc = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "blocks.json")],
                              cwd=work, env=_env(TMPDIR=tmp, XDG_CACHE_HOME=str(cache)),
                              capture_output=True, text=True, timeout=300)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]
        left_in_tmp = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp) for f in fs)
    finally:
        if tmpdir_on == "tmpfs":
            shutil.rmtree(tmp, ignore_errors=True)
    assert "loss after 10 steps" in out and "input tiles read" in out and "runtime baseline" in out
    assert PROBE not in out, "a command-line tool printed JAX's platform probe"
    where, why = json.loads(out.split("SCRATCH ")[1].splitlines()[0])
    if tmpdir_on == "tmpfs":
        assert where == os.path.join(str(cache), "jask", "scratch") and "tmpfs" in why
        assert left_in_tmp == 0, "nothing may be written to the RAM-backed $TMPDIR"
        assert f"scratch {where} (default:" in out, "jask.explain must say which scratch folder it uses"
    else:
        assert where == os.path.join(tmp, "jask-scratch")
    assert sorted(os.listdir(work)) == [], "the README's clean-up block must remove what its examples wrote"


def test_demo_cli_is_quiet_and_reports_memory_apart(tmp_path):
    """The demo's output has no platform-probe line and splits peak RSS into runtime and jask."""
    proc = subprocess.run([sys.executable, "-m", "jask.demo", "--rows=32768", "--features=32", "--steps=3",
                           "--budget=16MB", f"--data_dir={tmp_path / 'demo'}"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert PROBE not in out
    if "this platform cannot reset the peak" in out:   # gVisor on a TPU VM: only a lifetime peak exists
        assert re.search(r"peak RSS \d+ MiB over the process's lifetime(, reached while the runtime started| = "
                         r"runtime baseline \d+ MiB .*\+ \d+ MiB added since)", out), out
        assert "RSS during the step" not in out, out
        return
    assert re.search(r"peak RSS \d+ MiB = runtime baseline \d+ MiB .*\+ \d+ MiB added since", out), out
    m = re.search(r"jask's working set: at most (\d+) MiB per step after the first \((within|OVER) "
                  r"the budget of (\d+) MiB", out)
    assert m, out
    assert m.group(2) == "within", m.group(0)


@pytest.mark.parametrize("flag, says", [("--steps=0", "--steps must be at least 1"),
                                        ("--rows=-5", "--rows must be at least 1"),
                                        ("--budget=lots", "cannot parse memory size 'lots'")])
def test_demo_refuses_bad_flags_before_writing(tmp_path, flag, says):
    """A bad flag is one line naming it, before any data is written (--steps=0 divided by zero after
    training; --rows=-5 left an empty X.zarr behind)."""
    proc = subprocess.run([sys.executable, "-m", "jask.demo", "--features=8", flag, f"--data_dir={tmp_path / 'd'}"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "d").exists()


def test_platform_probe_filter_drops_only_the_probe():
    """The INFO probe record goes; the same text as a warning, and other INFO records, stay."""
    f = cli.DropPlatformProbe()
    rec = lambda level, msg: logging.LogRecord("jax._src.xla_bridge", level, __file__, 1, msg, (), None)
    assert not f.filter(rec(logging.INFO, "Unable to initialize backend 'tpu': INTERNAL: no libtpu"))
    assert f.filter(rec(logging.WARNING, "Unable to initialize backend 'cuda': driver too old"))
    assert f.filter(rec(logging.INFO, "Compiling step for with global shapes"))


def test_no_absolute_machine_paths_in_the_package():
    """Defaults are relative to the working directory or an environment variable, never /work/... ."""
    found = []
    pattern = re.compile(r"(?<![\w.~$/:\-])/[A-Za-z_][\w.-]*/[\w.-]+")
    for d, _, files in os.walk(os.path.join(ROOT, "jask")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(d, name)
                for n, line in enumerate(open(path), 1):
                    for m in pattern.finditer(line):
                        if not m.group(0).startswith(("/proc/", "/sys/", "/dev/")):
                            found.append(f"{os.path.relpath(path, ROOT)}:{n}: {m.group(0)}")
    assert not found, found
