"""Each candidate of a pass as TensorFlow ops (tfbigconv/planning/candidates.py):
"tf" is TensorFlow's own kernel for the case (tfbigconv/kernels.py: Conv2D, or
DepthwiseConv2dNative, for dilated depthwise filters as tf.nn.depthwise_conv2d
runs them), "direct" and "fft" our ops, planned or for the op to choose."""
import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from tfbigconv.planning import candidates, planner, tf_rules
from conftest import TOLERANCE, random_case
from reference import (conv2d_reference, conv2d_reference_backprop_filter,
                       conv2d_reference_backprop_input, rel_l2)

ATTRS = dict(strides=[1, 1, 1, 1], padding="SAME", explicit_paddings=[], data_format="NHWC",
             dilations=[1, 1, 1, 1])


def test_output_shape_is_the_geometrys():
    a = dict(ATTRS, strides=[1, 2, 3, 1], padding="VALID")
    assert candidates.output_shape((2, 20, 31, 3), (5, 4, 3, 7), a) == [2, 8, 10, 7]
    nchw = dict(ATTRS, data_format="NCHW")
    assert candidates.output_shape((2, 3, 20, 31), (5, 4, 3, 7), nchw) == [2, 7, 20, 31]


@pytest.mark.parametrize("chosen", ["tf", "direct", "fft"])
def test_every_candidate_runs_every_pass(chosen):
    """run_pass (what autotune times) against the float64 reference."""
    x_shape, w_shape = (2, 12, 13, 4), (5, 3, 4, 6)
    x, w = random_case(x_shape, 0, np.float64), random_case(w_shape, 1, np.float64)
    y_ref = conv2d_reference(x, w, (1, 1), "SAME")
    dy = random_case(y_ref.shape, 2, np.float64)
    refs = (y_ref, conv2d_reference_backprop_input(dy, w, x_shape, (1, 1), "SAME"),
            conv2d_reference_backprop_filter(x, dy, w_shape, (1, 1), "SAME"))
    a = dict(ATTRS, algorithm="auto", workspace_limit_bytes=0)
    with tf.device("/CPU:0"):
        for p, ref in zip(planner.PASSES, refs):
            got = candidates.run_pass(p, chosen, tf.constant(x), tf.constant(w), tf.constant(dy),
                                      a, "CPU")
            assert rel_l2(got.numpy(), ref) < TOLERANCE["float64"], (p, chosen)


@pytest.mark.parametrize("chosen", [("tf", "fft"), ("direct", None), (None, "tf"),
                                    ("fft", "direct")])
def test_gradients_emits_the_wanted_passes_as_chosen(chosen):
    """candidates.gradients, the one wiring of the gradient passes: each wanted
    pass as its candidate, against the float64 reference; None where not wanted."""
    x_shape, w_shape, strides = (2, 13, 11, 4), (5, 4, 4, 3), (2, 1)
    x, w = random_case(x_shape, 0, np.float64), random_case(w_shape, 1, np.float64)
    dy = random_case(conv2d_reference(x, w, strides, "SAME").shape, 2, np.float64)
    refs = (conv2d_reference_backprop_input(dy, w, x_shape, strides, "SAME"),
            conv2d_reference_backprop_filter(x, dy, w_shape, strides, "SAME"))
    spec = tfbigconv.arguments.parse_attrs(2, [1, 2, 1, 1], "SAME", "NHWC", 1).with_operands(
        x_shape, w_shape)
    with tf.device("/CPU:0"):
        got = candidates.gradients(tf.constant(x), tf.constant(w), tf.constant(dy), spec,
                                   chosen, "CPU")
    for g, ref, c in zip(got, refs, chosen):
        if c is None:
            assert g is None
        else:
            assert rel_l2(g.numpy(), ref) < TOLERANCE["float64"], chosen


@pytest.mark.parametrize("x_shape, w_shape, padding, dil", [
    ((2, 13, 17, 6), (3, 3, 1, 6), "SAME", (2, 2)),
    ((2, 13, 17, 6), (3, 5, 1, 12), "SAME", (3, 2)),    # multiplier 2, odd sizes
    ((1, 20, 19, 4), (3, 3, 1, 4), "VALID", (4, 3)),
    ((2, 11, 12, 3), (2, 4, 1, 3), "SAME", (5, 1)),     # even sides
    ((3, 7, 9, 5), (4, 4, 1, 5), "SAME", (3, 3)),       # filter wider than the input
    ((2, 15, 15, 4), (3, 3, 1, 8), [[0, 0], [1, 3], [2, 0], [0, 0]], (2, 3)),
    ((2, 20, 21, 4), (3, 3, 1, 4), "SAME", (8, 8)),     # dilated side 17: the forward too
    ((1, 19, 23, 3), (3, 4, 1, 6), [[0, 0], [2, 1], [0, 3], [0, 0]], (7, 1)),
])
@pytest.mark.parametrize("shapes, dtype", [("static", tf.float32), ("dynamic", tf.float32),
                                           ("static", tf.float64)])
def test_dilated_depthwise_tf_kernels_run_as_tf_nn_depthwise_conv2d(x_shape, w_shape, padding,
                                                                  dil, shapes, dtype, eigen_tf):
    """TF's kernels for dilated depthwise filters: SpaceToBatchND, the
    undilated DepthwiseConv2dNative* (VALID), BatchToSpaceND, as
    tf.nn.depthwise_conv2d runs them, in the gradients, and in the forward pass
    from a dilated side of SPACE_TO_BATCH_FORWARD_SIDE (below, grouped Conv2D);
    also where TF has no dilated Conv2D gradient (planned as without oneDNN;
    float64 runs TF's Eigen kernels here). Every pass against float64."""
    fmt_pad = padding if isinstance(padding, str) else "EXPLICIT"
    explicit = sum(padding, []) if fmt_pad == "EXPLICIT" else []
    a = dict(strides=[1, 1, 1, 1], padding=fmt_pad, explicit_paddings=explicit,
             data_format="NHWC", dilations=[1, dil[0], dil[1], 1])
    pairs = ((0, 0), (0, 0)) if fmt_pad != "EXPLICIT" else (tuple(padding[1]), tuple(padding[2]))
    x, w = random_case(x_shape, 30, np.float64), random_case(w_shape, 31, np.float64)
    y_ref = conv2d_reference(x, w, (1, 1), fmt_pad, dil, explicit=pairs)
    dy = random_case(y_ref.shape, 32, np.float64)
    refs = (y_ref, conv2d_reference_backprop_input(dy, w, x_shape, (1, 1), fmt_pad, dil,
                                                   explicit=pairs),
            conv2d_reference_backprop_filter(x, dy, w_shape, (1, 1), fmt_pad, dil, explicit=pairs))

    def passes(x, w, dy):
        return [candidates.run_pass(p, "tf", x, w, dy, a, "CPU") for p in planner.PASSES]

    specs = [tf.TensorSpec(s if shapes == "static" else [None] * 3 + [s[3]], dtype)
             for s in (x_shape, w_shape, y_ref.shape)]
    specs[1] = tf.TensorSpec(w_shape, dtype)
    def checked(fn):  # run on the CPU against float64; the graph's op types
        fn = tf.function(fn, input_signature=specs)
        with tf.device("/CPU:0"):
            got = fn(*(tf.constant(v, dtype) for v in (x, w, dy)))
        for g, r in zip(got, refs):
            assert rel_l2(g.numpy(), r) < TOLERANCE[dtype.name]
        # The op types, also inside tf.cond's branches (a forced "tf" with shapes
        # unknown until the graph runs routes empty tensors to our op).
        graph_def = fn.get_concrete_function().graph.as_graph_def()
        return {n.op for n in graph_def.node} | {
            n.op for f in graph_def.library.function for n in f.node_def}

    wide = max((k - 1) * d + 1 for k, d in zip(w_shape, dil)) >= tf_rules.SPACE_TO_BATCH_FORWARD_SIDE
    forward = "DepthwiseConv2dNative" if wide else "Conv2D"
    types = checked(passes)
    assert {"SpaceToBatchND", "BatchToSpaceND", "DepthwiseConv2dNativeBackpropInput",
            "DepthwiseConv2dNativeBackpropFilter", forward} <= types, types
    assert not types & {"Conv2DBackpropInput", "Conv2DBackpropFilter"}, types
    assert ("Conv2D" in types) != wide, types
    # The copies count as workspace in every pass on the path.
    e = tfbigconv.explain(x_shape, w_shape, 1, padding, dilations=dil)
    tf_rows = {r.pass_: r for r in e.rows if r.algorithm.startswith("tf.")}
    assert tf_rows["forward"].algorithm == "tf." + forward
    for p in (planner.PASSES if wide else planner.PASSES[1:]):
        assert tf_rows[p].algorithm == "tf.DepthwiseConv2dNative"
        assert "SpaceToBatchND" in tf_rows[p].note and tf_rows[p].workspace_bytes > 0
        planned = planner.plan(p, x_shape, w_shape, a, dtype.name, "auto", 0, "CPU")
        assert planned.tf_for_auto == "measured"  # the copies are not in the estimate
    # Forced "tf" runs them too, not TF's grouped Conv2D gradients (which Eigen
    # rejects with dilations, and oneDNN with EXPLICIT padding).
    def forced(x, w, dy):
        with tf.GradientTape() as t:
            t.watch([x, w])
            y = tfbigconv.bigconv2d(x, w, 1, padding, dilations=dil, algorithm="tf")
        return [y] + t.gradient(y, [x, w], output_gradients=dy)

    types = checked(forced)
    # The forward keeps its static spatial shape (Keras and memory_report read it).
    y_spec = tf.function(lambda x, w: tfbigconv.bigconv2d(x, w, 1, padding, dilations=dil,
                                                          algorithm="tf"))
    y = y_spec.get_concrete_function(tf.TensorSpec([None] + list(x_shape[1:]), dtype),
                                     specs[1]).structured_outputs
    assert y.shape.as_list() == [None] + list(y_ref.shape[1:]), y.shape
    assert "SpaceToBatchND" in types and not types & {"Conv2DBackpropInput",
                                                       "Conv2DBackpropFilter"}, types
