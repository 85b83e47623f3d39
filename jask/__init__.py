"""jask: out-of-core, differentiable arrays for JAX, stored in Zarr."""
from jask.io.malloc import limit_arenas

limit_arenas()  # before any reader or writer thread exists; see jask/io/malloc.py

from jask import config
from jask.exec.events import Stats
from jask.hijax.array import DiskArray
from jask.config import set_memory_budget
from jask.io.scratch import cleanup_scratch
from jask.io.urls import BucketNotFoundError, RemoteAccessError, RemoteStoreError, StoreURLError
from jask.linalg.add import add
from jask.linalg.dot import dot
from jask.linalg.mul import mul
from jask.linalg.square import square
from jask.linalg.sub import sub
from jask.linalg.sum import sum  # noqa: A004
from jask.api import methods  # noqa: F401 - DiskArray's operators and methods
from jask.api.observe import explain, profile, runtime_baseline
from jask import numpy  # noqa: E402 - jax.numpy's API over DiskArrays
from jask.ops.shape import transpose_op as transpose  # axes positional too, as jnp.transpose
from jask import nn  # noqa: E402 - jax.nn's names over DiskArrays
from jask.ops.batches import batches
from jask.ops.interpret import on_disk
from jask.api.sinks import materialize, persist, rechunk, to_zarr, update_, update_all
from jask.api.sources import from_numpy, from_zarr
from jask.api.errors import OverBudgetError
from jask.exec.multihost import ProcessLostError
from jask.io.scratch import TmpfsScratchError

__version__ = "0.1.0"

__all__ = [
    "BucketNotFoundError", "DiskArray", "OverBudgetError", "ProcessLostError", "RemoteAccessError", "RemoteStoreError", "Stats",
    "StoreURLError", "TmpfsScratchError", "add", "batches", "cleanup_scratch", "config", "dot", "explain",
    "from_numpy", "from_zarr", "materialize", "mul", "nn", "numpy", "on_disk", "persist", "profile", "rechunk",
    "runtime_baseline", "set_memory_budget", "square", "sub", "sum", "to_zarr", "transpose", "update_", "update_all",
]
