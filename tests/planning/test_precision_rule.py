"""The planner's precision rule (planner._precision_rule, issue 52 item 4): where
the FFT is estimated less precise than direct (rounding growing with log2 of
its transform size against the square root of the terms direct sums per
output), fft is not for auto, neither by its estimate nor timed fastest. And on
a pass under planner.SMALL_PASS_MACS multiply-adds, only direct is for auto
where it can run: neither fft nor TF's kernel is estimated, timed or picked
there, as TF's own Conv2D (a one-channel depthwise filter in float64) missed
TF's depthwise gradient checks too; a requested algorithm still runs as asked.

The cases are TensorFlow's own gradient checks, run as its tests run them
(tf.compat.v1.test.compute_gradient, graph mode, the same ramp data), with
autotuning rigged so that fft is timed fastest in every pass: before the rule,
auto then ran fft and missed TF's tolerances.
"""
import math
import re
import types

import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from tfbigconv.planning import autotune, planner
from reference import rel_l2

CONV3D = dict(strides=[1] * 5, padding="VALID", explicit_paddings=[], data_format="NDHWC",
              dilations=[1] * 5)


def ramp(shape):
    """TF's test data: 0, 1/n, 2/n, ... in the shape."""
    n = int(np.prod(shape))
    return (np.arange(n, dtype=np.float64) / n).reshape(shape)


@pytest.fixture
def fft_timed_fastest(autotuning, eigen_tf, monkeypatch):
    """Autotuning on, its clock saying fft (and any gradient pair with fft) is
    10x faster than the rest, and TF's kernels planned as without oneDNN, where
    their estimates are not trusted: so every candidate is timed, on any host.
    Yields the list of (pass, candidates) timed."""
    timed = []

    def measure(pass_, names, *args, **kwargs):
        timed.append((pass_, tuple(names)))
        return {n: 1e-3 if "fft" in n.split("+") else 1e-2 for n in names}
    monkeypatch.setattr(autotune, "measure", measure)
    yield timed


def gradient_error(conv, x_shape, w_shape, dtype, wrt):
    """max |theoretical - numerical| Jacobian entry, as TF's conv tests compute it."""
    with tf.Graph().as_default(), tf.compat.v1.Session():
        x = tf.constant(ramp(x_shape), dtype)
        w = tf.constant(ramp(w_shape), dtype)
        y = conv(x, w)
        t = x if wrt == "input" else w
        jt, jn = tf.compat.v1.test.compute_gradient(t, t.shape.as_list(), y, y.shape.as_list())
        return float(np.abs(jt - jn).max())


# conv_ops_3d_test.py, testFilterGradientKernelSizeMatchesInputSize and its
# input twin: float32, tolerance 5e-3. Measured here (oneDNN on / off):
# filter fft 6.1e-3 / 5.7e-3, direct 1.85e-3, tf.nn.conv3d 3.0e-3 / 1.9e-3.
@pytest.mark.parametrize("wrt", ["filter", "input"])
def test_3d_gradient_check_holds_where_fft_is_timed_fastest(fft_timed_fastest, wrt):
    err = gradient_error(lambda x, w: tfbigconv.bigconv3d(x, w, [1] * 5, "VALID"),
                         [2, 5, 4, 3, 2], [5, 4, 3, 2, 3], tf.float32, wrt)
    assert err < 5e-3
    timed = [names for _, names in fft_timed_fastest]
    assert not any("fft" in n for names in timed for n in names), timed


# depthwise_conv_op_base.py, CheckGradConfigsToTest(Explicit) with one input
# channel (TF's tests under TF1 behaviour): float64, tolerance 1e-12. fft gave
# 1.3e-12 to 1.8e-12; TF's Conv2D 4.8e-13 to 1.3e-12 (1.1e-12 to 1.3e-12 with
# the explicit padding), tf.nn.depthwise_conv2d 6.2e-13 to 8.6e-13, direct
# 4.2e-13 to 6.2e-13. Problems of at most 2560 multiply-adds: direct only.
DEPTHWISE_CHECKS = [
    ([2, 5, 8, 1], [4, 4, 1, 2], 1, "SAME"),
    ([2, 15, 16, 1], [3, 3, 1, 2], 3, "VALID"),
    ([2, 5, 8, 1], [4, 4, 1, 2], 1, [[0, 0], [0, 1], [2, 3], [0, 0]]),  # ...Explicit
]


@pytest.mark.parametrize("x_shape,w_shape,stride,padding", DEPTHWISE_CHECKS)
@pytest.mark.parametrize("wrt", ["filter", "input"])
def test_depthwise_float64_gradient_check_holds_where_fft_is_timed_fastest(
        fft_timed_fastest, x_shape, w_shape, stride, padding, wrt):
    def conv(x, w):
        kh, kw, c, m = w.shape
        return tfbigconv.bigconv2d(x, tf.reshape(w, [kh, kw, 1, c * m]), [1, stride, stride, 1],
                                   padding)
    err = gradient_error(conv, x_shape, w_shape, tf.float64, wrt)
    assert err < 1e-12, err  # TF's tolerance
    timed = [names for _, names in fft_timed_fastest]
    assert not any(a != "direct" for names in timed for n in names for a in n.split("+")), timed


@pytest.mark.native
@pytest.mark.parametrize("x_shape,w_shape,stride,padding", DEPTHWISE_CHECKS)
def test_tiny_passes_plan_direct_and_tf_runs_as_asked(autotuning, model, monkeypatch,
                                                      x_shape, w_shape, stride, padding):
    """Under SMALL_PASS_MACS auto plans direct for every pass, though TF's Conv2D
    is estimated 1000x faster and would be timed fastest (nothing but direct is
    timed); algorithm="tf" runs TF's Conv2D and its gradients as asked, exactly
    as tf.nn.conv2d does."""
    model("im2col_flops_per_second", 1000)
    timed = []

    def measure(pass_, names, *args, **kwargs):
        timed.append(tuple(names))
        return {n: 1e-3 if "tf" in n.split("+") else 1e-2 for n in names}
    monkeypatch.setattr(autotune, "measure", measure)
    w_shape = w_shape[:2] + [1, w_shape[2] * w_shape[3]]  # one channel: a Conv2D filter
    e = tfbigconv.explain(x_shape, w_shape, stride, padding)
    assert e.chosen == dict.fromkeys(planner.PASSES, "direct"), e.reasons
    assert all("precision decides" in r for r in e.reasons.values()), e.reasons
    assert all(r.available for r in e.rows if r.algorithm == "tf.Conv2D"), e.rows
    x, w = tf.constant(ramp(x_shape)), tf.constant(ramp(w_shape))

    def run(conv):
        with tf.device("/CPU:0"), tf.GradientTape() as t:
            t.watch([x, w])
            y = conv(x, w)
            loss = tf.reduce_sum(y * tf.sin(y))
        return [y] + t.gradient(loss, [x, w])
    auto = lambda x, w: tfbigconv.bigconv2d(x, w, stride, padding)  # noqa: E731
    forced = lambda x, w: tfbigconv.bigconv2d(x, w, stride, padding, algorithm="tf")  # noqa: E731
    types = {op.type for op in tf.function(lambda: run(auto)).get_concrete_function()
             .graph.get_operations()}
    assert {"BigConv2D", "BigConv2DBackpropInput", "BigConv2DBackpropFilter"} <= types, types
    assert not types & {"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"}, types
    assert not any(a != "direct" for names in timed for n in names for a in n.split("+")), timed
    types = {op.type for op in tf.function(lambda: run(forced)).get_concrete_function()
             .graph.get_operations()}
    assert {"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"} <= types, types
    assert not types & {"BigConv2D", "BigConv2DBackpropInput", "BigConv2DBackpropFilter"}, types
    want = run(lambda x, w: tf.nn.conv2d(x, w, stride, padding))
    for got, ref in zip(run(forced), want):
        np.testing.assert_array_equal(got, ref)
    for got, ref in zip(run(auto), want):  # direct: as precise as float64 sums get here
        assert rel_l2(got.numpy(), ref.numpy()) < 1e-13


def plan(pass_, x_shape, w_shape, attrs, algorithm="auto"):
    return planner.plan(pass_, x_shape, w_shape, attrs, "float32", algorithm, 0)


@pytest.mark.parametrize("pass_", planner.PASSES)
def test_small_3d_case_keeps_fft_out_of_auto(pass_):
    p = plan(pass_, [2, 5, 4, 3, 2], [5, 4, 3, 2, 3], CONV3D)
    assert planner.fft_less_precise(p)
    assert p.fft.for_auto is False and p.chosen != "fft"
    assert "fft" not in autotune._eligible(p)
    # Asked for, it runs.
    assert plan(pass_, [2, 5, 4, 3, 2], [5, 4, 3, 2, 3], CONV3D, "fft").chosen == "fft"


def test_estimated_fft_goes_to_the_fastest_precise_candidate(monkeypatch):
    """Where the estimates pick fft on a case where it is less precise, the choice
    is the fastest of the others (TF's kernel where trusted), and the reason says
    why. Over SMALL_PASS_MACS (1.19M multiply-adds), where TF's kernel may run."""
    shapes = [2, 22, 22, 22, 1], [2, 2, 2, 1, 8]  # K = 8 against 512 FFT points
    real, seen = planner._core.plan_pass, []
    monkeypatch.setattr(planner._core, "plan_pass",
                        lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    p = plan("forward", *shapes, CONV3D)
    assert p.geometry.macs >= planner.SMALL_PASS_MACS
    # _core.plan_pass's PassPlan of that plan, with fft chosen
    fake = types.SimpleNamespace(**{k: getattr(seen[-1], k) for k in (
        "pass_", "device", "limit", "tf_kernel", "tf", "direct", "fft", "fft_plan")},
        chosen="fft", reason="auto: fft is the fastest that fits")
    monkeypatch.setattr(planner._core, "plan_pass", lambda *a, **k: fake)
    got = plan("forward", *shapes, CONV3D)
    assert "less precise" in planner.fft_less_precise(got)
    others = [n for n in ("tf", "direct") if got.estimate(n).available
              and got.estimate(n).fits and (n != "tf" or got.tf_trusted)]
    assert got.chosen == min(others, key=lambda n: got.estimate(n).seconds)
    assert planner.fft_less_precise(got) in got.reason


@pytest.mark.parametrize("x_shape,w_shape", [
    ([16, 321, 481, 1], [135, 135, 1, 3]),     # the seed case
    ([8, 56, 56, 128], [31, 31, 1, 128]),      # RepLKNet-style depthwise
    ([4, 128, 128, 32], [31, 31, 32, 32]),
])
def test_large_filters_keep_fft(x_shape, w_shape):
    attrs = dict(strides=[1] * 4, padding="SAME", explicit_paddings=[], data_format="NHWC",
                 dilations=[1] * 4)
    for pass_ in planner.PASSES:
        p = plan(pass_, x_shape, w_shape, attrs)
        assert not planner.fft_less_precise(p), (pass_, planner.fft_less_precise(p))
        assert p.fft.for_auto


def test_fft_size_is_read_from_the_plan():
    p = plan("forward", [2, 40, 40, 4], [15, 15, 4, 4],
             dict(strides=[1] * 4, padding="VALID", explicit_paddings=[], data_format="NHWC",
                  dilations=[1] * 4))
    n = planner.fft_size(p)
    assert n is not None and n >= 15 * 15 and math.log2(n) > 7


@pytest.mark.parametrize("pass_", ["forward", "backprop_input", "backprop_filter"])
@pytest.mark.parametrize("x_shape,w_shape,fmt", [
    ([2, 40, 40, 4], [15, 15, 4, 4], "NHWC"),
    ([1, 3, 33, 29], [9, 7, 3, 5], "NCHW"),
    ([1, 12, 14, 16, 2], [5, 6, 7, 2, 3], "NDHWC"),
])
def test_fft_size_is_the_size_the_plans_note_shows(pass_, x_shape, w_shape, fmt):
    """The FFT size from the plan's fields (Plan.fft_points) is the one plan.cc's
    note shows the user ("tile ... (FFT 24x30) ...")."""
    rank = len(x_shape)
    p = plan(pass_, x_shape, w_shape,
             dict(strides=[1] * rank, padding="SAME", explicit_paddings=[], data_format=fmt,
                  dilations=[1] * rank))
    shown = re.search(r"\(FFT ([0-9x]+)\)", p.fft.note).group(1)
    assert planner.fft_size(p) == math.prod(int(n) for n in shown.split("x"))
    assert len(shown.split("x")) == rank - 2
