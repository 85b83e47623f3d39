"""Scratch space for op outputs and gradients.

Where: ``JASK_SCRATCH_DIR`` or ``set_memory_budget(..., scratch_dir=...)`` when
set; otherwise ``$TMPDIR/jask-scratch``, unless ``$TMPDIR`` (``/tmp``) is on
tmpfs, which lives in RAM and would defeat the memory budget: then the user
cache directory, ``$XDG_CACHE_HOME/jask/scratch`` (``~/.cache/jask/scratch``).
A store URL (``s3://bucket/scratch``) works too, with credentials from the
``scratch_storage_options`` setting; its stores are deleted as they are freed.
:func:`scratch_location` says which was chosen and why.

Each process gets its own folder ``<scratch_dir>/jask-<pid>-<token>``. Stores in
it are deleted when the arrays that own them are garbage collected, and the
folder itself at interpreter exit. Folders whose owner is gone (a killed
process) are removed the next time any process uses the same scratch dir, and
with them the temporaries that process left beside the user paths it wrote
(listed in its folder's ``targets`` file). In an object store, shared by many
hosts, the owner's liveness is its heartbeat object (:mod:`jask.io.remote_scratch`).
"""
from __future__ import annotations

import atexit
import itertools
import os
import shutil
import tempfile

from jask.io import remote_scratch, resumable_scratch, urls
from jask.io.settings import current as _current_settings
from jask.io.owners import new_token, owner_gone
from jask.io.recovery import recover

_RAM_FILESYSTEMS = {"tmpfs", "ramfs"}
_counter = itertools.count()
_process_dir: str | None = None
_recorded: set = set()   # (process folder, user path) already noted in its TARGETS file
TARGETS = "targets"      # in a process folder: the user paths it writes beside, one a line

def filesystem_type(path: str) -> str:
    """Filesystem type of the mount holding ``path`` (from /proc/mounts; '' if unknown)."""
    path = os.path.realpath(path)
    best, fstype = "", ""
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mount = parts[1].replace("\\040", " ")
                inside = path == mount or path.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, fstype = mount, parts[2]
    except OSError:
        return ""
    return fstype


def _fstype_of(path: str) -> str:
    """Filesystem type of ``path``, or of its nearest existing parent if it does not exist yet."""
    probe = os.path.abspath(path)
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    return filesystem_type(probe or path)


def cache_scratch_dir() -> str:
    """The on-disk fallback: ``$XDG_CACHE_HOME/jask/scratch``, else ``~/.cache/jask/scratch``."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "jask", "scratch")


class TmpfsScratchError(ValueError):
    """The scratch dir chosen is on a RAM filesystem; ``disks`` lists the mounted real disks found."""

    def __init__(self, message, path, disks):
        super().__init__(message)
        self.path, self.disks = path, disks


_DISK_FILESYSTEMS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "jfs", "reiserfs", "bcachefs",
                     "overlay", "nfs", "nfs4", "cifs", "smb3", "lustre", "gpfs", "beegfs", "ceph", "fuseblk"}


def real_disks(limit: int = 8) -> list[tuple[str, str]]:
    """Mounted folders on disk filesystems, as ``(mount point, type)``, from /proc/mounts."""
    found = []
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[2] in _DISK_FILESYSTEMS:
                    mount = parts[1].replace("\\040", " ")
                    if os.path.isdir(mount) and all(m != mount for m, _ in found):
                        found.append((mount, parts[2]))
    except OSError:
        pass
    return found[:limit]


def check_scratch_dir(path: str, allow_tmpfs: bool, source: str = "scratch_dir") -> None:
    """Refuse a scratch dir in RAM (a tmpfs or ramfs folder, a ``memory://`` URL) unless explicitly allowed
    (:class:`TmpfsScratchError`), a path that is or lies under a file (``NotADirectoryError``), and a
    malformed store URL (:class:`~jask.io.urls.StoreURLError`); ``source`` names the setting in messages."""
    path = urls.parse(path, source)     # file:// URLs become paths
    if isinstance(path, urls.Location):
        if path.scheme == "memory" and not allow_tmpfs:
            raise TmpfsScratchError(
                f"{source}: scratch dir {path.url!r} is a memory:// URL, which lives in this process's RAM and "
                "would defeat the memory budget; choose a folder on a real disk (or an s3:// or gs:// URL), "
                "or pass allow_tmpfs=True to use it anyway", path.url, real_disks())
        return
    probe = path
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        where = "is a file" if probe == path else f"lies under {probe}, which is a file"
        raise NotADirectoryError(f"{source}: scratch dir {path!r} {where}, not a folder; choose a folder "
                                 "(it is created if missing)")
    fstype = _fstype_of(path)
    if fstype in _RAM_FILESYSTEMS and not allow_tmpfs:
        fallback = cache_scratch_dir()
        hint = (f"the default when $TMPDIR is on tmpfs is {fallback!r}; "
                if _fstype_of(fallback) not in _RAM_FILESYSTEMS else "")
        disks = real_disks()
        listed = ", ".join(f"{m} ({t})" for m, t in disks) or "none found in /proc/mounts"
        raise TmpfsScratchError(
            f"{source}: scratch dir {path!r} is on {fstype}, which lives in RAM and would defeat the memory "
            f"budget; choose a folder on a real disk with the environment variable JASK_SCRATCH_DIR or "
            f"jask.set_memory_budget(..., scratch_dir=...) ({hint}leave both unset to use it); "
            f"real disks mounted here: {listed}; or pass allow_tmpfs=True to use it anyway", path, disks)


def scratch_location() -> tuple[str, str]:
    """The scratch root the next store would use, and why it was chosen (a short phrase)."""
    config = _current_settings()
    if config.scratch_dir:
        return config.scratch_dir, f"from {_source()}"
    temp = os.path.join(tempfile.gettempdir(), "jask-scratch")
    fstype = _fstype_of(temp)
    if fstype in _RAM_FILESYSTEMS and not config.allow_tmpfs:
        return cache_scratch_dir(), f"default: {os.path.dirname(temp)} is on {fstype}, so the user cache dir"
    return temp, "default: $TMPDIR/jask-scratch"


def _source() -> str:
    """The setting the scratch dir comes from, as messages name it (``JASK_SCRATCH_DIR``...)."""
    config = _current_settings()
    if not config.scratch_dir:
        return "the default scratch dir"
    return "JASK_SCRATCH_DIR" if config.scratch_dir == os.environ.get("JASK_SCRATCH_DIR") \
        else "set_memory_budget(scratch_dir=...)"


def _default_root() -> str:
    return scratch_location()[0]


def remove_stale(root: str, keep_resumable: bool = True) -> list[str]:
    """Delete process folders under ``root`` whose owner has ended, and the leftovers beside the
    user paths each recorded (:func:`record_target`); returns the absolute paths removed."""
    removed = []
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return removed
    for name in sorted(names):
        parts = name.split("-")
        folder = os.path.join(os.path.abspath(root), name)
        if len(parts) == 3 and parts[0] == "jask" and parts[1].isdigit() and owner_gone(int(parts[1]), folder):
            removed += _sweep_targets(folder, keep_resumable)
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed + resumable_scratch.sweep(root, keep=keep_resumable)


def _sweep_targets(folder: str, keep_resumable: bool) -> list[str]:
    try:
        with open(os.path.join(folder, TARGETS)) as f:
            targets = [line.rstrip("\n") for line in f if line.strip()]
    except OSError:
        return []
    return [p for t in dict.fromkeys(targets) for p in recover(t, keep_resumable)]


def in_scratch(path: str) -> bool:
    """Whether ``path`` lies in the scratch dir this process uses (its stores need no sweeping)."""
    return _process_dir is not None and path.startswith(os.path.dirname(_process_dir) + os.sep)


def record_target(path: str) -> None:
    """Note in this process's folder that it writes beside ``path``, before it does.

    Should the process be killed, whoever sweeps its folder (:func:`remove_stale`)
    then also removes the hidden temporaries it left beside ``path``. Skipped
    where no scratch folder can be made (the write itself does not need one).
    """
    try:
        folder = process_dir()
    except (OSError, ValueError):
        return
    if urls.is_url(folder) or (folder, path) in _recorded:    # an object-store scratch dir keeps no list
        return
    try:
        with open(os.path.join(folder, TARGETS), "a") as f:
            f.write(path + "\n")
    except OSError:
        return
    _recorded.add((folder, path))


def process_dir() -> str:
    """This process's scratch folder, created (and stale folders swept) on first use."""
    global _process_dir
    root = urls.parse(_default_root(), "scratch_dir")
    if isinstance(root, urls.Location):   # an object store: each store deletes itself when freed (jask.io.remote)
        root = root.url
        if _process_dir is None or not _process_dir.startswith(root.rstrip("/") + "/"):
            check_scratch_dir(root, _current_settings().allow_tmpfs, _source())
            folder = f"jask-{os.getpid()}-{new_token()}"
            remote_scratch.claim(root, folder, storage_options())   # after sweeping dead processes' folders
            _process_dir = f"{root.rstrip('/')}/{folder}"
        return _process_dir
    if _process_dir is None or os.path.dirname(_process_dir) != os.path.abspath(root):
        check_scratch_dir(root, _current_settings().allow_tmpfs, _source())
        created_root = not os.path.isdir(root)
        os.makedirs(root, exist_ok=True)
        remove_stale(root)
        _process_dir = os.path.join(os.path.abspath(root), f"jask-{os.getpid()}-{new_token()}")
        os.makedirs(_process_dir)
        atexit.register(_remove_process_dir, _process_dir, created_root)
    return _process_dir


def _remove_process_dir(path: str, remove_root: bool) -> None:
    """At exit: delete this process's folder, and the root too if this process made it and it is empty."""
    shutil.rmtree(path, ignore_errors=True)
    if remove_root:
        try:
            os.rmdir(os.path.dirname(path))     # fails harmlessly while other processes' folders are there
        except OSError:
            pass


def new_path(tag: str = "array") -> str:
    """A fresh, not yet existing store path (or URL) in this process's scratch folder."""
    return os.path.join(process_dir(), f"{tag}-{next(_counter)}.zarr")


def resumable_path(key: str, what: str = "persist") -> str:
    """Where a resumable scratch store named ``key`` goes (:mod:`jask.io.resumable_scratch`); local only."""
    folder = process_dir()
    if urls.is_url(folder):
        raise ValueError(f"{what}: resume=True needs a local scratch dir, not the store URL "
                         f"{os.path.dirname(folder)}; set JASK_SCRATCH_DIR to a folder on a disk")
    return resumable_scratch.path_for(os.path.dirname(folder), key)


def storage_options() -> dict | None:
    """``storage_options`` for a scratch dir that is a store URL (the ``scratch_storage_options`` setting)."""
    return getattr(_current_settings(), "scratch_storage_options", None)


def cleanup_scratch(root: str | None = None, paths=()) -> list[str]:
    """Remove what killed processes left behind; returns the absolute paths removed.

    That is their scratch folders under ``root`` (default: the scratch dir in
    use) and the hidden temporaries (``.NAME.jask-tmp-PID-...``, ``-new-``,
    unread ``-old-``) beside the user paths they were writing, which those
    folders record, and beside each of ``paths``, including partial writes a
    ``to_zarr(..., resume=True)`` could continue, and what killed ``persist(...,
    resume=True)`` calls left under ``<root>/resume``. Only leftovers whose owner
    process has ended are touched (:mod:`jask.io.owners`). ``root`` may be a
    ``file://`` URL. Under a scratch dir on an object store (``s3://...``), the
    folders of processes whose heartbeat stopped (:mod:`jask.io.remote_scratch`)
    are removed, whichever host ran them; their URLs are returned.
    """
    root = urls.parse(root or _default_root(), "scratch_dir")
    if isinstance(root, urls.Location):
        own = _process_dir.rsplit("/", 1)[-1] if _process_dir and urls.is_url(_process_dir) else None
        removed = remote_scratch.sweep(root.url, storage_options(), keep=own)
    else:
        removed = remove_stale(root, keep_resumable=False)
    for p in paths:
        removed += recover(os.path.abspath(os.fspath(p)), keep_resumable=False)
    return removed
