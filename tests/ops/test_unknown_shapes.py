"""Empty tensors whose shapes are known only when the graph runs (ops/conv.py): with
algorithm "tf" the planner cannot rule them out when the op is built, and TF's
kernels mishandle them (oneDNN's return an input-shaped result), so they must still
give tf.nn.convNd's shapes (as TF's Eigen kernels and the static shape give them),
and empty or zero gradients. The cases are those a fuzz of the entry points found."""
import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from conftest import random_case

# (face, input shape, filter shape, padding, the output shape tf.nn.convNd gives)
CASES = [
    (tfbigconv.bigconv1d, [0, 20, 3], [5, 3, 4], "SAME", (0, 20, 4)),
    (tfbigconv.bigconv1d, [1, 5, 2], [6, 2, 2], "VALID", (1, 0, 2)),
    (tfbigconv.bigconv3d, [0, 6, 7, 8, 3], [3, 3, 3, 3, 4], "SAME", (0, 6, 7, 8, 4)),
    (tfbigconv.bigconv2d, [0, 9, 8, 6], [3, 3, 3, 8], "SAME", (0, 9, 8, 8)),  # grouped
    (tfbigconv.bigconv2d, [2, 4, 9, 3], [5, 2, 3, 6], "VALID", (2, 0, 8, 6)),
    (tfbigconv.bigconv2d, [2, 4, 9, 3], [2, 2, 3, 6], [[0, 0], [1, 1], [0, 0], [0, 0]],
     (2, 5, 8, 6)),  # not empty: TF's kernel runs
]


@pytest.mark.parametrize("algorithm", ["tf", "auto", "direct"])
@pytest.mark.parametrize("face,x_shape,w_shape,padding,out_shape", CASES)
def test_shapes_known_when_run(face, x_shape, w_shape, padding, out_shape, algorithm):
    x = tf.constant(random_case(x_shape, 0))
    w = tf.constant(random_case(w_shape, 1))
    strides = [1] * 5 if face is tfbigconv.bigconv3d else 1  # as tf.nn.conv3d takes them

    @tf.function(input_signature=[tf.TensorSpec([None] * len(x_shape)),
                                  tf.TensorSpec([None] * len(w_shape))])
    def step(x, w):
        with tf.GradientTape() as t:
            t.watch([x, w])
            y = face(x, w, strides, padding, algorithm=algorithm)
            loss = tf.reduce_sum(y * y)
        return (y,) + tuple(t.gradient(loss, [x, w]))

    y, dx, dw = step(x, w)
    assert y.shape == out_shape
    assert dx.shape == x.shape and dw.shape == w.shape
    if 0 in out_shape:  # nothing reaches the output: zero gradients
        assert not np.any(dw.numpy()) and not np.any(dx.numpy())
    else:  # the same as with static shapes
        with tf.GradientTape() as t:
            t.watch([x, w])
            want = face(x, w, strides, padding, algorithm=algorithm)
            loss = tf.reduce_sum(want * want)
        np.testing.assert_allclose(y.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
        for got, ref in zip((dx, dw), t.gradient(loss, [x, w])):
            np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)
