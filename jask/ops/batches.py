"""Minibatches: row batches of DiskArray datasets, read into memory one batch at a time.

A training step works on one batch, small enough for memory, so batches come
out as NumPy arrays: a step jitted over them compiles once (every batch has the
same shape; the last partial batch is dropped unless ``drop_last=False``) and
runs on jnp with in-memory weights. Each batch reads only its rows' region of
the store (counted in ``jask.profile()``), and the next batch is read on a
background thread while the step computes.

``shuffle=seed`` permutes the order of the batches (a new order per epoch with
``epoch=``). Random single rows would each read a whole chunk, so rows are
mixed the way streaming loaders do it: ``shuffle_buffer=k`` reads k batches
of that order together and deals their rows out at random as k new batches.
Each epoch groups other batches, so rows meet new partners every epoch, while
the bytes read stay each batch's rows, once. It holds k batches in memory (2k
while they are stacked) and reads the next k meanwhile.

A compressed chunk (or one in an object store) is decoded whole for any rows
of it, so where such a chunk spans several batches a shuffled order of single
batches decoded it once per batch (55 times per epoch for chunks of 64
batches, 21x an unshuffled epoch's time). There the order is drawn by spans,
the rows of one such chunk: the spans in random order, a few of them open at
once (as many as a quarter of the memory budget holds, 2 to 16), each next
batch a random one of the open spans' remaining batches. Each chunk is then
decoded once per epoch and kept while its span is open.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np

from jask.hijax.array import DiskArray
from jask.graph.nodes import StoredNode
from jask.exec.events import count as count_events
from jask.io import settings
from jask.io.prefetch import Prefetcher
from jask.io.reader import reader_for


def _stored(name, x):
    if not isinstance(x, DiskArray) or x._node is None:
        raise TypeError(f"batches: {name} must be a DiskArray outside jit (got {type(x).__name__}); "
                        "iterate over batches outside the jitted step and pass each batch in")
    if x.ndim == 0:
        raise ValueError(f"batches: {name} is 0-d; batches are rows of an array of rank >= 1")
    node = x._node.resolved()
    if not isinstance(node, StoredNode):
        from jask.api.sinks import persist
        node = persist(x)._node.resolved()          # a lazy dataset is computed once, then read by rows
    return node.store


def batches(*arrays, batch_size, shuffle=None, epoch=0, drop_last=True, shuffle_buffer=1):
    """Yield row batches ``(x[i:i+b], y[i:i+b], ...)`` of DiskArrays with equal row counts, as NumPy arrays.

    With one array, yields arrays; with several, tuples. ``shuffle`` is a seed
    for the batch order (``epoch`` varies it per epoch), ``None`` keeps order.
    ``shuffle_buffer=k`` (with ``shuffle``) also shuffles rows among each k
    batches read together, the same rows of every array. Where a compressed chunk
    holds several batches, the shuffled order opens a few chunks at a time, so
    each is decoded once per epoch (see the module's docstring).
    """
    if not arrays:
        raise TypeError("batches needs at least one DiskArray")
    batch_size = int(batch_size)
    if batch_size < 1:
        raise ValueError(f"batches: batch_size must be >= 1, got {batch_size}")
    if not isinstance(shuffle_buffer, (int, np.integer)) or isinstance(shuffle_buffer, bool) or shuffle_buffer < 1:
        raise ValueError(f"batches: shuffle_buffer is a number of batches >= 1, got {shuffle_buffer!r}")
    if shuffle_buffer > 1 and shuffle is None:
        raise ValueError(f"batches: shuffle_buffer={shuffle_buffer} shuffles rows with a seed; pass shuffle=SEED too")
    rows = {a.shape[0] if isinstance(a, DiskArray) and a.ndim else None for a in arrays}
    stores = [_stored(f"argument {k}", a) for k, a in enumerate(arrays)]
    if len(rows) != 1:
        raise ValueError(f"batches: arrays need the same number of rows, got shapes "
                         f"{', '.join(str(a.shape) for a in arrays)}")
    n = rows.pop()
    count = n // batch_size if drop_last else math.ceil(n / batch_size)
    if count == 0:
        raise ValueError(f"batches: {n} rows make no full batch of {batch_size}; use a smaller batch_size "
                         "or drop_last=False")
    rng = None if shuffle is None else np.random.default_rng([int(shuffle), int(epoch)])
    caches = [(s, c) for s in stores for c in [getattr(reader_for(s), "whole_chunks", None)] if c is not None]
    span = max((c.chunk[0] for _, c in caches), default=0)
    if rng is None:
        order, holds = list(range(count)), []
    elif span > batch_size:     # batches share decoded chunks: drawn span by span, a few spans open at once
        per_span = [(c, _chunks_per_span(c, span), math.prod(c.chunk) * s.dtype.itemsize) for s, c in caches]
        budget = settings.setting("memory_budget", 0)      # the budget jask.set_memory_budget set
        open_spans = int(np.clip(budget // (4 * sum(k * b for _, k, b in per_span)), 2, 16))
        order = span_order(count, batch_size, span, open_spans, rng)
        holds = [(c, open_spans * k + 2) for c, k, _ in per_span]
    else:
        order, holds = [int(b) for b in rng.permutation(count)], []
    return _iterate(stores, order, batch_size, n, len(arrays) == 1, int(shuffle_buffer), rng, holds)


def _chunks_per_span(cache, span) -> int:
    """Chunks of a store a span of ``span`` rows covers: its row bands, each with all its column chunks."""
    return math.ceil(span / cache.chunk[0]) * math.prod(
        math.ceil(d / k) for d, k in zip(cache.shape[1:], cache.chunk[1:]))


def span_order(count, batch_size, span, open_spans, rng) -> list[int]:
    """A random order of batches ``0..count-1`` in which the batches of a span (``span`` rows; a batch
    belongs to the span of its first row) are drawn while at most ``open_spans`` spans are open: the spans
    open in random order, and each next batch is a random one of the open spans' remaining batches (a
    span with more left is likelier), so every batch is as likely to come next as any other open one."""
    by_span: dict = {}
    for b in range(count):
        by_span.setdefault(b * batch_size // span, []).append(b)
    waiting = [[int(b) for b in rng.permutation(by_span[s])] for s in rng.permutation(sorted(by_span))]
    waiting.reverse()                    # popped from the end: the first span of the order opens first
    opened, order = [], []
    for u in rng.random(count).tolist():    # the draws taken at once: NumPy calls per batch took 15-20 us each
        while waiting and len(opened) < open_spans:
            opened.append(waiting.pop())
        left = sum(len(o) for o in opened)
        pick = min(int(u * left), left - 1)
        k = 0
        while pick >= len(opened[k]):
            pick -= len(opened[k])
            k += 1
        order.append(opened[k].pop())
        if not opened[k]:
            opened.pop(k)
    return order


def _iterate(stores, order, batch_size, n, single, buffer, rng, holds):
    requests = []
    for b in order:
        for k, store in enumerate(stores):
            reg = (slice(b * batch_size, min((b + 1) * batch_size, n)),) + tuple(slice(0, d) for d in store.shape[1:])
            requests.append(((b, k), _reader(store, reg)))
    per_group = buffer * len(stores)
    with contextlib.ExitStack() as held:
        for cache, chunks in holds:     # each open span's chunks stay decoded until its last batch is read
            held.enter_context(cache.holding(chunks))
        yield from _read(stores, requests, per_group, single, buffer, rng)


def _read(stores, requests, per_group, single, buffer, rng):
    with Prefetcher(requests, depth=max(2 * len(stores), per_group), count=count_events) as stream:
        while True:
            got = [value for _, value in _take(stream, per_group)]
            if not got:
                return
            group = [got[i:i + len(stores)] for i in range(0, len(got), len(stores))]
            del got
            for one in (_deal(group, rng) if buffer > 1 else group):
                yield one[0] if single else tuple(one)


def _deal(group, rng):
    """The rows of a group of batches (each a list with one block per array), permuted alike in every
    array and dealt out again in batches of the same sizes, one at a time."""
    sizes = [len(batch[0]) for batch in group]
    perm = rng.permutation(sum(sizes))
    stacked = [np.concatenate([batch[k] for batch in group]) for k in range(len(group[0]))]
    group.clear()                       # the blocks as read go: the group is held once, stacked
    start = 0
    for size in sizes:
        rows = perm[start:start + size]
        start += size
        yield [s[rows] for s in stacked]


def _take(stream, k):
    out = []
    for _ in range(k):
        item = next(stream, None)
        if item is None:
            break
        out.append(item)
    return out


def _reader(store, reg):
    return lambda: np.array(reader_for(store).read(reg))
