"""The gradient of a softmax within its budget: a plan charges a fused chain as its windows do.

Producers inlined in their consumer's program (the backward's chain of seven ops) hold no tile of
their own: the window schedule never charged them, and the planner's two slots each took the plan of a
256 MiB gradient to tiles of half its chunks' edge, whose reads kept whole chunks decoded (138-147 MiB
over a 64 MB budget, 98-116 MiB once the plan kept the chunks' edge).
"""
import jax
import numpy as np
import pytest
import zarr

import jask
import jask.nn
from jask.exec import driver
from jask.io import decoded_chunks

# test_logsumexp_pass's tolerance for softmax gradients: a TPU v5e's exp is up to 58 ulp off on [-1, 0], and
# one element of 4096 came out 2.2e-5 relative off there (2026-12-07; 3e-6 absolute of -0.14 after cancellation)
GRAD_RTOL = 1e-4


def _pair(shape, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 3).astype(np.float32), rng.standard_normal(shape).astype(np.float32)


def _softmax_grad(x, b, axis):
    """d/dx sum(softmax(x) * b) in NumPy: s * (b - sum(s * b))."""
    s = np.exp(x - x.max(axis=axis, keepdims=True))
    s /= s.sum(axis=axis, keepdims=True)
    return s * (b - (s * b).sum(axis=axis, keepdims=True))


def _plan(array):
    """The plan computing a lazy ``array`` runs (what ``jask.explain`` describes)."""
    return driver.make_plan([array._node])


@pytest.mark.parametrize("axis", [0, 1])
def test_softmax_gradient_plans_within_a_budget_its_windows_fit(small_tiles, axis):
    """At edge 4 the backward's plan projects 960 bytes; charging the chain's six inlined ops two tiles each
    projected 1728 bytes, over this 1.6 KiB budget: the plan was refused."""
    x, b = _pair((24, 20))
    a, bb = jask.from_numpy(x), jask.from_numpy(b)
    jask.set_memory_budget(1600)
    with jask.profile() as forward:
        grad = jax.grad(lambda v: jask.sum(jask.nn.softmax(v, axis=axis) * bb))(a)
    p = _plan(grad)
    assert p.tile == 4 and p.projected_bytes <= 1600
    assert [[p.prepared[id(n)].name for n in g] for g in p.groups] == [["stop_gradient"], ["grad[subtract]"], ["add"]]
    with jask.profile() as backward:
        got = np.asarray(grad)
    np.testing.assert_allclose(got, _softmax_grad(x, b, axis), rtol=GRAD_RTOL, atol=1e-6)
    assert (forward.plans, backward.plans) == (1, 1)
    assert backward.kernel_calls == backward.windows >= 30       # the gradient's 6 x 5 tiles, at least
    # x and b twice each (the sums of s * b, then the gradient), plus a few 16-byte logsumexp tiles per window
    assert 4 * x.nbytes <= backward.bytes_read <= 4 * x.nbytes + 4 * 16 * backward.windows


def test_softmax_gradient_keeps_its_chunks_edge(tmp_path):
    """At a 64 KiB budget the gradient of (64, 64) stores in zstd chunks of 32 plans tiles of 32 (the old
    projection took 16): each tile one whole chunk, so no read keeps a decoded chunk for the next tile."""
    x, b = _pair((64, 64), 1)
    for name, v in (("x", x), ("b", b)):
        zarr.create_array(str(tmp_path / f"{name}.zarr"), shape=v.shape, chunks=(32, 32), dtype=v.dtype)[...] = v
    a, bb = jask.from_zarr(str(tmp_path / "x.zarr")), jask.from_zarr(str(tmp_path / "b.zarr"))
    jask.set_memory_budget(64 * 1024)
    grad = jax.grad(lambda v: jask.sum(jask.nn.softmax(v, axis=1) * bb))(a)
    p = _plan(grad)
    assert p.tile == 32 and p.projected_bytes <= 64 * 1024
    decodes = decoded_chunks.live()["decodes"]
    with jask.profile() as backward:
        got = np.asarray(grad)
    np.testing.assert_allclose(got, _softmax_grad(x, b, 1), rtol=GRAD_RTOL, atol=1e-6)
    assert decoded_chunks.live()["decodes"] == decodes
    assert backward.plans == 1 and backward.windows >= 4          # the gradient's 2 x 2 tiles, at least
    assert 4 * x.nbytes <= backward.bytes_read <= 4 * x.nbytes + x.nbytes // 4
