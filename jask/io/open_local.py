"""Opening a local Zarr array in place, pinned, with clear errors for bad paths (``from_zarr``)."""
from __future__ import annotations

import os
import stat
import time

import zarr

from jask.io import recovery
from jask.io.destinations import zarr_node
from jask.io.pins import pin_current
from jask.io.recovery import settle, swap_in_progress
from jask.io.store import Store


def open_existing(path: str, mode: str) -> Store:
    """Open a Zarr array at ``path`` without copying it, with clear errors for bad paths.

    The folder is pinned (:class:`Pin`): this store reads the version it
    opened, even if another process replaces the path meanwhile.
    """
    if mode not in ("r", "r+"):
        raise ValueError(f"from_zarr mode must be 'r' or 'r+', got {mode!r}")
    path = os.path.abspath(os.fspath(path))
    deadline = time.monotonic() + recovery.SWAP_WAIT_SECONDS   # one wait in all, however many swaps meet it
    while True:
        settle(path, deadline)   # a writer's next swap may begin right after settle returns: then settle again
        late = time.monotonic() >= deadline
        try:   # one stat: with two (exists, then isdir) a swap between them made a folder "a file"
            is_folder = stat.S_ISDIR(os.stat(path).st_mode)
        except FileNotFoundError:
            if late or not swap_in_progress(path):
                raise FileNotFoundError(f"from_zarr: no Zarr array at {path}") from None
            continue
        if not is_folder:
            raise ValueError(f"from_zarr: {path} is a file, not a Zarr array folder")
        try:
            pin = pin_current(path)
            break
        except FileNotFoundError:
            if late:
                raise FileNotFoundError(f"from_zarr: no Zarr array at {path}") from None
    node = zarr_node(pin.root)
    if node is None or node == "group":
        pin.release()
        if node == "group":
            raise ValueError(f"from_zarr: cannot open {path} as a Zarr array: it holds a Zarr group")
        raise ValueError(f"from_zarr: {path} is not a Zarr array (no zarr.json or .zarray inside)")
    try:
        array = zarr.open_array(pin.root, mode=mode)
    except Exception as e:  # zarr raises several types for malformed metadata
        pin.release()
        raise ValueError(f"from_zarr: cannot open {path} as a Zarr array: {e}") from e
    return Store(path, array, owned=False, writable=(mode == "r+"), pin=pin)
