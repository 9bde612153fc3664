"""tfbigconv's Keras layers: BigConv1D, BigConv2D, BigConv3D, BigDepthwiseConv1D,
BigDepthwiseConv2D, BigDepthwiseConv3D and fuse_linear's FusedLinearConv and
FusedBiasMap, for Keras 3 (layers.py; their logic: base.py and fused.py), all
registered under the package name "tfbigconv"; the same layers for Keras 2
(tf_keras) in keras2.py; convert_model (convert.py) and fuse_linear
(fuse_model.py), which take models of either flavour (flavours.py).

This package is the Keras front end: it builds on tfbigconv.fusion (the kernel
algebra and the fused subgraph's math), never the other way round."""
from tfbigconv.keras.layers import (BigConv1D, BigConv2D, BigConv3D, BigDepthwiseConv1D,
                                    BigDepthwiseConv2D, BigDepthwiseConv3D, FusedBiasMap,
                                    FusedLinearConv)

__all__ = ["BigConv1D", "BigConv2D", "BigConv3D", "BigDepthwiseConv1D", "BigDepthwiseConv2D",
           "BigDepthwiseConv3D", "FusedLinearConv", "FusedBiasMap"]
