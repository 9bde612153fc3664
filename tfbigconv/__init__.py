"""tfbigconv: fast, memory-bounded convolution with large filters for TensorFlow.

`bigconv2d` is a drop-in for `tf.nn.conv2d`, `bigconv1d` for `tf.nn.conv1d` (plus
CAUSAL padding), `bigconv3d` for `tf.nn.conv3d` (plus groups); `tfbigconv.keras` has the Keras
layers `BigConv2D` and `BigDepthwiseConv2D`; `convert_model` swaps them into an
existing Keras model; `memory_report` shows where a model's training step keeps
its memory (and `explain_oom` prints it when a step runs out); `fuse_linear`
merges chains and branches of linear convolutions into one large-kernel
convolution (kernel algebra: `tfbigconv.fuse`); inside `portable()` our ops trace as
stock TensorFlow ops, for a SavedModel that loads without tfbigconv.

Importing this package loads the custom ops, registers their gradients and the
Keras layers, so SavedModels and `.keras` files that use them load afterwards.
Serving code should call `tfbigconv.register_all()` before loading a model.
"""
import os as _os
import sys as _sys
import warnings as _warnings

from tfbigconv import _missing
from tfbigconv import pure_tf as _pure_tf


def _load_compiled():
    """Imports _core and the op library: (why not, the modules that did not load)."""
    try:
        from tfbigconv import _core  # noqa: F401
    except ImportError as e:
        where = _os.path.dirname(__file__)
        return (f"its module _core is missing from {where} or does not load: {e}; if that is "
                "the source tree, run from another directory so that the installed package "
                "is imported"), ("_core", "_native")
    try:
        from tfbigconv import _native  # noqa: F401  (checks the TF version, registers the ops)
    except ImportError as e:
        return str(e).splitlines()[0], ("_native",)
    return "", ()


_cause, _not_loaded = _load_compiled()
if _cause:  # pure TensorFlow instead (pure_tf/), said once, here
    _missing.install(_sys.modules[__name__], _not_loaded, _cause)
    _pure_tf.missing_library = _cause
    _warnings.warn(_missing.message("tfbigconv's custom ops", _cause), RuntimeWarning,
                   stacklevel=2)

from tfbigconv import _native  # noqa: E402
from tfbigconv._native import ops as _raw_ops  # noqa: F401,E402  (the ops, for tests and power users)
from tfbigconv.cost_model import profiles as _profiles  # noqa: E402
from tfbigconv.ops import gradients as _gradients  # noqa: F401,E402  (registers the gradients)
from tfbigconv.ops.conv1d import bigconv1d  # noqa: E402
from tfbigconv.ops.conv2d import ALGORITHMS, bigconv2d  # noqa: E402
from tfbigconv.ops.conv3d import bigconv3d  # noqa: E402
from tfbigconv.ops.depthwise import depthwise_conv2d  # noqa: E402
from tfbigconv.planning.explain import explain  # noqa: E402
from tfbigconv.pure_tf import portable  # noqa: E402

from tfbigconv import keras  # registers the Keras layers (needs Keras 3, a TensorFlow dependency)
from tfbigconv.keras import flavours as _flavours
from tfbigconv.keras.convert import convert_model
from tfbigconv.memory import MemoryReport, explain_oom, memory_report
from tfbigconv import fusion as fuse
from tfbigconv.fusion import train as fuse_train
from tfbigconv.keras.fuse_model import SubgraphReport, fuse_linear
from tfbigconv.routing import route
from tfbigconv.version import __version__ as __version__  # public: the alias re-exports it

# tfbigconv.fuse and tfbigconv.fuse_train, public modules before the package was
# layered, stay importable by those names (import tfbigconv.fuse, from ... import).
_sys.modules[__name__ + ".fuse"] = fuse
_sys.modules[__name__ + ".fuse_train"] = fuse_train

# The planner's constants, in both compiled modules (see cost_model/profiles.py).
if not _cause:
    _profiles.load_active(_native.LIB_PATH)

__all__ = ["bigconv1d", "bigconv2d", "bigconv3d", "depthwise_conv2d", "explain", "ALGORITHMS", "convert_model", "fuse", "fuse_train", "fuse_linear",
           "SubgraphReport", "keras", "register_all", "memory_report", "MemoryReport",
           "explain_oom", "portable", "route"]


def register_all():
    """Registers everything a model using tfbigconv needs to load; call before loading one.

    That is the custom ops (BigConv2D, BigConv3D and their BackpropInput and
    BackpropFilter ops) for `tf.saved_model.load`, their gradients, and the
    Keras layers (`tfbigconv>BigConv1D`, ..., `tfbigconv>BigDepthwiseConv3D`,
    and fuse_linear's `tfbigconv>FusedLinearConv` and `tfbigconv>FusedBiasMap`)
    for `keras.models.load_model`, and, once tf_keras is in use
    (`tfbigconv.keras.keras2` imported, as under TF_USE_LEGACY_KERAS=1, or a
    tf_keras model given to tfbigconv), the same names for
    `tf_keras.models.load_model`. Importing tfbigconv already
    does all this (and fails with ImportError, saying what to rebuild, when the
    ops were built against another TensorFlow); the call makes a serving
    script's dependency explicit, keeps linters from removing the import, and
    is idempotent.

    Returns the registered Keras names, e.g. ["tfbigconv>BigConv2D", ...].
    """
    return list(dict.fromkeys(name for flavour in _flavours.made()
                              for name in flavour.register()))
