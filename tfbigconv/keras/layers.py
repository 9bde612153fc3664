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
`tfbigconv.keras.base` and `fused`, shared with the Keras 2 (tf_keras) classes of
`tfbigconv.keras.keras2`; the classes are made on Keras 3's base classes by
`tfbigconv.keras.flavours.KERAS3` (from `flavours.LAYER_CLASSES`), and are
exported here.
"""
from tfbigconv.keras.base import check_options, declares_jit
from tfbigconv.keras.flavours import KERAS3

__all__ = ["BigConv1D", "BigConv2D", "BigConv3D", "BigDepthwiseConv1D", "BigDepthwiseConv2D",
           "BigDepthwiseConv3D", "FusedLinearConv", "FusedBiasMap", "check_backend",
           "check_options", "declares_jit"]

check_backend = KERAS3.check_backend
BigConv1D = KERAS3.layers.BigConv1D
BigConv2D = KERAS3.layers.BigConv2D
BigConv3D = KERAS3.layers.BigConv3D
BigDepthwiseConv1D = KERAS3.layers.BigDepthwiseConv1D
BigDepthwiseConv2D = KERAS3.layers.BigDepthwiseConv2D
BigDepthwiseConv3D = KERAS3.layers.BigDepthwiseConv3D
FusedLinearConv = KERAS3.layers.FusedLinearConv
FusedBiasMap = KERAS3.layers.FusedBiasMap
# The flavour's rank-generic depthwise base (BigDepthwiseConv3D's), which Keras does
# not export.
BaseDepthwiseConv = KERAS3.layers.BaseDepthwiseConv
