"""Swap two paths' names in one atomic step, where Linux and the filesystem allow it.

``renameat2(RENAME_EXCHANGE)`` lets a commit replace a folder without the path
ever going missing; :mod:`jask.io.store` falls back to two renames (and
:mod:`jask.io.recovery`) where this returns False. Tests turn it off through
:data:`USE_EXCHANGE` to exercise that fallback.
"""
from __future__ import annotations

import ctypes
import errno
import os

USE_EXCHANGE = True   # swap folders with renameat2(RENAME_EXCHANGE) where the filesystem can
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_libc = None


def swap_names(a: str, b: str) -> bool:
    """Atomically swap the names ``a`` and ``b``; False where the system or filesystem cannot."""
    global _libc
    if not USE_EXCHANGE:
        return False
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            _libc = False
    fn = getattr(_libc, "renameat2", None) if _libc else None
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), a, None, b)
