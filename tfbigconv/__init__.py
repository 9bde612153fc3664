"""tfbigconv: fast, memory-bounded 2-D convolution with large filters for TensorFlow.

`bigconv2d` is a drop-in for `tf.nn.conv2d`. Importing this package loads the
custom ops, so SavedModels that use them can be loaded afterwards.
"""
try:
    from tfbigconv import _core
except ImportError as e:  # pragma: no cover - build or path problem
    import os as _os
    raise ImportError(
        f"tfbigconv's compiled module _core is missing from {_os.path.dirname(__file__)}. "
        "If that is the source tree, run from another directory so that the installed "
        "package is imported; otherwise build with: pip install --no-build-isolation ."
    ) from e
from tfbigconv import _ops, cost_model
from tfbigconv._ops import ops as _raw_ops  # noqa: F401  (the ops, for tests and power users)
from tfbigconv.conv import ALGORITHMS, bigconv2d
from tfbigconv.explain import explain

# The planner's constants, in both compiled modules (see cost_model.py).
cost_model.load_active(_ops._LIB_PATH)

__all__ = ["bigconv2d", "explain", "ALGORITHMS"]
__version__ = "0.1.0"
