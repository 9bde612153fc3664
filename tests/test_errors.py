"""Every invalid argument raises InvalidArgumentError naming the problem, at
trace time with static shapes and at run time with unknown shapes."""
import pytest
import tensorflow as tf

import tfbigconv
from conftest import random_case

X = random_case((1, 8, 8, 2), 0)
W = random_case((3, 3, 2, 4), 1)

BAD = [
    (dict(input=random_case((8, 8, 2), 0)), "input must be rank 4"),
    (dict(filters=random_case((3, 3, 2), 0)), "filters must be rank 4"),
    (dict(filters=random_case((3, 3, 3, 4), 0)), "multiple of the filter's in_depth"),
    (dict(input=random_case((1, 8, 8, 4), 0), filters=random_case((3, 3, 2, 3), 0)),
     "multiple of groups"),
    (dict(strides=0), "strides must be positive"),
    (dict(strides=[1, 2, 3]), "strides must be an int or a list of 1, 2 or 4"),
    (dict(strides=[2, 1, 1, 1]), "batch and depth"),
    (dict(strides=[1, 1, 1, 2]), "batch and depth"),
    (dict(dilations=-2), "dilations must be positive"),
    (dict(padding="FULL"), "padding must be one of"),
    (dict(padding=[[0, 0], [1, 1], [1, 1]]), "4 \\[before, after\\] pairs"),
    (dict(padding=[[0, 0], [1, -1], [1, 1], [0, 0]]), "non-negative"),
    (dict(padding=[[1, 0], [1, 1], [1, 1], [0, 0]]), "batch and depth"),
    (dict(filters=random_case((10, 3, 2, 4), 0)), "larger than the padded input along height"),
    (dict(data_format="NWHC"), "data_format"),
    (dict(algorithm="magic"), "algorithm"),
    (dict(input=tf.zeros((1, 8, 8, 2), tf.int32)), "input dtype"),
    (dict(filters=tf.zeros((3, 3, 2, 4), tf.float64)), "filters dtype"),
]


def call(**kw):
    args = dict(input=X, filters=W, strides=1, padding="VALID")
    args.update(kw)
    return tfbigconv.bigconv2d(**args)


@pytest.mark.parametrize("kwargs,fragment", BAD)
def test_eager_errors(kwargs, fragment):
    with pytest.raises(tf.errors.InvalidArgumentError, match=fragment):
        call(**kwargs)


@pytest.mark.parametrize("kwargs,fragment", BAD)
def test_tf_function_errors(kwargs, fragment):
    with pytest.raises(tf.errors.InvalidArgumentError, match=fragment):
        tf.function(lambda: call(**kwargs))()


@pytest.mark.parametrize("x,w,fragment", [
    (random_case((1, 8, 8, 3), 0), W, "multiple of the filter's in_depth"),
    (X, random_case((10, 3, 2, 4), 0), "larger than the padded input"),
    (random_case((1, 8, 8, 4), 0), random_case((3, 3, 2, 3), 0), "multiple of groups"),
    (random_case((1, 8, 8), 0), W, "input must be rank 4"),
])
def test_runtime_errors_with_unknown_shapes(x, w, fragment):
    fn = tf.function(lambda x, w: tfbigconv.bigconv2d(x, w, 1, "VALID"),
                     input_signature=[tf.TensorSpec(None), tf.TensorSpec(None)])
    with pytest.raises(tf.errors.InvalidArgumentError, match=fragment):
        fn(x, w)


def test_raw_op_rejects_bad_attrs():
    """The op itself (not only the Python wrapper) validates its attributes."""
    with pytest.raises(tf.errors.InvalidArgumentError, match="strides"):
        tfbigconv._raw_ops.big_conv2d(input=X, filter=W, strides=[1, 1, 1], padding="VALID")
    with pytest.raises(tf.errors.InvalidArgumentError, match="explicit_paddings"):
        tfbigconv._raw_ops.big_conv2d(input=X, filter=W, strides=[1, 1, 1, 1], padding="EXPLICIT",
                                      explicit_paddings=[1, 1])
