"""tfbigconv's Keras layers: BigConv2D and BigDepthwiseConv2D (layers.py), and
fuse_linear's FusedLinearConv and FusedBiasMap (tfbigconv.fusion.layers), all
registered under the package name "tfbigconv"; convert_model (convert.py)."""
from tfbigconv.keras.layers import BigConv2D, BigDepthwiseConv2D
from tfbigconv.fusion.layers import FusedBiasMap, FusedLinearConv

__all__ = ["BigConv2D", "BigDepthwiseConv2D", "FusedLinearConv", "FusedBiasMap"]
