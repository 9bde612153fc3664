"""tfbigconv's Keras layers: BigConv1D, BigConv2D, BigConv3D, BigDepthwiseConv1D,
BigDepthwiseConv2D and BigDepthwiseConv3D (layers.py), and
fuse_linear's FusedLinearConv and FusedBiasMap (tfbigconv.fusion.layers), all
registered under the package name "tfbigconv"; convert_model (convert.py)."""
from tfbigconv.keras.layers import (BigConv1D, BigConv2D, BigConv3D, BigDepthwiseConv1D,
                                    BigDepthwiseConv2D, BigDepthwiseConv3D)
from tfbigconv.fusion.layers import FusedBiasMap, FusedLinearConv

__all__ = ["BigConv1D", "BigConv2D", "BigConv3D", "BigDepthwiseConv1D", "BigDepthwiseConv2D",
           "BigDepthwiseConv3D", "FusedLinearConv", "FusedBiasMap"]
