"""TensorFlow ops: bigconv2d (conv2d.py) and the gradients of tfbigconv's ops (gradients.py)."""
