"""tfbigconv's Keras layers: BigConv1D, BigConv2D, BigConv3D, BigDepthwiseConv1D,
BigDepthwiseConv2D, BigDepthwiseConv3D and fuse_linear's FusedLinearConv and
FusedBiasMap, for Keras 3 (layers.py; their logic: base.py and fused.py), all
registered under the package name "tfbigconv"; the same layers for Keras 2
(tf_keras) in keras2.py (each flavour's classes made by its Flavour, flavours.py,
from one table); convert_model (convert.py) and fuse_linear (fuse_model.py),
which take models of either flavour.

`tfbigconv.keras` gives the layers of the Keras that `tf.keras` is, as `tf.keras`
does: Keras 3's (`tfbigconv.keras.layers`), or, under TF_USE_LEGACY_KERAS=1 (read
as TensorFlow reads it, at import) with tf-keras installed, tf_keras'
(`tfbigconv.keras.keras2`). Those two modules give their flavour always.

This package is the Keras front end: it builds on tfbigconv.fusion (the kernel
algebra and the fused subgraph's math), never the other way round."""
import importlib.util
import os

from tfbigconv.keras import layers  # noqa: F401  (registers the Keras 3 layers, in either mode)


def legacy_tf_keras():
    """Whether `tf.keras` is tf_keras (Keras 2): TF_USE_LEGACY_KERAS as TensorFlow
    reads it, and tf-keras installed (without it TensorFlow's tf.keras fails)."""
    return (os.environ.get("TF_USE_LEGACY_KERAS") in ("true", "True", "1")
            and importlib.util.find_spec("tf_keras") is not None)


if legacy_tf_keras():
    from tfbigconv.keras.keras2 import (BigConv1D, BigConv2D, BigConv3D, BigDepthwiseConv1D,
                                        BigDepthwiseConv2D, BigDepthwiseConv3D, FusedBiasMap,
                                        FusedLinearConv)
else:
    from tfbigconv.keras.layers import (BigConv1D, BigConv2D, BigConv3D, BigDepthwiseConv1D,
                                        BigDepthwiseConv2D, BigDepthwiseConv3D, FusedBiasMap,
                                        FusedLinearConv)

__all__ = ["BigConv1D", "BigConv2D", "BigConv3D", "BigDepthwiseConv1D", "BigDepthwiseConv2D",
           "BigDepthwiseConv3D", "FusedLinearConv", "FusedBiasMap"]
