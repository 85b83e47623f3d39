"""Accelerator tests: the OPS table and a larger-shape sweep on the compiled ``pallas`` backend.

Run on a TPU or GPU machine with ``pytest tpu_tests``. Without one every test is
skipped with the reason; CPU coverage of the same lowerings is
``tests/test_kernels.py`` under ``pallas-interpret``.
"""
import os
import sys

import jax
import pytest

import jask
from jask.config import config

# References (jnp) multiply float32 at full precision, as jask does (config "precision"):
# at JAX's default a TPU's f32 dot is one bf16 pass, ~2e-2 off on a 10-term product (seen on a v5e).
jax.config.update("jax_default_matmul_precision", "highest")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "tests"))  # for test_ops.OPS


def accelerator() -> str | None:
    """``tpu`` or ``gpu`` when JAX's default platform is one, else None."""
    from jask.kernels.pallas import current_platform
    p = current_platform()
    return p if p in ("tpu", "gpu") else None


def pytest_collection_modifyitems(config, items):
    if accelerator() is None:
        reason = (f"no TPU or GPU: JAX's default platform is {jax.default_backend()!r}, and these tests "
                  "compile Pallas kernels for real hardware (tests/test_kernels.py covers CPU with "
                  "pallas-interpret)")
        here = os.path.dirname(os.path.abspath(__file__))
        for item in items:
            if os.path.abspath(str(item.path)).startswith(here + os.sep):
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def _jask_settings():
    saved = dict(vars(config))
    jask.config.update("backend", "pallas")
    yield
    for k, v in saved.items():
        setattr(config, k, v)


@pytest.fixture
def small_tiles():
    jask.config.update("tile", 4)
    yield 4
