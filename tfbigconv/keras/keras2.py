"""The Big layers for Keras 2 (the tf-keras package, `tf.keras` under
TF_USE_LEGACY_KERAS=1): BigConv1D, BigConv2D, BigConv3D, BigDepthwiseConv1D,
BigDepthwiseConv2D and BigDepthwiseConv3D, and fuse_linear's FusedLinearConv and
FusedBiasMap. `tfbigconv.convert_model` and `tfbigconv.fuse_linear` take tf_keras
models and put these layers in them.

    from tfbigconv.keras.keras2 import BigConv2D

They are the Keras 3 layers of `tfbigconv.keras` (same names, arguments,
weights and configs, including `algorithm` and `workspace_limit`; the logic is
shared, in `tfbigconv.keras.base`) on tf_keras' base classes: Conv1D, Conv2D,
Conv3D, DepthwiseConv1D, DepthwiseConv2D, and tf_keras' rank-generic depthwise
base with rank 3 for BigDepthwiseConv3D. They are registered with tf_keras
(package "tfbigconv"), so .keras, .h5 and SavedModel files saved by tf_keras'
`model.save` load with `tf_keras.models.load_model` once this module has been
imported. Mixed precision works as in tf_keras' own layers.

tf-keras is an optional dependency (`pip install tf-keras`); `import tfbigconv`
does not import it, this module does.
"""
import functools
import inspect

try:
    import tf_keras
    # tf_keras' base class of DepthwiseConv1D/2D, which takes the rank.
    from tf_keras.src.layers.convolutional.base_depthwise_conv import (
        DepthwiseConv as BaseDepthwiseConv)
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError("tfbigconv.keras.keras2 needs Keras 2, the tf-keras package: "
                      "pip install tf-keras (the version matching your TensorFlow)") from e

from tfbigconv.keras.base import (BigConv1DLogic, BigConv2DLogic, BigConv3DLogic,
                                  BigDepthwiseConv1DLogic, BigDepthwiseConv2DLogic,
                                  BigDepthwiseConv3DLogic, Flavour)
from tfbigconv.keras.fused import FusedBiasMapLogic, FusedLinearConvLogic

__all__ = ["BigConv1D", "BigConv2D", "BigConv3D", "BigDepthwiseConv1D", "BigDepthwiseConv2D",
           "BigDepthwiseConv3D", "FusedLinearConv", "FusedBiasMap"]


def _check_backend():
    """tf_keras runs on TensorFlow only."""


def _with_defaults(init, **defaults):
    """`init` with other defaults: tf_keras' own, where they differ from Keras 3's."""
    signature = inspect.signature(init)
    signature = signature.replace(parameters=[
        p.replace(default=defaults.get(name, p.default))
        for name, p in signature.parameters.items()])

    @functools.wraps(init)
    def wrapped(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return init(*bound.args, **bound.kwargs)

    wrapped.__signature__ = signature
    return wrapped


KERAS2 = Flavour(check_backend=_check_backend, depthwise_kernel="depthwise_kernel",
                 declares_jit=False, package="tf_keras")
_register = tf_keras.utils.register_keras_serializable(package="tfbigconv")


@_register
class BigConv2D(BigConv2DLogic, tf_keras.layers.Conv2D):
    __doc__ = BigConv2DLogic.__doc__
    _flavour = KERAS2


@_register
class BigDepthwiseConv2D(BigDepthwiseConv2DLogic, tf_keras.layers.DepthwiseConv2D):
    __doc__ = BigDepthwiseConv2DLogic.__doc__
    _flavour = KERAS2


@_register
class BigConv1D(BigConv1DLogic, tf_keras.layers.Conv1D):
    __doc__ = BigConv1DLogic.__doc__
    _flavour = KERAS2
    # tf_keras' Conv1D is channels_last unless told, whatever image_data_format says.
    __init__ = _with_defaults(BigConv1DLogic.__init__, data_format="channels_last")


@_register
class BigDepthwiseConv1D(BigDepthwiseConv1DLogic, tf_keras.layers.DepthwiseConv1D):
    __doc__ = BigDepthwiseConv1DLogic.__doc__
    _flavour = KERAS2


@_register
class BigConv3D(BigConv3DLogic, tf_keras.layers.Conv3D):
    __doc__ = BigConv3DLogic.__doc__
    _flavour = KERAS2


@_register
class BigDepthwiseConv3D(BigDepthwiseConv3DLogic, BaseDepthwiseConv):
    __doc__ = BigDepthwiseConv3DLogic.__doc__
    _flavour = KERAS2


@_register
class FusedLinearConv(FusedLinearConvLogic, tf_keras.layers.Layer):
    __doc__ = FusedLinearConvLogic.__doc__
    _flavour = KERAS2


@_register
class FusedBiasMap(FusedBiasMapLogic, tf_keras.layers.Layer):
    __doc__ = FusedBiasMapLogic.__doc__
    _flavour = KERAS2
