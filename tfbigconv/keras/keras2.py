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
base with rank 3 for BigDepthwiseConv3D. Each takes its tf_keras base class's
arguments, positions and defaults (tf_keras' Conv1D is channels_last unless
told, whatever image_data_format says). `tfbigconv.keras.flavours` makes them
(`tf_keras_flavour`, from `flavours.LAYER_CLASSES`); this module exports them.
They are registered with tf_keras (package "tfbigconv"), so .keras, .h5 and
SavedModel files saved by tf_keras' `model.save` load with
`tf_keras.models.load_model` once this module has been imported. Mixed precision
works as in tf_keras' own layers.

tf-keras is an optional dependency (`pip install tf-keras`); `import tfbigconv`
does not import it, this module does.
"""
try:
    import tf_keras
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError("tfbigconv.keras.keras2 needs Keras 2, the tf-keras package: "
                      "pip install tf-keras (the version matching your TensorFlow)") from e

from tfbigconv.keras.flavours import tf_keras_flavour

__all__ = ["BigConv1D", "BigConv2D", "BigConv3D", "BigDepthwiseConv1D", "BigDepthwiseConv2D",
           "BigDepthwiseConv3D", "FusedLinearConv", "FusedBiasMap"]

KERAS2 = tf_keras_flavour(tf_keras)
BigConv1D = KERAS2.layers.BigConv1D
BigConv2D = KERAS2.layers.BigConv2D
BigConv3D = KERAS2.layers.BigConv3D
BigDepthwiseConv1D = KERAS2.layers.BigDepthwiseConv1D
BigDepthwiseConv2D = KERAS2.layers.BigDepthwiseConv2D
BigDepthwiseConv3D = KERAS2.layers.BigDepthwiseConv3D
FusedLinearConv = KERAS2.layers.FusedLinearConv
FusedBiasMap = KERAS2.layers.FusedBiasMap
# The flavour's rank-generic depthwise base (BigDepthwiseConv3D's), which Keras does
# not export.
BaseDepthwiseConv = KERAS2.layers.BaseDepthwiseConv
