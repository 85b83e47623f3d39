"""Committing several arrays as one (``jask.update_all``): after a kill, all old or all new.

Each commit alone is atomic (:mod:`jask.io.store`); a set of them is made
atomic by rolling forward. Once every new array is complete, :func:`commit_group`
writes a token into each new folder (file :data:`MARK`) and then a log beside
every target, ``.NAME.jask-group-PID-TOKEN``, listing all the targets. Only
then are the folders swapped in, one by one; the marks and logs go last.
Should the process die in between, :func:`roll_forward` (run by every
``recover`` of any of the paths, so by ``from_zarr``, writes and scratch sweeps)
finds the log of the ended process and swaps in each new folder still waiting,
found by its mark. The writer holds a ``flock`` on each log until the logs
are gone, so "ended" is the lock being free, not a guess from the pid. The
commit point is the last log written: a group one of whose logs is missing
or cut short was killed while writing them (no swap yet), so its logs are
removed instead (otherwise a target without a log, opened first, would have
its new folder swept as a leftover, and a target with one, opened later, be
rolled forward: a mix). Before that point the new folders are ordinary
leftovers, swept as such, and every target keeps its old value. After it,
a swap that fails (the writer alive) keeps the new folders and frees the
logs, so the next open of any target finishes the group.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os

from jask.io import durable, faults
from jask.io.owners import new_token, owner_gone, sibling, sibling_owner, siblings as _siblings
from jask.io.resume import JOURNAL

MARK = ".jask-group"


def _log_name(final: str, token: str) -> str:
    head, name = os.path.split(final)
    return os.path.join(head, f".{name}.jask-group-{token}")


def _writing_name(final: str, token: str) -> str:
    """Where a log is written and locked before it is renamed to :func:`_log_name`."""
    head, name = os.path.split(final)
    return os.path.join(head, f".{name}.jask-glog-{token}")


def _mark_of(folder: str) -> str | None:
    try:
        with open(os.path.join(folder, MARK)) as f:
            return f.read().strip()
    except OSError:
        return None


def _unmark(folder: str) -> None:
    try:
        os.unlink(os.path.join(folder, MARK))
    except OSError:
        pass


def _write_logs(finals, token: str, power: bool) -> list[int]:
    """One log per target naming the whole group, each locked (``flock``) by this process; returns the locks.

    A log appears under its name already locked: it is written under a
    ``-glog-`` name, locked, then renamed, and the lock lives as long as this
    process holds it or lives. So a recoverer that can take a log's lock knows
    its writer has ended, whatever the pid in its name now names (a pid reused
    by a new process kept a dead writer's group half swapped). With ``power``
    each log and its folder are fsynced.
    """
    text = json.dumps({"token": token, "targets": finals}).encode()
    held = []
    try:
        for final in finals:
            fd = os.open(_writing_name(final, token), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            held.append(fd)
            _lock(fd, blocking=True)
            os.write(fd, text)
            os.rename(_writing_name(final, token), _log_name(final, token))
            if power:
                durable.sync_file(_log_name(final, token), final)
        for final in {os.path.dirname(f): f for f in finals}.values() if power else ():
            durable.sync_parent(final)   # each folder holding logs, once
    except BaseException:
        _release(held)
        raise
    return held


def _lock(fd: int, blocking: bool) -> bool | None:
    """Take ``fd``'s exclusive lock: True if taken, False if another open file holds it, None where the
    filesystem has no locks (then the pid in the log's name decides, :func:`roll_forward`)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
        return None
    return True


def _release(fds) -> None:
    for fd in fds:
        os.close(fd)


def commit_group(pendings, commit_one, power: bool = False) -> list:
    """Commit every pending store with ``commit_one`` so that a kill leaves all old or all new.

    With ``power`` (durability "power") every new folder, mark included, and
    every log is fsynced before the first swap, so a power cut cannot leave a
    log pointing at a folder not wholly on disk.
    """
    token = f"{os.getpid()}-{new_token()}"
    finals = [p.final_path for p in pendings]
    try:
        for p in pendings:
            with open(os.path.join(p.tmp_path, MARK), "w") as f:
                f.write(token)
            p.complete(power)                  # last chunks and shard indexes written (and synced)
    except BaseException:
        for p in pendings:
            p.abort()
        raise
    try:
        held = _write_logs(finals, token, power)
    except BaseException:   # no swap yet: the group is withdrawn, so no later recovery rolls it forward
        for final in finals:
            for log in (_log_name(final, token), _writing_name(final, token)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(log)
        for p in pendings:
            p.abort()
        raise
    for p in pendings:      # the commit point is passed: a failed swap leaves its new folder to recovery
        p.keep()
    try:
        if faults.hook is not None:
            faults.fire("after_group_log", path=finals[0])
        stores = [commit_one(p) for p in pendings]
        for final in finals:
            _unmark(final)
        for final in finals:
            os.unlink(_log_name(final, token))
    finally:
        _release(held)        # on an error mid-swap too: the next open of a target then finishes the group
    return stores


def roll_forward(path: str) -> list[str]:
    """Finish the group commits an ended process left half done on ``path``; returns the logs handled.

    (A ``-glog-`` file a killed writer never renamed is a plain leftover: no swap happened, and the
    sweep removes it with the rest, :func:`jask.io.recovery.sweep`.)"""
    handled = []
    for log in _siblings(path, "group"):
        pid = sibling_owner(log)
        if pid is None:
            continue
        try:
            fd = os.open(log, os.O_RDONLY)
        except OSError:
            continue
        try:
            locked = _lock(fd, blocking=False)   # held by its live writer, or by another recoverer
            if locked is False or (locked is None and not owner_gone(pid, log)):
                continue
            entry = _read_log(log)
            if entry is None or not all(_read_log(_log_name(f, entry["token"])) == entry for f in entry["targets"]):
                _roll_back(log, entry)
                handled.append(log)
                continue
            token, finals = entry["token"], entry["targets"]
            for final in finals:
                _swap_in(final, token)
            for final in finals:
                _unmark(final)
            for final in finals:
                try:
                    os.unlink(_log_name(final, token))
                except FileNotFoundError:
                    pass
            handled.append(log)
        except (OSError, ValueError, KeyError, TypeError):
            pass        # locked by another recoverer, or gone meanwhile: it finishes the group
        finally:
            os.close(fd)
    return handled


def _read_log(log: str) -> dict | None:
    """A group log's entry, or None when it is missing or was cut short (killed while writing it)."""
    try:
        with open(log) as f:
            entry = json.load(f)
        return entry if isinstance(entry.get("token"), str) and isinstance(entry.get("targets"), list) else None
    except (OSError, ValueError, AttributeError):
        return None


def _roll_back(log: str, entry: dict | None) -> None:
    """Drop a group that never reached its commit point (some target's log missing or cut short).

    No swap happens before every log is written, so every target is old: the
    logs go, and the new folders are left to the sweep as the leftovers they are.
    (The logs also go one by one after a finished commit, all swaps done: then
    dropping the rest changes nothing either.)
    """
    for f in (entry or {}).get("targets", ()):
        try:
            os.unlink(_log_name(f, entry["token"]))
        except (FileNotFoundError, TypeError):
            pass
    try:
        os.unlink(log)
    except FileNotFoundError:
        pass


def _swap_in(final: str, token: str) -> None:
    """Put the new folder of group ``token`` at ``final`` unless it is there already."""
    if _mark_of(final) == token:
        return
    waiting = [s for kind in ("tmp", "new") for s in _siblings(final, kind) if _mark_of(s) == token]
    if not waiting:
        return                  # swapped and unmarked before the kill
    try:
        os.unlink(os.path.join(waiting[0], JOURNAL))     # a committed array carries no resume journal
    except FileNotFoundError:
        pass
    if os.path.lexists(final):
        os.rename(final, sibling(final, "old"))
    os.rename(waiting[0], final)
