"""Optimizer state checkpointed in a folder and committed with the parameters, so a killed job resumes exactly.

Why: the moments of :func:`jask.optim.adam` (and of :func:`jask.optim.on_disk`
transforms) are scratch stores, and the step count is a value in memory; both
die with the process. A job killed at step n would restart with parameters of
step n but zeroed moments and count: another trajectory. So:

- :func:`checkpoint_state` writes a state (``opt.init(params)``) to a new folder,
  in one rename: ``jask-state.json`` (each leaf's key path, file, shape, dtype,
  whether it is a DiskArray; written once, never changed) and one Zarr array
  per leaf, ``leaf-<i>.zarr``. Leaves held in memory (a count, a schedule's
  value: JAX or NumPy arrays, Python numbers) are stored flattened to 1-D.
- ``jask.optim.update_params(params, new_params, state=new_state, state_path=...)``
  (:func:`commit`) puts the parameters and every leaf store in ONE
  :func:`jask.update_all` group. The in-memory leaves ride the same group as
  tiny arrays, so no separate file can lag behind it: a kill at any point
  leaves, once any of the arrays is opened again (``from_zarr`` rolls a dead
  group forward), all of them at step n or all at step n+1.
- :func:`load_state` reopens the folder in a new process against a template
  (``opt.init(params)``), refusing one of another structure, shape or dtype.
- Every store of the group records the folder (``jask`` attribute
  ``optimizer_state``, :func:`jask.api.sinks.checkpoint_of`); a commit of one
  of them without the state is refused while the folder exists, since it
  would leave the checkpoint a step behind.

The state's DiskArray leaves are user stores opened ``mode="r+"``: under
``jax.jit`` they are plain DiskArray arguments (their JAX type is shape and
dtype only), so a jitted step neither retraces nor copies them.
"""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from jask.api.sinks import commit_together, to_zarr
from jask.api.sources import from_numpy, from_zarr
from jask.config import config
from jask.graph.nodes import StoredNode
from jask.graph.tiling import block_shape
from jask.hijax import compat
from jask.hijax.array import DiskArray, is_disk_array
from jask.io import durable
from jask.io.destinations import check_destination
from jask.io.owners import sibling
from jask.io.pins import remove_tree
from jask.io.recovery import recover
from jask.io.remote import RemoteStore
from jask.io.urls import parse
from jask.plan.tiling import default_tile

MANIFEST = "jask-state.json"
FORMAT = 1


def _folder(path, call: str) -> str:
    where = parse(path, call)
    if not isinstance(where, str):
        raise ValueError(f"{call}: {path} is a store URL; an optimizer state is committed with the parameters "
                         "as one group, which needs a local folder (object stores have no group commit)")
    return where


def _leaves_with_keys(tree):
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_disk_array)
    return [(jax.tree_util.keystr(k), leaf) for k, leaf in flat], treedef


def _describe(state, call: str) -> list[dict]:
    """One entry per leaf of ``state`` (key, file, shape, dtype, on_disk); refuses leaves that cannot be stored."""
    out = []
    for i, (key, leaf) in enumerate(_leaves_with_keys(state)[0]):
        if compat.is_traced(leaf) or isinstance(leaf, jax.core.Tracer) or \
                (is_disk_array(leaf) and leaf._node is None):
            raise TypeError(f"{call}: state{key} is traced; call {call} outside jit, on the jitted step's result")
        on_disk = is_disk_array(leaf)
        if not on_disk:
            try:
                leaf = np.asarray(leaf)
            except Exception as e:
                raise TypeError(f"{call}: state{key} is a {type(leaf).__name__}, not an array") from e
            if leaf.dtype.kind not in "fiub" and leaf.dtype != jnp.bfloat16:
                raise TypeError(f"{call}: state{key} has dtype {leaf.dtype}; only numeric or boolean "
                                "leaves can be stored")
            leaf = leaf.astype(jax.dtypes.canonicalize_dtype(leaf.dtype))   # as jnp and from_numpy store it
        size = int(np.prod(leaf.shape, dtype=np.int64))
        out.append(dict(key=key, file=f"leaf-{i}.zarr" if size else None, on_disk=on_disk,
                        shape=[int(d) for d in leaf.shape], dtype=str(jnp.dtype(leaf.dtype))))
    return out


def _what(d: dict) -> str:
    return f"shape {tuple(d['shape'])}, dtype {d['dtype']}, {'a DiskArray' if d['on_disk'] else 'in memory'}"


def _check_matches(got: list[dict], want: list[dict], path: str, call: str) -> None:
    """ValueError naming the first leaf where the state ``got`` differs from the checkpoint's ``want``."""
    for g, w in zip(got, want):
        if g["key"] != w["key"]:
            raise ValueError(f"{call}: the state's leaf state{g['key']} is state{w['key']} in the checkpoint at "
                             f"{path}: another optimizer or parameter tree")
        if (g["shape"], g["dtype"], g["on_disk"]) != (w["shape"], w["dtype"], w["on_disk"]):
            raise ValueError(f"{call}: state{g['key']} has {_what(g)}, but the checkpoint at {path} holds "
                             f"{_what(w)} ({w['file']})")
    if len(got) != len(want):
        extra = got[len(want)]["key"] if len(got) > len(want) else want[len(got)]["key"]
        raise ValueError(f"{call}: the state has {len(got)} leaves, the checkpoint at {path} {len(want)} "
                         f"(first unmatched: state{extra}): another optimizer or parameter tree")


def _is_checkpoint(path: str) -> bool:
    """Whether the folder ``path`` holds an optimizer state written by :func:`checkpoint_state`."""
    return os.path.isfile(os.path.join(path, MANIFEST))


def _manifest(path: str, call: str) -> list[dict]:
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{call}: no optimizer checkpoint at {path}; write one first with "
                                "jask.optim.checkpoint_state(opt.init(params), path)")
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            meta = json.load(f)
        if meta["jask_state"] != FORMAT:
            raise ValueError(f"format {meta['jask_state']!r}")
        return meta["leaves"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{call}: {path} is not an optimizer checkpoint written by jask.optim.checkpoint_state "
                         f"(its {MANIFEST} is missing or unreadable: {e})") from e


def checkpoint_state(state, path):
    """Store an optimizer state in a new folder ``path`` and return it with its DiskArray leaves read from there.

    Pass the result to the jitted step, and each step's new state to
    ``jask.optim.update_params(params, new_params, state=new_state, state_path=path)``,
    which commits it with the parameters (see the module docstring). The
    folder appears whole or not at all. An existing ``path`` is refused: to
    continue from a checkpoint, use :func:`load_state`.
    """
    call = "checkpoint_state"
    path = _folder(path, call)
    leaves = _describe(state, call)
    recover(path)                       # a creation killed earlier leaves a hidden -tmp- folder: gone now
    if os.path.lexists(path):
        what = "holds an optimizer checkpoint; continue from it with jask.optim.load_state(opt.init(params), " \
               "path), or remove it to start afresh" if _is_checkpoint(path) else \
               "exists and is not an optimizer checkpoint; choose another path"
        raise FileExistsError(f"{call}: {path} {what}")
    check_destination(path, overwrite=False, call=call)      # its folder exists or can be made, writable
    tmp = sibling(path, "tmp")
    os.makedirs(tmp)
    try:
        for d, (_, leaf) in zip(leaves, _leaves_with_keys(state)[0]):
            if d["file"]:
                x = leaf if d["on_disk"] else from_numpy(np.asarray(leaf).reshape(-1))
                to_zarr(x, os.path.join(tmp, d["file"]), chunks=_chunks(x))
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump({"jask_state": FORMAT, "leaves": leaves}, f, indent=1)
        power = config.durability == "power"
        if power:
            durable.sync_tree(tmp, path)
        os.rename(tmp, path)
        if power:
            durable.sync_parent(path)
    except BaseException:
        remove_tree(tmp)
        raise
    return _reopen(state, path, leaves, call)


STEP_ARRAYS = 8     # arrays an optimizer step's pass holds tiles of: parameters, gradient inputs, moments


def _chunks(x) -> tuple[int, ...]:
    """Chunks the size of an optimizer step's tiles, so each step reads and writes whole chunks.

    (``to_zarr``'s default for a zero state is one chunk per array: a 64 MiB
    moment was one chunk, each step's tiles read from it strided.)
    """
    return block_shape(x.shape, default_tile(x.shape, np.dtype(x.dtype).itemsize, n_inputs=STEP_ARRAYS))


def load_state(template, path):
    """Reopen the optimizer state a run stored at ``path``: ``template`` (``opt.init(params)``) gives its structure.

    The stores are opened first, which finishes a step a killed process was
    committing, so the state matches parameters opened from their stores. A
    folder whose leaves differ from ``template``'s in structure, shape or
    dtype is refused (``ValueError`` naming the leaf, both shapes and the path)
    before anything is read.
    """
    call = "load_state"
    path = _folder(path, call)
    want = _manifest(path, call)
    _check_matches(_describe(template, call), want, path, call)
    return _reopen(template, path, want, call)


def _open_leaf(path: str, d: dict, call: str) -> DiskArray:
    """The leaf's store, opened ``r+``, checked against its entry."""
    file = os.path.join(path, d["file"])
    x = from_zarr(file, mode="r+")
    shape = tuple(d["shape"]) if d["on_disk"] else (int(np.prod(d["shape"], dtype=np.int64)),)
    if x.shape != shape or str(jnp.dtype(x.dtype)) != d["dtype"]:
        raise ValueError(f"{call}: state{d['key']} should be stored with shape {shape} and dtype {d['dtype']}, "
                         f"but {file} holds shape {x.shape} and dtype {x.dtype}")
    return x


def _like(template_leaf, value: np.ndarray):
    """``value`` as the same kind of object as ``template_leaf`` (a JAX array, a NumPy array or scalar, a number)."""
    if isinstance(template_leaf, jax.Array):
        return jnp.asarray(value)
    if isinstance(template_leaf, (bool, int, float, complex)):
        return type(template_leaf)(value.item())
    value = value.astype(np.asarray(template_leaf).dtype)
    return value[()] if isinstance(template_leaf, np.generic) else value


def _reopen(template, path: str, leaves: list[dict], call: str):
    """``template`` with each leaf replaced by the stored one (DiskArrays opened ``r+``, memory leaves read)."""
    flat, treedef = _leaves_with_keys(template)
    opened = [_open_leaf(path, d, call) if d["file"] else None for d in leaves]   # all opened before any read
    out = []
    for d, (_, leaf), x in zip(leaves, flat, opened):
        if d["on_disk"]:
            out.append(x if x is not None else leaf)        # a zero-size DiskArray has nothing to store
            continue
        value = np.zeros(d["shape"], jnp.dtype(d["dtype"])) if x is None else \
            np.asarray(x).reshape(d["shape"]).astype(jnp.dtype(d["dtype"]))
        out.append(_like(leaf, value))
    return jax.tree.unflatten(treedef, out)


def _user_store(p) -> bool:
    node = p._node.resolved() if isinstance(p, DiskArray) and p._node is not None else None
    return isinstance(node, StoredNode) and not node.store.owned and not isinstance(node.store, RemoteStore)


def commit(targets: list, values: list, state, path, resume: bool = False) -> None:
    """Commit parameters ``targets`` <- ``values`` and ``state`` into the checkpoint ``path``, as one group.

    ``state`` is the step's new state; afterwards its DiskArray leaves read
    the committed stores (as ``targets`` do), so it is the next step's input.
    Everything is checked before anything is computed.
    """
    call = "update_params"
    path = _folder(path, call)
    leaves = _manifest(path, call)
    _check_matches(_describe(state, call), leaves, path, call)
    for i, p in enumerate(targets):
        if not _user_store(p):
            raise ValueError(f"{call}: parameter {i} (shape {getattr(p, 'shape', '?')}) is not a local Zarr store "
                             "opened with jask.from_zarr(path, mode='r+'); a checkpointed state is committed "
                             "with the parameters, so they must be stores that outlive the process too")
    flat = [leaf for _, leaf in _leaves_with_keys(state)[0]]
    stored = [(d, leaf) for d, leaf in zip(leaves, flat) if d["file"]]
    leaf_targets = [_open_leaf(path, d, call) for d, _ in stored]
    leaf_values, seen = [], set()
    for d, leaf in stored:
        v = leaf if d["on_disk"] else from_numpy(np.asarray(leaf).reshape(-1))
        if id(v._node.resolved()) in seen:     # update_all takes one value per target: copy a shared one
            v = v + jnp.zeros((), v.dtype)
        seen.add(id(v._node.resolved()))
        leaf_values.append(v)
    commit_together(list(targets) + leaf_targets, list(values) + leaf_values, resume=resume,
                    checkpoint=os.path.abspath(path))
    for (d, leaf), t in zip(stored, leaf_targets):
        if d["on_disk"]:
            leaf._node = t._node        # the new state stands for its committed copy, as persist's arrays do
