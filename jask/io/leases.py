"""Read leases that make a mapped chunk file safe against writers that truncate it in place.

A map of a file another program truncates kills the process with SIGBUS at the
next touch of a lost page. A Linux read lease (``fcntl F_SETLEASE``) closes that
hole: while this process holds one, any other open of the file for writing, and
any truncate, blocks in the kernel until the lease is released (at most
``/proc/sys/fs/lease-break-time``, 45 s by default). The kernel grants one only
when nobody has the file open for writing, to its owner or to a process with
``CAP_LEASE``, on a filesystem that supports leases: anything else is refused
and the caller reads the chunk instead of mapping it.

The lease lives as long as the open file does, and the map itself refers to
the open file, so it ends by itself when the map is unmapped. A writer that
comes while the map is still alive is served by :class:`_Watcher`: a thread
that looks at the live leases every ``POLL_S`` and, for one a writer waits on,
copies the mapped bytes into anonymous memory, moves that memory over the map
in one ``mremap`` (threads reading the tile see the same bytes before and
after) and releases the lease. The writer then goes on, and the tile keeps the
bytes it was opened with. No signal is involved: the lease's owner is cleared
(``F_SETOWN 0``), so the kernel sends none, and SIGIO's default action (end the
process) is replaced by ignore in case a break comes in the instant between
taking the lease and clearing its owner.
"""
from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import signal
import threading
import weakref

POLL_S = 0.02            # how often the watcher looks for writers waiting on a lease
_MREMAP_MAYMOVE, _MREMAP_FIXED = 1, 2

_count_lock = threading.Lock()
_counts = {"taken": 0, "refused": 0, "released_for_writers": 0}


def take(fd: int) -> bool:
    """Take a read lease on the open, read-only file ``fd``; False when the kernel refuses one
    (the file is open for writing somewhere, not ours, or its filesystem has no leases)."""
    if _libc is None or not _sigio_safe():
        return _count("refused")
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError:
        return _count("refused")
    try:
        fcntl.fcntl(fd, fcntl.F_SETOWN, 0)   # no signal when a writer breaks it: the watcher polls
    except OSError:
        release(fd)
        return _count("refused")
    return _count("taken")


def release(fd: int) -> None:
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    except OSError:
        pass


def watch(mapped: mmap.mmap, fd: int, address: int, nbytes: int) -> None:
    """Serve writers that wait on the lease of ``fd`` while ``mapped`` (at ``address``) lives.
    Takes ``fd`` over: it is closed when the map is gone."""
    _watcher.add(mapped, fd, address, nbytes)


def counts() -> dict:
    """``taken``, ``refused`` and ``released_for_writers`` (maps made private for a writer) so far."""
    with _count_lock:
        return dict(_counts, live=len(_watcher.entries))


def _count(name: str) -> bool:
    with _count_lock:
        _counts[name] += 1
    return name == "taken"


def _sigio_safe() -> bool:
    """Make sure a stray SIGIO cannot end the process (its default action); False if unsure."""
    try:
        if signal.getsignal(signal.SIGIO) != signal.SIG_DFL:
            return True          # someone handles or ignores it already
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGIO, signal.SIG_IGN)
        elif _libc.signal(signal.SIGIO, 1) == -1:   # 1 is SIG_IGN; Python allows signal.signal on the main thread only
            return False
        return True
    except (ValueError, OSError, AttributeError):
        return False


class _Entry:
    __slots__ = ("ref", "fd", "address", "nbytes")

    def __init__(self, mapped, fd, address, nbytes):
        self.ref, self.fd, self.address, self.nbytes = weakref.ref(mapped), fd, address, nbytes


class _Watcher:
    """One daemon thread, running while some lease is live."""

    def __init__(self):
        self.entries: dict[int, _Entry] = {}
        self.cv = threading.Condition()
        self.thread = None

    def add(self, mapped, fd, address, nbytes):
        entry = _Entry(mapped, fd, address, nbytes)
        with self.cv:
            self.entries[id(entry)] = entry
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="jask-leases", daemon=True)
                self.thread.start()
            self.cv.notify()
        weakref.finalize(mapped, self._gone, id(entry))

    def _gone(self, key):
        with self.cv:
            entry = self.entries.pop(key, None)
            if entry is not None and entry.fd >= 0:
                os.close(entry.fd)
                entry.fd = -1

    def _run(self):
        while True:
            with self.cv:       # under the lock: no fd is closed while it is asked about
                while not self.entries:
                    self.cv.wait()
                self.cv.wait(POLL_S)
                waited_on = [e for e in self.entries.values() if e.fd >= 0 and _break_pending(e.fd)]
            for entry in waited_on:
                self._serve(entry)

    def _serve(self, entry: _Entry) -> None:
        mapped = entry.ref()     # a strong reference: the map cannot be unmapped while it is moved
        if mapped is None or not _make_private(entry.address, entry.nbytes):
            return
        with self.cv:
            if entry.fd >= 0:
                release(entry.fd)
                os.close(entry.fd)     # the map no longer refers to the file: nothing left to watch
                entry.fd = -1
        _count("released_for_writers")
        del mapped


def _break_pending(fd: int) -> bool:
    """Whether a writer waits on the lease of ``fd`` (the kernel then reports the type it will become)."""
    try:
        return fcntl.fcntl(fd, fcntl.F_GETLEASE) != fcntl.F_RDLCK
    except OSError:
        return False


def _make_private(address: int, nbytes: int) -> bool:
    """Replace the file pages mapped at ``address`` by an anonymous copy of them, in one step."""
    copy = _libc.mmap(None, nbytes, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if copy in (None, ctypes.c_void_p(-1).value):
        return False
    ctypes.memmove(copy, address, nbytes)
    _libc.mprotect(copy, nbytes, mmap.PROT_READ)
    if _libc.mremap(copy, nbytes, nbytes, _MREMAP_MAYMOVE | _MREMAP_FIXED, address) != address:
        _libc.munmap(copy, nbytes)
        return False
    return True


def _load_libc():
    if not hasattr(fcntl, "F_SETLEASE"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        for name, res, args in (
                ("mmap", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                           ctypes.c_int, ctypes.c_long]),
                ("mremap", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int,
                                             ctypes.c_void_p]),
                ("mprotect", ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]),
                ("munmap", ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t]),
                ("signal", ctypes.c_ssize_t, [ctypes.c_int, ctypes.c_ssize_t])):
            fn = getattr(libc, name)
            fn.restype, fn.argtypes = res, args
        return libc
    except (OSError, AttributeError):
        return None


_libc = _load_libc()
_watcher = _Watcher()


def _after_fork_in_child():
    """The parent's watcher thread is not in the child, and its locks may have been held at the fork."""
    global _count_lock
    _count_lock = threading.Lock()
    _watcher.cv = threading.Condition()
    _watcher.thread = None


os.register_at_fork(after_in_child=_after_fork_in_child)
