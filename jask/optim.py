"""Optimizers over DiskArray parameters, as ``optax.GradientTransformation``s.

Stock optax transforms call ``jnp`` functions (``jnp.zeros_like``, ``jnp.sqrt``)
on every leaf, which cannot dispatch to a disk-backed type without reading it
into memory. These transforms keep optax's interface and state layout (so they
chain with optax's pure-scalar wrappers and plug into ``optax``-style loops)
but compute with jask ops, tile by tile. Moments are ``persist``-ed each step,
deferred to the pass that next runs (the parameter update, which reads them):
that one pass reads the parameters, the gradient's inputs and the old moments
once and writes new parameters and moments, and the next step reads the
stored moments instead of recomputing a growing chain.

:func:`on_disk` runs any stock optax transformation instead (optax's own code,
each jnp primitive on a DiskArray a lazy op; see :mod:`jask.ops.interpret`).

A state that must outlive the process (a job resumed after a kill on the
trajectory it was on): :func:`checkpoint_state`, ``update_params(...,
state=, state_path=)`` and :func:`load_state`, in :mod:`jask.optim_state`.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from jask.graph.op import BlockParallelOp
from jask.hijax import compat
from jask.hijax.array import DiskArray, is_disk_array, type_of, zeros_node
from jask.hijax.make_op import make_op
from jask.linalg.add import add
from jask.linalg.mul import mul
from jask.linalg.square import square
from jask.api.sinks import persist, structure_mismatch, update_all
from jask.io.remote import RemoteStore
from jask.ops.interpret import on_disk as _on_disk_fn
from jask.optim_state import checkpoint_state, commit as _commit_state, load_state  # noqa: F401 (public here)


class AdamDirection(BlockParallelOp):
    """m / (sqrt(v) + eps), elementwise: Adam's step direction."""

    def __init__(self, eps=1e-8):
        self.eps = eps

    def forward_block(self, m_block, v_block):
        return (m_block / (jnp.sqrt(v_block) + self.eps)).astype(m_block.dtype)

    def index_map(self, out_idx):
        return [(out_idx, out_idx)]

    def combine(self, acc, partial):
        return acc + partial

    def backward_block(self, d_out_block, m_block, v_block):
        _, vjp = jax.vjp(self.forward_block, m_block, v_block)
        return vjp(d_out_block)

    def output_shape(self, m_shape, v_shape):
        if m_shape != v_shape:
            raise ValueError(f"adam_direction got incompatible shapes {m_shape}, {v_shape}")
        return m_shape


adam_direction = make_op(AdamDirection, doc="Adam's direction m / (sqrt(v) + eps).")


def zeros_like(x) -> DiskArray:
    """An all-zero DiskArray with ``x``'s shape and dtype; needs no storage (an in-memory ``x``: jnp's zeros)."""
    if not is_disk_array(x):
        return jnp.zeros_like(x)
    t = type_of(x)
    return DiskArray(node=zeros_node(t.shape, t.dtype))


def _per_leaf(disk_fn, memory_fn):
    """``disk_fn`` where a DiskArray is among the arguments, else ``memory_fn``: parameter trees may mix
    DiskArrays with small in-memory arrays (a bias kept in memory), as optax's would."""
    return lambda *xs: disk_fn(*xs) if any(is_disk_array(x) for x in xs) else memory_fn(*xs)


_add = _per_leaf(add, jnp.add)
_mul = _per_leaf(mul, lambda x, s: (x * s).astype(x.dtype))
_square = _per_leaf(square, jnp.square)


class ScaleByAdamState(NamedTuple):
    count: jax.Array
    mu: optax.Updates
    nu: optax.Updates


def _leaves(tree):
    return jax.tree.leaves(tree, is_leaf=is_disk_array)


def _map(f, *trees):
    return jax.tree.map(f, *trees, is_leaf=is_disk_array)


def _persist_tree(tree):
    """``tree`` with its DiskArray leaves stored, all in the next pass that runs (``persist(defer=True)``)."""
    leaves, treedef = jax.tree.flatten(tree, is_leaf=is_disk_array)
    disk = [i for i, x in enumerate(leaves) if is_disk_array(x)]
    if disk:
        stored = persist(*[leaves[i] for i in disk], defer=True)
        for i, x in zip(disk, stored if isinstance(stored, tuple) else (stored,)):
            leaves[i] = x
    return jax.tree.unflatten(treedef, leaves)


def adam(learning_rate, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> optax.GradientTransformation:
    """Adam (Kingma & Ba) for DiskArray parameters.

    Parameters
    ----------
    learning_rate : float or callable
        A constant, or an optax schedule ``count -> scalar``.
    """

    def init_fn(params):
        return ScaleByAdamState(jnp.zeros([], jnp.int32), _map(zeros_like, params), _map(zeros_like, params))

    def update_fn(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count) if hasattr(optax, "safe_increment") else state.count + 1
        mu = _map(lambda g, m: _add(_mul(m, b1), _mul(g, 1.0 - b1)), updates, state.mu)
        nu = _map(lambda g, v: _add(_mul(v, b2), _mul(_square(g), 1.0 - b2)), updates, state.nu)
        # stored in the pass that next runs (the parameter update reads them): W, g's inputs, m and v once
        mu, nu = _persist_tree((mu, nu))
        t = count.astype(jnp.float32)
        c1 = 1.0 / (1.0 - jnp.float32(b1) ** t)
        c2 = 1.0 / (1.0 - jnp.float32(b2) ** t)
        lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
        step = _map(lambda m, v: _mul(_direction(_mul(m, c1), _mul(v, c2), eps),
                                      -jnp.asarray(lr, jnp.float32)), mu, nu)
        return step, ScaleByAdamState(count, mu, nu)

    return optax.GradientTransformation(init_fn, update_fn)


def _direction(m, v, eps):
    """:class:`AdamDirection` of one leaf: the tiled op, or its block formula on in-memory moments."""
    return adam_direction(m, v, eps=eps) if is_disk_array(m) else AdamDirection(eps).forward_block(m, v)


def on_disk(transformation: optax.GradientTransformation) -> optax.GradientTransformation:
    """Any stock optax transformation (``optax.adamw(...)``, a ``chain``) run on DiskArray parameters.

    optax computes with ``jax.numpy`` functions, which cannot take a DiskArray;
    wrapped, its ``init`` and ``update`` run through :func:`jask.on_disk`: the
    same code, each primitive that touches a DiskArray a lazy tiled op, so
    moments of DiskArray parameters are DiskArrays and nothing parameter-sized
    is held in memory. The new state's DiskArrays are stored with the next pass
    that runs (``persist(defer=True)``), so step k does not recompute steps
    before it. Apply the updates with :func:`apply_updates` (or
    ``jask.on_disk(optax.apply_updates)``).
    """
    init, update = _on_disk_fn(transformation.init), _on_disk_fn(transformation.update)

    def update_fn(updates, state, params=None, **extra):
        updates, state = update(updates, state, params, **extra)
        return updates, _persist_tree(state)

    return transformation._replace(init=init, update=update_fn)


def sgd(learning_rate) -> optax.GradientTransformation:
    """Plain gradient descent for DiskArray parameters.

    ``learning_rate``: a number, a JAX scalar (traced too), or an optax schedule
    ``count -> scalar`` (the state then counts steps, as ``optax.sgd``'s does).
    """
    scheduled = callable(learning_rate)

    def init_fn(params):
        return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32)) if scheduled else optax.EmptyState()

    def update_fn(updates, state, params=None):
        if scheduled:
            lr, state = learning_rate(state.count), optax.ScaleByScheduleState(count=state.count + 1)
        else:
            lr = learning_rate
        factor = -float(lr) if isinstance(lr, (int, float)) else -jnp.asarray(lr, jnp.float32)
        return _map(lambda g: _mul(g, factor), updates), state

    return optax.GradientTransformation(init_fn, update_fn)


def apply_updates(params, updates):
    """``params + updates`` leaf by leaf (lazy); follow with :func:`update_params`."""
    return _map(_add, params, updates)


def update_params(params, new_params, resume: bool = False, state=None, state_path=None) -> None:
    """Commit new values into the parameter arrays in place, keeping their identity: after a crash, all old or all new.

    Parameters in local stores go through :func:`jask.update_all`: every new
    value in one pass, committed as one group, so a step killed between two
    commits is finished by the next open instead of leaving parameters of two
    steps; ``resume=True`` continues a killed step's computation. Where any
    parameter lives at a store URL (no group commit there), each is updated
    alone with ``update_`` (each atomic by itself).

    ``state`` (the step's new optimizer state) with ``state_path`` (a folder
    made by :func:`checkpoint_state`) commits the state's leaves, moments and
    count alike, in the same group as the parameters (local stores opened
    ``mode="r+"``), and leaves ``state``'s DiskArrays reading the committed
    stores: a job killed at any point restarts (:func:`load_state`) with
    parameters and state of one step. From then on, those stores refuse a
    commit without the state while the folder exists. See :mod:`jask.optim_state`.
    """
    _check_eager(params, new_params)
    mismatch = structure_mismatch(params, new_params, ("params", "new_params"))
    if mismatch is not None:   # leaves are paired in order: a renamed key would write one into another
        raise ValueError(f"update_params: params and new_params differ in structure: {mismatch}")
    targets = _leaves(params)
    values = _leaves(new_params)
    if (state is None) != (state_path is None):
        raise ValueError("update_params: pass state= (the step's new optimizer state) and state_path= (its "
                         "checkpoint folder, from jask.optim.checkpoint_state) together")
    if state_path is not None:
        _commit_state(targets, values, state, state_path, resume=resume)
        return
    if any(_at_url(p) for p in targets):
        for p, q in zip(targets, values):
            p.update_(q, resume=resume)
        return
    update_all(targets, values, resume=resume)


def _check_eager(params, new_params) -> None:
    """update_params commits stores in place: eagerly, DiskArray parameters only, with a message saying so."""
    if any(compat.is_traced(x) for x in jax.tree.leaves((params, new_params), is_leaf=is_disk_array)):
        raise TypeError("update_params cannot run inside jit: return the new parameters (and state) from the "
                        "jitted step and call jask.optim.update_params on its result")
    for path, p in jax.tree_util.tree_flatten_with_path(params, is_leaf=is_disk_array)[0]:
        if not is_disk_array(p):
            where = jax.tree_util.keystr(path) or "the root"
            raise TypeError(f"update_params: the parameter at {where} is an in-memory {type(p).__name__}, not a "
                            "DiskArray: only arrays in stores are committed in place; keep an in-memory "
                            "parameter's new value from the step's result instead")


def _at_url(p: DiskArray) -> bool:
    """Whether ``p`` is stored at a store URL."""
    return isinstance(getattr(p._node.resolved(), "store", None), RemoteStore)
