"""Fusing linear convolutions (tfbigconv.fuse is this package): the kernel
algebra on LinearMaps (algebra), a linear subgraph as a program of steps
(program), and training a fused subgraph (train, tfbigconv.fuse_train). Plain
TensorFlow, no Keras: fuse_linear, which reads and rewrites Keras models, and
the layers it makes are in tfbigconv.keras (fuse_model.py, fused.py), which
builds on this package."""
from tfbigconv.fusion.algebra import (  # noqa: F401
    LinearMap, NotFusable, add, affine, batchnorm_affine, border_strips, compose_kernels,
    composition_macs, concat, convolve, dilate_kernel, fused_padding, identity, pad, regroup,
    same_pads)
from tfbigconv.fusion.program import (  # noqa: F401
    apply_fused, bias_map, compose_program, conv_kernel, conv_padding, live_values, run_program,
    run_values)

__all__ = [
    "NotFusable", "LinearMap", "identity", "pad", "convolve", "add", "concat", "affine",
    "batchnorm_affine", "regroup", "dilate_kernel", "compose_kernels", "same_pads",
    "compose_program", "composition_macs", "run_program", "run_values", "live_values",
    "conv_kernel", "conv_padding", "bias_map", "fused_padding", "border_strips",
    "apply_fused",
]
