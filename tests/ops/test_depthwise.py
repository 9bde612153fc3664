"""depthwise_conv2d (tfbigconv/ops/depthwise.py): parity with tf.nn.depthwise_conv2d
(and TF1's) in float64 by relative L2, in every algorithm, padding, stride, dilation,
layout and dtype; channel multipliers, large and small filters, batch 0, unknown
shapes, gradients of first and second order; TF's exceptions for bad arguments."""
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from conftest import TOLERANCE, pure_tf_mode, random_case, second_order_grads
from reference import rel_l2

ALGORITHMS = ["auto", "tf", "direct", "fft"]
EXPLICIT = [[0, 0], [2, 1], [0, 3], [0, 0]]


def tol(dtype, algorithm):
    if dtype == "float64":  # the FFT's rounding, also on the pure-TF path
        return 1e-10 if algorithm != "fft" and not pure_tf_mode() else 1e-9
    return TOLERANCE[dtype] * (10 if dtype == "float32" else 1)


def operands(x_shape, w_shape, dtype=tf.float64, seed=0):
    return (tf.constant(random_case(x_shape, seed, np.float64), dtype),
            tf.constant(random_case(w_shape, seed + 1, np.float64), dtype))


def tf_depthwise(x, w, strides, padding, **kw):
    """tf.nn.depthwise_conv2d in float64 (its UserWarning for strides with
    dilations silenced, as the test of that warning checks ours)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return tf.nn.depthwise_conv2d(tf.cast(x, tf.float64), tf.cast(w, tf.float64), strides,
                                      padding, **kw)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("padding", ["SAME", "VALID", EXPLICIT])
@pytest.mark.parametrize("stride,dil", [(1, 1), (2, 1), (3, 1), (1, 2), (1, (3, 2))])
@pytest.mark.parametrize("multiplier", [1, 3])
def test_matches_tf(algorithm, padding, stride, dil, multiplier):
    x, w = operands((2, 23, 19, 5), (5, 3, 5, multiplier), seed=stride + multiplier)
    dil = [dil, dil] if isinstance(dil, int) else list(dil)
    strides = [1, stride, stride, 1]
    got = tfbigconv.depthwise_conv2d(x, w, strides, padding, dilations=dil, algorithm=algorithm)
    want = tf_depthwise(x, w, strides, padding, dilations=dil)
    assert got.shape == want.shape
    assert rel_l2(got, want) < tol("float64", algorithm)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("x_shape,w_shape", [
    ((1, 67, 61, 3), (31, 31, 3, 1)),   # RepLKNet's large kernel
    ((2, 13, 17, 7), (13, 13, 7, 2)),   # a filter as tall as the input, prime sizes
    ((3, 17, 29, 2), (1, 1, 2, 4)),     # the smallest filter
    ((2, 31, 37, 11), (3, 7, 11, 1)),   # odd, prime, unequal sides
])
def test_filter_sizes(algorithm, x_shape, w_shape):
    x, w = operands(x_shape, w_shape)
    for padding in ("SAME", "VALID"):
        got = tfbigconv.depthwise_conv2d(x, w, [1, 1, 1, 1], padding, algorithm=algorithm)
        assert rel_l2(got, tf_depthwise(x, w, [1, 1, 1, 1], padding)) < tol("float64", algorithm)


def test_output_channel_order():
    """Output channel c * multiplier + m is input channel c with filter[:, :, c, m]."""
    x, w = operands((1, 9, 8, 3), (3, 3, 3, 2))
    y = tfbigconv.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME")
    for c in range(3):
        for m in range(2):
            one = tf.nn.conv2d(x[..., c:c + 1], w[:, :, c:c + 1, m:m + 1], 1, "SAME")
            assert rel_l2(y[..., c * 2 + m:c * 2 + m + 1], one) < 1e-12


@pytest.mark.parametrize("algorithm", ["auto", "direct", "fft"])  # "tf": NHWC on TF's CPU
def test_nchw(algorithm):
    """NCHW, which TF's CPU kernel refuses (it runs on the GPU): the NHWC result transposed."""
    x, w = operands((2, 15, 14, 4), (5, 4, 4, 2))
    nchw = tf.transpose(x, [0, 3, 1, 2])
    for padding in ("SAME", [[0, 0], [0, 0], [2, 1], [0, 3]]):
        nhwc_pad = padding if isinstance(padding, str) else EXPLICIT
        got = tfbigconv.depthwise_conv2d(nchw, w, [1, 1, 2, 2], padding, data_format="NCHW",
                                         dilations=[2, 1], algorithm=algorithm)
        want = tf_depthwise(x, w, [1, 2, 2, 1], nhwc_pad, dilations=[2, 1])
        assert rel_l2(tf.transpose(got, [0, 2, 3, 1]), want) < tol("float64", algorithm)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_dtypes(dtype, algorithm):
    x, w = operands((2, 21, 18, 6), (9, 9, 6, 2), getattr(tf, dtype))
    got = tfbigconv.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME", algorithm=algorithm)
    assert got.dtype == x.dtype
    # the reference on the operands as rounded to the dtype
    assert rel_l2(tf.cast(got, tf.float64), tf_depthwise(x, w, [1, 1, 1, 1], "SAME")) \
        < tol(dtype, algorithm)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("strides,dil,padding", [([1, 1, 1, 1], [1, 1], "SAME"),
                                                 ([1, 2, 2, 1], [1, 1], "VALID"),
                                                 ([1, 1, 1, 1], [2, 3], EXPLICIT)])
def test_gradients(algorithm, strides, dil, padding):
    x, w = operands((2, 14, 13, 3), (5, 4, 3, 2))

    def ours(x, w):
        return tfbigconv.depthwise_conv2d(x, w, strides, padding, dilations=dil,
                                          algorithm=algorithm)

    def theirs(x, w):
        return tf.nn.depthwise_conv2d(x, w, strides, padding, dilations=dil)

    dy = tf.constant(random_case(theirs(x, w).shape, 5, np.float64))
    firsts = []
    for conv in (ours, theirs):
        with tf.GradientTape() as t:
            t.watch([x, w])
            y = conv(x, w)
        firsts.append(t.gradient(y, [x, w], output_gradients=dy))
    for got, want in zip(*firsts):
        assert rel_l2(got, want) < tol("float64", algorithm)
    for got, want in zip(second_order_grads(ours, x, w), second_order_grads(theirs, x, w)):
        assert rel_l2(got, want) < tol("float64", algorithm) * 10


def test_strides_with_dilations_as_tf():
    """tf.nn.depthwise_conv2d's UserWarning, and its result: the strided convolution
    of the space-to-batch blocks (not the strided dilated convolution)."""
    x, w = operands((2, 19, 22, 3), (3, 4, 3, 2))
    with pytest.warns(UserWarning, match="all values of strides must be 1"):
        got = tfbigconv.depthwise_conv2d(x, w, [1, 2, 2, 1], "SAME", dilations=[2, 2])
    want = tf_depthwise(x, w, [1, 2, 2, 1], "SAME", dilations=[2, 2])
    assert got.shape == want.shape
    assert rel_l2(got, want) < 1e-10


def test_tf1_keywords():
    x, w = operands((2, 16, 15, 3), (3, 3, 3, 2))
    got = tfbigconv.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME", rate=[2, 3])
    want = tf.compat.v1.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME", rate=[2, 3])
    assert rel_l2(got, want) < 1e-10
    with pytest.raises(ValueError, match="Cannot specify both 'rate' and 'dilations'"):
        tfbigconv.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME", rate=[1, 1], dilations=[1, 1])
    with pytest.raises(ValueError, match="Cannot specify both"):  # TF says the same
        tf.compat.v1.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME", rate=[1, 1],
                                         dilations=[1, 1])
    # TF1's positional rate lands on data_format here: refused, saying to pass rate=
    with pytest.raises(TypeError, match="rate="):
        tfbigconv.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME", [2, 3])


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_unknown_shapes_and_batch_zero(algorithm):
    # the filter's in_channels known, as in a model ("tf" with both depths unknown runs
    # TF's grouped Conv2D, whose CPU gradient refuses groups)
    spec = [tf.TensorSpec(None, tf.float64), tf.TensorSpec([None, None, 3, None], tf.float64)]

    @tf.function(input_signature=spec)
    def step(x, w):
        with tf.GradientTape() as t:
            t.watch([x, w])
            y = tfbigconv.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME", algorithm=algorithm)
            loss = tf.reduce_sum(y * y)
        return (y,) + tuple(t.gradient(loss, [x, w]))

    for batch in (2, 0):
        x, w = operands((batch, 11, 9, 3), (4, 4, 3, 2))
        y, dx, dw = step(x, w)
        with tf.GradientTape() as t:
            t.watch([x, w])
            want = tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME")
            loss = tf.reduce_sum(want * want)
        want_dx, want_dw = t.gradient(loss, [x, w])
        assert y.shape == want.shape and dx.shape == x.shape
        if batch:
            assert rel_l2(y, want) < tol("float64", algorithm)
            assert rel_l2(dx, want_dx) < tol("float64", algorithm)
            assert rel_l2(dw, want_dw) < tol("float64", algorithm)
        else:
            assert not np.any(dw.numpy())
    with pytest.raises(tf.errors.InvalidArgumentError, match="same depth"):
        step(*operands((1, 11, 9, 2), (4, 4, 3, 2)))


def expected_class(fn, *args, **kwargs):
    """The exception class tf.nn.depthwise_conv2d raises here (ask TF: it depends on the
    host, oneDNN and eager or graph mode)."""
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001  (the class is the answer)
        return type(e)
    raise AssertionError("TF took it")


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("case", [
    dict(strides=[1, 1, 1]),                         # not 4 strides
    dict(strides=1),                                 # not a list
    dict(strides=[2, 1, 1, 1]),                      # batch stride
    dict(strides=[1, 1, 1, 2]),                      # channel stride
    dict(w_shape=(3, 3, 4, 2)),                      # in_channels not the input's
    dict(w_shape=(3, 3, 3)),                         # filter rank
    # input rank: not asked eagerly, where oneDNN's kernel aborts the process (TF 2.21);
    # the class TF's shape function and Eigen kernel raise
    dict(x_shape=(9, 10, 3), eager=tf.errors.InvalidArgumentError),
    dict(padding="FOO"),
    dict(padding=[[0, 0], [1, 2], [3, 4]]),          # 3 pairs
    dict(dilations=[0, 1]),
    dict(dilations=2),
    dict(w_shape=(12, 3, 3, 2), padding="VALID"),   # a negative output size
    dict(dtype=tf.int32),
])
def test_bad_arguments_raise_as_tf(case, graph):
    x_shape, w_shape = case.get("x_shape", (2, 9, 10, 3)), case.get("w_shape", (3, 3, 3, 2))
    dtype = case.get("dtype", tf.float32)
    x, w = [tf.cast(t, dtype) for t in operands(x_shape, w_shape)]
    args = (case.get("strides", [1, 1, 1, 1]), case.get("padding", "SAME"))
    kw = {"dilations": case["dilations"]} if "dilations" in case else {}

    def call(conv):
        return (tf.function(lambda: conv(x, w, *args, **kw)) if graph
                else lambda: conv(x, w, *args, **kw))

    want = (case["eager"] if "eager" in case and not graph
            else expected_class(call(tf.nn.depthwise_conv2d)))
    with pytest.raises(want):
        call(tfbigconv.depthwise_conv2d)()


@pytest.mark.native
def test_algorithms_run_their_kernels():
    """"tf" runs TF's DepthwiseConv2dNative on the grouped filter, "direct" our op."""
    x, w = operands((2, 16, 16, 8), (3, 3, 8, 1), tf.float32)
    f = tf.function(lambda x, w: tfbigconv.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME",
                                                             algorithm="tf"))
    ops = {op.type for op in f.get_concrete_function(x, w).graph.get_operations()}
    assert "DepthwiseConv2dNative" in ops
    f = tf.function(lambda x, w: tfbigconv.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME",
                                                            algorithm="direct"))
    assert "BigConv2D" in {op.type for op in f.get_concrete_function(x, w).graph.get_operations()}
