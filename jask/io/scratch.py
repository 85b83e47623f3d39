"""Scratch space for op outputs and gradients.

Each process gets its own folder ``<scratch_dir>/jask-<pid>-<token>``. Stores in
it are deleted when the arrays that own them are garbage collected, and the
folder itself at interpreter exit. Folders whose owner pid is dead (a killed
process) are removed the next time any process uses the same scratch dir.
"""
from __future__ import annotations

import atexit
import itertools
import os
import secrets
import shutil
import tempfile

_RAM_FILESYSTEMS = {"tmpfs", "ramfs"}
_counter = itertools.count()
_process_dir: str | None = None


def filesystem_type(path: str) -> str:
    """Filesystem type of the mount holding ``path`` (from /proc/mounts; '' if unknown)."""
    path = os.path.realpath(path)
    best, fstype = "", ""
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mount = parts[1].replace("\\040", " ")
                inside = path == mount or path.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, fstype = mount, parts[2]
    except OSError:
        return ""
    return fstype


def check_scratch_dir(path: str, allow_tmpfs: bool) -> None:
    """Refuse a scratch dir on a RAM-backed filesystem unless explicitly allowed."""
    probe = path
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    fstype = filesystem_type(probe or path)
    if fstype in _RAM_FILESYSTEMS and not allow_tmpfs:
        raise ValueError(
            f"scratch dir {path!r} is on {fstype}, which lives in RAM and would defeat "
            "the memory budget; pass allow_tmpfs=True to use it anyway")


def _default_root() -> str:
    from jask.config import config
    if config.scratch_dir:
        return config.scratch_dir
    return os.path.join(tempfile.gettempdir(), "jask-scratch")


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (owner checks for scratch and half-done swaps)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(root: str) -> list[str]:
    """Delete process folders under ``root`` whose owner pid is no longer alive."""
    removed = []
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return removed
    for name in names:
        parts = name.split("-")
        if len(parts) == 3 and parts[0] == "jask" and parts[1].isdigit():
            pid = int(parts[1])
            if pid != os.getpid() and not pid_alive(pid):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
                removed.append(name)
    return removed


def process_dir() -> str:
    """This process's scratch folder, created (and stale folders swept) on first use."""
    global _process_dir
    from jask.config import config
    root = _default_root()
    if _process_dir is None or os.path.dirname(_process_dir) != os.path.abspath(root):
        check_scratch_dir(root, config.allow_tmpfs)
        os.makedirs(root, exist_ok=True)
        remove_stale(root)
        _process_dir = os.path.join(os.path.abspath(root), f"jask-{os.getpid()}-{secrets.token_hex(4)}")
        os.makedirs(_process_dir)
        atexit.register(shutil.rmtree, _process_dir, True)
    return _process_dir


def new_path(tag: str = "array") -> str:
    """A fresh, not yet existing store path in this process's scratch folder."""
    return os.path.join(process_dir(), f"{tag}-{next(_counter)}.zarr")


def cleanup_scratch(root: str | None = None) -> list[str]:
    """Remove scratch folders left behind by dead processes; returns their names."""
    return remove_stale(root or _default_root())
