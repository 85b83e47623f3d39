"""Shared fixtures: a private scratch dir for the session, settings restored after each test."""
import atexit
import gc
import os
import shutil
import tempfile

import jax
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.configuration import set_hypothesis_home_dir

import jask
from jask.config import config
from jask.hijax import runtime
from jask.io import scratch

# References (jnp) multiply float32 at full precision, as jask does (config "precision"):
# at JAX's default a TPU's f32 dot is one bf16 pass, ~2e-2 off on a 10-term product (seen on a v5e).
jax.config.update("jax_default_matmul_precision", "highest")
# One process at a time may hold a TPU chip (a second one fails on libtpu's lock file): on an
# accelerator machine, the processes tests start compute on the host.
if jax.default_backend() != "cpu":
    os.environ["JAX_PLATFORMS"] = "cpu"

collect_ignore = ["memory_worker.py", "pytest_main.py"]


def pytest_collection_modifyitems(items):
    """The slow tests first, in collection order otherwise. xdist hands tests to its workers in this order,
    so they start on the long ones and finish together; in file order the suite ended on one worker
    running a 28 s test while the other had finished (CI on 2026-12-07: the workers ended 33 s apart)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


# Hypothesis profiles (tests/test_properties.py): "ci" by default, bounded and the same examples every
# run; "long" by JASK_HYPOTHESIS_PROFILE=long or --hypothesis-profile=long, 500 examples (ci: 12) and new ones
# each run (a failure prints the @reproduce_failure blob that replays it). Nothing is written into the
# repository: no example database, and Hypothesis's own files (constants cache, patches of failing
# examples) go to a temporary folder removed at exit.
_hypothesis_home = tempfile.mkdtemp(prefix="jask-hypothesis-")
atexit.register(shutil.rmtree, _hypothesis_home, ignore_errors=True)
set_hypothesis_home_dir(_hypothesis_home)
_HYPOTHESIS = dict(database=None, deadline=None, print_blob=True,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                          HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=12, derandomize=True, **_HYPOTHESIS)
settings.register_profile("long", max_examples=500, derandomize=False, **_HYPOTHESIS)
settings.load_profile(os.environ.get("JASK_HYPOTHESIS_PROFILE", "ci"))


LEFTOVER_LIMIT = 10 * 2**20   # bytes the suite may leave in its temporary folders (issue 18)


def _du(path) -> int:
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(d, f)).st_size
            except OSError:
                pass
    return total


@pytest.fixture(scope="session", autouse=True)
def _session_scratch(request, tmp_path_factory):
    """All scratch stores of the run live here; at the end no store may be left behind.

    Passed tests' ``tmp_path`` folders are deleted as they finish
    (``tmp_path_retention_policy = "failed"`` in pyproject.toml); when every
    test passed, less than 10 MB may remain in the session's temporary folder,
    so a fixture that keeps big stores past its tests is caught here.
    """
    root = tmp_path_factory.mktemp("jask-scratch")
    jask.set_memory_budget(config.memory_budget, scratch_dir=root)
    yield root
    runtime.safe_point()
    jax.clear_caches()  # a jitted function keeps the DiskArrays it created while tracing (slice iotas,
    gc.collect()         # in-memory operands) as constants for as long as its compiled code is cached
    leftovers = [os.path.join(d, f) for d, dirs, files in os.walk(root) for f in dirs if f.endswith(".zarr")]
    assert not leftovers, f"scratch stores left after the test session: {leftovers[:5]}"
    if request.session.testsfailed == 0:
        base = tmp_path_factory.getbasetemp()
        left = _du(base)
        big = sorted(((_du(p), p.name) for p in base.iterdir()), reverse=True)[:5]
        assert left < LEFTOVER_LIMIT, (f"{left / 2**20:.0f} MiB left in {base} after the session "
                                       f"(largest: {big}); delete big stores when a fixture ends")


@pytest.fixture(autouse=True)
def _jask_settings():
    saved = dict(vars(config))
    yield
    for k, v in saved.items():
        setattr(config, k, v)


@pytest.fixture
def small_tiles():
    """Tile edge 4: every test shape spans several tiles in every dimension."""
    jask.config.update("tile", 4)
    yield 4
