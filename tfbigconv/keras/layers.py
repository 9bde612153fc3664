"""Keras 3 layers on tfbigconv's kernels: drop-in for Conv1D, Conv2D, Conv3D,
DepthwiseConv1D and DepthwiseConv2D, and the DepthwiseConv3D Keras lacks; and
fuse_linear's FusedLinearConv and FusedBiasMap (their logic: `tfbigconv.keras.fused`).

`BigConv1D`, `BigConv2D`, `BigConv3D`, `BigDepthwiseConv1D` and
`BigDepthwiseConv2D` subclass the Keras layer of the same name without "Big", so
they take the same constructor arguments with the same defaults, create the same
weights (same names, shapes and order), and serialize the same way; only the
convolution itself runs through `tfbigconv.bigconv1d`, `bigconv2d` or `bigconv3d`.
`BigDepthwiseConv3D` is DepthwiseConv2D's layer in 3-D (Keras' depthwise base class
with rank 3). Two extra arguments are passed through to the op:

  algorithm: one of `tfbigconv.ALGORITHMS` ("auto" by default).
  workspace_limit: workspace budget in bytes; 0 (default) means decided from
    free memory.

Both layers are registered as Keras serializable objects (package "tfbigconv"),
so `.keras` files load with `keras.models.load_model` once `tfbigconv` has been
imported. XLA: see `declares_jit` (under `jit_compile=True` the layers run
bigconv2d's pure-TensorFlow path, which XLA compiles).

Mixed precision: under a "mixed_float16" or "mixed_bfloat16" policy the kernel
stays float32 and the convolution runs in the compute dtype (the kernels
accumulate half types in float32), like the Keras layers.

Requires Keras 3 with the TensorFlow backend. The layers' logic is in
`tfbigconv.keras.base`, shared with the Keras 2 (tf_keras) classes of
`tfbigconv.keras.keras2`; this module adds Keras 3's base classes and `KERAS3`.
"""
import keras

from tfbigconv.keras.base import (BigConv1DLogic, BigConv2DLogic, BigConv3DLogic,
                                  BigDepthwiseConv1DLogic, BigDepthwiseConv2DLogic,
                                  BigDepthwiseConv3DLogic, Flavour, check_options, declares_jit)
from tfbigconv.keras.fused import FusedBiasMapLogic, FusedLinearConvLogic

# Keras' base class of DepthwiseConv1D/2D, which takes the rank; Keras has no
# DepthwiseConv3D to subclass.
from keras.src.layers.convolutional.base_depthwise_conv import BaseDepthwiseConv

if int(keras.__version__.split(".")[0]) < 3:  # pragma: no cover - depends on the install
    raise ImportError(
        f"tfbigconv.keras needs Keras 3 (found keras {keras.__version__}); "
        "for Keras 2 use tfbigconv.keras.keras2 (pip install tf-keras)")

__all__ = ["BigConv1D", "BigConv2D", "BigConv3D", "BigDepthwiseConv1D", "BigDepthwiseConv2D",
           "BigDepthwiseConv3D", "FusedLinearConv", "FusedBiasMap", "check_backend",
           "check_options", "declares_jit"]


def check_backend():
    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            "tfbigconv's Keras layers run TensorFlow ops and need the TensorFlow backend; "
            f"the Keras backend is {keras.backend.backend()!r} (set KERAS_BACKEND=tensorflow)")


KERAS3 = Flavour(check_backend=check_backend, depthwise_kernel="kernel", declares_jit=True,
                 package="keras")
_register = keras.saving.register_keras_serializable(package="tfbigconv")


@_register
class BigConv2D(BigConv2DLogic, keras.layers.Conv2D):
    __doc__ = BigConv2DLogic.__doc__
    _flavour = KERAS3


@_register
class BigDepthwiseConv2D(BigDepthwiseConv2DLogic, keras.layers.DepthwiseConv2D):
    __doc__ = BigDepthwiseConv2DLogic.__doc__
    _flavour = KERAS3


@_register
class BigConv1D(BigConv1DLogic, keras.layers.Conv1D):
    __doc__ = BigConv1DLogic.__doc__
    _flavour = KERAS3


@_register
class BigDepthwiseConv1D(BigDepthwiseConv1DLogic, keras.layers.DepthwiseConv1D):
    __doc__ = BigDepthwiseConv1DLogic.__doc__
    _flavour = KERAS3


@_register
class BigConv3D(BigConv3DLogic, keras.layers.Conv3D):
    __doc__ = BigConv3DLogic.__doc__
    _flavour = KERAS3


@_register
class BigDepthwiseConv3D(BigDepthwiseConv3DLogic, BaseDepthwiseConv):
    __doc__ = BigDepthwiseConv3DLogic.__doc__
    _flavour = KERAS3


@_register
class FusedLinearConv(FusedLinearConvLogic, keras.layers.Layer):
    __doc__ = FusedLinearConvLogic.__doc__
    _flavour = KERAS3


@_register
class FusedBiasMap(FusedBiasMapLogic, keras.layers.Layer):
    __doc__ = FusedBiasMapLogic.__doc__
    _flavour = KERAS3
