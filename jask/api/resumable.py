"""``persist(..., resume=True)``: scratch stores named by what they compute, so a killed pass continues.

:func:`graph_key` hashes a lazy array's graph: each op's name, class and
parameters, scalar values, and for each stored input its path, the identity
(device, inode, modification time) of the folder it reads, and each file's size and
modification time (its metadata and chunks); at a store URL, its committed version.
The same computation over the same unchanged input arrays, in a new process,
gets the same key; any input replaced (``update_`` swaps in a new folder) or
any parameter changed gives another key. A module-level function (jnp's, in
jask.numpy's ops) counts by its module, name and code; where a parameter has no
stable text (a lambda or closure: its ``repr`` holds its address), the key differs
per process and nothing is resumed, which is safe. An input that is itself a resumable
persist's result counts by its key, so chained resumable persists resume too. The store of a key and its lifetime:
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
    if callable(value):
        return _function_text(value)
    return repr(value)


def _function_text(fn) -> str:
    """A function by its module, name and code, the same in every process: jask.numpy's ops carry jnp's
    functions (``jnp.exp``), whose ``repr`` holds an address. Only a module-level function without closure
    (a ``jax.jit`` of one too); any other callable keeps its ``repr``: a key of its own per process."""
    inner = fn.__wrapped__ if hasattr(fn, "lower") and hasattr(fn, "__wrapped__") else fn   # jax.jit's wrapper
    code = getattr(inner, "__code__", None)
    if code is None or inner.__closure__ or "<" in inner.__qualname__:     # lambdas, closures, builtins
        return repr(fn)
    body = hashlib.sha256(code.co_code + repr((code.co_consts, code.co_names)).encode()).hexdigest()
    return f"function({inner.__module__}.{inner.__qualname__},{body})"


def _stored_text(store) -> str:
    """A stored input: path, the folder's identity, its metadata and every file's size and modification
    time (a chunk written in place by another tool changes no folder: its file's time does). At a store
    URL: the committed version jask reads (each commit writes a new one). A scratch store (in-memory data
    jask stored: ``from_numpy``, a slice's row numbers) by its files' contents, as its path is this process's."""
    version = getattr(store, "version", None)
    if version is not None:
        if not version:
            raise ValueError(f"persist(..., resume=True): the input {store.path} is a plain Zarr array at a store "
                             "URL, whose changes jask cannot tell; copy it with jask.to_zarr to a URL or folder "
                             "first (a jask-written array is named by its committed version), or drop resume=True")
        return f"stored({store.path},{version})"
    if store.owned:
        return f"scratch({_files_digest(store.root, contents=True)})"
    st = os.stat(store.root)
    return f"stored({store.path},{st.st_dev},{st.st_ino},{st.st_mtime_ns},{_files_digest(store.root)})"


def _files_digest(root: str, contents: bool = False) -> str:
    """A digest of every file under ``root``: its relative path and size, and its modification time or,
    with ``contents``, its bytes."""
    files = hashlib.sha256()
    for folder, subfolders, names in os.walk(root):
        subfolders.sort()
        for name in sorted(names):
            file = os.path.join(folder, name)
            f = os.stat(file)
            files.update(f"{os.path.relpath(file, root)}:{f.st_size}:".encode())
            if contents:
                with open(file, "rb") as fh:
                    files.update(hashlib.sha256(fh.read()).digest())
            else:
                files.update(f"{f.st_mtime_ns};".encode())
    return files.hexdigest()


def _body(n, texts) -> str:
    """What one node is, its inputs given by their digests in ``texts``."""
    if isinstance(n, StoredNode):
        key = getattr(n.store, "resume_key", None)       # a resumable persist's result: by its key, as a
        return f"resumed({key})" if key else _stored_text(n.store)   # new process finds it elsewhere
    if isinstance(n, ScalarNode):
        return f"scalar({_param_text(np.asarray(n.value))})"
    if isinstance(n, OpNode):
        spec = n.spec
        return (f"op({spec.name},{_param_text(spec.cls)},{_param_text(spec.kwargs)},"
                + ",".join(texts[id(i.resolved())] for i in n.inputs) + ")")
    return type(n).__name__


def graph_key(node) -> str:
    """A hex digest naming what ``node`` computes (see the module docstring)."""
    texts: dict[int, str] = {}
    stack = [node.resolved()]
    while stack:                                     # inputs first, without recursion (chains are deep)
        n = stack[-1]
        inputs = [i.resolved() for i in getattr(n, "inputs", ()) if id(i.resolved()) not in texts]
        if isinstance(n, OpNode) and inputs:
            stack.extend(inputs)
            continue
        stack.pop()
        if id(n) not in texts:
            texts[id(n)] = hashlib.sha256(f"{_body(n, texts)}|{n.shape}|{n.dtype.str}".encode()).hexdigest()
    return texts[id(node.resolved())]


def persist_resumable(nodes) -> None:
    """Store each not yet computed node of ``nodes`` under its key, continuing or taking over
    what a killed process left for that key; afterwards each node stands for its stored copy."""
    todo = {id(n.resolved()): n.resolved() for n in nodes if isinstance(n.resolved(), OpNode)}
    keys = {i: graph_key(n) for i, n in todo.items()}
    paths = {i: scratch.resumable_path(keys[i]) for i in todo}
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
    for i, n in todo.items():
        if not any(p is n for p in plain):
            n.resolved().store.resume_key = keys[i]
