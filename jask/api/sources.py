"""Sources: DiskArrays from in-memory data or existing Zarr stores."""
from __future__ import annotations

import os

import jax
import numpy as np

from jask.exec.sinks import store_numpy
from jask.graph.nodes import StoredNode
from jask.graph.tiling import block_shape
from jask.hijax.array import DiskArray, zeros_node
from jask.io import dtypes
from jask.io.arguments import block_edges
from jask.io.remote import open_store
from jask.plan.tiling import default_tile

SUPPORTED_KINDS = "fiub"


def check_array_facts(name, shape, dtype, allow_empty: bool = False):
    """Refuse dtypes and shapes jask cannot tile, naming what is wrong."""
    dtype = np.dtype(dtype)
    if dtype.kind not in SUPPORTED_KINDS and not dtypes.is_stored_by_view(dtype):
        raise TypeError(f"{name}: dtype {dtype} is not supported; use a numeric or boolean dtype "
                        "(or bfloat16)")
    if dtype.itemsize == 8 and not jax.config.jax_enable_x64:
        raise TypeError(f"{name}: dtype {dtype} needs 64-bit JAX, which is off, so tiles would be "
                        "computed in 32 bits; call jax.config.update('jax_enable_x64', True) first, "
                        "or convert the data to a 32-bit dtype")
    if any(d == 0 for d in shape) and not allow_empty:
        raise ValueError(f"{name}: shape {tuple(shape)} has a zero-size dimension; an empty Zarr array is not "
                         "opened (it has no data to stream): jask.from_numpy(np.zeros(shape)) gives an empty DiskArray")


def from_numpy(arr, chunks=None) -> DiskArray:
    """Copy an in-memory array into a new scratch Zarr store.

    Parameters
    ----------
    arr : array_like
        64-bit data is stored in 32 bits while JAX's x64 mode is off, as
        ``jnp.asarray`` would convert it (chunk by chunk: no full copy).
    chunks : int or tuple of int, optional
        Zarr chunk shape (an int: that edge on every axis); by default the
        tile shape the memory budget gives.
    """
    if isinstance(arr, DiskArray):
        raise TypeError("from_numpy got a DiskArray; it is already disk-backed")
    a = np.asarray(arr)
    if a.dtype.kind in SUPPORTED_KINDS and a.dtype.itemsize == 8 and not jax.config.jax_enable_x64:
        # as jnp.asarray does: 64-bit data (np.random.rand's float64) becomes 32-bit while x64 is off
        dtype = np.dtype(jax.dtypes.canonicalize_dtype(a.dtype))
    else:
        dtype = a.dtype
    check_array_facts("from_numpy", a.shape, dtype, allow_empty=True)
    if a.size == 0:     # no values to store: the storage-free zero node of that shape is exact
        return DiskArray(node=zeros_node(a.shape, dtype))
    if chunks is None:
        chunks = block_shape(a.shape, default_tile(a.shape, dtype.itemsize))
    chunks = block_edges(chunks, a.shape, "from_numpy")
    return DiskArray(node=store_numpy(a, chunks, dtype=dtype))


def from_zarr(path_or_array, mode: str = "r", storage_options=None, missing_chunks: str = "auto") -> DiskArray:
    """Open an existing Zarr array without copying it.

    Parameters
    ----------
    path_or_array : str, path or zarr.Array
        A local Zarr array folder, a store URL (``s3://bucket/x.zarr``,
        ``gs://...``, ``memory://...``, ``file:///...``), or an opened
        ``zarr.Array`` on a local store. Local folders are read directly;
        URLs through zarr's fsspec store, at the version current when opened.
    mode : {"r", "r+"}
        ``"r+"`` allows :meth:`DiskArray.update_` to replace its contents.
        Zarr v2 arrays are read, but ``"r+"`` is refused for them: jask writes v3 only.
    storage_options : dict, optional
        For URLs: passed to s3fs/gcsfs as they take them (``key``, ``secret``,
        ``endpoint_url``, ``client_kwargs``, ...).
    missing_chunks : {"auto", "fill"}
        A missing chunk reads as the array's fill value, as Zarr specifies,
        except in arrays jask wrote (``attributes["jask"]["dense"]``: every
        chunk is stored), where it is damage and raises ``MissingChunkError``.
        ``"fill"`` reads those as the fill value too: for a jask array later
        edited by a tool that removes chunks of fill values (zarr-python does).

    A ``uint16`` array whose ``attributes["jask"]["dtype"]`` is ``"bfloat16"``
    opens as bfloat16 (how jask stores bfloat16; see :mod:`jask.io.dtypes`).
    """
    if missing_chunks not in ("auto", "fill"):
        raise ValueError(f"from_zarr: missing_chunks must be 'auto' or 'fill', got {missing_chunks!r}")
    path = path_or_array
    if not isinstance(path, (str, os.PathLike)):
        store = getattr(path_or_array, "store", None)
        root = getattr(store, "root", None)
        if root is None:
            on = f" on a {type(store).__name__}" if store is not None else ""
            raise TypeError(f"from_zarr expects a path or a zarr.Array on a local store, got a "
                            f"{type(path_or_array).__name__}{on}; for a store in a bucket pass its URL "
                            "(and storage_options=...)")
        path = os.path.join(str(root), getattr(path_or_array, "path", "") or "")
    store = open_store(path, mode, storage_options, fill_missing=(missing_chunks == "fill"))
    check_array_facts(f"from_zarr({store.path!r})", store.shape, store.dtype)
    if mode == "r+" and getattr(store.array.metadata, "zarr_format", 3) != 3:
        raise ValueError(f"from_zarr: {store.path} is a Zarr v2 array; jask reads v2 but writes only v3, "
                         "so update_ would silently change its format. Open it with mode='r' and write "
                         "a v3 copy with to_zarr(new_path) to update that instead")
    return DiskArray(node=StoredNode(store))
