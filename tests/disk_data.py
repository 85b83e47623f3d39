"""Test helpers: small NumPy arrays stored as jask arrays, and the tiles a run reads from one of them."""
import os

import jask
from jask.io import faults


def store_arrays(root, arrays: dict, tile: int) -> dict:
    """Each array written to ``root/<name>.zarr`` in chunks of ``tile`` (the tile edge forced to it);
    returns the stored DiskArrays by name."""
    for name, a in arrays.items():
        chunks = tuple(min(tile, d) for d in a.shape)
        jask.to_zarr(jask.from_numpy(a), os.path.join(root, f"{name}.zarr"), chunks=chunks)
    jask.config.update("tile", tile)
    return {name: jask.from_zarr(os.path.join(root, f"{name}.zarr")) for name in arrays}


def tile_reads(fn, path):
    """``(fn(), tiles read from the store at path while it ran)``, counted at the reader."""
    recorder = faults.Recorder()
    with faults.armed(recorder):
        out = fn()
    return out, sum(1 for point, p in recorder.points
                    if point == "before_tile_read" and os.path.realpath(p or "") == os.path.realpath(path))
