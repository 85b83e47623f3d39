"""Pins: how a reader keeps the version of a store it opened while another process replaces the path.

A :class:`Pin` is a directory file descriptor holding a shared ``flock`` on an
array folder; a replaced (``-old-``) folder is deleted only by whoever gets the
exclusive lock on it (:func:`drop_retired`, or the last pin let go).
"""
from __future__ import annotations

import fcntl
import os
import shutil
import weakref


def remove_tree(path: str) -> None:
    """Remove a leftover folder, or file (a group's unrenamed log); what is already gone is fine."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    try:
        os.unlink(path)
    except OSError:
        pass


class Pin:
    """A directory file descriptor on one array folder, holding a shared ``flock`` on it.

    Reads go through the descriptor (``openat`` on ``fd`` for direct chunk
    reads, ``root`` = ``/proc/self/fd/N`` for zarr), which follows the folder
    through renames, so a reader keeps the version it opened while another
    process swaps the path. The lock keeps any jask process from deleting the
    folder meanwhile. Released when garbage collected: the last holder of a
    retired (``-old-``) folder deletes it.
    """

    def __init__(self, path: str):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        proc = f"/proc/self/fd/{fd}"
        self.root = proc if os.path.isdir(proc) else os.path.abspath(path)
        self.inode = _inode(os.fstat(fd))
        self._finalizer = weakref.finalize(self, _release_pin, fd, os.getpid())

    def release(self) -> None:
        self._finalizer()

    def deleted(self) -> bool:
        """Whether the pinned folder was removed (it may be renamed: that is fine)."""
        return os.fstat(self.fd).st_nlink == 0


def folder_deleted(pin: "Pin | None", path: str) -> bool:
    """Whether the folder a store reads was deleted: through its pin if it has one (a pinned
    folder may be renamed meanwhile), else by its path."""
    return pin.deleted() if pin is not None else not os.path.isdir(path)


METADATA_FILES = ("zarr.json", ".zarray")   # an array folder holds one of them (Zarr v3, v2)


def folder_emptied(pin: "Pin | None", path: str) -> bool:
    """:func:`folder_deleted`, or the folder has lost its Zarr metadata file.

    Asked where a chunk file is missing, before calling the store damaged or sparse: some
    filesystems keep a removed folder's link count above zero (gVisor, the TPU machine's
    sandbox, 2026-12-06), so a store deleted under a pin would read as missing chunks, or as
    fill values where missing chunks are allowed. A removed folder has lost its entries too.
    """
    if folder_deleted(pin, path):
        return True
    for name in METADATA_FILES:
        try:
            os.stat(name, dir_fd=pin.fd) if pin is not None else os.stat(os.path.join(path, name))
            return False
        except OSError:
            continue
    return True


def _inode(st) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _release_pin(fd: int, owner: int) -> None:
    """Drop a pin; if it was the last on a retired folder, delete the folder.

    In a forked child the descriptor (and its lock) is the parent's too, so it is only closed.
    """
    try:
        if os.getpid() != owner:
            return
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        here = os.readlink(f"/proc/self/fd/{fd}")
        if is_retired(here):
            remove_tree(here)
    except OSError:
        pass   # others still read it, or no /proc: the next recover() of its path sweeps it
    finally:
        os.close(fd)


def is_retired(path: str) -> bool:
    return os.path.basename(path).startswith(".") and ".jask-old-" in os.path.basename(path)


def pin_current(path: str) -> Pin:
    """Pin the folder now at ``path`` (retrying if a swap lands between the open and the lock)."""
    for _ in range(100):
        pin = Pin(path)
        try:
            if _inode(os.stat(path)) == pin.inode:
                return pin
        except FileNotFoundError:
            pass
        pin.release()
    raise OSError(f"{path} is being replaced faster than it can be opened")


def held(path: str) -> bool | None:
    """Whether some open file holds a lock on the folder ``path`` (a pin, or a writer between the two
    renames of its swap); None where it cannot be told (no such folder, or no ``flock`` there)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)


def drop_retired(path: str) -> bool:
    """Delete a replaced folder unless some process still reads it (holds its lock); returns whether deleted."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    try:
        remove_tree(path)
    finally:
        os.close(fd)
    return True
