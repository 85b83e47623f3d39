"""Recovery: finishing or undoing a replacement of a path that a crash interrupted, and sweeping leftovers.

A replacement leaves hidden siblings ``.NAME.jask-KIND-PID-TOKEN`` (``tmp``,
``new``, ``old``) while it runs; :func:`recover` reads them after a crash.
"""
from __future__ import annotations

import os
import time

from jask.io.pins import drop_retired, held, is_retired, remove_tree
from jask.io.owners import owner_gone, sibling_owner as _owner, siblings as _siblings
from jask.io.groups import roll_forward
from jask.io.resume import resumable


SWAP_WAIT_SECONDS = 10.0   # how long open_existing waits for another process's two-rename swap


def _owner_alive(sibling: str) -> bool:
    """Whether the process named in a sibling is another live process (not a newer one with its pid)."""
    pid = _owner(sibling)
    return pid is not None and pid != os.getpid() and not owner_gone(pid, sibling)


def _mid_swap(new: str) -> bool:
    """Whether a writer is between the two renames of a swap with this ``-new-`` sibling: it holds a lock
    on the folder meanwhile (:meth:`jask.io.store.PendingStore._swap`), which dies with it, so a pid
    since given to another process does not count. Where locks cannot tell, the pid decides."""
    locked = held(new)
    return _owner_alive(new) if locked is None else locked


def recover(path: str, keep_resumable: bool = True) -> list[str]:
    """Finish or undo a replacement of ``path`` that a crash interrupted, and sweep leftovers.

    Only a dead process's swap (or this process's own) is finished: a live
    process may be between its two renames. If ``path`` is missing, a ``-new-``
    sibling (only ever a complete array) wins, otherwise an ``-old-`` one is put
    back. Then :func:`sweep` removes what is left over; returns what it removed.
    ``keep_resumable=False`` also removes what a ``resume=True`` write could continue.
    """
    path = os.path.abspath(path)
    roll_forward(path)          # a dead process's group commit (jask.io.groups): all its swaps, first
    if not os.path.exists(path) and not swap_in_progress(path):
        for kind in ("new", "old"):
            found = [f for f in _siblings(path, kind) if kind == "new" or not _owner_alive(f)]
            if found:
                try:
                    os.rename(found[-1], path)
                except OSError:
                    pass    # another process recovered it first
                break
    return sweep(path, keep_resumable)


def sweep(path: str, keep_resumable: bool = True) -> list[str]:
    """Remove ``-tmp-``/``-new-`` siblings of ended processes and ``-old-`` ones nobody reads; returns them.

    An ``-old-`` sibling is a replaced array: it goes once no process holds a
    pin on it (whatever process replaced it), and only while ``path`` exists.
    This process's own siblings stay (another thread may be writing them);
    ones with its pid that an earlier process made go (:func:`jask.io.owners.owner_gone`).
    A leftover may be a file: a group's log its killed writer never renamed. With ``keep_resumable``
    a ``-tmp-`` folder a ``resume=True`` write can continue stays (:mod:`jask.io.resume`).
    """
    exists = os.path.exists(path)
    removed = []
    for leftover in _siblings(path):
        if is_retired(leftover):
            if exists and drop_retired(leftover):
                removed.append(leftover)
            continue
        pid = _owner(leftover)
        if ".jask-group-" in os.path.basename(leftover):
            continue                         # a live group commit's log (dead ones: roll_forward)
        if pid is not None and owner_gone(pid, leftover) and not (keep_resumable and resumable(leftover)) \
                and not held(leftover):            # locked: a writer mid-swap, whatever its pid says
            remove_tree(leftover)
            removed.append(leftover)
    return removed


def swap_in_progress(path: str) -> bool:
    """Whether a writer (another process, or another thread here) is between the two renames of a swap
    of ``path``: while the path is missing, its ``-new-`` sibling is there, locked."""
    return any(_mid_swap(f) for f in _siblings(path, "new"))


def settle(path: str, deadline: float | None = None) -> None:
    """Recover ``path``; while it is missing because a live process is mid-swap, wait for that swap.

    Waits until ``deadline`` (a :func:`time.monotonic` time; by default
    :data:`SWAP_WAIT_SECONDS` from now), then returns whether or not the path is back.
    """
    if deadline is None:
        deadline = time.monotonic() + SWAP_WAIT_SECONDS
    recover(path)
    while not os.path.exists(path) and swap_in_progress(path) and time.monotonic() < deadline:
        time.sleep(0.005)
        recover(path)
