"""``jask.nn``: ``jax.nn``'s names over DiskArrays, with gradients.

Activations are elementwise jnp functions lifted tile by tile
(:func:`jask.ops.elementwise.lift`); ``softmax``/``log_softmax`` stream over
their axis with the stable one-pass ``logsumexp`` (blocks folded by ``logaddexp``).
With no DiskArray argument every function is ``jax.nn``'s own.
"""
import jax
import jax.numpy as jnp
import numpy as np

from jask.hijax.array import is_disk_array, type_of
from jask.ops import elementwise as _ew
from jask.ops import reductions as _red
from jask.ops.shape import expand_dims as _expand_dims
from jask.ops.shape import moveaxis as _moveaxis
from jask.api.sources import from_numpy as _from_numpy

relu = _ew.lift(jax.nn.relu, "relu")
relu6 = _ew.lift(jax.nn.relu6, "relu6")
sigmoid = _ew.lift(jax.nn.sigmoid, "sigmoid")
log_sigmoid = _ew.lift(jax.nn.log_sigmoid, "log_sigmoid")
softplus = _ew.lift(jax.nn.softplus, "softplus")
silu = swish = _ew.lift(jax.nn.silu, "silu")
tanh = _ew.tanh
elu = _ew.lift(jax.nn.elu, "elu")
leaky_relu = _ew.lift(jax.nn.leaky_relu, "leaky_relu")
_gelu = _ew.lift(jax.nn.gelu, "gelu")


def gelu(x, approximate=True):
    """``jax.nn.gelu`` (tanh approximation by default, as in JAX)."""
    return _gelu(x, approximate=bool(approximate))


def logsumexp(a, axis=None, b=None, keepdims=False, return_sign=False, where=None):
    """``jax.nn.logsumexp``: stable, in one streaming pass."""
    if not is_disk_array(a):
        return jax.nn.logsumexp(a, axis=axis, b=b, keepdims=keepdims, return_sign=return_sign, where=where)
    return _red.logsumexp(a, axis=axis, b=b, keepdims=keepdims, return_sign=return_sign, where=where)


def log_softmax(x, axis=-1, where=None, _name="log_softmax"):
    """``x - logsumexp(x, axis, keepdims=True)``."""
    if not is_disk_array(x):
        return jax.nn.log_softmax(x, axis=axis, where=where)
    if where is not None:
        raise NotImplementedError(f"jask.nn.{_name}: where= is not supported; mask the input with "
                                  "jask.numpy.where(mask, x, -inf) instead")
    return _ew.subtract(x, _red.logsumexp(x, axis=axis, keepdims=True))


def softmax(x, axis=-1, where=None):
    """``exp(x - logsumexp(x, axis, keepdims=True))``: stable, two passes over ``x`` (logsumexp, then exp)."""
    if not is_disk_array(x):
        return jax.nn.softmax(x, axis=axis, where=where)
    return _ew.exp(log_softmax(x, axis=axis, where=where, _name="softmax"))


def one_hot(x, num_classes, dtype=jnp.float_, axis=-1):
    """``jax.nn.one_hot``: ``x[..., None] == arange(num_classes)`` along ``axis``, as ``dtype``."""
    if not is_disk_array(x):
        return jax.nn.one_hot(x, num_classes, dtype=dtype, axis=axis)
    num_classes, dtype = int(num_classes), jax.dtypes.canonicalize_dtype(dtype)
    classes = _from_numpy(np.arange(num_classes, dtype=np.int32))
    hot = _ew.astype(_ew.equal(_expand_dims(x, -1), classes), dtype)
    ndim = type_of(x).ndim + 1
    axis = axis + ndim if axis < 0 else axis
    return hot if axis == ndim - 1 else _moveaxis(hot, -1, axis)


def __getattr__(name):
    if not name.startswith("__") and hasattr(jax.nn, name):
        raise NotImplementedError(f"jask.nn.{name} is not supported yet; nearest supported: relu, gelu, sigmoid, "
                                  "softplus, softmax, log_softmax, logsumexp, one_hot, or "
                                  "jask.numpy.elementwise(fn) to lift an elementwise function")
    raise AttributeError(f"module 'jask.nn' has no attribute {name!r}")
