"""bigconv3d (tfbigconv/ops/conv3d.py) and the BigConv3D ops inside TensorFlow: parity
with tf.nn.conv3d where TensorFlow runs the case and with the float64 reference where it
does not (groups, dilations, NCDHW, explicit padding); dtypes, batch 0, unknown shapes,
gradients of first and second order, algorithm "tf", auto with TF's Conv3D
as a candidate (its emitters, routes and autotuning), errors. (The kernels' 3-D
arithmetic across tiles: tests/core/test_conv3d_core.py.)"""
import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from conftest import TOLERANCE, random_case, second_order_grads, tape_types
from tfbigconv.arguments import Algorithm
from tfbigconv.planning import candidates, planner, tf_rules
from reference import conv3d_reference, conv3d_reference_grads, rel_l2

TF_DTYPES = {"float16": tf.float16, "bfloat16": tf.bfloat16, "float32": tf.float32,
             "float64": tf.float64}


def tol(dtype, algorithm):
    return 1e-4 if (dtype == "float32" and algorithm != "direct") else TOLERANCE[dtype]


@pytest.mark.parametrize("algorithm", ["direct", "fft", "auto"])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("strides", [1, (2, 1, 3)])
def test_matches_tf_nn_conv3d(algorithm, padding, strides):
    x = random_case((2, 11, 12, 10, 3), 0)
    w = random_case((5, 4, 3, 3, 4), 1)
    s5 = [1, *((strides,) * 3 if isinstance(strides, int) else strides), 1]
    got = tfbigconv.bigconv3d(x, w, strides, padding, algorithm=algorithm)
    want = tf.nn.conv3d(x, w, s5, padding)
    assert got.shape == want.shape and rel_l2(got, want) < tol("float32", algorithm)


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("fmt", ["NDHWC", "NCDHW"])
def test_groups_dilations_explicit_padding(algorithm, fmt):
    """What TensorFlow's CPU Conv3D refuses, against the reference."""
    x = random_case((2, 9, 10, 11, 6), 2)
    w = random_case((3, 5, 3, 2, 9), 3)            # 3 groups
    pads = ((1, 2), (0, 3), (4, 0))
    xin = np.ascontiguousarray(x.transpose(0, 4, 1, 2, 3)) if fmt == "NCDHW" else x
    pairs = [[0, 0], *pads, [0, 0]] if fmt == "NDHWC" else [[0, 0], [0, 0], *pads]
    got = tfbigconv.bigconv3d(xin, w, [1, 2, 1], pairs, fmt, [2, 1, 2], algorithm=algorithm)
    if fmt == "NCDHW":
        got = tf.transpose(got, (0, 2, 3, 4, 1))
    ref = conv3d_reference(x, w, (1, 2, 1), "EXPLICIT", (2, 1, 2), "NDHWC", pads)
    assert rel_l2(got, ref) < tol("float32", algorithm)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("algorithm", ["direct", "fft"])
def test_dtypes(dtype, algorithm):
    x = tf.cast(random_case((1, 7, 8, 9, 4), 4), TF_DTYPES[dtype])
    w = tf.cast(random_case((3, 3, 5, 1, 8), 5), TF_DTYPES[dtype])   # depthwise, multiplier 2
    got = tfbigconv.bigconv3d(x, w, 1, "SAME", algorithm=algorithm)
    assert got.dtype == TF_DTYPES[dtype]
    ref = conv3d_reference(tf.cast(x, tf.float64).numpy(), tf.cast(w, tf.float64).numpy(),
                           padding="SAME")
    assert rel_l2(tf.cast(got, tf.float64), ref) < tol(dtype, algorithm)


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
def test_gradients_against_reference(algorithm):
    x = random_case((2, 8, 7, 9, 4), 6)
    w = random_case((3, 4, 3, 2, 6), 7)
    xt, wt = tf.constant(x), tf.constant(w)
    with tf.GradientTape() as tape:
        tape.watch([xt, wt])
        y = tfbigconv.bigconv3d(xt, wt, (1, 2, 1), "SAME", dilations=(2, 1, 1),
                                algorithm=algorithm)
    dy = random_case(y.shape, 8)
    dx, dw = tape.gradient(y, [xt, wt], output_gradients=tf.constant(dy))
    rdx, rdw = conv3d_reference_grads(x, w, dy, (1, 2, 1), "SAME", (2, 1, 1))
    assert rel_l2(dx, rdx) < tol("float32", algorithm)
    assert rel_l2(dw, rdw) < tol("float32", algorithm)


def test_second_order_gradients_match_tf():
    x = tf.constant(random_case((1, 6, 7, 5, 2), 9).astype(np.float64))
    w = tf.constant(random_case((3, 2, 3, 2, 3), 10).astype(np.float64))
    ours = second_order_grads(
        lambda x, w: tfbigconv.bigconv3d(x, w, 2, "SAME", algorithm="direct"), x, w)
    theirs = second_order_grads(
        lambda x, w: tf.nn.conv3d(x, w, [1, 2, 2, 2, 1], "SAME"), x, w)
    for a, b in zip(ours, theirs):
        assert rel_l2(a, b) < 1e-10


def test_batch_zero_and_unknown_shapes():
    w = random_case((3, 3, 3, 2, 3), 0)
    assert tfbigconv.bigconv3d(np.zeros((0, 5, 6, 7, 2), np.float32), w, 1, "SAME").shape == \
        (0, 5, 6, 7, 3)

    @tf.function(input_signature=[tf.TensorSpec([None, None, None, None, 2], tf.float32)])
    def f(x):
        return tfbigconv.bigconv3d(x, w, 1, "SAME")

    x = random_case((2, 5, 6, 7, 2), 1)
    assert rel_l2(f(x), conv3d_reference(x, w, padding="SAME")) < 1e-4
    assert f(np.zeros((0, 4, 4, 4, 2), np.float32)).shape == (0, 4, 4, 4, 3)


def test_algorithm_tf_is_tf_nn_conv3d_where_tensorflow_runs_it():
    x = random_case((1, 6, 6, 6, 2), 0)
    w = random_case((3, 3, 3, 2, 2), 1)
    assert rel_l2(tfbigconv.bigconv3d(x, w, 1, "VALID", algorithm="tf"),
                  tf.nn.conv3d(x, w, [1] * 5, "VALID")) == 0


@pytest.mark.native  # the pure-TF path composes TF's convolution (groups, empty batches)
def test_algorithm_tf_refuses_what_tensorflows_kernel_cannot_run():
    """As in 2-D, by tf_rules: TF's kernel returns its input for an empty batch, and
    its CPU Conv3D takes no groups."""
    x, w = random_case((1, 6, 6, 6, 2), 0), random_case((3, 3, 3, 2, 2), 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="empty tensors"):
        tfbigconv.bigconv3d(x[:0], w, 1, "VALID", algorithm="tf")
    with pytest.raises(tf.errors.InvalidArgumentError, match="groups"):
        tfbigconv.bigconv3d(random_case((1, 6, 6, 6, 4), 2), w, 1, "VALID", algorithm="tf")


@pytest.mark.native  # a forced "tf" is TF's kernel where our ops run
def test_algorithm_tf_in_ncdhw_where_tensorflow_says():
    """A forced "tf" in 3-D goes through planning.tf_rules, as in 2-D (issue 54: it
    had rules of its own, which let NCDHW through where tf_rules did not). TF is
    asked here: its CPU Conv3D runs NCDHW only through oneDNN (TF 2.21's Eigen
    kernel: "only supports the NHWC tensor format"), and "tf" does as TF does."""
    x, w = random_case((1, 2, 6, 7, 8), 0), random_case((3, 3, 3, 2, 2), 1)
    try:
        with tf.device("/CPU:0"):
            want = tf.raw_ops.Conv3D(input=x, filter=w, strides=[1] * 5, padding="VALID",
                                     data_format="NCDHW")
    except tf.errors.InvalidArgumentError as e:
        assert "NHWC" in str(e)
        assert not tf_rules.tf_cpu_onednn("Conv3D", "float32", False)
        with pytest.raises(tf.errors.InvalidArgumentError, match="runs only NDHWC"):
            tfbigconv.bigconv3d(x, w, 1, "VALID", "NCDHW", algorithm="tf")
    else:
        assert tf_rules.tf_cpu_onednn("Conv3D", "float32", False)
        got = tfbigconv.bigconv3d(x, w, 1, "VALID", "NCDHW", algorithm="tf")
        assert rel_l2(got, want) < 1e-6


@pytest.mark.native  # ResourceExhaustedError for the workspace comes from our ops
def test_errors_name_the_argument():
    x = random_case((1, 6, 6, 6, 2), 0)
    w = random_case((3, 3, 3, 2, 2), 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="data_format"):  # ValueError in graphs
        tfbigconv.bigconv3d(x, w, 1, "SAME", "NHWC")
    with pytest.raises(ValueError, match="strides"):
        tfbigconv.bigconv3d(x, w, [1, 1], "SAME")
    with pytest.raises(ValueError, match="padding"):
        tfbigconv.bigconv3d(x, w, 1, [[0, 0]] * 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="input must be rank 5"):
        tfbigconv.bigconv3d(x[0], w, 1, "SAME")
    with pytest.raises(tf.errors.InvalidArgumentError, match="depth"):
        tfbigconv.bigconv3d(x, random_case((3, 3, 3, 3, 2), 2), 1, "SAME")
    with pytest.raises(tf.errors.InvalidArgumentError, match="algorithm"):
        tfbigconv.bigconv3d(x, w, 1, "SAME", algorithm="winograd")
    with pytest.raises(tf.errors.InvalidArgumentError, match="dtype"):  # TypeError in graphs
        tfbigconv.bigconv3d(tf.constant(x), tf.constant(w, tf.float64), 1, "SAME")
    with pytest.raises(tf.errors.ResourceExhaustedError, match="workspace"):
        tfbigconv.bigconv3d(random_case((1, 30, 30, 30, 2), 3), random_case((9, 9, 9, 2, 2), 4),
                            1, "SAME", algorithm="fft", workspace_limit=1000)


def test_under_xla_bigconv3d_is_tf_conv3d_with_groups():
    x = random_case((2, 7, 8, 9, 4), 0)
    w = random_case((3, 3, 3, 2, 6), 1)
    f = tf.function(lambda x, w: tfbigconv.bigconv3d(x, w, 1, "SAME"), jit_compile=True)
    assert rel_l2(f(x, w), conv3d_reference(x, w, padding="SAME")) < 1e-5


def test_algorithm_tf_with_unknown_shapes():
    w = random_case((3, 3, 3, 2, 2), 1)

    @tf.function(input_signature=[tf.TensorSpec([None, 6, 6, 6, 2], tf.float32)])
    def f(x):
        return tfbigconv.bigconv3d(x, w, 1, "SAME", algorithm="tf")

    x = random_case((2, 6, 6, 6, 2), 0)
    assert rel_l2(f(x), tf.nn.conv3d(x, w, [1] * 5, "SAME")) < 1e-6


@pytest.mark.parametrize("fmt", ["NDHWC", "NCDHW"])
def test_under_xla_explicit_padding_and_layouts(fmt):
    """The pure-TF path pads explicitly and transposes NCDHW around tf.nn.conv3d."""
    x = random_case((2, 6, 7, 8, 4), 2)
    w = random_case((3, 2, 3, 2, 4), 3)
    pads = ((1, 0), (2, 1), (0, 3))
    xin = np.ascontiguousarray(x.transpose(0, 4, 1, 2, 3)) if fmt == "NCDHW" else x
    pairs = [[0, 0], *pads, [0, 0]] if fmt == "NDHWC" else [[0, 0], [0, 0], *pads]
    f = tf.function(lambda x, w: tfbigconv.bigconv3d(x, w, [1, 2, 1], pairs, fmt),
                    jit_compile=True)
    got = f(xin, w)
    if fmt == "NCDHW":
        got = tf.transpose(got, (0, 2, 3, 4, 1))
    ref = conv3d_reference(x, w, (1, 2, 1), "EXPLICIT", (1, 1, 1), "NDHWC", pads)
    assert rel_l2(got, ref) < 1e-5


@pytest.mark.native  # the pure-TF path is tf.nn.conv3d, which runs on the GPU
def test_a_gpu_placement_warns_that_the_ops_run_on_the_cpu(gpu_host, monkeypatch):
    from tfbigconv.ops import conv
    monkeypatch.setattr(conv, "_warned", [])
    x, w = random_case((1, 5, 5, 5, 2), 0), random_case((3, 3, 3, 2, 2), 1)
    with pytest.warns(RuntimeWarning, match="no GPU kernels"):
        y = tfbigconv.bigconv3d(x, w, 1, "SAME")  # still computed, on the CPU
    assert rel_l2(y, conv3d_reference(x, w, padding="SAME")) < 1e-4


def _ncdhw(v):
    return np.ascontiguousarray(np.transpose(v, (0, 4, 1, 2, 3)))


@pytest.mark.native
@pytest.mark.parametrize("fmt", ["NDHWC", "NCDHW"])
def test_every_candidate_of_every_pass(fmt):
    """auto's candidates in 3-D (planning.candidates): TF's Conv3D ops, explicit
    padding as tf.pad or a crop around them, and our ops, against the reference."""
    onednn = tf_rules.tf_cpu_onednn("Conv3D", "float32", False)
    if fmt == "NCDHW" and not onednn:
        pytest.skip("TF's Eigen Conv3D runs only NDHWC")
    x, w = random_case((2, 7, 8, 9, 3), 11), random_case((3, 2, 4, 3, 5), 12)
    pads, strides = ((1, 2), (0, 1), (3, 0)), (1, 2, 1)
    dil = (2, 1, 1) if onednn else (1, 1, 1)  # TF's Eigen Conv3D takes no dilations
    ref_y = conv3d_reference(x, w, strides, "EXPLICIT", dil, "NDHWC", pads)
    dy = random_case(ref_y.shape, 13)
    ref_dx, ref_dw = conv3d_reference_grads(x, w, dy, strides, "EXPLICIT", dil, "NDHWC", pads)
    flat = [0, 0, *np.ravel(pads), 0, 0] if fmt == "NDHWC" else [0, 0, 0, 0, *np.ravel(pads)]
    order = (lambda v: [1, *v, 1]) if fmt == "NDHWC" else (lambda v: [1, 1, *v])
    a = dict(strides=order(strides), padding="EXPLICIT", explicit_paddings=[int(p) for p in flat],
             data_format=fmt, dilations=order(dil), algorithm="auto", workspace_limit_bytes=0)
    to = _ncdhw if fmt == "NCDHW" else (lambda v: v)
    back = (lambda v: np.transpose(v, (0, 2, 3, 4, 1))) if fmt == "NCDHW" else (lambda v: v)
    xt, wt, dyt = tf.constant(to(x)), tf.constant(w), tf.constant(to(dy))
    for chosen in ("tf", "direct", "fft"):
        got = [candidates.run_pass(p, chosen, xt, wt, dyt, a, "CPU") for p in
               ("forward", "backprop_input", "backprop_filter")]
        for g, ref in zip((back(got[0].numpy()), back(got[1].numpy()), got[2]),
                          (ref_y, ref_dx, ref_dw)):
            assert rel_l2(g, ref) < 1e-4, chosen


@pytest.mark.native
def test_auto_runs_tf_conv3d_for_a_small_filter_and_ours_for_a_large_one():
    """auto weighs TF's Conv3D per pass when the op is built (explain's choice):
    for a small filter it runs TF's Conv3D where the kernel rules trust its
    estimate (oneDNN's Conv3D) and ours where they time it first (TF's Eigen
    Conv3D: autotuning is off here); for a large filter ours on every host. The
    training step's results hold on either route."""
    small, large = ((2, 8, 12, 12, 16), (3, 3, 3, 16, 16)), ((1, 12, 20, 20, 2), (9, 9, 9, 2, 2))
    attrs = dict(strides=[1] * 5, padding="SAME", explicit_paddings=[], data_format="NDHWC",
                 dilations=[1] * 5)
    trusted = {p: planner.plan(p, *small, attrs, "float32", "auto", 0).tf_trusted
               for p in planner.PASSES}
    # The rules' own fact: trusted exactly where TF runs Conv3D through oneDNN.
    assert set(trusted.values()) == {tf_rules.tf_cpu_onednn("Conv3D", "float32", False)}
    for (xs, ws), is_small in ((small, True), (large, False)):
        chosen = tfbigconv.explain(xs, ws, padding="SAME").chosen
        wanted = {p: is_small and trusted[p] for p in planner.PASSES}
        assert {p: c.startswith("tf") for p, c in chosen.items()} == wanted, chosen
        types = tape_types(lambda x, w: tfbigconv.bigconv3d(x, w, 1, "SAME"), xs, ws)
        assert ("Conv3D" in types) == any(wanted.values()), types
        assert ("BigConv3D" in types) != wanted["forward"], types
        x, w = random_case(xs, 14), random_case(ws, 15)
        xt, wt = tf.constant(x), tf.constant(w)
        with tf.GradientTape() as tape:
            tape.watch([xt, wt])
            y = tfbigconv.bigconv3d(xt, wt, 1, "SAME")
        dy = random_case(y.shape, 16)
        dx, dw = tape.gradient(y, [xt, wt], output_gradients=tf.constant(dy))
        rdx, rdw = conv3d_reference_grads(x, w, dy, padding="SAME")
        assert rel_l2(y, conv3d_reference(x, w, padding="SAME")) < 1e-4
        assert rel_l2(dx, rdx) < 1e-4 and rel_l2(dw, rdw) < 1e-4


@pytest.mark.native
def test_tf_forward_with_our_gradients(monkeypatch):
    """A forward pass planned as TF's Conv3D whose gradient passes are planned as
    ours: the routed gradient (ops.planned.tf_forward_routed) in 3-D. Both
    choices are forced: auto picks TF's Conv3D here only where oneDNN runs it
    (the test above), and TF's Eigen kernel runs this case too."""
    from tfbigconv.ops import planned
    plan_forward = planned.plan_forward
    monkeypatch.setattr(planned, "plan_forward",
                        lambda *a: plan_forward(*a).replace(chosen=Algorithm.TF))
    monkeypatch.setattr(planner, "choose_gradients", lambda *a, **k: ("direct", "fft"))
    x, w = random_case((2, 6, 7, 8, 4), 17), random_case((3, 3, 3, 4, 4), 18)
    xt, wt = tf.constant(x), tf.constant(w)
    with tf.GradientTape() as tape:
        tape.watch([xt, wt])
        y = tfbigconv.bigconv3d(xt, wt, (1, 2, 1), "VALID")
    dy = random_case(y.shape, 19)
    dx, dw = tape.gradient(y, [xt, wt], output_gradients=tf.constant(dy))
    rdx, rdw = conv3d_reference_grads(x, w, dy, (1, 2, 1), "VALID")
    assert rel_l2(y, conv3d_reference(x, w, (1, 2, 1), "VALID")) < 1e-4
    assert rel_l2(dx, rdx) < 1e-4 and rel_l2(dw, rdw) < 1e-4
    types = tape_types(lambda x, w: tfbigconv.bigconv3d(x, w, (1, 2, 1), "VALID"),
                       x.shape, w.shape)
    assert {"Conv3D", "BigConv3DBackpropInput", "BigConv3DBackpropFilter"} <= types, types
    assert "BigConv3D" not in types, types


@pytest.mark.native
def test_autotuning_times_the_3d_candidates(autotuning):
    """Where estimates are close, the 3-D passes are timed as the 2-D ones are,
    and the choices are cached."""
    import json
    xs, ws = (2, 8, 16, 16, 8), (5, 5, 5, 8, 8)
    e = tfbigconv.explain(xs, ws, padding="SAME", autotune=True)
    timed = [r for r in e.rows if r.measured_seconds is not None]
    assert timed, e
    entries = json.loads(autotuning.read_text())["entries"]
    assert any('"NDHWC"' in k for k in entries)
