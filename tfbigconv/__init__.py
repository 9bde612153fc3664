"""tfbigconv: fast, memory-bounded 2-D convolution with large filters for TensorFlow.

`bigconv2d` is a drop-in for `tf.nn.conv2d`. Importing this package loads the
custom ops, so SavedModels that use them can be loaded afterwards.
"""
from tfbigconv import _core
from tfbigconv._ops import ops as _raw_ops  # noqa: F401  (registers the ops)
from tfbigconv.conv import ALGORITHMS, bigconv2d

__all__ = ["bigconv2d", "ALGORITHMS"]
__version__ = "0.1.0"
