"""``persist(..., resume=True)``: scratch stores named by what they compute, so a killed pass continues.

:func:`graph_key` hashes a lazy array's graph: each op's name, class and
parameters, scalar values, and for each stored input its path, the identity
(device, inode, modification time) of the folder it reads and its metadata.
The same computation over the same unchanged input arrays, in a new process,
gets the same key; any input replaced (``update_`` swaps in a new folder) or
any parameter changed gives another key. Where a parameter has no stable text
(a Python function's ``repr`` holds its address), the key differs per process
and nothing is resumed, which is safe. The store of a key and its lifetime:
:mod:`jask.io.resumable_scratch`.
"""
from __future__ import annotations

import hashlib
import os

import numpy as np
import zarr

from jask.exec.driver import run
from jask.exec.sinks import ScratchSink
from jask.graph.nodes import OpNode, ScalarNode, StoredNode
from jask.io import resumable_scratch, scratch
from jask.io.store import Store


def _param_text(value) -> str:
    """A stable text for an op parameter (arrays by their bytes: their ``repr`` elides elements)."""
    if isinstance(value, np.ndarray):
        return f"ndarray({value.dtype.str},{value.shape},{hashlib.sha256(value.tobytes()).hexdigest()})"
    if isinstance(value, (tuple, list)):
        return type(value).__name__ + "(" + ",".join(_param_text(v) for v in value) + ")"
    if isinstance(value, dict):
        return "dict(" + ",".join(f"{k!r}:{_param_text(v)}" for k, v in sorted(value.items())) + ")"
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return repr(value)


def _stored_text(store) -> str:
    """A stored input: path, the folder's identity and its metadata (changes whenever its contents do)."""
    st = os.stat(store.root)
    try:
        with open(os.path.join(store.root, "zarr.json"), "rb") as f:
            meta = hashlib.sha256(f.read()).hexdigest()
    except OSError:
        meta = "?"
    return f"stored({store.path},{st.st_dev},{st.st_ino},{st.st_mtime_ns},{meta})"


def graph_key(node) -> str:
    """A hex digest naming what ``node`` computes (see the module docstring)."""
    texts: dict[int, str] = {}

    def text(n) -> str:
        n = n.resolved()
        if id(n) not in texts:
            if isinstance(n, StoredNode):
                body = _stored_text(n.store)
            elif isinstance(n, ScalarNode):
                body = f"scalar({_param_text(np.asarray(n.value))})"
            elif isinstance(n, OpNode):
                spec = n.spec
                body = (f"op({spec.name},{_param_text(spec.cls)},{_param_text(spec.kwargs)},"
                        + ",".join(text(i) for i in n.inputs) + ")")
            else:
                body = type(n).__name__
            texts[id(n)] = hashlib.sha256(f"{body}|{n.shape}|{n.dtype.str}".encode()).hexdigest()
        return texts[id(n)]

    return text(node)


def persist_resumable(nodes) -> None:
    """Store each not yet computed node of ``nodes`` under its key, continuing or taking over
    what a killed process left for that key; afterwards each node stands for its stored copy."""
    todo = {id(n.resolved()): n.resolved() for n in nodes if isinstance(n.resolved(), OpNode)}
    paths = {i: scratch.resumable_path(graph_key(n)) for i, n in todo.items()}
    fresh, plain, seen = [], [], set()
    for i, n in todo.items():
        if paths[i] in seen:                                  # the same computation twice: a plain copy
            plain.append(n)
            continue
        seen.add(paths[i])
        taken = scratch.new_path("resumed")
        if resumable_scratch.take(paths[i], taken):          # complete: a killed process stored it
            n.set_result(StoredNode(Store(taken, zarr.open_array(taken, mode="r"), owned=True)))
        elif resumable_scratch.in_use(paths[i]):             # a live process holds it: a plain copy
            plain.append(n)
        else:
            fresh.append(n)
    if fresh:
        run(fresh, lambda n, tile: ScratchSink(n, tile, path=paths[id(n)], resume=True))
    if plain:
        run(plain)
