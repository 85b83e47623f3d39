"""``jask.numpy.linalg``: ``jax.numpy.linalg`` names over DiskArrays (``norm`` for now)."""
import jax.numpy as _jnp

from jask.ops.norm import norm  # noqa: F401


def __getattr__(name):
    if not name.startswith("__") and hasattr(_jnp.linalg, name):
        raise NotImplementedError(f"jask.numpy.linalg.{name} is not supported yet; nearest supported: "
                                  "jask.numpy.linalg.norm, or jask.numpy.matmul for products")
    raise AttributeError(f"module 'jask.numpy.linalg' has no attribute {name!r}")
