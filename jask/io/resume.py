"""Resuming a killed write: which chunks of its hidden ``-tmp-`` folder are complete, and claiming it.

A write started with ``resume=True`` appends to the file :data:`JOURNAL` in its
``-tmp-`` folder one line per chunk once that chunk's file is completely
written (the chunk's coordinates, then a CRC-32 of them, so a damaged line is dropped). When
the process is killed the folder stays: sweeps keep a folder with a journal
(:func:`resumable`) unless asked not to. The next write of the same array
(same metadata, byte for byte) to the same path with ``resume=True`` claims it
with a rename, so only one claimant wins; it keeps the chunks whose journal
lines are whole and whose files have the full chunk size, and computes only
the tiles that touch any other chunk. Only arrays of one uncompressed file per
chunk are resumed (the layout ``jask.io.layout`` calls ``"chunk"``).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import warnings
import zlib

from jask.io.layout import covering
from jask.io.owners import owner_gone, sibling, sibling_owner, siblings

JOURNAL = ".jask-chunks"


def resumable(folder: str) -> bool:
    """Whether ``folder`` (a ``-tmp-`` sibling) holds a journal, so a later ``resume=True`` write can continue it."""
    return os.path.isfile(os.path.join(folder, JOURNAL))


def claim(final_path: str, tmp_path: str) -> bool:
    """Replace the fresh folder ``tmp_path`` by an ended process's resumable one for the same array.

    Candidates are ``-tmp-`` siblings of ``final_path`` whose owner has ended
    and whose ``zarr.json`` equals the fresh one's. Returns whether one was claimed.
    """
    with open(os.path.join(tmp_path, "zarr.json"), "rb") as f:
        meta = f.read()
    for cand in siblings(final_path, "tmp"):
        pid = sibling_owner(cand)
        if cand == tmp_path or pid is None or not resumable(cand) or not owner_gone(pid, cand):
            continue
        try:
            with open(os.path.join(cand, "zarr.json"), "rb") as f:
                if f.read() != meta:
                    continue
            aside = sibling(final_path, "tmp")     # named like any -tmp-: swept once this process ends
            os.rename(tmp_path, aside)
            try:
                os.rename(cand, tmp_path)         # only one claimant's rename finds it
            except OSError:
                os.rename(aside, tmp_path)        # (an OSError here leaves no folder to write: raised)
                continue
            shutil.rmtree(aside, ignore_errors=True)
            try:
                os.utime(tmp_path)                # now this live process's: newer than its start
            except OSError:
                pass
            return True
        except OSError:
            if not os.path.isdir(tmp_path):
                raise
            continue
    return False


def progress(folder: str) -> tuple[int, int]:
    """``(chunks journaled as complete, chunks in all)`` of a resumable ``-tmp-`` folder (0, 0 if unreadable)."""
    try:
        with open(os.path.join(folder, "zarr.json")) as f:
            meta = json.load(f)
        shape, chunk = meta["shape"], meta["chunk_grid"]["configuration"]["chunk_shape"]
        with open(os.path.join(folder, JOURNAL), "rb") as f:
            lines = f.read().decode("ascii", "replace").split("\n")[:-1]
    except (OSError, ValueError, KeyError, TypeError):
        return 0, 0
    whole = {line for line in lines if _line(line.split()[:-1]) == line + "\n"}
    return len(whole), math.prod(-(-d // c) for d, c in zip(shape, chunk))


def warn_before_removing(final_path: str) -> None:
    """Warn (``RuntimeWarning``) about each resumable write an ended process left for ``final_path``.

    Called by a write without ``resume=True``, which then removes those folders
    (:func:`jask.io.recovery.recover`): the message says how far the killed
    write got and that ``resume=True`` would have continued it.
    """
    for cand in siblings(final_path, "tmp"):
        pid = sibling_owner(cand)
        if pid is not None and resumable(cand) and owner_gone(pid, cand):
            done, total = progress(cand)
            warnings.warn(
                f"{final_path}: a killed write (process {pid}) left a resumable partial array here with "
                f"{done} of {total} chunks done; this write, started without resume=True, removes it and "
                "starts afresh. Pass resume=True (to_zarr(..., resume=True), update_(..., resume=True)) to "
                "continue such a write instead", RuntimeWarning, stacklevel=2)


def _line(coords) -> str:
    text = " ".join(map(str, coords))
    return f"{text} {zlib.crc32(text.encode('ascii')):08x}\n"


class ChunkJournal:
    """The chunks of one pending array known to be completely on disk, appended to its journal file."""

    def __init__(self, root: str, layout):
        self.root, self.lay = root, layout
        self.path = os.path.join(root, JOURNAL)
        self.done = self._load()
        self.resumed = len(self.done)        # chunks found complete when the write began

    def _load(self) -> set:
        """The recorded chunks whose line is whole and whose file has the full chunk size."""
        try:
            with open(self.path, "rb") as f:
                text = f.read().decode("ascii", "replace")
        except FileNotFoundError:
            return set()
        full = math.prod(self.lay.chunk) * self.lay.dtype.itemsize
        done = set()
        for line in text.split("\n")[:-1]:              # the last piece lacks its newline if cut
            fields = line.split()
            if len(fields) != len(self.lay.chunk) + 1 or not all(f.isdigit() for f in fields[:-1]):
                continue
            coords = tuple(int(f) for f in fields[:-1])
            if _line(coords) != line + "\n":
                continue
            try:
                if os.path.getsize(os.path.join(self.root, self.lay.encode_key(coords))) == full:
                    done.add(coords)
            except OSError:
                pass
        return done

    def record(self, region) -> None:
        """Note the chunks lying wholly inside ``region``: once its write returned, they are on disk."""
        lines = []
        for coords in covering(region, self.lay.chunk):
            inside = all(s.start <= c * n and min((c + 1) * n, d) <= s.stop
                         for s, c, n, d in zip(region, coords, self.lay.chunk, self.lay.shape))
            if inside and coords not in self.done:
                self.done.add(coords)
                lines.append(_line(coords))
        if lines:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, "".join(lines).encode("ascii"))
            finally:
                os.close(fd)

    def covers(self, region) -> bool:
        """Whether every chunk ``region`` touches is already on disk (its tile need not be computed)."""
        return all(c in self.done for c in covering(region, self.lay.chunk))

    def remove(self) -> None:
        """Delete the journal (before the commit: a committed array carries none)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
