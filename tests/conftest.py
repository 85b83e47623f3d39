"""Shared fixtures: every test runs with a private scratch dir and small tiles."""
import os

import pytest

import jask
from jask.config import config


@pytest.fixture(autouse=True)
def _jask_settings(tmp_path_factory):
    saved = dict(vars(config))
    yield
    for k, v in saved.items():
        setattr(config, k, v)


@pytest.fixture
def small_tiles():
    """Tile edge 4: every test shape spans several tiles in every dimension."""
    jask.config.update("tile", 4)
    yield 4
collect_ignore = ["memory_worker.py", "pytest_main.py"]
