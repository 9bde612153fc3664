"""Fusing linear convolutions: the kernel algebra (algebra), training a fused subgraph (train), the Keras layers it makes (layers) and fuse_linear on a model (model)."""
