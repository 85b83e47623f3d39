"""Fault injection at named points of the storage seam, for crash and I/O-error tests.

The seam (:mod:`jask.io.store`) calls ``faults.fire(point, path=...)`` at each
point below, guarded by ``if faults.hook is not None``, so an unarmed process
pays one attribute lookup per point and nothing else.

Points, in the order one store write passes them (``path`` is the store's
final path; the tile points also get ``region``):

``after_create``
    the hidden ``-tmp-`` folder exists with its metadata, no chunk yet.
``before_tile_write`` / ``after_tile_write``
    around each tile written into a pending store (write-behind thread).
``before_fsync``
    durability ``"power"`` only (:mod:`jask.io.durable`): before each fsync,
    ``target`` naming the file or folder: every file of the new folder, then
    its folders deepest first (before ``before_commit``), and the parent folder
    once the new array is in place (after ``after_swap``/``after_retire``).
``before_commit``
    every chunk is on disk (the writer has finished); nothing renamed yet.
``after_new_ready``, ``after_old_aside``
    replacing without ``RENAME_EXCHANGE`` only: new folder renamed to its
    ``-new-`` sibling, then the old one to its ``-old-`` sibling (the path is
    missing in between).
``after_swap``
    the final path holds the new array (rename, or atomic exchange).
``after_retire``
    replacing: the old array moved to its ``-old-`` sibling.
``after_commit``
    done; the old folder is removed, or left to readers still holding it.
``after_group_log``
    ``update_all`` only (:mod:`jask.io.groups`): every new array complete and
    marked, the group's logs written; no target swapped yet.
``before_tile_read``
    a reader is about to read one region of a store (``path``, ``region``);
    a hook that sleeps here makes a slow disk (lifetime tests).

A crash before ``after_swap`` leaves the old value (with two renames: before
``after_old_aside``, from where recovery finishes the swap), from it on the new
one. An error raised before ``after_swap`` aborts the write; raised from it on,
it reaches the caller although the new array is already in place.

Arm it in-process by setting :data:`hook` to a callable ``(point, info)``
(see :class:`Trigger`, :class:`Recorder`, :func:`armed`), or in a child process
through the environment, read at import::

    JASK_FAULT=after_tile_write:7          # SIGKILL self at the 7th tile written
    JASK_FAULT=*:12                        # ... at the 12th point of any kind
    JASK_FAULT=before_tile_write:3:ENOSPC  # raise OSError(ENOSPC) there instead

Several specs may be given separated by commas. Actions: ``kill`` (the
default: ``os.kill(os.getpid(), SIGKILL)``, no cleanup of any kind runs),
``ENOSPC``, ``EIO`` (or any ``errno`` name: raise ``OSError`` with it).
"""
from __future__ import annotations

import contextlib
import errno
import os
import signal
import threading

POINTS = ("after_create", "before_tile_write", "after_tile_write", "before_fsync", "before_commit", "after_new_ready",
          "after_old_aside", "after_swap", "after_retire", "after_commit", "before_tile_read", "after_group_log")

hook = None  # None (unarmed), or a callable (point: str, info: dict)


def fire(point: str, **info) -> None:
    """Call the hook, if armed, at ``point`` (the seam checks ``hook is not None`` first)."""
    h = hook
    if h is not None:
        h(point, info)


class Trigger:
    """A hook that acts at the ``n``-th (1-based) firing of ``point`` (``"*"``: any point).

    ``action`` is ``"kill"`` (SIGKILL this process) or an ``errno`` name such as
    ``"ENOSPC"`` or ``"EIO"`` (raise that ``OSError``). ``seen`` counts firings.
    """

    def __init__(self, point: str, n: int, action: str = "kill"):
        if point != "*" and point not in POINTS:
            raise ValueError(f"unknown fault point {point!r}; known: {', '.join(POINTS)} or '*'")
        if int(n) < 1:
            raise ValueError(f"fault count must be at least 1, got {n!r}")
        if action != "kill" and not isinstance(getattr(errno, action, None), int):
            raise ValueError(f"unknown fault action {action!r}; use 'kill' or an errno name like 'ENOSPC'")
        self.point, self.n, self.action = point, int(n), action
        self.seen = 0
        self._lock = threading.Lock()

    def __call__(self, point: str, info: dict) -> None:
        if self.point != "*" and point != self.point:
            return
        with self._lock:
            self.seen += 1
            hit = self.seen == self.n
        if not hit:
            return
        if self.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        code = getattr(errno, self.action)
        raise OSError(code, f"{os.strerror(code)} (injected at {point})", info.get("path"))


class Recorder:
    """A hook that records ``(point, path)`` of every firing, in order (thread-safe)."""

    def __init__(self):
        self.points: list[tuple[str, str | None]] = []
        self._lock = threading.Lock()

    def __call__(self, point: str, info: dict) -> None:
        with self._lock:
            self.points.append((point, info.get("path")))


class _Several:
    def __init__(self, hooks):
        self.hooks = hooks

    def __call__(self, point, info):
        for h in self.hooks:
            h(point, info)


def parse(spec: str):
    """The hook a ``JASK_FAULT`` spec (``POINT:N[:ACTION][,...]``) describes."""
    triggers = []
    for part in spec.split(","):
        fields = part.strip().split(":")
        if len(fields) not in (2, 3) or not fields[1].strip().isdigit():
            raise ValueError(f"bad fault spec {part!r}; expected POINT:N or POINT:N:ACTION, "
                             "e.g. after_tile_write:7 or before_tile_write:3:ENOSPC")
        triggers.append(Trigger(fields[0].strip(), int(fields[1]), fields[2].strip() if len(fields) == 3 else "kill"))
    return triggers[0] if len(triggers) == 1 else _Several(triggers)


def arm(spec_or_hook) -> object:
    """Arm a hook (a callable, or a ``JASK_FAULT`` spec string); returns it."""
    global hook
    hook = parse(spec_or_hook) if isinstance(spec_or_hook, str) else spec_or_hook
    return hook


def disarm() -> None:
    global hook
    hook = None


@contextlib.contextmanager
def armed(spec_or_hook):
    """Arm a hook for the ``with`` block, restoring the previous one afterwards."""
    global hook
    saved = hook
    try:
        yield arm(spec_or_hook)
    finally:
        hook = saved


if os.environ.get("JASK_FAULT"):
    arm(os.environ["JASK_FAULT"])
