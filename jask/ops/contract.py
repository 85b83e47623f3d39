"""Contractions: ``matmul``/``dot``/``tensordot``/``einsum`` over DiskArrays and in-memory operands.

Everything maps onto the tiled ``dot`` (``jask.linalg.dot``), transposes,
size-1 reshapes, broadcasting multiplies and sums, so gradients come from
those ops. An in-memory operand (a weight matrix as a NumPy or concrete JAX
array) is written to scratch once per call; dtypes promote as in jnp.
``einsum`` contracts operands pairwise, left to right: a pair with one
contracted index and at most one free index per side is one ``dot``; any
other pair is a broadcast multiply fused into a sum.
"""
from __future__ import annotations

import string

import jax.numpy as jnp
import numpy as np

from jask.hijax.array import is_disk_array, type_of
from jask.linalg.dot import dot as _dot
from jask.ops import elementwise as ew
from jask.ops import reductions as red
from jask.ops import shape as shp
from jask.ops.operands import as_operand


def _promoted(name, *xs):
    xs = [as_operand(name, x) for x in xs]
    dtype = np.dtype(jnp.result_type(*[type_of(x).dtype for x in xs]))
    return [x if type_of(x).dtype == dtype else ew.astype(x, dtype) for x in xs]


def matmul(a, b):
    """``a @ b`` with NumPy matmul semantics (batched, vectors); either operand may be in memory."""
    if not (is_disk_array(a) or is_disk_array(b)):
        return jnp.matmul(a, b)
    return _dot(*_promoted("matmul", a, b))


def dot(a, b):
    """``jnp.dot`` for 1-D and 2-D operands (equal to matmul there)."""
    if not (is_disk_array(a) or is_disk_array(b)):
        return jnp.dot(a, b)
    if _ndim(a) > 2 or _ndim(b) > 2:
        raise NotImplementedError("jask.numpy.dot of arrays above 2-D is not supported; "
                                  "use jask.numpy.matmul (batched) or einsum instead")
    return matmul(a, b)


def _ndim(x):
    return type_of(x).ndim if is_disk_array(x) else np.ndim(x)


def _parse(subscripts, n):
    if "." in subscripts:
        raise NotImplementedError(f"einsum {subscripts!r}: ellipses are not supported; name every axis")
    subscripts = subscripts.replace(" ", "")
    ins, arrow, out = subscripts.partition("->")
    ins = ins.split(",")
    if len(ins) != n:
        raise ValueError(f"einsum {subscripts!r} names {len(ins)} operands, got {n}")
    if not arrow:
        counts = {c: sum(s.count(c) for s in ins) for c in set("".join(ins))}
        out = "".join(sorted(c for c, k in counts.items() if k == 1))
    for s in ins:
        if len(set(s)) != len(s):
            raise NotImplementedError(f"einsum {subscripts!r}: an index repeated within one operand (a trace or "
                                      "diagonal) is not supported")
    return ins, out


def _sum_out(x, idx, keep):
    """Sum ``x`` (indices ``idx``) over the indices not in ``keep``."""
    axes = tuple(k for k, c in enumerate(idx) if c not in keep)
    if not axes:
        return x, idx
    rest = "".join(c for c in idx if c in keep)
    return (red.sum(x, axis=axes) if rest else red.sum(x)), rest


def _to(x, idx, order):
    """``x`` with indices ``idx`` as indices ``order`` (a superset: missing ones become size-1 axes)."""
    present = [c for c in order if c in idx]
    if list(idx) != present:
        x = shp.transpose(x, [idx.index(c) for c in present])
    missing = tuple(k for k, c in enumerate(order) if c not in idx)
    return shp.expand_dims(x, missing) if missing else x


def _pair(a, ia, b, ib, keep):
    """Contract ``a`` (indices ``ia``) with ``b`` over shared indices not in ``keep``; returns (result, indices)."""
    a, ia = _sum_out(a, ia, keep + ib)
    b, ib = _sum_out(b, ib, keep + ia)
    batch = "".join(c for c in ia if c in ib and c in keep)
    contract = "".join(c for c in ia if c in ib and c not in keep)
    fa = "".join(c for c in ia if c not in ib)
    fb = "".join(c for c in ib if c not in ia)
    if len(contract) == 1 and len(fa) <= 1 and len(fb) <= 1:
        left = _to(a, ia, batch + (fa or "!") + contract)        # "!": a size-1 stand-in for a missing free axis
        right = _to(b, ib, batch + contract + (fb or "?"))
        out = _dot(left, right)
        drop = tuple(k for k, c in enumerate(batch + (fa or "!") + (fb or "?")) if c in "!?")
        return (shp.squeeze(out, drop) if drop else out), batch + fa + fb
    order = batch + fa + fb + contract
    prod = ew.multiply(_to(a, ia, order), _to(b, ib, order))
    return _sum_out(prod, order, keep)


def einsum(subscripts, *operands, optimize=None, precision=None, preferred_element_type=None):
    """``jnp.einsum`` for named indices (no ``...``, no repeated index within an operand)."""
    if not any(is_disk_array(x) for x in operands):
        return jnp.einsum(subscripts, *operands, precision=precision,
                          preferred_element_type=preferred_element_type)
    ins, out = _parse(subscripts, len(operands))
    xs = _promoted("einsum", *operands)
    for x, s in zip(xs, ins):
        if type_of(x).ndim != len(s):
            raise ValueError(f"einsum {subscripts!r}: operand {s!r} has {len(s)} indices but shape {type_of(x).shape}")
    acc, idx = xs[0], ins[0]
    for k in range(1, len(xs)):
        later = out + "".join(ins[k + 1:])
        acc, idx = _pair(acc, idx, xs[k], ins[k], later)
    acc, idx = _sum_out(acc, idx, out)
    if not is_disk_array(acc):
        return acc
    return shp.transpose(acc, [idx.index(c) for c in out]) if idx != out else acc


def tensordot(a, b, axes=2):
    """``jnp.tensordot`` through :func:`einsum` (``axes`` an int or a pair of axis sequences)."""
    na, nb = _ndim(a), _ndim(b)
    if isinstance(axes, (int, np.integer)):
        ax_a, ax_b = list(range(na - axes, na)), list(range(axes))
    else:
        ax_a, ax_b = [list(x) if isinstance(x, (list, tuple)) else [x] for x in axes]
    ax_a, ax_b = [x % na for x in ax_a], [x % nb for x in ax_b]
    letters = iter(string.ascii_letters)
    ia = [next(letters) for _ in range(na)]
    ib = [next(letters) for _ in range(nb)]
    for x, y in zip(ax_a, ax_b):
        ib[y] = ia[x]
    out = [c for k, c in enumerate(ia) if k not in ax_a] + [c for k, c in enumerate(ib) if k not in ax_b]
    return einsum(f"{''.join(ia)},{''.join(ib)}->{''.join(out)}", a, b)
