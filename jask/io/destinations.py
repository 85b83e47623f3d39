"""Checks on a path an array is about to be written to, made before any tile is computed.

``to_zarr(..., overwrite=True)`` replaces only a Zarr array: a file, or a folder
holding something else, at the path is refused (with or without ``overwrite``;
an empty folder is written into), as is a path whose folder
cannot be made or written. Each error names the path and what to do.
"""
from __future__ import annotations

import json
import os

from jask.io.recovery import recover


def zarr_node(path: str) -> str | None:
    """What Zarr metadata the folder ``path`` holds: ``"array"``, ``"group"``, ``"unknown"`` (a
    ``zarr.json`` that cannot be read or names neither), or None (no Zarr metadata)."""
    if os.path.isfile(os.path.join(path, ".zarray")):
        return "array"
    try:
        with open(os.path.join(path, "zarr.json"), "rb") as f:
            meta = json.load(f)
    except FileNotFoundError:
        return "group" if os.path.isfile(os.path.join(path, ".zgroup")) else None
    except (OSError, ValueError):
        return "unknown"
    node = meta.get("node_type") if isinstance(meta, dict) else None
    return node if node in ("array", "group") else "unknown"


def is_empty_folder(path: str) -> bool:
    """Whether ``path`` is a folder with nothing in it (not a link): an array may be written there."""
    try:
        return not os.path.islink(path) and os.path.isdir(path) and not os.listdir(path)
    except OSError:
        return False


def is_zarr_array(path: str) -> bool:
    """Whether the folder ``path`` holds a Zarr array (v3 ``zarr.json`` of an array, or v2 ``.zarray``)."""
    return zarr_node(path) == "array"


def check_destination(path: str, overwrite: bool, call: str = "to_zarr") -> None:
    """Refuse ``path`` as a place to write an array, with an error naming why, or return.

    Raises ``FileExistsError`` (something other than a Zarr array is there, or
    an array without ``overwrite``), ``NotADirectoryError`` (a parent is a
    file) or ``PermissionError`` (the folder it goes in is not writable).
    """
    recover(path)          # a killed process's half-done replacement is finished first: see what is there
    if os.path.lexists(path) and not is_empty_folder(path):
        if not os.path.isdir(path):
            raise FileExistsError(f"{call}: {path} is a file, not a Zarr array; jask writes to a new path, an "
                                  "empty folder or (overwrite=True) over a Zarr array: remove it first or "
                                  "choose another path")
        node = zarr_node(path)
        if node == "group":
            raise FileExistsError(f"{call}: {path} is a Zarr group, not an array; overwrite=True replaces only "
                                  "Zarr arrays: choose another path")
        if node != "array":
            raise FileExistsError(f"{call}: {path} is a folder that holds no Zarr array (no zarr.json "
                                  "of an array, or .zarray); overwrite=True replaces only Zarr arrays: choose another path")
        if not overwrite:
            raise FileExistsError(f"{call}: {path} already exists; pass overwrite=True to replace it")
    parent = os.path.dirname(path)
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise NotADirectoryError(f"{call}: cannot write {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"{call}: cannot write {path}: the folder {parent} is not writable")
