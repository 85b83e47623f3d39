"""Whether the process that made a leftover (a scratch folder, a hidden sibling) is gone.

Leftovers carry their owner's pid in their name. A pid is only a hint: once
the owner is dead the system may give the same pid to a new process. So an
owner counts as gone when no process has the pid, or when the process that
has it now started well after the leftover was last modified or renamed (the
owner made it, so it started before). A rename keeps a folder's mtime but
updates its ctime, so the later of the two counts: a live process's ``-old-``
sibling or a claimed resume folder is as new as its rename. The margin, :data:`REUSE_MARGIN_SECONDS`, absorbs
coarse timestamps and clock skew between a network disk and this machine; a
pid reused sooner than that keeps the leftover until a later sweep.

Every name a process makes ends in a token that starts with its host's tag
and its own (:func:`new_token`). A leftover of another host keeps its pid's
meaning there only, so it never counts as ended here (that host's processes
sweep it): processes of several hosts write one shared folder in a
``jax.distributed`` run, and in containers they often all have the same pid.
This process's own pid is told exactly: a leftover with it, this host's tag
and another process tag was made by an earlier process that had the same
pid. That is the common reuse: a job restarted in its container gets the pid
its killed run had, often within seconds, and its ``resume=True`` must find
that run's partial write ended, not its own. Names without these tags (older
jask versions) are judged by the pid alone.
"""
from __future__ import annotations

import glob
import os
import secrets
import socket
import zlib

REUSE_MARGIN_SECONDS = 60.0

_HOST = f"{zlib.crc32(socket.gethostname().encode()) & 0xffff:04x}"   # this host's: begins every token
_tag = secrets.token_hex(2)          # this process's: follows the host's in every token it makes


def _new_tag() -> None:
    global _tag
    _tag = secrets.token_hex(2)


os.register_at_fork(after_in_child=_new_tag)


def new_token() -> str:
    """A fresh token for a name carrying this process's pid (``PID-TOKEN``): the host's tag, this process's,
    then random (12 hex digits)."""
    return _HOST + _tag + secrets.token_hex(2)


def released_token() -> str:
    """A token for a leftover this process gives up while it lives (a failed ``resume=True`` write keeps
    its folder): another process tag than its own, so here :func:`owner_gone` counts it as ended at once,
    as a killed run's; other processes see a live pid and leave it alone until this process ends."""
    return _HOST + f"{(int(_tag, 16) + 1) % 0x10000:04x}" + secrets.token_hex(2)


def sibling(path: str, kind: str, token: str | None = None) -> str:
    """A hidden sibling of ``path`` owned by this process: ``.NAME.jask-KIND-PID-TOKEN``."""
    head, name = os.path.split(os.path.abspath(path))
    return os.path.join(head, f".{name}.jask-{kind}-{os.getpid()}-{token or new_token()}")


def siblings(path: str, kind: str = "") -> list[str]:
    """The hidden siblings of ``path`` (of one ``kind``, e.g. ``"tmp"``, or all), sorted."""
    head, name = os.path.split(path)
    return sorted(glob.glob(os.path.join(head, f".{glob.escape(name)}.jask-{kind + '-' if kind else ''}*")))


def sibling_owner(sibling_path: str) -> int | None:
    """The pid in a ``.NAME.jask-KIND-PID-TOKEN`` sibling's name (None if it has none)."""
    parts = os.path.basename(sibling_path).rsplit("-", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists: an id that names a thread of another process does not count."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return _leads_a_process(pid)


def _leads_a_process(pid: int) -> bool:
    """Whether ``pid`` (a live id) is a process's own id, not one of its threads'.

    Linux gives threads ids from the same space as processes, and ``kill(tid, 0)``
    succeeds for them: a dead owner's pid reused by any thread of any process
    (jask's processes each run dozens) looked alive. A process's id is its thread
    group id (``Tgid`` in ``/proc/PID/status``). True where ``/proc`` cannot say.
    """
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1]) == pid
    except (OSError, ValueError):
        pass
    return True


def _boot_time() -> float | None:
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


def process_start(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch), from /proc; None where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()   # the command name may hold spaces and ')'
        boot = _boot_time()
        if boot is None:
            return None
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")   # field 22: start time in clock ticks
    except (OSError, IndexError, ValueError):
        return None


def _tagged_token(leftover: str, pid: int) -> str | None:
    """The token of a ``...-PID-TOKEN`` name with this ``pid``, if it is one :func:`new_token` makes."""
    parts = os.path.basename(leftover).rsplit("-", 2)
    if len(parts) != 3 or parts[1] != str(pid) or len(parts[2]) != 12:
        return None
    try:
        int(parts[2], 16)
    except ValueError:
        return None
    return parts[2]


def owner_gone(pid: int, leftover: str) -> bool:
    """Whether the process ``pid`` that made ``leftover`` has ended (its pid free, or taken by a newer process)."""
    token = _tagged_token(leftover, pid)
    if token is not None and token[:4] != _HOST:
        return False                         # another host's: its pid names nothing here
    if token is not None and pid == os.getpid():
        return token[4:8] != _tag            # another process tag: an earlier process that had this pid
    if not pid_alive(pid):
        return True
    started = process_start(pid)
    try:
        st = os.lstat(leftover)
    except OSError:
        return False
    modified = max(st.st_mtime, st.st_ctime)      # a rename updates only the ctime
    return started is not None and started > modified + REUSE_MARGIN_SECONDS
