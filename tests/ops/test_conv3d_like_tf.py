"""bigconv3d as tf.nn.conv3d where TF's conv_ops_3d_test found it differ (issue 52):
batch dimensions before the 5 (testConv3DExpandedBatch: TF's squeeze_batch_dims,
which bigconv2d shares), and a filter with no elements (TF's class and words, which
its tests match)."""
import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from conftest import random_case
from reference import conv3d_reference, conv3d_reference_grads, rel_l2

ALGORITHMS = ["auto", "tf", "direct", "fft"]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_expanded_batch_as_tf(algorithm):
    """TF's testConv3DExpandedBatch: x (2, 5, 2, 3, 1, 3), a 1x1x1x3x3 filter."""
    x, w = random_case((2, 5, 2, 3, 1, 3), 0), random_case((1, 1, 1, 3, 3), 1)
    got = tfbigconv.bigconv3d(x, w, [1] * 5, "VALID", algorithm=algorithm)
    want = tf.nn.conv3d(x, w, [1] * 5, "VALID")
    assert got.shape == want.shape == (2, 5, 2, 3, 1, 3)
    ref = conv3d_reference(x.reshape(10, 2, 3, 1, 3), w).reshape(want.shape)
    assert rel_l2(got.numpy(), ref) < 1e-5


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_batch_dimensions_unknown_when_built_with_gradients(algorithm):
    x, w = random_case((2, 3, 5, 6, 7, 2), 0), random_case((3, 2, 3, 2, 4), 1)
    dy = random_case((2, 3, 5, 6, 7, 4), 2)

    @tf.function(input_signature=[tf.TensorSpec([None, None, 5, 6, 7, 2]),
                                  tf.TensorSpec([3, 2, 3, 2, 4])])
    def step(x, w):
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            y = tfbigconv.bigconv3d(x, w, 1, "SAME", algorithm=algorithm)
        return [y] + tape.gradient(y, [x, w], output_gradients=dy)

    y, dx, dw = step(x, w)
    assert y.shape == (2, 3, 5, 6, 7, 4)
    flat = x.reshape(6, 5, 6, 7, 2)
    ry = conv3d_reference(flat, w, padding="SAME").reshape(y.shape)
    rdx, rdw = conv3d_reference_grads(flat, w, dy.reshape(6, 5, 6, 7, 4), padding="SAME")
    assert rel_l2(y.numpy(), ry) < 1e-4
    assert rel_l2(dx.numpy(), rdx.reshape(x.shape)) < 1e-4
    assert rel_l2(dw.numpy(), rdw) < 1e-4


ZERO_FILTERS = [(0, 1, 1, 2, 3), (1, 0, 1, 2, 3), (1, 1, 0, 2, 3), (1, 1, 1, 0, 3),
                (1, 1, 1, 2, 0)]
TF_WORDS = "filter must not have zero elements"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("f_shape", ZERO_FILTERS)
def test_filter_without_elements_raises_tfs_words(f_shape, algorithm):
    """TF's Conv3D raises InvalidArgumentError for any zero dimension (asked of TF here;
    its words for a zero in_depth depend on the host); ours raises the same class
    with TF's words, eagerly and in a tf.function."""
    x, w = random_case((1, 4, 4, 4, 2), 0), np.zeros(f_shape, np.float32)
    with pytest.raises(Exception) as tf_error:
        tf.nn.conv3d(x, w, [1] * 5, "VALID")
    assert type(tf_error.value) is tf.errors.InvalidArgumentError
    for run in (lambda f: f(), lambda f: tf.function(f)()):
        with pytest.raises(tf.errors.InvalidArgumentError, match=TF_WORDS):
            run(lambda: tfbigconv.bigconv3d(x, w, 1, "VALID", algorithm=algorithm))
