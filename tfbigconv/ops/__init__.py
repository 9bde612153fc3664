"""TensorFlow ops: the N-d front end (conv.py) and its faces bigconv1d, bigconv2d and bigconv3d (conv1d.py, conv2d.py, conv3d.py), and the gradients of tfbigconv's ops (gradients.py)."""
