"""Tiles kept from one window for a later one of the same share, instead of read again.

Windows never straddle two output tiles, and an output tile whose entries fill more than a window
is split over several, so input tiles that neighbouring output tiles share were read once per
output tile: an unaligned strided slice's boundary tiles (``x[:, 5::3]``: 4 input tiles per output
tile, 3 of them its own: 320 MiB read for 256), a product's row panel once per window of its band.
:func:`keep_reads` runs on a share's finished schedule (pure host work, before any byte moves): a
tile read by window t that window u > t reads again is kept from t's read, while every window it
waits through (t+1 .. u-1, at most ``KEEP_HORIZON`` on) stays within the window limit with it, and
is charged to them (window u charges it already, as one of its tiles). The runner holds it from t's
values until u takes it (:class:`jask.exec.run_windows.WindowRunner`).
"""
from __future__ import annotations

import numpy as np

# How many windows ahead a read tile may be kept for (bounds the host work per read).
KEEP_HORIZON = 8


def keep_reads(sched: list, limit_bytes: int) -> list:
    """``sched`` (one share's windows, in order) with each read a later window repeats kept for it instead:
    the earlier window lists it in ``keep``, the later one in ``kept`` and no longer reads it."""
    reads = [dict(zip(w.read_keys, w.reads)) for w in sched]
    size = {}
    for t, w in enumerate(sched):
        for key, (_, (source, reg)) in reads[t].items():
            size[key] = int(np.prod([r.stop - r.start for r in reg], dtype=np.int64)) * max(
                np.dtype(source.dtype).itemsize, 4)
        for key in list(reads[t]) + w.kept:
            for u in range(t + 1, min(len(sched), t + 1 + KEEP_HORIZON)):
                if key in reads[u] or key in sched[u].kept:
                    between = sched[t + 1:u]
                    if key in reads[u] and all(v.projected + size[key] <= limit_bytes for v in between):
                        for v in between:
                            v.projected += size[key]
                        w.keep.append(key)
                        sched[u].kept.append(key)
                        del reads[u][key]
                    break                      # the next window needing it takes it, or reads it again
    for w, got in zip(sched, reads):
        w.read_keys, w.reads = list(got), list(got.values())
    return sched
