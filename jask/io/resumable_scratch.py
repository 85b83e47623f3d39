"""Scratch stores a later process can find again: ``persist(..., resume=True)``.

A normal scratch store lives in its process's own folder under a random name,
so a new process cannot find it. A resumable one is named by the caller's key
(a hash of the computation, ``jask.api.resume_key``) and lives in
``<scratch root>/resume/<key>``, written like any store (a hidden ``-tmp-``
sibling, journaled by :mod:`jask.io.resume`, renamed in when complete). The
folder carries the file :data:`OWNER` with its process's pid, so:

- killed while writing, its ``-tmp-`` sibling is claimed by the next write of
  the same key (only the chunks not journaled are computed);
- killed after the commit (during what came next), the complete folder is
  taken over whole by the next process asking for the key (:func:`take`);
- otherwise it is deleted when its arrays are freed, as scratch is.

What killed processes left here is kept for :data:`KEEP_SECONDS` by the
automatic sweep of dead scratch folders, and removed by ``cleanup_scratch()``
(:func:`sweep`).
"""
from __future__ import annotations

import os
import time

from jask.io.owners import owner_gone
from jask.io.pins import remove_tree
from jask.io.recovery import sweep as sweep_siblings

FOLDER = "resume"
OWNER = ".jask-owner"
KEEP_SECONDS = 7 * 24 * 3600.0   # a killed resumable persist is kept this long by automatic sweeps


def path_for(root: str, key: str) -> str:
    """Where the store of ``key`` lives under the local scratch root ``root``."""
    return os.path.join(os.path.abspath(root), FOLDER, key)


def mark_owner(folder: str) -> None:
    """Note this process as the owner of ``folder`` (the hidden folder about to be committed)."""
    with open(os.path.join(folder, OWNER), "w") as f:
        f.write(str(os.getpid()))


def owner_of(folder: str) -> int | None:
    """The pid recorded in a committed folder (None when unreadable)."""
    try:
        with open(os.path.join(folder, OWNER)) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _gone(folder: str) -> bool:
    pid = owner_of(folder)
    return pid is None or owner_gone(pid, folder)


def in_use(path: str) -> bool:
    """Whether a live process holds the complete store at ``path`` (this one included)."""
    pid = owner_of(path)
    return os.path.isdir(path) and pid is not None and (pid == os.getpid() or not owner_gone(pid, path))


def take(path: str, new_path: str) -> bool:
    """Move the complete store a killed process left at ``path`` to ``new_path`` (this process's
    scratch); returns whether it did. The rename lets only one process take it."""
    if not os.path.isfile(os.path.join(path, "zarr.json")) or not _gone(path):
        return False
    try:
        os.rename(path, new_path)
    except OSError:
        return False
    mark_owner(new_path)
    return True


def sweep(root: str, keep: bool = True) -> list[str]:
    """Remove what ended processes left under ``<root>/resume``; returns the paths removed.

    With ``keep`` (the automatic sweep), what a resumed persist could use is kept
    until :data:`KEEP_SECONDS` after it last changed.
    """
    folder = os.path.join(os.path.abspath(root), FOLDER)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    removed, now = [], time.time()
    for name in names:
        path = os.path.join(folder, name)
        if name.startswith("."):
            continue                         # -tmp- siblings: swept with their key below
        try:
            young = now - os.lstat(path).st_mtime < KEEP_SECONDS
        except OSError:
            continue
        removed += sweep_siblings(path, keep_resumable=keep and young)
        if _gone(path) and not (keep and young):
            remove_tree(path)
            removed.append(path)
    for name in names:                       # siblings whose key was never committed
        if name.startswith(".") and ".jask-" in name:
            key = name[1:].split(".jask-", 1)[0]
            if key not in names:
                young = now - _mtime(os.path.join(folder, name)) < KEEP_SECONDS
                removed += sweep_siblings(os.path.join(folder, key), keep_resumable=keep and young)
    if not keep:
        try:
            os.rmdir(folder)                 # only when empty
        except OSError:
            pass
    return sorted(set(removed))


def _mtime(path: str) -> float:
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return 0.0
