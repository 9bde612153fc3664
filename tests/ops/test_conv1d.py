"""bigconv1d (tfbigconv/ops/conv1d.py): parity with tf.nn.conv1d and the float64
reference in every padding (CAUSAL and explicit too), stride, dilation, group, layout
and dtype; batch 0, unknown shapes, gradients of first and second order; errors."""
import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from conftest import TOLERANCE, random_case, second_order_grads, tape_types
from reference import conv1d_reference, conv1d_reference_grads, rel_l2

ALGORITHMS = ["direct", "fft", "auto"]
TF_DTYPES = {"float16": tf.float16, "bfloat16": tf.bfloat16, "float32": tf.float32,
             "float64": tf.float64}


def tol(dtype, algorithm):
    return 1e-4 if (dtype == "float32" and algorithm != "direct") else TOLERANCE[dtype]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("k", [1, 4, 17, 64])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("stride,dil", [(1, 1), (2, 1), (3, 2), (1, 3)])
def test_matches_tf_nn_conv1d(algorithm, k, padding, stride, dil):
    x = random_case((2, 203, 3), k)
    w = random_case((k, 3, 5), k + 1)
    got = tfbigconv.bigconv1d(x, w, stride, padding, dilations=dil, algorithm=algorithm)
    want = tf.nn.conv1d(x, w, stride, padding, dilations=dil)
    assert got.shape == want.shape
    assert rel_l2(got, want) < tol("float32", algorithm)
    assert rel_l2(got, conv1d_reference(x, w, stride, padding, dil)) < tol("float32", algorithm)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("fmt", ["NWC", "NCW"])
@pytest.mark.parametrize("stride,dil", [(1, 1), (2, 3)])
def test_causal_padding(algorithm, fmt, stride, dil):
    """Keras Conv1D's causal: (k - 1) * dilation zeros before; output t sees inputs <= t."""
    x = random_case((2, 97, 4) if fmt == "NWC" else (2, 4, 97), 0)
    w = random_case((9, 4, 6), 1)
    y = tfbigconv.bigconv1d(x, w, stride, "CAUSAL", fmt, dil, algorithm=algorithm)
    assert rel_l2(y, conv1d_reference(x, w, stride, "CAUSAL", dil, fmt)) < tol("float32", algorithm)
    t = 40  # changing inputs after t leaves outputs up to t alone
    later = x.copy()
    if fmt == "NWC":
        later[:, t + 1:] += 1.0
    else:
        later[:, :, t + 1:] += 1.0
    y2 = tfbigconv.bigconv1d(later, w, stride, "CAUSAL", fmt, dil, algorithm=algorithm).numpy()
    keep = t // stride + 1
    a, b = (y[:, :keep], y2[:, :keep]) if fmt == "NWC" else (y[..., :keep], y2[..., :keep])
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("fmt", ["NWC", "NCW"])
def test_explicit_padding(algorithm, fmt):
    x = random_case((2, 50, 3) if fmt == "NWC" else (2, 3, 50), 2)
    w = random_case((11, 3, 2), 3)
    pairs = [[0, 0], [7, 2], [0, 0]] if fmt == "NWC" else [[0, 0], [0, 0], [7, 2]]
    got = tfbigconv.bigconv1d(x, w, 2, pairs, fmt, algorithm=algorithm)
    want = conv1d_reference(x, w, 2, "EXPLICIT", 1, fmt, (7, 2))
    assert rel_l2(got, want) < tol("float32", algorithm)


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("fmt", ["NWC", "NCW"])
@pytest.mark.parametrize("fin,cout", [(6, 4), (2, 6), (1, 6), (1, 12)])
def test_dtypes_groups_layouts(algorithm, dtype, fmt, fin, cout):
    """Dense, grouped and depthwise (multiplier 1 and 2) in every dtype and layout,
    against the float64 reference of the rounded inputs."""
    cin = 6
    x = tf.cast(random_case((2, 61, cin) if fmt == "NWC" else (2, cin, 61), 4), TF_DTYPES[dtype])
    w = tf.cast(random_case((13, fin, cout), 5), TF_DTYPES[dtype])
    got = tfbigconv.bigconv1d(x, w, 1, "SAME", fmt, algorithm=algorithm)
    assert got.dtype == TF_DTYPES[dtype]
    ref = conv1d_reference(tf.cast(x, tf.float64).numpy(), tf.cast(w, tf.float64).numpy(), 1,
                           "SAME", 1, fmt)
    assert rel_l2(tf.cast(got, tf.float64), ref) < tol(dtype, algorithm)


@pytest.mark.parametrize("channels", [1, 7, 8, 9, 17])
@pytest.mark.parametrize("fmt", ["NWC", "NCW"])
def test_long_depthwise_causal_fft_walks_stage_blocks(channels, fmt):
    """Long depthwise filters run as 1-D FFTs whose rows ducc0 takes in blocks of up to
    8 planes; channel counts around the block size, all three passes."""
    length, k = 300, 256
    x = random_case((2, length, channels) if fmt == "NWC" else (2, channels, length), channels)
    w = random_case((k, 1, channels), 1)
    dy = random_case((2, length, channels) if fmt == "NWC" else (2, channels, length), 2)
    xt, wt = tf.constant(x), tf.constant(w)
    with tf.GradientTape() as tape:
        tape.watch([xt, wt])
        y = tfbigconv.bigconv1d(xt, wt, 1, "CAUSAL", fmt, algorithm="fft")
    dx, dw = tape.gradient(y, [xt, wt], output_gradients=tf.constant(dy))
    rdx, rdw = conv1d_reference_grads(x, w, dy, 1, "CAUSAL", 1, fmt)
    assert rel_l2(y, conv1d_reference(x, w, 1, "CAUSAL", 1, fmt)) < 1e-4
    assert rel_l2(dx, rdx) < 1e-4 and rel_l2(dw, rdw) < 1e-4


@pytest.mark.native
@pytest.mark.parametrize("channels,algorithm,fused", [
    (16, "fft", True),
    (7, "fft", False),  # fewer channels than a group of lanes
    (16, "direct", False)])
def test_depthwise_gradients_share_one_transform_of_dy(channels, algorithm, fused):
    """Both gradients of a long 1-D depthwise convolution planned as fft on the CPU
    are one BigConv2DBackprop op (dL/dy transformed once for both); they match
    the float64 reference, in eager, in a tf.function and in a TF1 graph."""
    x = random_case((2, 300, channels), 0)
    w = random_case((200, 1, channels), 1)
    dy = random_case((2, 300, channels), 2)
    conv = lambda x, w: tfbigconv.bigconv1d(x, w, 1, "CAUSAL", algorithm=algorithm)
    types = tape_types(conv, x.shape, w.shape)
    assert ("BigConv2DBackprop" in types) == fused, types
    assert ("BigConv2DBackpropFilter" in types) != fused, types
    rdx, rdw = conv1d_reference_grads(x, w, dy, 1, "CAUSAL")

    def grads(x, w):
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            y = conv(x, w)
        return tape.gradient(y, [x, w], output_gradients=tf.constant(dy))
    xt, wt = tf.constant(x), tf.constant(w)
    for got in (grads(xt, wt), tf.function(grads)(xt, wt)):
        assert rel_l2(got[0], rdx) < 1e-4 and rel_l2(got[1], rdw) < 1e-4
    with tf.Graph().as_default():
        xg, wg = tf.compat.v1.placeholder(tf.float32, x.shape), tf.compat.v1.placeholder(tf.float32, w.shape)
        g = tf.gradients(conv(xg, wg), [xg, wg], grad_ys=tf.constant(dy))
        assert any(op.type == "BigConv2DBackprop" for op in tf.compat.v1.get_default_graph().get_operations()) == fused
        with tf.compat.v1.Session() as sess:
            gdx, gdw = sess.run(g, {xg: x, wg: w})
    assert rel_l2(gdx, rdx) < 1e-4 and rel_l2(gdw, rdw) < 1e-4


@pytest.mark.native
def test_fused_gradients_of_second_order_match_tf():
    x = tf.constant(random_case((2, 120, 8), 3).astype(np.float64))
    w = tf.constant(random_case((80, 1, 8), 4).astype(np.float64))
    conv = lambda x, w: tfbigconv.bigconv1d(x, w, 1, "CAUSAL", algorithm="fft")
    assert "BigConv2DBackprop" in tape_types(conv, x.shape, w.shape, tf.float64)
    ours = second_order_grads(conv, x, w)
    theirs = second_order_grads(lambda x, w: tf.nn.depthwise_conv2d(
        tf.pad(x, [[0, 0], [79, 0], [0, 0]])[:, None], tf.reshape(w, (1, 80, 8, 1)),
        [1, 1, 1, 1], "VALID")[:, 0], x, w)
    for a, b in zip(ours, theirs):
        assert rel_l2(a, b) < 1e-10


@pytest.mark.native
def test_fused_backprop_op_runs_what_it_does_not_fuse():
    """BigConv2DBackprop on a case the fused backward does not serve (2-D,
    grouped) runs the two gradients as their own ops do."""
    from tfbigconv._native import ops as native
    x, w = random_case((2, 9, 11, 6), 5), random_case((3, 4, 2, 6), 6)
    a = dict(strides=[1, 1, 2, 1], padding="SAME", algorithm="fft")
    dy = random_case(native.big_conv2d(x, w, **a).shape, 7)
    dx, dw = native.big_conv2d_backprop(x, w, dy, **a)
    assert rel_l2(dx, native.big_conv2d_backprop_input(x.shape, w, dy, **a)) < 1e-6
    assert rel_l2(dw, native.big_conv2d_backprop_filter(x, w.shape, dy, **a)) < 1e-6
    with pytest.raises(tf.errors.InvalidArgumentError, match="out_backprop shape"):
        native.big_conv2d_backprop(x, w, dy[:, :3], **a)


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
def test_gradients_against_reference(algorithm):
    x = random_case((3, 45, 4), 6)
    w = random_case((7, 2, 6), 7)
    dy = random_case((3, 20, 6), 8)
    xt, wt = tf.constant(x), tf.constant(w)
    with tf.GradientTape() as tape:
        tape.watch([xt, wt])
        y = tfbigconv.bigconv1d(xt, wt, 2, "VALID", dilations=1, algorithm=algorithm)
    dx, dw = tape.gradient(y, [xt, wt], output_gradients=tf.constant(dy))
    rdx, rdw = conv1d_reference_grads(x, w, dy, 2, "VALID", 1)
    assert rel_l2(dx, rdx) < tol("float32", algorithm)
    assert rel_l2(dw, rdw) < tol("float32", algorithm)


def test_second_order_gradients_match_tf():
    x = tf.constant(random_case((2, 33, 3), 9).astype(np.float64))
    w = tf.constant(random_case((5, 3, 4), 10).astype(np.float64))
    ours = second_order_grads(
        lambda x, w: tfbigconv.bigconv1d(x, w, 2, "SAME", algorithm="direct"), x, w)
    theirs = second_order_grads(lambda x, w: tf.nn.conv1d(x, w, 2, "SAME"), x, w)
    for a, b in zip(ours, theirs):
        assert rel_l2(a, b) < 1e-10


def test_batch_zero_and_unknown_shapes():
    w = random_case((9, 2, 3), 0)
    empty = tfbigconv.bigconv1d(np.zeros((0, 40, 2), np.float32), w, 1, "CAUSAL")
    assert empty.shape == (0, 40, 3)

    @tf.function(input_signature=[tf.TensorSpec([None, None, 2], tf.float32)])
    def f(x):
        return tfbigconv.bigconv1d(x, w, 1, "CAUSAL")

    x = random_case((3, 41, 2), 1)
    assert rel_l2(f(x), conv1d_reference(x, w, 1, "CAUSAL")) < 1e-4
    assert f(np.zeros((0, 5, 2), np.float32)).shape == (0, 5, 3)


def test_batch_dimensions_before_the_sequence():
    x = random_case((2, 3, 30, 2), 0)
    w = random_case((5, 2, 3), 1)
    got = tfbigconv.bigconv1d(x, w, 1, "SAME")
    want = tf.nn.conv1d(x, w, 1, "SAME")
    assert got.shape == (2, 3, 30, 3) and rel_l2(got, want) < 1e-5


def test_stride_and_dilation_forms():
    x = random_case((1, 30, 2), 0)
    w = random_case((3, 2, 2), 1)
    a = tfbigconv.bigconv1d(x, w, [1, 2, 1], "VALID", dilations=[1, 2, 1])
    b = tfbigconv.bigconv1d(x, w, 2, "VALID", dilations=np.array([2]))
    assert rel_l2(a, b) == 0
    c = tfbigconv.bigconv1d(np.moveaxis(x, 2, 1), w, [1, 1, 2], "VALID", "NCW", [1, 1, 2])
    assert rel_l2(np.moveaxis(c.numpy(), 1, 2), a) < 1e-6


def test_errors_name_the_argument():
    x = random_case((1, 30, 2), 0)
    w = random_case((3, 2, 2), 1)
    for bad in ("NHWDC", "nwc"):  # tf.nn.conv1d is case-sensitive too
        with pytest.raises(ValueError, match="data_format"):
            tfbigconv.bigconv1d(x, w, 1, "SAME", bad)
    with pytest.raises(ValueError, match="stride"):
        tfbigconv.bigconv1d(x, w, [1, 1], "SAME")
    with pytest.raises(ValueError, match="padding"):
        tfbigconv.bigconv1d(x, w, 1, [[0, 0], [1, 1]])
    with pytest.raises(tf.errors.InvalidArgumentError, match="input must be rank 3"):
        tfbigconv.bigconv1d(x[0], w, 1, "SAME")
    with pytest.raises(tf.errors.InvalidArgumentError, match="filters must be rank 3"):
        tfbigconv.bigconv1d(x, w[None], 1, "SAME")
    with pytest.raises(tf.errors.UnimplementedError, match="stride"):
        tfbigconv.bigconv1d(x, w, [2, 1, 1], "SAME")
    with pytest.raises(tf.errors.InvalidArgumentError, match="padding|EXPLICIT|explicit"):
        tfbigconv.bigconv1d(x, w, 1, [[1, 0], [0, 0], [0, 0]])
    with pytest.raises(tf.errors.InvalidArgumentError, match="algorithm"):
        tfbigconv.bigconv1d(x, w, 1, "SAME", algorithm="winograd")

    @tf.function(input_signature=[tf.TensorSpec([None, 2, 2], tf.float32)])
    def unknown_width(f):
        return tfbigconv.bigconv1d(x, f, 1, "CAUSAL")

    with pytest.raises(ValueError, match="CAUSAL"):
        unknown_width(w)


@pytest.mark.native  # the pure-TF FFT spreads a NaN over its whole transform
def test_nan_and_inf_land_where_tf_puts_them():
    """The 1-D FFT path stages whole rows at once; a NaN or Inf in the input or the
    filter still reaches exactly the outputs tf.nn.conv1d gives it."""
    x = random_case((2, 300, 9), 0)
    w = random_case((64, 1, 9), 1)
    x[1, 100, 3] = np.nan
    x[0, 20, 5] = np.inf
    got = tfbigconv.bigconv1d(x, w, 1, "SAME", algorithm="fft").numpy()
    want = tf.nn.depthwise_conv2d(x[:, None], np.reshape(w, (1, 64, 9, 1)), [1, 1, 1, 1],
                                  "SAME").numpy()[:, 0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    assert rel_l2(got[finite], want[finite]) < 1e-4
    w[10, 0, 2] = np.nan
    got = tfbigconv.bigconv1d(random_case((2, 300, 9), 2), w, 1, "SAME", algorithm="fft").numpy()
    assert np.isnan(got[..., 2]).all() and np.isfinite(got[..., [0, 1, 3]]).all()


def test_under_xla_causal():
    x = random_case((2, 50, 4), 0)
    w = random_case((9, 1, 4), 1)
    f = tf.function(lambda x, w: tfbigconv.bigconv1d(x, w, 1, "CAUSAL"), jit_compile=True)
    assert rel_l2(f(x, w), conv1d_reference(x, w, 1, "CAUSAL")) < 1e-5
