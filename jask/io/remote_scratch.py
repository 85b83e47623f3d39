"""A process's scratch folder in an object store: its heartbeat, and the sweep of dead processes' folders.

On a local disk a killed process's scratch folder is known dead by its pid
(:mod:`jask.io.owners`). In a bucket shared by many hosts a pid means nothing,
so each process keeps a ``heartbeat`` object in its folder
``<scratch URL>/jask-<pid>-<token>/``: written before anything else goes there,
and rewritten every :data:`HEARTBEAT_S` by a daemon thread while the process
lives. A folder whose heartbeat is older than :data:`STALE_S`, or that has none
(its owner died before or while writing it, or an older jask made it), belongs
to a dead process: the first use of the scratch URL by any process, and
``jask.cleanup_scratch()``, delete it. Ages come from the heartbeat's own
content (the writer's clock); hosts' clocks must agree to well within
``STALE_S - HEARTBEAT_S`` (14 minutes). At exit a process deletes its own folder.
"""
from __future__ import annotations

import atexit
import json
import os
import socket
import threading
import time

HEARTBEAT = "heartbeat"
HEARTBEAT_S = 60.0
STALE_S = 15 * 60.0


def _root(url: str, storage_options):
    from jask.io import backends
    from jask.io.urls import parse
    return backends.zarr_store(parse(url, "scratch_dir"), storage_options, "scratch_dir")


def _beat(root, folder: str) -> None:
    from zarr.core.buffer.cpu import Buffer
    from zarr.core.sync import sync
    doc = {"time": time.time(), "host": socket.gethostname(), "pid": os.getpid()}
    sync(root.set(f"{folder}/{HEARTBEAT}", Buffer.from_bytes(json.dumps(doc).encode())))


def claim(root_url: str, folder: str, storage_options=None) -> None:
    """Sweep dead processes' folders under ``root_url``, then claim ``<root_url>/<folder>`` for this
    process: first heartbeat now, then one every :data:`HEARTBEAT_S` on a daemon thread; the folder
    is deleted at exit."""
    root = _root(root_url, storage_options)
    _sweep(root, root_url, keep=folder)
    try:
        _beat(root, folder)
    except Exception as e:
        from jask.io.backends import named_error
        raise named_error(e, f"scratch_dir: writing {root_url}/{folder}/{HEARTBEAT}", root_url) from e
    stop = threading.Event()

    def beat_on():
        while not stop.wait(HEARTBEAT_S):
            try:
                _beat(root, folder)
            except Exception:     # a missed beat is retried; STALE_S allows many
                pass

    threading.Thread(target=beat_on, name="jask-scratch-heartbeat", daemon=True).start()

    def at_exit():
        stop.set()
        from jask.io.versions import remove_prefix
        remove_prefix(root, folder)

    atexit.register(at_exit)


def age_s(root, folder: str) -> float | None:
    """Seconds since the folder's last heartbeat; None when it has none (or an unreadable one)."""
    from jask.io.versions import read_key
    try:
        raw = read_key(root, f"{folder}/{HEARTBEAT}")
        return None if raw is None else time.time() - float(json.loads(raw.to_bytes())["time"])
    except Exception:
        return None


def sweep(root_url: str, storage_options=None, keep: str | None = None) -> list[str]:
    """Delete the process folders under ``root_url`` whose owner is dead (stale or no heartbeat),
    other than ``keep``; returns their URLs."""
    return _sweep(_root(root_url, storage_options), root_url, keep)


def _sweep(root, root_url: str, keep: str | None) -> list[str]:
    from jask.io.versions import remove_children

    def dead(name):
        parts = name.split("-")
        if name == keep or len(parts) != 3 or parts[0] != "jask" or not parts[1].isdigit():
            return False
        age = age_s(root, name)
        return age is None or age > STALE_S
    return [f"{root_url.rstrip('/')}/{name}" for name in remove_children(root, dead)]
