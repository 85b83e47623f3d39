"""Property tests: random compositions of jask ops against the same expression in plain jnp.

Hypothesis draws an expression DAG (depth 2-4) over fresh and shared inputs
and shared intermediate values: ``add``, ``sub``, ``mul`` (array * array,
* Python number, * traced JAX scalar on either side, * the ``sum`` of another
expression), ``square``, unary minus, the user-defined ``cube`` from
``test_user_op.py``, ``transpose`` (any axes, and ``.T``), ``dot`` (matrix,
batched, 3-D @ 2-D, matrix-vector, vector-matrix), written through functions
and operators alike. Shapes have rank 1-3 with dims from {1, 2, 3, 5, 7, 8,
11, 13} (1 and primes: ragged against every tile), at most 4 tiles per axis
(2 on pallas-interpret); tile edges are forced to one of {1, 2, 3, 4, 8};
dtypes are float32, float16 and bfloat16. Each example checks, on one
backend and in one mode (eager or under ``jax.jit``), against jnp:

* the value of the expression (a DiskArray: shape, dtype and elements),
* ``jax.value_and_grad`` of ``sum(expr * W)`` (random ``W``): the loss, and
  the gradient for every input array and every JAX scalar.

Tolerances come from a forward error bound, not from a guess per dtype: the
same expression evaluated in float64 NumPy on ``|inputs|`` with every op
replaced by its absolute-value form (``|a| + |b|`` for ``a - b``,
``|A| @ |B|``...) bounds the size of every rounding error, and each op adds at
most one unit roundoff ``u`` of it (``k u`` for a contraction of length
``k``). An element may differ from jnp by ``4 K u bound + 2 K tiny``, where
``K`` counts the rounding steps below it (``u`` = 2^-24, 2^-11, 2^-8;
``tiny`` covers flushed subnormals). Gradients use the gradient of the bound
(a NumPy reverse pass, so the oracle shares no code with JAX's autodiff).

Profiles (registered in ``conftest.py``): ``ci`` (default) runs 12 examples
of the xla property and 4 of the pallas-interpret one, the same ones every
run; ``JASK_HYPOTHESIS_PROFILE=long`` (or ``--hypothesis-profile=long``)
runs 500 and 100, new ones each run. Neither keeps an example database.
``--hypothesis-show-statistics`` prints examples run and what they covered.
"""
from __future__ import annotations

import dataclasses
import operator
import os
import traceback

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, note, settings
from hypothesis import strategies as st

import jask
from test_user_op import cube

DIMS = (1, 2, 3, 5, 7, 8, 11, 13)
TILES = (1, 2, 3, 4, 8)
DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
          "bfloat16": np.dtype(ml_dtypes.bfloat16)}
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
LARGEST_BOUND = {"float32": 1e30, "float16": 1e4, "bfloat16": 1e30}  # keep float16 clear of overflow (65504)
CONSTANTS = (0.5, -1.5, 2.0, -0.25)   # exact in every dtype: the product rounds once
SCALARS = (0.75, -1.25, 1.5)

EXAMPLES = settings().max_examples                        # from the loaded profile
PALLAS_EXAMPLES = max(4, EXAMPLES // 5)
# Also without tests/conftest.py's profiles: examples take seconds (compilation), none may be stored.
PROPERTY = settings(deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---------------------------------------------------------------- expressions

@dataclasses.dataclass(eq=False)
class Expr:
    """One node of an expression DAG; the same object used twice is one shared value."""

    op: str
    args: tuple
    shape: tuple
    param: object = None
    form: str = "fn"          # "fn": jask.add(a, b); "op": a + b (jask side only)

    def __repr__(self):
        inner = ", ".join(map(repr, self.args))
        if self.op == "input":
            return f"x{self.param}{list(self.shape)}"
        if self.op in ("mulc", "muls"):
            return f"mul({inner}, {'s' if self.op == 'muls' else ''}{self.param[0]})"
        extra = f", axes={self.param}" if self.op == "transpose" else ""
        return f"{self.op}({inner}{extra})"


@dataclasses.dataclass
class Program:
    root: Expr
    inputs: list          # shapes of the input arrays x0, x1, ...
    scalars: list         # values of the JAX scalar inputs s0, s1, ...
    tile: int
    dtype: str
    seed: int

    def __repr__(self):
        return (f"Program({self.root!r}, scalars={self.scalars}, tile={self.tile}, dtype={self.dtype}, "
                f"seed={self.seed})")


class _Builder:
    """Draws an expression of a requested shape, reusing inputs and subexpressions of that shape."""

    def __init__(self, draw, dims):
        self.draw, self.dims = draw, dims
        self.inputs: list = []
        self.scalars: list = []
        self.made: dict = {}      # shape -> expressions built so far

    def dim(self):
        return self.draw(st.sampled_from(self.dims))

    def leaf(self, shape):
        same = [i for i, s in enumerate(self.inputs) if s == shape]
        if same and self.draw(st.booleans()):
            return Expr("input", (), shape, self.draw(st.sampled_from(same)))
        self.inputs.append(shape)
        return Expr("input", (), shape, len(self.inputs) - 1)

    def expr(self, shape, depth):
        if depth == 0:
            return self.leaf(shape)
        if self.made.get(shape) and self.draw(st.integers(0, 4)) == 0:
            return self.draw(st.sampled_from(self.made[shape]))   # a shared intermediate value
        ops = ["add", "sub", "mul", "mulc", "muls", "mulsum", "square", "neg", "cube", "dot", "dot"]
        if len(shape) >= 2:
            ops += ["transpose", "transpose"]   # tile-index mappings: where tiling bugs live
        e = getattr(self, "_" + self.draw(st.sampled_from(ops)))(shape, depth)
        self.made.setdefault(shape, []).append(e)
        return e

    def _sub_depth(self, depth):
        return self.draw(st.integers(0, depth - 1))

    def _form(self):
        return self.draw(st.sampled_from(("fn", "op")))

    def _binary(self, name, shape, depth):
        a = self.expr(shape, depth - 1)
        b = self.expr(shape, self._sub_depth(depth))
        return Expr(name, (a, b), shape, form=self._form())

    _add = lambda self, s, d: self._binary("add", s, d)
    _sub = lambda self, s, d: self._binary("sub", s, d)
    _mul = lambda self, s, d: self._binary("mul", s, d)

    def _unary(self, name, shape, depth):
        return Expr(name, (self.expr(shape, depth - 1),), shape, form=self._form())

    _square = lambda self, s, d: self._unary("square", s, d)
    _neg = lambda self, s, d: self._unary("neg", s, d)
    _cube = lambda self, s, d: self._unary("cube", s, d)

    def _mulc(self, shape, depth):
        c = self.draw(st.sampled_from(CONSTANTS))
        side = self.draw(st.sampled_from(("right", "left", "fn")))
        return Expr("mulc", (self.expr(shape, depth - 1),), shape, (c, side))

    def _muls(self, shape, depth):
        self.scalars.append(self.draw(st.sampled_from(SCALARS)))
        side = self.draw(st.sampled_from(("right", "left", "fn")))
        return Expr("muls", (self.expr(shape, depth - 1),), shape, (len(self.scalars) - 1, side))

    def _mulsum(self, shape, depth):
        """``a * sum(b)``: a reduction's scalar result used as a traced factor."""
        other = tuple(self.dim() for _ in range(self.draw(st.integers(1, 2))))
        a = self.expr(shape, depth - 1)
        b = self.expr(other, self._sub_depth(depth))
        return Expr("mulsum", (a, b), shape)

    def _transpose(self, shape, depth):
        axes = tuple(self.draw(st.permutations(range(len(shape)))))
        child = [0] * len(shape)
        for i, a in enumerate(axes):
            child[a] = shape[i]
        form = self._form() if axes == tuple(reversed(range(len(shape)))) else "fn"
        return Expr("transpose", (self.expr(tuple(child), depth - 1),), shape, axes, form=form)

    def _dot(self, shape, depth):
        k = self.dim()
        if len(shape) == 1:
            a_shape, b_shape = (((shape[0], k), (k,)) if self.draw(st.booleans()) else ((k,), (k, shape[0])))
        elif len(shape) == 2:
            a_shape, b_shape = (shape[0], k), (k, shape[1])
        else:
            b_shape = (shape[0], k, shape[2]) if self.draw(st.booleans()) else (k, shape[2])
            a_shape = (shape[0], shape[1], k)
        a = self.expr(a_shape, depth - 1)
        b = self.expr(b_shape, self._sub_depth(depth))
        return Expr("dot", (a, b), shape, k, form=self._form())


@st.composite
def programs(draw, dtypes=tuple(DTYPES), max_rank=3, max_depth=4, max_tiles_per_axis=4):
    """An expression with its tile edge and dtype; dims stay within ``max_tiles_per_axis`` tiles."""
    tile = draw(st.sampled_from(TILES))
    dims = tuple(d for d in DIMS if d <= max_tiles_per_axis * tile)
    b = _Builder(draw, dims)
    shape = tuple(b.dim() for _ in range(draw(st.integers(1, max_rank))))
    root = b.expr(shape, draw(st.integers(2, max_depth)))
    return Program(root, b.inputs, b.scalars, tile, draw(st.sampled_from(dtypes)),
                   draw(st.integers(0, 2**16)))


# ---------------------------------------------------------------- three evaluations of one expression

def _jask_op(e, xs, scalars):
    """One node on the jask side, through functions or operators as the node says."""
    fn = e.form == "fn"
    if e.op in ("add", "sub", "mul"):
        return getattr(jask, e.op)(*xs) if fn else getattr(operator, e.op)(*xs)
    if e.op in ("mulc", "muls"):
        factor = e.param[0] if e.op == "mulc" else scalars[e.param[0]]
        side = e.param[1]
        return jask.mul(xs[0], factor) if side == "fn" else (xs[0] * factor if side == "right" else factor * xs[0])
    if e.op == "mulsum":
        return xs[0] * jask.sum(xs[1])
    if e.op == "square":
        return jask.square(xs[0]) if fn else xs[0] ** 2
    if e.op == "neg":
        return -xs[0]
    if e.op == "cube":
        return cube(xs[0])
    if e.op == "transpose":
        return jask.transpose(xs[0], axes=e.param) if fn else xs[0].T
    if e.op == "dot":
        return jask.dot(*xs) if fn else xs[0] @ xs[1]
    raise AssertionError(e.op)


def _jnp_op(e, xs, scalars):
    if e.op in ("add", "sub", "mul"):
        return getattr(operator, e.op)(*xs)
    if e.op == "mulc":
        return xs[0] * e.param[0]
    if e.op == "muls":
        return xs[0] * scalars[e.param[0]]
    if e.op == "mulsum":
        return xs[0] * jnp.sum(xs[1])
    if e.op == "square":
        return jnp.square(xs[0])
    if e.op == "neg":
        return -xs[0]
    if e.op == "cube":
        return xs[0] * xs[0] * xs[0]
    if e.op == "transpose":
        return jnp.transpose(xs[0], e.param)
    if e.op == "dot":
        return jnp.matmul(*xs)
    raise AssertionError(e.op)


def _bound_op(e, xs, scalars):
    """The absolute-value form of a node (inputs already non-negative): a bound on every term's size."""
    if e.op in ("add", "sub"):
        return xs[0] + xs[1]
    if e.op == "mulc":
        return xs[0] * abs(e.param[0])
    if e.op == "muls":
        return xs[0] * scalars[e.param[0]]
    if e.op == "mulsum":
        return xs[0] * np.sum(xs[1])
    if e.op == "neg":
        return xs[0]
    if e.op == "transpose":
        return np.transpose(xs[0], e.param)
    if e.op == "dot":
        return np.matmul(*xs)
    if e.op == "mul":
        return xs[0] * xs[1]
    if e.op == "square":
        return xs[0] * xs[0]
    if e.op == "cube":
        return xs[0] * xs[0] * xs[0]
    raise AssertionError(e.op)


def _unbroadcast(g, shape):
    """Sum a gradient over the leading axes that broadcasting added."""
    return g.sum(axis=tuple(range(g.ndim - len(shape)))) if g.ndim > len(shape) else g


def _bound_vjp(e, xs, scalars, g, scalar_grads):
    """Cotangents of a bound node's inputs (the bound's own gradient, in NumPy)."""
    if e.op in ("add", "sub"):
        return [g, g]
    if e.op == "mul":
        return [g * xs[1], g * xs[0]]
    if e.op == "mulc":
        return [g * abs(e.param[0])]
    if e.op == "muls":
        scalar_grads[e.param[0]] += np.sum(g * xs[0])
        return [g * scalars[e.param[0]]]
    if e.op == "mulsum":
        return [g * np.sum(xs[1]), np.full(xs[1].shape, np.sum(g * xs[0]))]
    if e.op == "square":
        return [2 * xs[0] * g]
    if e.op == "cube":
        return [3 * xs[0] * xs[0] * g]
    if e.op == "neg":
        return [g]
    if e.op == "transpose":
        return [np.transpose(g, np.argsort(e.param))]
    a, b = xs
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    g2 = g[..., None, :] if a.ndim == 1 else g
    g2 = g2[..., None] if b.ndim == 1 else g2
    ga = _unbroadcast(g2 @ np.swapaxes(b2, -1, -2), a2.shape)
    gb = _unbroadcast(np.swapaxes(a2, -1, -2) @ g2, b2.shape)
    return [ga[0] if a.ndim == 1 else ga, gb[:, 0] if b.ndim == 1 else gb]


def bound_and_grads(root, arrays, scalars, w):
    """The bound of the expression, and of the gradients of ``sum(expr * w)`` (all float64, non-negative)."""
    memo, order = {}, []

    def go(e):
        if id(e) not in memo:
            memo[id(e)] = arrays[e.param] if e.op == "input" else _bound_op(e, [go(a) for a in e.args], scalars)
            order.append(e)
        return memo[id(e)]

    out = go(root)
    cot = {id(root): w}
    grads = [np.zeros_like(a) for a in arrays]
    scalar_grads = [np.zeros(()) for _ in scalars]
    for e in reversed(order):       # consumers before producers
        g = cot.pop(id(e), None)
        if g is None:
            continue
        if e.op == "input":
            grads[e.param] = grads[e.param] + g
            continue
        for a, ga in zip(e.args, _bound_vjp(e, [memo[id(a)] for a in e.args], scalars, g, scalar_grads)):
            cot[id(a)] = cot[id(a)] + ga if id(a) in cot else ga
    return out, grads + scalar_grads


def evaluate(root, node_fn, arrays, scalars):
    """Evaluate the DAG bottom-up; a node used twice is computed once (so jask sees a shared value)."""
    memo = {}

    def go(e):
        if id(e) not in memo:
            memo[id(e)] = arrays[e.param] if e.op == "input" else node_fn(e, [go(a) for a in e.args], scalars)
        return memo[id(e)]

    return go(root)


def rounding_steps(root) -> int:
    """K: rounding errors of size u * bound that can reach the root (first order, see the module doc)."""
    memo = {}

    def k(e):
        if id(e) in memo:
            return memo[id(e)]
        ks = [k(a) for a in e.args]
        if e.op == "input":
            r = 0
        elif e.op in ("add", "sub", "mul"):
            r = ks[0] + ks[1] + 1
        elif e.op in ("mulc", "muls"):
            r = ks[0] + 1
        elif e.op == "mulsum":
            r = ks[0] + ks[1] + int(np.prod(e.args[1].shape)) + 2
        elif e.op == "square":
            r = 2 * ks[0] + 1
        elif e.op == "cube":
            r = 3 * ks[0] + 2
        elif e.op in ("neg", "transpose"):
            r = ks[0]
        elif e.op == "dot":
            r = ks[0] + ks[1] + e.param + 1
        else:
            raise AssertionError(e.op)
        memo[id(e)] = r
        return r

    return k(root)


# ---------------------------------------------------------------- the property

@dataclasses.dataclass
class Case:
    """Data, references and tolerances of one program."""

    prog: Program
    arrays: list            # input arrays in the program's dtype (NumPy)
    scalars: list           # JAX scalars in the program's dtype
    W: np.ndarray
    want: np.ndarray
    want_loss: np.ndarray   # sum(expr * W): the scalar the gradients are taken of
    want_grads: list
    value_tol: np.ndarray
    loss_tol: float
    grad_tols: list


def _case(prog: Program) -> Case:
    dtype = DTYPES[prog.dtype]
    rng = np.random.default_rng(prog.seed)
    arrays = [rng.uniform(-0.5, 0.5, s).astype(dtype) for s in prog.inputs]  # products shrink: less overflow
    scalars = [jnp.asarray(v, dtype) for v in prog.scalars]
    W = rng.uniform(-1, 1, prog.root.shape).astype(dtype)
    n = len(arrays)

    def value_and_grads(node_fn, args, w):
        """The expression and, by one VJP with cotangent ``w``, the gradients of ``sum(expr * w)``."""
        out, vjp = jax.vjp(lambda *a: evaluate(prog.root, node_fn, a[:n], a[n:]), *args)
        return out, vjp(w)

    @jax.jit   # one compilation per example instead of one per primitive and shape
    def reference(args, w):
        return value_and_grads(_jnp_op, args, w)

    # The oracle runs on the host CPU (IEEE arithmetic, subnormals kept), whatever device jask computes on.
    with jax.default_device(jax.devices("cpu")[0]):
        args = [jnp.asarray(a) for a in arrays] + [jnp.asarray(v) for v in scalars]
        want, want_grads = jax.tree.map(np.asarray, reference(args, jnp.asarray(W)))
        want_loss = np.asarray(jnp.sum(jnp.asarray(want) * jnp.asarray(W)))
    bound, bound_grads = bound_and_grads(prog.root, [np.abs(a.astype(np.float64)) for a in arrays],
                                         [abs(float(v)) for v in prog.scalars], np.abs(W.astype(np.float64)))
    limit = LARGEST_BOUND[prog.dtype]
    assume(np.all(bound < limit) and all(np.all(g < limit) for g in bound_grads))

    u, tiny = UNIT_ROUNDOFF[prog.dtype], float(ml_dtypes.finfo(dtype).tiny)   # numpy's finfo knows bfloat16 only with some ml_dtypes
    k = rounding_steps(prog.root)
    k_grad = 2 * k + W.size + 2       # the backward pass, and the loss's own product and sum
    k_loss = k + W.size + 1
    bound_loss = float(np.sum(bound * np.abs(W.astype(np.float64))))
    value_tol = 4 * k * u * bound + 2 * k * tiny
    loss_tol = 4 * k_loss * u * bound_loss + 2 * k_loss * tiny
    grad_tols = [4 * k_grad * u * g + 2 * k_grad * tiny for g in bound_grads]
    return Case(prog, arrays, scalars, W, want, want_loss, list(want_grads), value_tol, loss_tol, grad_tols)


def _close(got, want, tol, what):
    got = np.asarray(got, np.float32)
    want = np.asarray(want, np.float32)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    err = np.abs(got - want)
    bad = ~(err <= tol)   # NaN counts as a mismatch
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(np.atleast_1d(bad))[0]) if got.ndim else ()
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} elements off, e.g. at {i}: "
                             f"got {got[i]}, expected {want[i]} (tolerance {np.asarray(tol)[i]:.3g})")


def _check(prog: Program, backend: str, mode: str) -> None:
    """Run one example; on failure drop the frames' DiskArrays, which would keep scratch stores alive."""
    try:
        _compare(prog, backend, mode)
    except BaseException as e:
        traceback.clear_frames(e.__traceback__)
        raise


def _compare(prog: Program, backend: str, mode: str) -> None:
    case = _case(prog)
    jask.config.update("tile", prog.tile)
    jask.config.update("backend", backend)
    n = len(case.arrays) + len(case.scalars)
    disk = [jask.from_numpy(a) for a in case.arrays]
    w = jask.from_numpy(case.W)

    def value(*args):
        return evaluate(prog.root, _jask_op, args[:len(disk)], args[len(disk):])

    def loss(*args):
        return jask.sum(value(*args[:n]) * args[n])

    wrap = jax.jit if mode == "jit" else (lambda f: f)
    out = wrap(value)(*disk, *case.scalars)
    assert isinstance(out, jask.DiskArray), type(out)
    assert out.dtype == case.want.dtype, f"value dtype {out.dtype}, expected {case.want.dtype}"
    _close(out, case.want, case.value_tol, "value")

    got_loss, grads = wrap(jax.value_and_grad(loss, argnums=tuple(range(n))))(*disk, *case.scalars, w)
    assert got_loss.dtype == case.want_loss.dtype, f"loss dtype {got_loss.dtype}, expected {case.want_loss.dtype}"
    _close(got_loss, case.want_loss, case.loss_tol, "loss sum(expr * W)")
    for i, (g, want, tol) in enumerate(zip(grads, case.want_grads, case.grad_tols)):
        name = f"d/dx{i}" if i < len(disk) else f"d/ds{i - len(disk)}"
        if i < len(disk):
            assert isinstance(g, jask.DiskArray), f"{name} is a {type(g).__name__}, not a DiskArray"
        assert g.dtype == want.dtype, f"{name}: dtype {g.dtype}, expected {want.dtype}"
        _close(g, want, tol, name)


MODES = st.sampled_from(["eager", "jit"])


def _record(prog: Program, backend: str, mode: str) -> None:
    """Say what the example is (shown on failure) and count what it covers (``--hypothesis-show-statistics``)."""
    note(f"{prog!r}, backend={backend!r}, mode={mode!r}")
    event(f"dtype={prog.dtype}")
    event(f"tile={prog.tile}")
    event(f"mode={mode}")
    event(f"rank={len(prog.root.shape)}")
    seen, uses = set(), {}

    def walk(e):
        uses[id(e)] = uses.get(id(e), 0) + 1
        if id(e) in seen:
            return
        seen.add(id(e))
        how = e.param[1] if e.op in ("mulc", "muls") else e.form
        event(f"op={e.op}" + ("" if e.op in ("input", "mulsum", "neg", "cube") else f"/{how}"))
        for a in e.args:
            walk(a)

    walk(prog.root)
    if any(n > 1 for n in uses.values()):
        event("shared value or input")


@pytest.mark.slow
@PROPERTY
@given(prog=programs(), mode=MODES)
def test_compositions_xla(prog, mode):
    _record(prog, "xla", mode)
    _check(prog, "xla", mode)


@pytest.mark.slow
@settings(PROPERTY, max_examples=PALLAS_EXAMPLES)
@given(prog=programs(max_rank=2, max_depth=3, max_tiles_per_axis=2), mode=MODES)
def test_compositions_pallas_interpret(prog, mode):
    _record(prog, "pallas-interpret", mode)
    _check(prog, "pallas-interpret", mode)


# ---------------------------------------------------------------- the machinery itself

def test_bound_catches_a_wrong_value():
    """Guard on the tolerance: one element off by 1% of a float32 result fails the check."""
    a = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    root = Expr("sub", (Expr("input", (), (3, 4), 0), Expr("input", (), (3, 4), 1)), (3, 4))
    prog = Program(root, [(3, 4), (3, 4)], [], 4, "float32", 0)
    bound = evaluate(root, _bound_op, [np.abs(a), np.abs(a)], [])
    tol = 4 * rounding_steps(root) * UNIT_ROUNDOFF["float32"] * bound
    _close(a - a, np.zeros_like(a), tol, "exact")
    wrong = (a - a).copy()
    wrong[1, 2] += 0.01
    with pytest.raises(AssertionError, match=r"1 of 12 elements off, e.g. at \(1, 2\)"):
        _close(wrong, np.zeros_like(a), tol, "value")
    assert repr(prog).startswith("Program(sub(x0[3, 4], x1[3, 4])")


def test_profile_is_bounded_and_private():
    """Every profile keeps no example database and has no deadline; CI's is bounded and reproducible."""
    s = settings()
    assert s.database is None and s.deadline is None
    if os.environ.get("JASK_HYPOTHESIS_PROFILE", "ci") == "ci":
        assert s.derandomize and s.max_examples == 12 and PALLAS_EXAMPLES == 4
