"""Shared fixtures: a private scratch dir for the session, settings restored after each test."""
import gc
import os

import pytest

import jask
from jask.base import runtime
from jask.config import config
from jask.io import scratch

collect_ignore = ["memory_worker.py", "pytest_main.py"]


@pytest.fixture(scope="session", autouse=True)
def _session_scratch(tmp_path_factory):
    """All scratch stores of the run live here; at the end no store may be left behind."""
    root = tmp_path_factory.mktemp("jask-scratch")
    jask.set_memory_budget(config.memory_budget, scratch_dir=root)
    yield root
    runtime.safe_point()
    gc.collect()
    leftovers = [os.path.join(d, f) for d, dirs, files in os.walk(root) for f in dirs if f.endswith(".zarr")]
    assert not leftovers, f"scratch stores left after the test session: {leftovers[:5]}"


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
