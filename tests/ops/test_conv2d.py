"""bigconv2d (tfbigconv/ops/conv2d.py) and the BigConv2D op inside TensorFlow:
parity with tf.nn.conv2d and the float64 reference, dtypes, eager /
tf.function / unknown shapes; and what it emits for algorithm "auto" (the
planner's choice: TensorFlow's Conv2D or DepthwiseConv2dNative, or our op) and
a forced "tf" (TensorFlow's kernels, exactly)."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfbigconv
from tfbigconv.planning import planner, tf_rules
from tfbigconv.planning.plan import Verdict
from conftest import (TOLERANCE, cpu_bigconv2d, explicit_pairs, grads_vs_reference, op_types, rand,
                      random_case, tape_types)
from reference import conv2d_reference, rel_l2

ALGORITHMS = ["direct", "fft"]


def tol(dtype, algorithm):
    """float32 through FFTs is looser (docs/ARCHITECTURE.md section 7); 16-bit types are
    dominated by their own rounding whichever algorithm runs."""
    return 1e-4 if (dtype == "float32" and algorithm == "fft") else TOLERANCE[dtype]


TF_DTYPES = {"float16": tf.float16, "bfloat16": tf.bfloat16, "float32": tf.float32,
             "float64": tf.float64}


def reference(x, w, strides=1, padding="VALID", dil=1, fmt="NHWC"):
    s = (strides, strides) if isinstance(strides, int) else tuple(strides)
    d = (dil, dil) if isinstance(dil, int) else tuple(dil)
    if isinstance(padding, str):
        return conv2d_reference(x, w, s, padding, d, fmt)
    hw = padding[1:3] if fmt == "NHWC" else padding[2:4]
    return conv2d_reference(x, w, s, "EXPLICIT", d, fmt, tuple(tuple(p) for p in hw))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("k", [1, 3, 7, 15, 31, 63])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_matches_tf_nn_conv2d(algorithm, k, padding):
    x = random_case((2, 70, 75, 2), k)
    w = random_case((k, k, 2, 3), k + 1)
    got = tfbigconv.bigconv2d(x, w, 1, padding, algorithm=algorithm).numpy()
    want = tf.nn.conv2d(x, w, 1, padding).numpy()
    assert rel_l2(got, want) < tol("float32", algorithm)
    assert rel_l2(got, reference(x, w, 1, padding)) < tol("float32", algorithm)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("strides,dil", [(1, 1), (2, 1), (3, 1), (4, 1), ((1, 2), 1), (1, 2),
                                         (1, 3), (1, (3, 1))])
@pytest.mark.parametrize("padding", ["SAME", "VALID", [[0, 0], [1, 3], [0, 2], [0, 0]]])
def test_strides_dilations_padding_vs_tf(algorithm, strides, dil, padding):
    x = random_case((2, 31, 29, 5), 0)
    w = random_case((5, 4, 5, 7), 1)
    got = tfbigconv.bigconv2d(x, w, strides, padding, dilations=dil, algorithm=algorithm).numpy()
    want = tf.nn.conv2d(x, w, strides, padding, dilations=dil).numpy()
    assert rel_l2(got, want) < tol("float32", algorithm)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_135_filter_small_image(algorithm):
    x = random_case((1, 150, 141, 1), 3)
    w = random_case((135, 135, 1, 3), 4)
    got = tfbigconv.bigconv2d(x, w, 1, "VALID", algorithm=algorithm).numpy()
    assert rel_l2(got, reference(x, w)) < tol("float32", algorithm)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("fin,cout", [(4, 6), (2, 6), (1, 8), (1, 4)])
def test_dtypes_groups_nchw(algorithm, dtype, fmt, fin, cout):
    """Grouped and depthwise convolution in every dtype and layout; TF's CPU
    kernels refuse most of these, so the reference is float64 NumPy."""
    cin = 4
    shape = (2, 17, 19, cin) if fmt == "NHWC" else (2, cin, 17, 19)
    x = tf.cast(random_case(shape, 1, np.float64), TF_DTYPES[dtype])
    w = tf.cast(random_case((7, 5, fin, cout), 2, np.float64), TF_DTYPES[dtype])
    got = tfbigconv.bigconv2d(x, w, [1, 2], "SAME", data_format=fmt, algorithm=algorithm)
    assert got.dtype == TF_DTYPES[dtype]
    ref = reference(tf.cast(x, tf.float64).numpy(), tf.cast(w, tf.float64).numpy(), (1, 2),
                    "SAME", 1, fmt)
    assert rel_l2(tf.cast(got, tf.float64).numpy(), ref) <= tol(dtype, algorithm)


def test_nchw_explicit_padding():
    x = random_case((2, 3, 20, 22), 0)
    w = random_case((4, 6, 3, 5), 1)
    pad = explicit_pairs(((2, 0), (1, 3)), "NCHW")
    got = tfbigconv.bigconv2d(x, w, 2, pad, data_format="NCHW", dilations=[1, 1, 2, 1]).numpy()
    assert rel_l2(got, reference(x, w, 2, pad, (2, 1), "NCHW")) < TOLERANCE["float32"]


def test_batch_zero():
    out = tfbigconv.bigconv2d(tf.zeros((0, 10, 10, 2)), random_case((3, 3, 2, 4), 0), 1, "SAME")
    assert out.shape == (0, 10, 10, 4)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_tf_function_and_unknown_shapes(algorithm):
    x = random_case((3, 25, 26, 2), 0)
    w = random_case((9, 9, 2, 3), 1)
    ref = reference(x, w, 2, "SAME")

    def conv(x, w):
        return tfbigconv.bigconv2d(x, w, 2, "SAME", algorithm=algorithm)
    static = tf.function(conv)
    unknown = tf.function(
        conv, input_signature=[tf.TensorSpec([None, None, None, None]), tf.TensorSpec(None)])
    partial = tf.function(
        conv, input_signature=[tf.TensorSpec([None, 25, None, 2]), tf.TensorSpec([9, 9, 2, 3])])
    for fn in (static, unknown, partial):
        assert rel_l2(fn(x, w).numpy(), ref) < tol("float32", algorithm)
    # Shape inference keeps what is known.
    out_spec = partial.get_concrete_function().output_shapes
    assert out_spec.as_list() == [None, 13, None, 3]
    assert unknown.get_concrete_function().output_shapes.rank == 4


def test_argument_forms():
    """Every form tf.nn.conv2d accepts for strides, dilations and padding."""
    x = random_case((1, 20, 21, 2), 0)
    w = random_case((3, 4, 2, 2), 1)
    want = tf.nn.conv2d(x, w, [1, 2, 2, 1], "SAME", dilations=[1, 2, 2, 1]).numpy()
    for s, d in [(2, 2), ([2], [2]), ([2, 2], [2, 2]), ([1, 2, 2, 1], [1, 2, 2, 1])]:
        got = tfbigconv.bigconv2d(x, w, s, "SAME", dilations=d).numpy()
        assert rel_l2(got, want) < 1e-5
    got = tfbigconv.bigconv2d(tf.Variable(x), tf.Variable(w), 1, "same").numpy()
    assert rel_l2(got, tf.nn.conv2d(x, w, 1, "SAME").numpy()) < 1e-5


def test_deterministic():
    x = random_case((4, 40, 41, 8), 0)
    w = random_case((11, 11, 8, 40), 1)
    a = tfbigconv.bigconv2d(x, w, 1, "SAME").numpy()
    b = tfbigconv.bigconv2d(x, w, 1, "SAME").numpy()
    np.testing.assert_array_equal(a, b)


@st.composite
def geometries(draw):
    fmt = draw(st.sampled_from(["NHWC", "NCHW"]))
    groups = draw(st.integers(1, 3))
    fin = draw(st.integers(1, 3))
    cout = groups * draw(st.integers(1, 6))
    kh, kw = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    s = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    d = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    mode = draw(st.sampled_from(["SAME", "VALID", "EXPLICIT"]))
    pads = ((draw(st.integers(0, 4)), draw(st.integers(0, 4))),
            (draw(st.integers(0, 4)), draw(st.integers(0, 4))))
    eff = ((kh - 1) * d[0] + 1, (kw - 1) * d[1] + 1)
    extra = (pads[0][0] + pads[0][1], pads[1][0] + pads[1][1]) if mode == "EXPLICIT" else (0, 0)
    h = draw(st.integers(max(1, eff[0] - extra[0]), eff[0] + 20))
    w = draw(st.integers(max(1, eff[1] - extra[1]), eff[1] + 20))
    n = draw(st.integers(0, 2))
    return fmt, groups * fin, fin, cout, kh, kw, s, d, mode, pads, n, h, w


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(geometries(), st.integers(0, 2**31), st.sampled_from(ALGORITHMS))
def test_property_random_geometries(geo, seed, algorithm):
    fmt, cin, fin, cout, kh, kw, s, d, mode, pads, n, h, w = geo
    shape = (n, h, w, cin) if fmt == "NHWC" else (n, cin, h, w)
    x = random_case(shape, seed)
    f = random_case((kh, kw, fin, cout), seed + 1)
    padding = explicit_pairs(pads, fmt) if mode == "EXPLICIT" else mode
    got = tfbigconv.bigconv2d(x, f, list(s), padding, data_format=fmt, dilations=list(d),
                              algorithm=algorithm).numpy()
    ref = reference(x, f, s, padding, d, fmt)
    assert got.shape == ref.shape
    assert rel_l2(got, ref) < tol("float32", algorithm)


def test_fft_workspace_limit_too_small():
    x = random_case((1, 60, 60, 1), 0)
    w = random_case((31, 31, 1, 2), 1)
    with pytest.raises(tf.errors.ResourceExhaustedError, match="at least"):
        tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm="fft", workspace_limit=1000)
    got = tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm="fft", workspace_limit=1 << 20)
    assert rel_l2(got.numpy(), reference(x, w, 1, "SAME")) < 1e-4


def test_algorithms_agree():
    x = random_case((3, 45, 52, 6), 0)
    w = random_case((21, 19, 3, 8), 1)
    a = tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm="direct").numpy()
    b = tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm="fft").numpy()
    assert rel_l2(b, a) < 1e-4


@pytest.mark.parametrize("algorithm", ["auto"] + ALGORITHMS)
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_rank5_input_is_flattened_into_the_batch(algorithm, fmt):
    """tf.nn.conv2d's batch_shape + [H, W, C]: values and both gradients."""
    x = random_case((2, 3, 11, 10, 4) if fmt == "NHWC" else (2, 3, 4, 11, 10), 5)
    w = random_case((5, 4, 2, 6), 6)  # 2 groups
    want = np.stack([np.stack([reference(x[i, j][None], w, 2, "SAME", fmt=fmt)[0]
                               for j in range(3)]) for i in range(2)])
    xt, wt = tf.constant(x), tf.constant(w)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([xt, wt])
        y = tfbigconv.bigconv2d(xt, wt, 2, "SAME", data_format=fmt, algorithm=algorithm)
        loss = tf.reduce_sum(y * tf.sin(y))
    assert y.shape == want.shape
    assert rel_l2(y.numpy(), want) < 1e-4
    gx, gw = tape.gradient(loss, [xt, wt])
    with tf.GradientTape() as ref_tape:
        ref_tape.watch([xt, wt])
        flat = tf.reshape(xt, (6,) + x.shape[2:])
        ref = tf.reshape(tfbigconv.bigconv2d(flat, wt, 2, "SAME", data_format=fmt,
                                             algorithm="direct"), y.shape)
        ref_loss = tf.reduce_sum(ref * tf.sin(ref))
    rx, rw = ref_tape.gradient(ref_loss, [xt, wt])
    assert rel_l2(gx.numpy(), rx.numpy()) < 1e-4 and rel_l2(gw.numpy(), rw.numpy()) < 1e-4


def test_rank_6_and_unknown_batch_dims_in_tf_function():
    x = random_case((2, 1, 3, 9, 8, 2), 7)
    w = random_case((3, 3, 2, 3), 8)
    fn = tf.function(lambda x: tfbigconv.bigconv2d(x, w, 1, "VALID"),
                     input_signature=[tf.TensorSpec([None, None, None, 9, 8, 2])])
    assert fn.get_concrete_function().structured_outputs.shape.as_list() == [None] * 3 + [7, 6, 3]
    got = fn(x)
    want = tf.nn.conv2d(x, w, 1, "VALID")
    assert got.shape == want.shape == (2, 1, 3, 7, 6, 3)
    assert rel_l2(got.numpy(), want.numpy()) < 1e-5
    # Batch 0, on our kernel: TF 2.21's oneDNN Conv2D returns its input for an
    # empty batch (README, "Odd input").
    empty = tf.function(lambda x: tfbigconv.bigconv2d(x, w, 1, "VALID", algorithm="direct"),
                        input_signature=[tf.TensorSpec([None, None, None, 9, 8, 2])])(
                            np.zeros((0, 2, 3, 9, 8, 2), np.float32))
    assert empty.shape == (0, 2, 3, 7, 6, 3)


# ---- what auto and a forced "tf" emit ----------------------------------------

SMALL = ((8, 64, 64, 16), (3, 3, 16, 16), "SAME")
SEED16 = ((4, 321, 481, 1), (135, 135, 1, 3), "VALID")
# multiplier 2; the model picks TF's kernel; over planner.SMALL_PASS_MACS (1.28M), where
# TF's kernels may run for auto
DEPTHWISE = ((2, 40, 40, 8), (5, 5, 1, 16))


@pytest.mark.native
def test_small_filter_runs_tf_conv2d_and_large_filter_runs_fft():
    x_shape, w_shape, pad = SMALL
    e = tfbigconv.explain(x_shape, w_shape, padding=pad)
    assert e.chosen["forward"] == "tf.Conv2D"
    x, w = rand(x_shape, 0), rand(w_shape, 1)
    types = op_types(lambda x: tfbigconv.bigconv2d(x, w, 1, pad), x)
    assert "Conv2D" in types and "BigConv2D" not in types
    np.testing.assert_array_equal(tfbigconv.bigconv2d(x, w, 1, pad), tf.nn.conv2d(x, w, 1, pad))

    x_shape, w_shape, pad = SEED16
    e = tfbigconv.explain(x_shape, w_shape, padding=pad)
    assert e.chosen == {"forward": "fft", "backprop_input": "fft", "backprop_filter": "fft"}
    x, w = rand(x_shape, 2), rand(w_shape, 3)
    types = op_types(lambda x: tfbigconv.bigconv2d(x, w, 1, pad), x)
    assert "BigConv2D" in types and "Conv2D" not in types


@pytest.mark.native
def test_unknown_shapes_leave_the_choice_to_the_op():
    x, w = rand((2, 40, 40, 2), 10), rand((9, 9, 2, 3), 11)
    f = tf.function(lambda x: tfbigconv.bigconv2d(x, w, 1, "SAME"),
                    input_signature=[tf.TensorSpec([None, None, None, 2])])
    ops = [op for op in f.get_concrete_function().graph.get_operations() if op.type == "BigConv2D"]
    assert len(ops) == 1 and ops[0].get_attr("algorithm") == b"auto"
    assert ops[0].get_attr("planned_algorithm") == b"none"
    assert rel_l2(f(x).numpy(), tf.nn.conv2d(x, w, 1, "SAME").numpy()) < 1e-5


@pytest.mark.parametrize("algorithm", ["tf", "im2col"])
def test_forced_tf_is_tf_conv2d(algorithm):
    """"tf" (and its old name "im2col") is TF's Conv2D, its gradients included."""
    x, w = rand((2, 12, 13, 3), 14), rand((4, 4, 3, 5), 15)

    def run(conv):
        with tf.GradientTape() as t:
            t.watch([x, w])
            y = conv(x, w)
            loss = tf.reduce_sum(y * tf.sin(y))
        return [y] + t.gradient(loss, [x, w])

    got = run(lambda x, w: tfbigconv.bigconv2d(x, w, 2, "SAME", algorithm=algorithm))
    for g, r in zip(got, run(lambda x, w: tf.nn.conv2d(x, w, 2, "SAME"))):
        np.testing.assert_array_equal(g, r)
    assert tfbigconv.explain((2, 12, 13, 3), (4, 4, 3, 5), 2, "SAME",
                             algorithm=algorithm).chosen["forward"] == "tf.Conv2D"


@pytest.mark.native
def test_nothing_fits_raises_resource_exhausted_with_the_minimum(monkeypatch):
    # TF's kernel out of auto's reach: oneDNN's forward needs no workspace and fits.
    monkeypatch.setattr(tf_rules, "tf_kernel",
                        lambda *a, **k: ("", Verdict.NEVER, "left out by this test"))
    x, w = rand((2, 64, 64, 1), 16), rand((31, 31, 1, 3), 17)
    with pytest.raises(tf.errors.ResourceExhaustedError, match=r"at least \d+ bytes"):
        tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm="fft", workspace_limit=4096)
    with pytest.raises(tf.errors.ResourceExhaustedError, match="no algorithm fits"):
        tfbigconv.bigconv2d(x, w, 1, "SAME", workspace_limit=4096)
    # Unknown shapes: the op itself says so at run time.
    f = tf.function(lambda x: tfbigconv.bigconv2d(x, w, 1, "SAME", workspace_limit=4096),
                    input_signature=[tf.TensorSpec([None, 64, 64, 1])])
    with pytest.raises(tf.errors.ResourceExhaustedError, match="no algorithm fits"):
        f(x)


def test_auto_depthwise_runs_tf_depthwise_kernels():
    e = tfbigconv.explain(*DEPTHWISE, padding="SAME")
    assert e.chosen == dict.fromkeys(planner.PASSES, "tf.DepthwiseConv2dNative")
    ours = lambda x, w: cpu_bigconv2d(x, w, 1, "SAME")  # noqa: E731
    types = tape_types(ours, *DEPTHWISE)
    assert {"DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
            "DepthwiseConv2dNativeBackpropFilter"} <= types
    assert not types & {"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "BigConv2D"}
    x, w = rand(DEPTHWISE[0], 20), rand(DEPTHWISE[1], 21)
    for fn in (ours, tf.function(ours)):
        errors = grads_vs_reference(fn, x, w)
        assert max(errors) < TOLERANCE["float32"], errors


def test_auto_never_runs_grouped_conv2d_for_depthwise():
    """The issue's trap: TF's grouped Conv2D ran depthwise filters 10-300x
    slower than DepthwiseConv2dNative. Whatever auto picks, not that."""
    for x_shape, w_shape in (((2, 24, 24, 16), (15, 15, 1, 16)), ((2, 20, 20, 8), (7, 7, 1, 8))):
        types = tape_types(lambda x, w: cpu_bigconv2d(x, w, 1, "SAME"), x_shape, w_shape)
        assert not types & {"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"}, types
        e = tfbigconv.explain(x_shape, w_shape, padding="SAME")
        assert {r.algorithm for r in e.rows} == {"tf.DepthwiseConv2dNative", "direct", "fft"}


@pytest.mark.parametrize("strides", [1, 2])
def test_forced_tf_depthwise_is_tf_nn_depthwise_conv2d(strides):
    x, w = rand((2, 13, 15, 6), 24), rand((5, 5, 1, 12), 25)
    tf_w = tf.reshape(w, (5, 5, 6, 2))

    def run(fn, w):
        with tf.GradientTape() as t:
            t.watch([x, w])
            y = fn(x, w)
            loss = tf.reduce_sum(y * tf.sin(y))
        return [y] + t.gradient(loss, [x, w])

    got = run(lambda x, w: tfbigconv.bigconv2d(x, w, strides, "SAME", algorithm="tf"), w)
    want = run(lambda x, w: tf.nn.depthwise_conv2d(x, w, [1, strides, strides, 1], "SAME"), tf_w)
    want[2] = tf.reshape(want[2], w.shape)
    for g, r in zip(got, want):
        np.testing.assert_array_equal(g, r)


@pytest.mark.parametrize("x_shape,w_shape,strides,dil,padding", [
    ((2, 48, 44, 3), (21, 17, 3, 4), 1, 1, "SAME"),  # padding at both ends of both axes
    ((1, 37, 41, 2), (9, 7, 2, 3), 2, 1, "SAME"),  # a stride (backprop_input: in_dilation)
    ((1, 30, 33, 2), (5, 4, 2, 3), 1, (2, 3), "SAME"),  # dilation
    # more padding than the filter at one end, little at the other; only leading padding
    ((1, 25, 27, 2), (5, 5, 2, 3), 1, 1, [[0, 0], [12, 1], [3, 9], [0, 0]]),
    ((1, 20, 40, 2), (3, 11, 2, 2), 1, 1, [[0, 0], [2, 0], [10, 0], [0, 0]]),
    ((2, 31, 29, 4), (13, 13, 1, 4), 1, 1, "SAME"),  # depthwise
    ((1, 40, 37, 2), (15, 13, 2, 3), 1, 1, "VALID"),  # backprop_input: K - 1 at both ends
])
def test_fft_whole_image_tiles_wrap_around_their_padding(x_shape, w_shape, strides, dil, padding):
    """A tile of the whole image transforms fewer points than its padded window
    (fft_sizes.h, WholeTileFftNeed): the window's tail wraps onto its leading
    padding. Forward and both gradients against the float64 reference, with the
    plan asked for the whole image (no workspace limit)."""
    x, w = tf.constant(random_case(x_shape, 3)), tf.constant(random_case(w_shape, 4))
    conv = lambda x, w: tfbigconv.bigconv2d(x, w, strides, padding, dilations=dil,  # noqa: E731
                                            algorithm="fft")
    if isinstance(padding, str):
        errors = grads_vs_reference(conv, x, w, strides, padding, dil=dil)
    else:
        from reference import conv2d_reference_backprop_filter, conv2d_reference_backprop_input
        kw = dict(strides=(strides, strides), padding="EXPLICIT", dilations=(dil, dil),
                  explicit=tuple(tuple(p) for p in padding[1:3]))
        x64, w64 = x.numpy().astype(np.float64), w.numpy().astype(np.float64)
        dy = tf.constant(random_case(conv2d_reference(x64, w64, **kw).shape, 5))
        with tf.GradientTape() as t:
            t.watch([x, w])
            y = conv(x, w)
        dx, dw = t.gradient(y, [x, w], output_gradients=dy)
        dy64 = dy.numpy().astype(np.float64)
        errors = [rel_l2(y.numpy(), conv2d_reference(x64, w64, **kw)),
                  rel_l2(dx.numpy(), conv2d_reference_backprop_input(dy64, w64, x64.shape, **kw)),
                  rel_l2(dw.numpy(), conv2d_reference_backprop_filter(x64, dy64, w64.shape, **kw))]
    assert max(errors) < tol("float32", "fft"), errors


def test_fft_whole_image_tile_transform_is_shorter_than_its_window():
    """48x48 SAME with a 21x21 filter: the window is 68 per axis (70 points),
    the wrapped whole-image tile needs 58 (60 points)."""
    e = tfbigconv.explain([1, 48, 48, 2], [21, 21, 2, 2], padding="SAME", algorithm="fft")
    assert "tile 48x48 (FFT 60x60)" in e.table()
    valid = tfbigconv.explain([1, 48, 48, 2], [21, 21, 2, 2], padding="VALID", algorithm="fft")
    assert "(FFT 48x48)" in valid.table()  # no padding: the window as before
