"""Checks on a path an array is about to be written to, made before any tile is computed.

``to_zarr(..., overwrite=True)`` replaces only a Zarr array: a file, or a folder
holding something else, at the path is refused, as is a path whose folder
cannot be made or written. Each error names the path and what to do.
"""
from __future__ import annotations

import os

from jask.io.recovery import recover


def is_zarr_array(path: str) -> bool:
    """Whether the folder ``path`` holds Zarr array metadata (v3 ``zarr.json`` or v2 ``.zarray``)."""
    return os.path.isfile(os.path.join(path, "zarr.json")) or os.path.isfile(os.path.join(path, ".zarray"))


def check_destination(path: str, overwrite: bool, call: str = "to_zarr") -> None:
    """Refuse ``path`` as a place to write an array, with an error naming why, or return.

    Raises ``FileExistsError`` (something other than a Zarr array is there, or
    an array without ``overwrite``), ``NotADirectoryError`` (a parent is a
    file) or ``PermissionError`` (the folder it goes in is not writable).
    """
    recover(path)          # a killed process's half-done replacement is finished first: see what is there
    if os.path.lexists(path):
        if not overwrite:
            raise FileExistsError(f"{call}: {path} already exists; pass overwrite=True to replace it")
        if not os.path.isdir(path):
            raise FileExistsError(f"{call}: {path} is a file, not a Zarr array; overwrite=True replaces only "
                                  "Zarr arrays: remove it first or choose another path")
        if not is_zarr_array(path):
            raise FileExistsError(f"{call}: {path} is a folder that holds no Zarr array (no zarr.json or "
                                  ".zarray); overwrite=True replaces only Zarr arrays: choose another path")
    parent = os.path.dirname(path)
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise NotADirectoryError(f"{call}: cannot write {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"{call}: cannot write {path}: the folder {parent} is not writable")
