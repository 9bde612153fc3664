"""ConvGeometry through _core: output sizes, padding and validation."""
import itertools

import pytest
import tensorflow as tf

from tfbigconv import _core

from conftest import to4


def geometry(in_shape, f_shape, strides=1, padding="VALID", explicit=(), fmt="NHWC", dil=1):
    return _core.conv_geometry(list(in_shape), list(f_shape), to4(strides, fmt), padding,
                               list(explicit), fmt, to4(dil, fmt))


@pytest.mark.parametrize("n,k,s,d,padding", [
    (n, k, s, d, p)
    for n, k, s, d, p in itertools.product([1, 7, 16, 17, 31], [1, 2, 3, 7], [1, 2, 3, 4], [1, 2, 3],
                                            ["SAME", "VALID"])
    if (p == "SAME" or (k - 1) * d + 1 <= n) and (d == 1 or s == 1)  # TF refuses d>1 with s>1
])
def test_output_size_matches_tf(n, k, s, d, padding):
    """Output shapes agree with tf.nn.conv2d's shape inference."""
    g = geometry((1, n, n + 1, 2), (k, k, 2, 3), s, padding, dil=d)
    x = tf.TensorSpec((1, n, n + 1, 2))
    w = tf.TensorSpec((k, k, 2, 3))
    fn = tf.function(lambda x, w: tf.nn.conv2d(x, w, s, padding, dilations=d))
    expect = fn.get_concrete_function(x, w).output_shapes.as_list()
    assert g.output_shape == expect


def test_same_padding_split_like_tf():
    # pad_total = 4 for in 10, k 5, s 1: TF puts the smaller half first.
    g = geometry((1, 10, 10, 1), (6, 6, 1, 1), 1, "SAME")
    assert (g.pad_top, g.pad_bottom) == (2, 3)


def test_explicit_and_nchw():
    g = geometry((2, 3, 10, 12), (3, 5, 3, 4), (2, 1), "EXPLICIT",
                 [0, 0, 0, 0, 1, 2, 3, 0], "NCHW")
    assert (g.pad_top, g.pad_bottom, g.pad_left, g.pad_right) == (1, 2, 3, 0)
    assert g.output_shape == [2, 4, (10 + 3 - 3) // 2 + 1, 12 - 5 + 3 + 1]


def test_groups():
    g = geometry((1, 8, 8, 12), (3, 3, 4, 6))
    assert g.groups == 3


def test_batch_zero():
    assert geometry((0, 8, 8, 1), (3, 3, 1, 2)).output_shape == [0, 6, 6, 2]


BAD = [
    # (kwargs, fragment of the message)
    (dict(in_shape=(1, 8, 8), f_shape=(3, 3, 1, 1)), "input must be rank 4"),
    (dict(f_shape=(3, 3, 1)), "filter must be rank 4"),
    (dict(in_shape=(1, 8, 8, 5), f_shape=(3, 3, 2, 2)), "multiple of the filter's in_depth"),
    (dict(in_shape=(1, 8, 8, 4), f_shape=(3, 3, 2, 3)), "multiple of groups"),
    (dict(strides=0), "strides must be positive"),
    (dict(dil=-1), "dilations must be positive"),
    (dict(padding="FOO"), "padding must be one of"),
    (dict(padding="EXPLICIT", explicit=[0, 0, 1, 1]), "explicit_paddings must have 8"),
    (dict(padding="EXPLICIT", explicit=[0, 0, 1, -1, 0, 0, 0, 0]), "non-negative"),
    (dict(padding="EXPLICIT", explicit=[1, 0, 0, 0, 0, 0, 0, 0]), "batch and depth"),
    (dict(f_shape=(10, 3, 1, 1)), "larger than the padded input along height"),
    (dict(f_shape=(3, 3, 1, 1), dil=(1, 5)), "larger than the padded input along width"),
    (dict(f_shape=(0, 3, 1, 1)), "at least 1"),
    (dict(fmt="NWHC"), "data_format"),
]


@pytest.mark.parametrize("kwargs,fragment", BAD)
def test_invalid_arguments_are_named(kwargs, fragment):
    args = dict(in_shape=(1, 8, 8, 1), f_shape=(3, 3, 1, 1))
    args.update(kwargs)
    with pytest.raises(ValueError, match=fragment):
        geometry(**args)


def test_strides_on_batch_rejected():
    with pytest.raises(ValueError, match="batch and depth"):
        _core.conv_geometry([1, 8, 8, 1], [3, 3, 1, 1], [2, 1, 1, 1], "VALID", [], "NHWC",
                            [1, 1, 1, 1])
    with pytest.raises(ValueError, match="strides must have 4"):
        _core.conv_geometry([1, 8, 8, 1], [3, 3, 1, 1], [1, 1, 1], "VALID", [], "NHWC",
                            [1, 1, 1, 1])
