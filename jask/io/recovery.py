"""Recovery: finishing or undoing a replacement of a path that a crash interrupted, and sweeping leftovers.

A replacement leaves hidden siblings ``.NAME.jask-KIND-PID-TOKEN`` (``tmp``,
``new``, ``old``) while it runs; :func:`recover` reads them after a crash.
"""
from __future__ import annotations

import glob
import os
import time

from jask.io.pins import drop_retired, is_retired, remove_tree
from jask.io.scratch import pid_alive


SWAP_WAIT_SECONDS = 10.0   # how long open_existing waits for another process's two-rename swap


def _owner_alive(sibling: str) -> bool:
    """Whether the process named in a ``.NAME.jask-KIND-PID-TOKEN`` sibling is another live process."""
    pid = sibling.rsplit("-", 2)[-2]
    return pid.isdigit() and int(pid) != os.getpid() and pid_alive(int(pid))


def _siblings(path: str, kind: str = "") -> list[str]:
    head, name = os.path.split(path)
    return sorted(glob.glob(os.path.join(head, f".{glob.escape(name)}.jask-{kind}*")))


def recover(path: str) -> None:
    """Finish or undo a replacement of ``path`` that a crash interrupted, and sweep leftovers.

    Only a dead process's swap (or this process's own) is finished: a live
    process may be between its two renames. If ``path`` is missing, a ``-new-``
    sibling (only ever a complete array) wins, otherwise an ``-old-`` one is put
    back. Then :func:`sweep` removes what is left over.
    """
    path = os.path.abspath(path)
    if not os.path.exists(path):
        for kind in ("new", "old"):
            found = [f for f in _siblings(path, kind + "-") if not _owner_alive(f)]
            if found:
                try:
                    os.rename(found[-1], path)
                except OSError:
                    pass    # another process recovered it first
                break
    sweep(path)


def sweep(path: str) -> None:
    """Remove ``-tmp-``/``-new-`` siblings of dead processes and ``-old-`` ones nobody reads.

    An ``-old-`` sibling is a replaced array: it goes once no process holds a
    pin on it (whatever process replaced it), and only while ``path`` exists.
    """
    exists = os.path.exists(path)
    for leftover in _siblings(path):
        if is_retired(leftover):
            if exists:
                drop_retired(leftover)
            continue
        pid = leftover.rsplit("-", 2)[-2]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            remove_tree(leftover)


def _swap_in_progress(path: str) -> bool:
    return any(_owner_alive(f) for kind in ("new-", "old-") for f in _siblings(path, kind))


def settle(path: str) -> None:
    """Recover ``path``; while it is missing because a live process is mid-swap, wait for that swap."""
    deadline = time.monotonic() + SWAP_WAIT_SECONDS
    recover(path)
    while not os.path.exists(path) and _swap_in_progress(path) and time.monotonic() < deadline:
        time.sleep(0.005)
        recover(path)
