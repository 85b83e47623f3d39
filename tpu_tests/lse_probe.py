"""Which logsumexp is off on the chip: jask's block-wise fold, jax's one-shot reference, or the chip's exp/log?

Every result is compared with a float64 numpy reference on the host (relative error above 1, absolute below). Rows: jask (backends auto and xla, tile 4),
jax.nn on the chip, jax.nn on the host CPU, the old two-pass formula (max, then log of the sum of exp(x - max)) on
the chip, and the block-wise fold (jax.nn.logsumexp of 4-row blocks folded by logaddexp) on the chip. Then the
chip's exp, log and log1p against float64 in ulps. Run: python3 tpu_tests/lse_probe.py (from the project root).
"""
import numpy as np
import jax
import jax.numpy as jnp

import jask
import jask.nn

CPU = jax.devices("cpu")[0]


def _arr(shape, seed=0, scale=4.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _lse64(x, axis=None, keepdims=False):
    x = np.asarray(x, np.float64)
    m = np.max(x, axis=axis, keepdims=True)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def _softmax64(x, axis):
    return np.exp(np.asarray(x, np.float64) - _lse64(x, axis, keepdims=True))


def _rel(got, want):
    """Relative error where |want| > 1, absolute below (a log_softmax near 0 is not 1e-3 off for 1e-9)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1.0)))


def _two_pass(x, axis, keepdims):
    m = jnp.max(x, axis=axis, keepdims=True)
    out = jnp.log(jnp.sum(jnp.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else jnp.squeeze(out, axis=axis)


def _folded(x, axis, keepdims, block=4):
    """jax.nn.logsumexp of blocks of ``block`` along the first reduced axis, folded by logaddexp (as LogSumExp)."""
    axes = (0, 1) if axis is None else ((axis,) if isinstance(axis, int) else tuple(axis))
    first = axes[0]
    acc = None
    for start in range(0, x.shape[first], block):
        part = jax.nn.logsumexp(jax.lax.slice_in_dim(x, start, min(start + block, x.shape[first]), axis=first),
                                axis=axes, keepdims=True)
        acc = part if acc is None else jnp.logaddexp(acc, part)
    return acc if keepdims else jnp.squeeze(acc, axis=axes)


def _jask(x, fn, backend):
    jask.config.update("backend", backend)
    jask.config.update("tile", 4)
    return np.asarray(fn(jask.from_numpy(x)))


def lse_rows():
    print("logsumexp: error against float64 (test tolerance 1e-5)")
    x = _arr((18, 13))
    for axis, keepdims in [(0, False), (1, True), (None, False), ((0, 1), True)]:
        want = _lse64(x, axis, keepdims)
        rows = {b: _jask(x, lambda a: jask.nn.logsumexp(a, axis=axis, keepdims=keepdims), b) for b in ("auto", "xla")}
        rows["jax chip"] = jax.nn.logsumexp(x, axis=axis, keepdims=keepdims)
        with jax.default_device(CPU):
            rows["jax host"] = jax.nn.logsumexp(jnp.asarray(x), axis=axis, keepdims=keepdims)
        rows["two-pass chip"] = _two_pass(jnp.asarray(x), axis, keepdims)
        rows["fold chip"] = _folded(jnp.asarray(x), axis, keepdims)
        print(f"  axis={axis} keepdims={keepdims}: " + "  ".join(f"{k} {_rel(v, want):.1e}" for k, v in rows.items()))


def softmax_rows():
    print("softmax / log_softmax: error against float64 (test tolerance 1e-5, atol 1e-6)")
    x = _arr((128, 8), 1)
    for axis in (0, 1):
        want = _softmax64(x, axis)
        rows = {b: _jask(x, lambda a: jask.persist(jask.nn.softmax(a, axis=axis)), b) for b in ("auto", "xla")}
        rows["jax chip"] = jax.nn.softmax(x, axis=axis)
        with jax.default_device(CPU):
            rows["jax host"] = jax.nn.softmax(jnp.asarray(x), axis=axis)
        print(f"  softmax axis={axis}: " + "  ".join(f"{k} {_rel(v, want):.1e}" for k, v in rows.items()))
        want = np.asarray(x, np.float64) - _lse64(x, axis, keepdims=True)
        rows = {b: _jask(x, lambda a: jask.nn.log_softmax(a, axis=axis), b) for b in ("auto", "xla")}
        rows["jax chip"] = jax.nn.log_softmax(x, axis=axis)
        with jax.default_device(CPU):
            rows["jax host"] = jax.nn.log_softmax(jnp.asarray(x), axis=axis)
        print(f"  log_softmax axis={axis}: " + "  ".join(f"{k} {_rel(v, want):.1e}" for k, v in rows.items()))


def grad_rows():
    print("gradients (test tolerance 1e-4, atol 1e-6)")
    x, w = _arr((10, 9), 4), _arr((10, 9), 5, 1.0)
    for axis in (0, 1, None):
        lse_w = w.sum(axis=axis) if axis is not None else np.float32(1.0)
        want = _softmax64(x, axis) * (np.expand_dims(lse_w, axis) if axis is not None else 1.0)
        rows = {}
        for b in ("auto", "xla"):
            jask.config.update("backend", b)
            jask.config.update("tile", 4)
            a = jask.from_numpy(x)
            rows[b] = np.asarray(jax.grad(lambda v: jask.sum(jask.nn.logsumexp(v, axis=axis)
                                                             * jask.from_numpy(np.asarray(lse_w))))(a)
                                 if axis is not None else jax.grad(lambda v: jask.nn.logsumexp(v))(a))
        rows["jax chip"] = jax.grad(lambda v: jnp.sum(jax.nn.logsumexp(v, axis=axis) * lse_w))(x)
        with jax.default_device(CPU):
            rows["jax host"] = jax.grad(lambda v: jnp.sum(jax.nn.logsumexp(v, axis=axis) * lse_w))(jnp.asarray(x))
        print(f"  logsumexp grad axis={axis}: " + "  ".join(f"{k} {_rel(v, want):.1e}" for k, v in rows.items()))


def _in_pallas(fn):
    """``fn`` applied elementwise inside a Pallas kernel (interpret mode on a CPU) to a (N, 128) array."""
    from jax.experimental import pallas as pl

    def kernel(x_ref, o_ref):
        o_ref[...] = fn(x_ref[...])

    def run(v):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(v.shape, v.dtype),
                              interpret=jax.default_backend() == "cpu")(v)
    return run


def ulp_rows():
    print("the chip's transcendental functions against float64, in float32 ulps (max over the range)")
    cases = [("exp", jnp.exp, np.exp, -30.0, 30.0), ("log", jnp.log, np.log, 1e-3, 1e3),
             ("log1p", jnp.log1p, np.log1p, 0.0, 1.0),
             ("logaddexp", lambda v: jnp.logaddexp(v, jnp.float32(1.5)), lambda v: np.logaddexp(v, 1.5), -20.0, 20.0)]
    for name, fn, ref, lo, hi in cases:
        v = np.linspace(lo, hi, 128 * 1024, dtype=np.float32).reshape(1024, 128)
        want = ref(v.astype(np.float64))
        ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
        for where, f in (("xla", jax.jit(fn)), ("pallas", _in_pallas(fn))):
            try:
                got = np.asarray(f(jnp.asarray(v)), np.float64)
            except Exception as e:       # a lowering the platform refuses: say so, go on
                print(f"  {name} {where}: {type(e).__name__}: {str(e)[:120]}")
                continue
            err = np.abs(got - want) / np.maximum(ulp, np.finfo(np.float32).tiny)
            print(f"  {name} {where} on [{lo}, {hi}]: max {err.max():.1f} ulp, mean {err.mean():.2f}, "
                  f"at {v.flat[err.argmax()]!r}")


if __name__ == "__main__":
    print("devices", jax.devices(), "jax", jax.__version__)
    lse_rows()
    softmax_rows()
    grad_rows()
    ulp_rows()
