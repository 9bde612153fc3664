"""The gradients of bigconv2d and its ops (tfbigconv/ops/gradients.py):
BigConv2DBackpropInput / BigConv2DBackpropFilter through tf.GradientTape (first
and second order) against float64 references and tf.nn.conv2d's gradients,
each gradient pass planned on its own (TF's kernels and ours mixed). The
kernels' gradient passes through _core: core/test_cpu_kernels.py."""
import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from tfbigconv import _core
from conftest import (TOLERANCE, cpu_bigconv2d, explicit_pairs, grads_vs_reference, op_types, rand,
                      random_case, tape_types, to4)
from reference import conv2d_reference_backprop_filter, conv2d_reference_backprop_input, rel_l2

ALGORITHMS = ["direct", "fft"]


def out_shape(x_shape, w_shape, strides, padding, dil, fmt, pads):
    explicit = [v for p in explicit_pairs(pads, fmt) for v in p] if padding == "EXPLICIT" else []
    return _core.conv_geometry(list(x_shape), list(w_shape), to4(strides, fmt), padding, explicit,
                               fmt, to4(dil, fmt)).output_shape


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


# ---- each gradient pass planned on its own (auto) -----------------------------

@pytest.mark.native
def test_gradient_passes_are_planned_each_on_their_own(model):
    """Forward on TF's Conv2D, backprop_filter moved off it by the model: the
    gradient mixes TF's Conv2DBackpropInput with our BigConv2DBackpropFilter,
    and first and second order match tf.nn.conv2d's."""
    model("im2col_flops_per_second.forward", 1e6)
    model("im2col_flops_per_second.backprop_input", 1e6)
    model("im2col_flops_per_second.backprop_filter", 1e-6)
    # over planner.SMALL_PASS_MACS (1.15M), where TF's kernels may run for auto
    x_shape, w_shape, pad = (2, 40, 48, 3), (5, 5, 3, 4), "SAME"
    e = tfbigconv.explain(x_shape, w_shape, padding=pad)
    assert e.chosen["forward"] == "tf.Conv2D" and e.chosen["backprop_input"] == "tf.Conv2D"
    assert e.chosen["backprop_filter"] in ("direct", "fft")
    x, w = rand(x_shape, 4), rand(w_shape, 5)

    def grads(conv, x, w):
        with tf.GradientTape() as outer:
            outer.watch(w)
            with tf.GradientTape() as inner:
                inner.watch([x, w])
                y = conv(x, w)
                loss = tf.reduce_sum(y * tf.sin(y))
            dx, dw = inner.gradient(loss, [x, w])
            penalty = tf.reduce_sum(dx * dx) + tf.reduce_sum(dw * dw)
        return dx, dw, outer.gradient(penalty, w)

    ours = lambda x, w: tfbigconv.bigconv2d(x, w, 1, pad)
    types = op_types(lambda x, w: grads(ours, x, w), x, w)
    assert {"Conv2D", "Conv2DBackpropInput", "BigConv2DBackpropFilter"} <= types
    want = grads(lambda x, w: tf.nn.conv2d(x, w, 1, pad), x, w)
    for fn in (lambda: grads(ours, x, w), tf.function(lambda: grads(ours, x, w))):
        for got, ref in zip(fn(), want):
            assert rel_l2(got.numpy(), ref.numpy()) < 1e-5


@pytest.mark.native
def test_registered_gradient_uses_tf_where_it_wins(model):
    """Forward on our op (direct), backprop_input moved to TF's kernel by the model."""
    model("im2col_flops_per_second.forward", 1e-6)
    model("im2col_flops_per_second.backprop_input", 1e6)
    # over planner.SMALL_PASS_MACS (1.16M), where TF's kernels may run for auto
    x_shape, w_shape, pad = (2, 48, 48, 3), (5, 5, 3, 4), "VALID"
    e = tfbigconv.explain(x_shape, w_shape, padding=pad)
    assert e.chosen["forward"] != "tf.Conv2D" and e.chosen["backprop_input"] == "tf.Conv2D"
    x, w = rand(x_shape, 6), rand(w_shape, 7)

    def grads(conv, x, w):
        with tf.GradientTape() as t:
            t.watch([x, w])
            loss = tf.reduce_sum(conv(x, w) ** 2)
        return t.gradient(loss, [x, w])

    ours = lambda x, w: tfbigconv.bigconv2d(x, w, 1, pad)
    types = op_types(lambda x, w: grads(ours, x, w), x, w)
    assert {"BigConv2D", "Conv2DBackpropInput"} <= types
    for got, ref in zip(grads(ours, x, w), grads(lambda x, w: tf.nn.conv2d(x, w, 1, pad), x, w)):
        assert rel_l2(got.numpy(), ref.numpy()) < 1e-5


# multiplier 2; the model picks TF's kernel; over planner.SMALL_PASS_MACS (1.28M), where
# TF's kernels may run for auto
DEPTHWISE = ((2, 40, 40, 8), (5, 5, 1, 16))


@pytest.mark.native
def test_depthwise_gradient_passes_mix_tf_and_ours(model):
    """The model moves depthwise backprop_filter (then forward) off TF: the
    other passes stay on DepthwiseConv2dNative*, reshaping the filter."""
    x, w = rand(DEPTHWISE[0], 22), rand(DEPTHWISE[1], 23)
    ours = lambda x, w: cpu_bigconv2d(x, w, 1, "SAME")  # noqa: E731
    model("tf_depthwise_multiplier_flops_per_second.backprop_filter", 1e-6)  # DEPTHWISE: multiplier 2
    types = tape_types(ours, *DEPTHWISE)
    assert {"DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
            "BigConv2DBackpropFilter"} <= types
    assert max(grads_vs_reference(ours, x, w)) < TOLERANCE["float32"]
    model("tf_depthwise_multiplier_flops_per_second.forward", 1e-6)  # the registered gradient's turn
    types = tape_types(ours, *DEPTHWISE)
    assert {"BigConv2D", "DepthwiseConv2dNativeBackpropInput", "BigConv2DBackpropFilter"} <= types
    assert "DepthwiseConv2dNative" not in types
    assert max(grads_vs_reference(ours, x, w)) < TOLERANCE["float32"]


@pytest.mark.native
@pytest.mark.parametrize("wanted", ["filter", "input"])
def test_a_gradient_the_tape_does_not_want_is_not_planned(monkeypatch, wanted):
    """A layer's input needs no gradient in training (nor a frozen filter in
    fine-tuning): that pass is neither planned nor timed, and the other is planned
    alone (no pair timing). Where the forward pass is our op; a forward routed to
    TF's kernel plans its gradients when it is built (ops/conv2d.py)."""
    from tfbigconv.planning import planner
    planned = []
    decide = planner.decide
    monkeypatch.setattr(planner, "decide",
                        lambda pass_, *args, **kw: planned.append(pass_) or decide(pass_, *args, **kw))
    monkeypatch.setattr(planner, "decide_gradients",
                        lambda *args, **kw: pytest.fail("the pair was planned"))
    x, w = random_case((2, 48, 44, 1), 0), random_case((31, 29, 1, 2), 1)
    xt, wt = tf.constant(x), tf.Variable(w) if wanted == "filter" else tf.constant(w)
    source = wt if wanted == "filter" else tf.Variable(x)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            inp = source if wanted == "input" else xt
            y = tfbigconv.bigconv2d(inp, wt, 1, "SAME")
            loss = tf.reduce_sum(y * y)
        return tape.gradient(loss, source)

    got = step()
    assert "BigConv2D" in {op.type for op in step.get_concrete_function().graph.get_operations()}
    with tf.GradientTape() as tape:
        inp = source if wanted == "input" else xt
        y = tf.nn.conv2d(inp, wt, 1, "SAME")
        loss = tf.reduce_sum(y * y)
    want = tape.gradient(loss, source)
    assert rel_l2(got.numpy(), want.numpy()) < 1e-5
    assert planned == ["forward", "backprop_" + wanted], planned
