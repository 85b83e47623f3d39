"""``make_op`` under the path the guide for adding an op uses; it lives in :mod:`jask.hijax.make_op`."""
from jask.hijax.make_op import make_op

__all__ = ["make_op"]
