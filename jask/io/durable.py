"""How hard a commit works to outlive a crash: the ``durability`` setting and the fsyncs it asks for.

``"process"`` (the default): a committed array survives the writing process
being killed at any point (the commit is one rename; the kernel's page cache
holds the data until it writes it back). A power cut or kernel crash soon
after a commit may still lose the array or leave it partly written.

``"power"``: a committed user store also survives a power cut. Before the
commit rename, every file of the new folder is fsynced, then every folder in
it, deepest first (a folder after its entries); after the rename, the parent
folder, so the rename itself is on disk. Scratch stores (any store in the
scratch dir, whoever commits it: :class:`jask.io.store.PendingStore`) never
need it (they die with their process) and are not synced. To keep the fsyncs short, the raw
chunk and shard writers start each file's writeback as soon as it is written
(:func:`start_writeback`), so the disk works while later tiles compute.

Each fsync fires the fault point ``before_fsync`` (``target``: the file or
folder), so tests can record the order and fail at each step.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import os

from jask.io import faults, settings

MODES = ("process", "power")
SYNC_THREADS = 8   # files fsynced at once before a commit (512 MiB to_zarr: ~20% faster than one by one)


def mode() -> str:
    """The current ``durability`` setting (``jask.config``'s, handed in through :func:`jask.io.settings.use_settings`)."""
    return settings.setting("durability", "process")


def check_mode(value) -> str:
    """``value`` if it is a known durability mode, else a ValueError naming the choices."""
    if value not in MODES:
        raise ValueError(f"unknown durability {value!r}; choose 'process' (survive a killed process) "
                         "or 'power' (also a power cut: fsync before and after each commit)")
    return value


_SYNC_FILE_RANGE_WRITE = 2
_sync_file_range = None


def start_writeback(fd: int) -> None:
    """Ask the kernel to start writing ``fd``'s dirty pages now, without waiting (Linux ``sync_file_range``).

    A writer calls it as each chunk file is complete, so the disk writes while
    the next tiles compute and the fsyncs at commit find little left to do.
    A no-op where the call is missing.
    """
    global _sync_file_range
    if _sync_file_range is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).sync_file_range
            fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
            _sync_file_range = fn
        except (OSError, AttributeError):
            _sync_file_range = False
    if _sync_file_range:
        _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


def _fsync(path: str, final_path: str, directory: bool) -> None:
    if faults.hook is not None:
        faults.fire("before_fsync", path=final_path, target=path)
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(root: str, final_path: str) -> int:
    """Fsync every file under ``root`` (several at once), then every folder, deepest first, ``root`` last.

    Returns how many were synced. ``final_path`` names the array in fault
    points. An ``OSError`` propagates: the commit then aborts and the old value stays.
    """
    folders, files = [], []
    for folder, _, names in os.walk(root):
        folders.append(folder)
        files += [os.path.join(folder, name) for name in sorted(names)]
    with concurrent.futures.ThreadPoolExecutor(SYNC_THREADS) as pool:   # the disk queues them together
        for _ in pool.map(lambda f: _fsync(f, final_path, directory=False), files):
            pass
    for folder in sorted(folders, key=lambda f: f.count(os.sep), reverse=True):
        _fsync(folder, final_path, directory=True)
    return len(files) + len(folders)


def sync_file(path: str, final_path: str) -> None:
    """Fsync one written file (a group's log), through the same fault point as a store's files."""
    _fsync(path, final_path, directory=False)


def sync_parent(final_path: str) -> None:
    """Fsync the folder holding ``final_path``, so a rename onto it is on disk."""
    _fsync(os.path.dirname(final_path), final_path, directory=True)
