"""The trace-time planner (tfbigconv/planning/planner.py): plan() and
decide() per pass, the gradient passes chosen together, an unknown batch
planned as ASSUMED_BATCH images, and planning_only() (estimates alone, no
limit that raises). What the plans choose is tested through explain() and
bigconv2d: test_tf_rules.py, test_autotune.py, ops/."""
import pytest
import tensorflow as tf

import tfbigconv
from tfbigconv import arguments
from tfbigconv.planning import autotune, planner
from conftest import rand
from reference import conv2d_reference, conv2d_reference_backprop_input, rel_l2

ATTRS = dict(strides=[1, 1, 1, 1], padding="SAME", explicit_paddings=[], data_format="NHWC",
             dilations=[1, 1, 1, 1])
SEED16 = ((4, 321, 481, 1), (135, 135, 1, 3))


def test_planning_shapes():
    assert planner.planning_shape(tf.TensorShape([None, 28, 28, 8])) == [
        planner.ASSUMED_BATCH, 28, 28, 8]
    assert planner.planning_shape([3, 28, 28, 8]) == [3, 28, 28, 8]
    assert planner.planning_shape([3, None, 28, 8]) is None  # only the batch may be unknown
    assert planner.planning_shape(tf.TensorShape(None)) is None
    assert planner.planning_shape([28, 28, 8]) is None
    assert planner.static_shape([3, 3, 8, 8]) == [3, 3, 8, 8]
    assert planner.static_shape(tf.TensorShape([None, 3, 8, 8])) is None


def test_plan_is_the_cores_table_with_the_geometry():
    p = planner.plan("forward", SEED16[0], SEED16[1], dict(ATTRS, padding="VALID"), "float32",
                     "auto", 256 << 20, "CPU")
    assert p.pass_ == "forward" and p.device == "CPU" and p.chosen == "fft"
    assert p.geometry.output_shape == [4, 187, 347, 3] and p.measured is None
    assert p.tf_kernel == "tf.Conv2D" and p.tf_for_auto == "trusted" and p.tf_trusted
    assert set(planner.PASSES) == {"forward", "backprop_input", "backprop_filter"}
    with pytest.raises(tf.errors.InvalidArgumentError, match="multiple"):
        planner.plan("forward", [1, 8, 8, 3], [3, 3, 2, 4], ATTRS, "float32", "auto", 0, "CPU")
    with pytest.raises(tf.errors.ResourceExhaustedError, match="at least"):
        planner.plan("forward", SEED16[0], SEED16[1], ATTRS, "float32", "fft", 1024, "CPU")


def test_planning_only_plans_on_estimates_without_raising(autotuning, monkeypatch):
    """Inside planning_only(): nothing is timed, and a pass that fits no limit
    is planned without one, its error kept; outside, decide() raises."""
    def fail(*args, **kwargs):
        raise AssertionError("autotune.measure called")
    monkeypatch.setattr(autotune, "measure", fail)
    x, w = SEED16
    with pytest.raises(tf.errors.ResourceExhaustedError, match="at least"):
        planner.decide("forward", x, w, ATTRS, "float32", "fft", 1024, "CPU")
    with planner.planning_only() as failures:
        p = planner.decide("forward", x, w, ATTRS, "float32", "fft", 1024, "CPU")
        assert p.chosen == "fft" and p.limit > 1024
        assert len(failures) == 1 and "at least" in failures[0]
        plans = planner.decide_gradients(x, w, ATTRS, "float32", "auto", 0, "CPU",
                                         autotune=True)
        assert [p.pass_ for p in plans] == list(planner.PASSES[1:])
        assert all(p.measured is None for p in plans)
    assert not autotuning.exists()


def test_choose_gradients_plans_static_shapes_and_leaves_the_rest_to_the_op():
    a = arguments.ConvSpec.of(ATTRS)
    chosen = planner.choose_gradients(tf.TensorShape([None, 321, 481, 1]), [135, 135, 1, 3], a,
                                      tf.float32, "CPU")
    assert chosen == ("fft", "fft")
    assert planner.choose_gradients([None, None, None, 1], [135, 135, 1, 3], a, tf.float32,
                                    "CPU") == ("auto", "auto")
    forced = a.replace(algorithm="direct")
    assert planner.choose_gradients([4, 321, 481, 1], [135, 135, 1, 3], forced, tf.float32,
                                    "CPU") == ("direct", "direct")


# ---- an unknown batch is planned at trace time -----------------------------

def test_unknown_batch_is_planned_at_trace_time(monkeypatch, model):
    planned = []
    real = planner.plan

    def spy(pass_, input_shape, *args, **kwargs):
        planned.append((pass_, list(input_shape)))
        return real(pass_, input_shape, *args, **kwargs)

    monkeypatch.setattr(planner, "plan", spy)
    # A 3x3 dense layer where the model puts TF's Conv2D far ahead (whatever the
    # active profile says of it): TF's Conv2D, as with a known batch.
    model("im2col_flops_per_second", 100)
    w = rand((3, 3, 8, 8), 40)
    f = tf.function(lambda x: tfbigconv.bigconv2d(x, w, 1, "SAME"),
                    input_signature=[tf.TensorSpec([None, 28, 28, 8])])
    types = {op.type for op in f.get_concrete_function().graph.get_operations()}
    model("im2col_flops_per_second", 0.01)
    assert "Conv2D" in types and "BigConv2D" not in types
    assert planned and all(s == [planner.ASSUMED_BATCH, 28, 28, 8] for _, s in planned)
    x = rand((3, 28, 28, 8), 41)
    assert rel_l2(f(x).numpy(), conv2d_reference(x, w, (1, 1), "SAME")) < 1e-5

    # A large filter: our ops, each pass with its trace-time plan.
    w = rand((21, 21, 2, 3), 42)

    @tf.function(input_signature=[tf.TensorSpec([None, 40, 40, 2])])
    def grads(x):
        with tf.GradientTape() as t:
            t.watch(x)
            y = tfbigconv.bigconv2d(x, w, 1, "SAME")
            loss = tf.reduce_sum(y * y)
        return y, t.gradient(loss, x)

    ops = grads.get_concrete_function().graph.get_operations()
    for op_type in ("BigConv2D", "BigConv2DBackpropInput"):
        found = [op for op in ops if op.type == op_type]
        assert len(found) == 1 and found[0].get_attr("planned_algorithm") in (b"direct", b"fft")
    x = rand((3, 40, 40, 2), 43)
    y, dx = grads(x)
    y_ref = conv2d_reference(x, w, (1, 1), "SAME")
    assert rel_l2(y.numpy(), y_ref) < 1e-4
    dx_ref = conv2d_reference_backprop_input(2 * y_ref, w, x.shape, (1, 1), "SAME")
    assert rel_l2(dx.numpy(), dx_ref) < 1e-4
