"""Gradients: BigConv2DBackpropInput / BigConv2DBackpropFilter, in the core
(both algorithms, NaN-poisoned outputs) and through tf.GradientTape (first and
second order), against float64 references and tf.nn.conv2d's gradients."""
import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from tfbigconv import _core
from conftest import (PADDINGS, TOLERANCE, explicit_pairs, hw_pair, random_case, run_core_pass,
                      to4)
from reference import conv2d_reference_backprop_filter, conv2d_reference_backprop_input, rel_l2

ALGORITHMS = ["direct", "fft"]


def tol(dtype, algorithm):
    return 1e-4 if (dtype == "float32" and algorithm == "fft") else TOLERANCE[dtype]


def out_shape(x_shape, w_shape, strides, padding, dil, fmt, pads):
    explicit = [v for p in explicit_pairs(pads, fmt) for v in p] if padding == "EXPLICIT" else []
    return _core.conv_geometry(list(x_shape), list(w_shape), to4(strides, fmt), padding, explicit,
                               fmt, to4(dil, fmt))["output_shape"]


def check_core_grads(kind, x_shape, w_shape, strides=1, padding="VALID", dil=1, fmt="NHWC",
                     pads=((0, 0), (0, 0)), dtype="float32", **kw):
    x = random_case(x_shape, 1, dtype)
    w = random_case(w_shape, 2, dtype)
    dy = random_case(out_shape(x_shape, w_shape, strides, padding, dil, fmt, pads), 3, dtype)
    args = (hw_pair(strides), padding, hw_pair(dil), fmt, pads)
    dx = run_core_pass(kind, "backprop_input", dy, w, x_shape, strides, padding, dil, fmt, pads, **kw)
    dw = run_core_pass(kind, "backprop_filter", x, dy, w_shape, strides, padding, dil, fmt, pads, **kw)
    assert rel_l2(dx, conv2d_reference_backprop_input(dy, w, x_shape, *args)) <= tol(dtype, kind)
    assert rel_l2(dw, conv2d_reference_backprop_filter(x, dy, w_shape, *args)) <= tol(dtype, kind)


@pytest.mark.parametrize("kind", ALGORITHMS)
@pytest.mark.parametrize("padding,pads", PADDINGS)
@pytest.mark.parametrize("strides", [1, 2, 3, (1, 3), (4, 2)])
@pytest.mark.parametrize("dil", [1, 2, (1, 3)])
def test_core_padding_strides_dilations(kind, padding, pads, strides, dil):
    for cout in (2, 40):
        check_core_grads(kind, (2, 19, 23, 3), (4, 5, 3, cout), strides, padding, dil, pads=pads)


@pytest.mark.parametrize("kind", ALGORITHMS)
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("cin,fin,cout", [(6, 3, 4), (8, 1, 8), (8, 1, 16), (20, 10, 6),
                                          (4, 1, 64), (64, 32, 64)])
def test_core_groups_and_layouts(kind, fmt, cin, fin, cout):
    shape = (2, 15, 17, cin) if fmt == "NHWC" else (2, cin, 15, 17)
    check_core_grads(kind, shape, (5, 4, fin, cout), 2, "SAME", 1, fmt)


@pytest.mark.parametrize("kind", ALGORITHMS)
@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_core_dtypes(kind, dtype):
    check_core_grads(kind, (2, 21, 18, 3), (7, 6, 3, 5), 1, "SAME", dtype=dtype)


@pytest.mark.parametrize("isa", _core.supported_isas())
def test_core_direct_isas(isa):
    check_core_grads("direct", (2, 22, 25, 4), (9, 8, 2, 36), (1, 2), "SAME", isa=isa)
    check_core_grads("direct", (2, 22, 25, 4), (9, 8, 4, 3), 1, "VALID", (2, 1), isa=isa)


@pytest.mark.parametrize("kind", ALGORITHMS)
def test_core_large_filters(kind):
    check_core_grads(kind, (2, 80, 75, 1), (63, 63, 1, 3), 1, "VALID")
    check_core_grads(kind, (1, 40, 44, 2), (31, 31, 2, 3), 1, "SAME")


@pytest.mark.parametrize("kind", ALGORITHMS)
def test_core_empty_reductions(kind):
    """Batch 0: dx is empty and dw must be all zeros."""
    x = random_case((0, 9, 9, 2), 0)
    dy = random_case((0, 7, 7, 3), 1)
    dw = run_core_pass(kind, "backprop_filter", x, dy, (3, 3, 2, 3))
    np.testing.assert_array_equal(dw, np.zeros((3, 3, 2, 3), np.float32))


def test_core_backprop_filter_deterministic_across_threads():
    x, dy = random_case((4, 30, 33, 8), 0), random_case((4, 30, 33, 8), 1)
    for kind in ALGORITHMS:
        outs = [run_core_pass(kind, "backprop_filter", x, dy, (7, 7, 8, 8), 1, "SAME",
                              num_threads=t) for t in (1, 2, 3)]
        for o in outs[1:]:
            np.testing.assert_array_equal(o, outs[0])


# ---- through TensorFlow ----------------------------------------------------

def tape_grads(fn, x, w):
    x, w = tf.constant(x), tf.constant(w)
    with tf.GradientTape() as t:
        t.watch([x, w])
        y = fn(x, w)
        loss = tf.reduce_sum(y * tf.sin(y))
    return [g.numpy() for g in t.gradient(loss, [x, w])]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("strides,padding", [(1, "SAME"), (2, "VALID"), ((1, 3), "SAME"),
                                             (1, [[0, 0], [2, 1], [0, 3], [0, 0]])])
def test_matches_tf_gradients(algorithm, strides, padding):
    x = random_case((2, 30, 27, 3), 0)
    w = random_case((9, 7, 3, 5), 1)
    got = tape_grads(lambda x, w: tfbigconv.bigconv2d(x, w, strides, padding, algorithm=algorithm), x, w)
    want = tape_grads(lambda x, w: tf.nn.conv2d(x, w, strides, padding), x, w)
    for g, r in zip(got, want):
        assert rel_l2(g, r) < 1e-4


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_grouped_dilated_gradients_vs_reference(algorithm, fmt):
    """Grouped and dilated: TF's CPU has no gradient for these; float64 reference."""
    shape = (2, 17, 19, 6) if fmt == "NHWC" else (2, 6, 17, 19)
    x, w = random_case(shape, 0, np.float64), random_case((5, 4, 2, 9), 1, np.float64)
    dy = random_case(out_shape(shape, w.shape, 2, "SAME", (2, 1), fmt, None), 2, np.float64)
    x_t, w_t = tf.constant(x), tf.constant(w)
    with tf.GradientTape() as t:
        t.watch([x_t, w_t])
        y = tfbigconv.bigconv2d(x_t, w_t, 2, "SAME", data_format=fmt, dilations=(2, 1),
                                algorithm=algorithm)
    dx, dw = t.gradient(y, [x_t, w_t], output_gradients=tf.constant(dy))
    args = ((2, 2), "SAME", (2, 1), fmt)
    assert rel_l2(dx, conv2d_reference_backprop_input(dy, w, shape, *args)) < 1e-10
    assert rel_l2(dw, conv2d_reference_backprop_filter(x, dy, w.shape, *args)) < 1e-10


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_compute_gradient_small(algorithm):
    x = random_case((1, 7, 6, 2), 0, np.float64)
    w = random_case((3, 4, 1, 4), 1, np.float64)
    fn = lambda x, w: tfbigconv.bigconv2d(x, w, (2, 1), "SAME", dilations=(1, 2),
                                          algorithm=algorithm)
    theoretical, numerical = tf.test.compute_gradient(fn, [tf.constant(x), tf.constant(w)])
    for t_, n_ in zip(theoretical, numerical):
        assert rel_l2(t_, n_) < 1e-7


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_second_order_and_gradient_penalty(algorithm):
    """Hessian-vector products and a gradient penalty (gradient of ||dL/dx||)
    against the same computation on tf.nn.conv2d."""
    x = random_case((2, 12, 11, 2), 0, np.float64)
    w = random_case((5, 5, 2, 3), 1, np.float64)

    def penalty(conv, x, w):
        x, w = tf.constant(x), tf.constant(w)
        with tf.GradientTape() as outer:
            outer.watch([x, w])
            with tf.GradientTape() as inner:
                inner.watch(x)
                loss = tf.reduce_sum(tf.tanh(conv(x, w)))
            gx = inner.gradient(loss, x)
            pen = tf.reduce_sum(gx * gx)
        return [g.numpy() for g in outer.gradient(pen, [x, w])]

    got = penalty(lambda x, w: tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm=algorithm), x, w)
    want = penalty(lambda x, w: tf.nn.conv2d(x, w, 1, "SAME"), x, w)
    for g, r in zip(got, want):
        assert rel_l2(g, r) < 1e-10


def test_algorithms_agree_on_gradients():
    x, w = random_case((2, 40, 37, 4), 0), random_case((15, 13, 4, 6), 1)
    a = tape_grads(lambda x, w: tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm="direct"), x, w)
    b = tape_grads(lambda x, w: tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm="fft"), x, w)
    for g, r in zip(a, b):
        assert rel_l2(g, r) < 1e-4


def test_gradient_in_tf_function_with_unknown_shapes():
    x, w = random_case((2, 20, 21, 3), 0), random_case((5, 5, 3, 4), 1)

    @tf.function(input_signature=[tf.TensorSpec(None), tf.TensorSpec(None)])
    def grads(x, w):
        with tf.GradientTape() as t:
            t.watch([x, w])
            loss = tf.reduce_sum(tfbigconv.bigconv2d(x, w, 2, "SAME") ** 2)
        return t.gradient(loss, [x, w])

    got = [g.numpy() for g in grads(x, w)]
    x_t, w_t = tf.constant(x), tf.constant(w)
    with tf.GradientTape() as t:
        t.watch([x_t, w_t])
        loss = tf.reduce_sum(tf.nn.conv2d(x_t, w_t, 2, "SAME") ** 2)
    want = [g.numpy() for g in t.gradient(loss, [x_t, w_t])]
    for g, r in zip(got, want):
        assert rel_l2(g, r) < 1e-5


def test_backprop_op_errors():
    ops = tfbigconv._raw_ops
    w = random_case((3, 3, 2, 4), 0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="out_backprop shape"):
        ops.big_conv2d_backprop_input(input_sizes=[1, 8, 8, 2], filter=w,
                                      out_backprop=random_case((1, 5, 5, 4), 1),
                                      strides=[1, 1, 1, 1], padding="VALID")
    with pytest.raises(tf.errors.InvalidArgumentError, match="input_sizes"):
        ops.big_conv2d_backprop_input(input_sizes=[1, 8, 8], filter=w,
                                      out_backprop=random_case((1, 6, 6, 4), 1),
                                      strides=[1, 1, 1, 1], padding="VALID")
    with pytest.raises(tf.errors.InvalidArgumentError, match="filter_sizes"):
        ops.big_conv2d_backprop_filter(input=random_case((1, 8, 8, 2), 0), filter_sizes=[3, 3, 2],
                                       out_backprop=random_case((1, 6, 6, 4), 1),
                                       strides=[1, 1, 1, 1], padding="VALID")


def test_fft_backprop_filter_with_large_batch_fits_small_limit():
    """dL/dfilter's "input channels" are the batch: a limit far below the
    spectra of all of dL/doutput runs in reduction blocks."""
    x, w_shape = random_case((24, 40, 38, 1), 0), (21, 21, 1, 3)
    dy = random_case((24, 20, 18, 3), 1)
    limit = 2 << 20
    dw = run_core_pass("fft", "backprop_filter", x, dy, w_shape, workspace_limit=limit,
                       num_threads=2)
    ref = conv2d_reference_backprop_filter(x, dy, w_shape)
    assert rel_l2(dw, ref) < 1e-4
