"""Does logsumexp's error on the chip grow with the number of folded blocks? softmax's error follows it.

jask's logsumexp folds each block's result into a float32 accumulator with ``logaddexp``: every fold rounds a
value of |lse|'s size and, on a chip whose ``exp`` is not IEEE, adds the correction's error. Rows: tile edges
4, 16 and 128 along a 128-long axis (32, 8 and 1 blocks), computed on the chip and on the host CPU (jask's compute
device set to it), against float64. Then the chip's exp in ulps where softmax and the fold evaluate it (arguments
at or below 0). Run: python3 tpu_tests/fold_probe.py (from the project root).
"""
import numpy as np
import jax
import jax.numpy as jnp

import jask
import jask.nn

CPU = jax.devices("cpu")[0]


def _lse64(x, axis):
    x = np.asarray(x, np.float64)
    m = np.max(x, axis=axis, keepdims=True)
    return np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m


def fold_rows():
    x = (np.random.default_rng(1).standard_normal((128, 8)) * 4).astype(np.float32)
    want_lse = _lse64(x, 0)
    want_sm = np.exp(x.astype(np.float64) - want_lse)
    print(f"tile  device  lse abs err  softmax rel err  (x (128, 8), axis 0; |lse| up to {np.abs(want_lse).max():.1f})")
    for device in (jax.devices()[0], CPU):
        for tile in (4, 16, 128):
            jask.config.update("device", device)
            jask.config.update("tile", tile)
            a = jask.from_numpy(x)
            lse = np.asarray(jask.nn.logsumexp(a, axis=0, keepdims=True), np.float64)
            sm = np.asarray(jask.persist(jask.nn.softmax(a, axis=0)), np.float64)
            print(f"{tile:4d}  {device.platform:6s}  {np.abs(lse - want_lse).max():.2e}     "
                  f"{(np.abs(sm - want_sm) / want_sm).max():.2e}")
    jask.config.update("device", None)


def exp_rows():
    for lo, hi in ((-30.0, 0.0), (-1.0, 0.0), (-1e-3, 1e-3)):
        v = np.linspace(lo, hi, 128 * 1024, dtype=np.float32).reshape(1024, 128)
        want = np.exp(v.astype(np.float64))
        ulp = np.spacing(want.astype(np.float32)).astype(np.float64)
        err = np.abs(np.asarray(jax.jit(jnp.exp)(jnp.asarray(v)), np.float64) - want) / ulp
        print(f"chip exp on [{lo}, {hi}]: max {err.max():.1f} ulp, mean {err.mean():.2f}, at {v.flat[err.argmax()]!r}")


if __name__ == "__main__":
    print("devices", jax.devices(), "jax", jax.__version__)
    fold_rows()
    exp_rows()
