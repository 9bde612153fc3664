"""bigconv2d and the BigConv2D op inside TensorFlow: parity with tf.nn.conv2d
and the float64 reference, dtypes, eager / tf.function / unknown shapes."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfbigconv
from conftest import TOLERANCE, explicit_pairs, random_case, to4
from reference import conv2d_reference, rel_l2

TF_DTYPES = {"float16": tf.float16, "bfloat16": tf.bfloat16, "float32": tf.float32,
             "float64": tf.float64}


def reference(x, w, strides=1, padding="VALID", dil=1, fmt="NHWC"):
    s = (strides, strides) if isinstance(strides, int) else tuple(strides)
    d = (dil, dil) if isinstance(dil, int) else tuple(dil)
    if isinstance(padding, str):
        return conv2d_reference(x, w, s, padding, d, fmt)
    hw = padding[1:3] if fmt == "NHWC" else padding[2:4]
    return conv2d_reference(x, w, s, "EXPLICIT", d, fmt, tuple(tuple(p) for p in hw))


@pytest.mark.parametrize("k", [1, 3, 7, 15, 31, 63])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_matches_tf_nn_conv2d(k, padding):
    x = random_case((2, 70, 75, 2), k)
    w = random_case((k, k, 2, 3), k + 1)
    got = tfbigconv.bigconv2d(x, w, 1, padding, algorithm="direct").numpy()
    want = tf.nn.conv2d(x, w, 1, padding).numpy()
    assert rel_l2(got, want) < 1e-5
    assert rel_l2(got, reference(x, w, 1, padding)) < TOLERANCE["float32"]


@pytest.mark.parametrize("strides,dil", [(1, 1), (2, 1), (3, 1), (4, 1), ((1, 2), 1), (1, 2),
                                         (1, 3), (1, (3, 1))])
@pytest.mark.parametrize("padding", ["SAME", "VALID", [[0, 0], [1, 3], [0, 2], [0, 0]]])
def test_strides_dilations_padding_vs_tf(strides, dil, padding):
    x = random_case((2, 31, 29, 5), 0)
    w = random_case((5, 4, 5, 7), 1)
    got = tfbigconv.bigconv2d(x, w, strides, padding, dilations=dil).numpy()
    want = tf.nn.conv2d(x, w, strides, padding, dilations=dil).numpy()
    assert rel_l2(got, want) < 1e-5


def test_135_filter_small_image():
    x = random_case((1, 150, 141, 1), 3)
    w = random_case((135, 135, 1, 3), 4)
    got = tfbigconv.bigconv2d(x, w, 1, "VALID").numpy()
    assert rel_l2(got, reference(x, w)) < TOLERANCE["float32"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("fin,cout", [(4, 6), (2, 6), (1, 8), (1, 4)])
def test_dtypes_groups_nchw(dtype, fmt, fin, cout):
    """Grouped and depthwise convolution in every dtype and layout; TF's CPU
    kernels refuse most of these, so the reference is float64 NumPy."""
    cin = 4
    shape = (2, 17, 19, cin) if fmt == "NHWC" else (2, cin, 17, 19)
    x = tf.cast(random_case(shape, 1, np.float64), TF_DTYPES[dtype])
    w = tf.cast(random_case((7, 5, fin, cout), 2, np.float64), TF_DTYPES[dtype])
    got = tfbigconv.bigconv2d(x, w, [1, 2], "SAME", data_format=fmt)
    assert got.dtype == TF_DTYPES[dtype]
    ref = reference(tf.cast(x, tf.float64).numpy(), tf.cast(w, tf.float64).numpy(), (1, 2),
                    "SAME", 1, fmt)
    assert rel_l2(tf.cast(got, tf.float64).numpy(), ref) <= TOLERANCE[dtype]


def test_nchw_explicit_padding():
    x = random_case((2, 3, 20, 22), 0)
    w = random_case((4, 6, 3, 5), 1)
    pad = explicit_pairs(((2, 0), (1, 3)), "NCHW")
    got = tfbigconv.bigconv2d(x, w, 2, pad, data_format="NCHW", dilations=[1, 1, 2, 1]).numpy()
    assert rel_l2(got, reference(x, w, 2, pad, (2, 1), "NCHW")) < TOLERANCE["float32"]


def test_batch_zero():
    out = tfbigconv.bigconv2d(tf.zeros((0, 10, 10, 2)), random_case((3, 3, 2, 4), 0), 1, "SAME")
    assert out.shape == (0, 10, 10, 4)


def test_tf_function_and_unknown_shapes():
    x = random_case((3, 25, 26, 2), 0)
    w = random_case((9, 9, 2, 3), 1)
    ref = reference(x, w, 2, "SAME")
    static = tf.function(lambda x, w: tfbigconv.bigconv2d(x, w, 2, "SAME"))
    unknown = tf.function(
        lambda x, w: tfbigconv.bigconv2d(x, w, 2, "SAME"),
        input_signature=[tf.TensorSpec([None, None, None, None]), tf.TensorSpec(None)])
    partial = tf.function(
        lambda x, w: tfbigconv.bigconv2d(x, w, 2, "SAME"),
        input_signature=[tf.TensorSpec([None, 25, None, 2]), tf.TensorSpec([9, 9, 2, 3])])
    for fn in (static, unknown, partial):
        assert rel_l2(fn(x, w).numpy(), ref) < TOLERANCE["float32"]
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
@given(geometries(), st.integers(0, 2**31))
def test_property_random_geometries(geo, seed):
    fmt, cin, fin, cout, kh, kw, s, d, mode, pads, n, h, w = geo
    shape = (n, h, w, cin) if fmt == "NHWC" else (n, cin, h, w)
    x = random_case(shape, seed)
    f = random_case((kh, kw, fin, cout), seed + 1)
    padding = explicit_pairs(pads, fmt) if mode == "EXPLICIT" else mode
    got = tfbigconv.bigconv2d(x, f, list(s), padding, data_format=fmt, dilations=list(d)).numpy()
    ref = reference(x, f, s, padding, d, fmt)
    assert got.shape == ref.shape
    assert rel_l2(got, ref) < TOLERANCE["float32"]
