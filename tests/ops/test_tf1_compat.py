"""TF1-style code (issue 52, item 1): under tf.compat.v1.disable_v2_behavior(),
tf.Variable and tf.get_variable filters are reference variables (dtype float32_ref),
fed through a placeholder and run in a Session, trained by tf.train optimizers; and
tf.compat.v1.nn's keywords (filter=, value=, use_cudnn_on_gpu). The TF1 scripts run
in a fresh process (TF1 behaviour is process-wide); they save what they computed
and the float64 reference checks it here. Under --pure-tf the process inherits
TFBIGCONV_PURE_TF=1."""
import inspect

import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from conftest import TESTS_DIR, random_case, run_python
from reference import (conv1d_reference, conv1d_reference_grads, conv2d_reference,
                       conv2d_reference_backprop_filter, conv3d_reference,
                       conv3d_reference_grads, rel_l2)

# The seed case's shape, smaller: a 135x135 filter with 3 outputs on one channel,
# (1, 200, 321, 1) in the seed (benchmarks measure that one).
SCRIPT = """
import sys
import numpy as np
import tensorflow.compat.v1 as tf
tf.disable_v2_behavior()
import tfbigconv

rng = np.random.default_rng(0)
out = {}


def case(tag, x_shape, make_filter, conv, optimizer):
    with tf.Graph().as_default():
        x = tf.placeholder(tf.float32, x_shape)
        w = make_filter()
        assert w.dtype.name == "float32_ref", w.dtype  # a reference variable
        y = conv(x, w)
        target = tf.placeholder(tf.float32, y.shape)
        loss = tf.reduce_mean(tf.square(y - target))
        dy = tf.placeholder(tf.float32, y.shape)
        # the optimizers' own gradient: compute_gradients on the reference variable
        (grad, _), = optimizer.compute_gradients(tf.reduce_sum(y * dy), var_list=[w])
        step = optimizer.minimize(loss)
        with tf.Session() as s:
            s.run(tf.global_variables_initializer())
            xv = rng.standard_normal(x_shape).astype(np.float32)
            w0 = s.run(w)
            yv = s.run(y, {x: xv})
            dyv = rng.standard_normal(yv.shape).astype(np.float32)
            gv = s.run(grad, {x: xv, dy: dyv})
            tv = yv + rng.standard_normal(yv.shape).astype(np.float32)
            losses = [s.run([loss, step], {x: xv, target: tv})[0] for _ in range(4)]
        out.update({tag + "/x": xv, tag + "/w": w0, tag + "/y": yv, tag + "/dy": dyv,
                    tag + "/grad": gv, tag + "/losses": np.array(losses)})


def variable(shape):
    return lambda: tf.Variable(rng.standard_normal(shape).astype(np.float32) / 50)


def get_variable(name, shape):
    init = rng.standard_normal(shape).astype(np.float32) / 50
    return lambda: tf.get_variable(name, shape, initializer=tf.constant_initializer(init))


case("2d", (1, 150, 201, 1), variable((135, 135, 1, 3)),
     lambda x, w: tfbigconv.bigconv2d(x, filter=w, strides=[1, 1, 1, 1], padding="VALID",
                                      use_cudnn_on_gpu=True),
     tf.train.AdamOptimizer(1e-5))
case("2d_get_variable", (2, 40, 37, 2), get_variable("w2", (15, 13, 2, 3)),
     lambda x, w: tfbigconv.bigconv2d(x, w, [1, 1, 1, 1], "SAME"),
     tf.train.GradientDescentOptimizer(0.05))
case("1d", (2, 300, 1), get_variable("w1", (135, 1, 3)),
     lambda x, w: tfbigconv.bigconv1d(value=x, filters=w, stride=1, padding="VALID",
                                      use_cudnn_on_gpu=False),
     tf.train.GradientDescentOptimizer(0.05))
case("3d", (1, 10, 30, 31, 1), variable((5, 15, 15, 1, 3)),
     lambda x, w: tfbigconv.bigconv3d(x, filter=w, strides=[1, 1, 1, 1, 1], padding="VALID"),
     tf.train.AdamOptimizer(0.01))
np.savez(sys.argv[1] if len(sys.argv) > 1 else OUT, **out)
"""

REFERENCES = {
    "2d": (lambda x, w: conv2d_reference(x, w),
           lambda x, w, dy: conv2d_reference_backprop_filter(x, dy, w.shape)),
    "2d_get_variable": (lambda x, w: conv2d_reference(x, w, padding="SAME"),
                        lambda x, w, dy: conv2d_reference_backprop_filter(x, dy, w.shape,
                                                                          padding="SAME")),
    "1d": (lambda x, w: conv1d_reference(x, w),
           lambda x, w, dy: conv1d_reference_grads(x, w, dy)[1]),
    "3d": (lambda x, w: conv3d_reference(x, w),
           lambda x, w, dy: conv3d_reference_grads(x, w, dy)[1]),
}


@pytest.fixture(scope="module")
def tf1_results(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tf1") / "out.npz")
    run_python(f"OUT = {path!r}\n" + SCRIPT, cwd=TESTS_DIR)
    return dict(np.load(path))


@pytest.mark.parametrize("tag", list(REFERENCES))
def test_tf1_script_with_reference_variables(tf1_results, tag):
    """Forward and the optimizer's gradient against the float64 reference; a few
    tf.train steps reduce the loss."""
    r = {k.split("/")[1]: v for k, v in tf1_results.items() if k.split("/")[0] == tag}
    forward, filter_grad = REFERENCES[tag]
    assert rel_l2(r["y"], forward(r["x"], r["w"])) < 1e-4
    assert rel_l2(r["grad"], filter_grad(r["x"], r["w"], r["dy"])) < 1e-4
    losses = r["losses"]
    assert np.all(np.isfinite(losses)) and np.all(np.diff(losses) < 0), losses


# (ours, TF1's, the case's arguments without the operands' names)
OPS = [
    (tfbigconv.bigconv1d, tf.compat.v1.nn.conv1d, (2, 20, 3), (4, 3, 2), 1),
    (tfbigconv.bigconv2d, tf.compat.v1.nn.conv2d, (2, 9, 10, 3), (4, 3, 3, 2), [1, 1, 1, 1]),
    (tfbigconv.bigconv3d, tf.compat.v1.nn.conv3d, (1, 5, 6, 7, 3), (2, 3, 2, 3, 2),
     [1, 1, 1, 1, 1]),
]
IDS = ["1d", "2d", "3d"]


@pytest.mark.parametrize("ours,theirs,x_shape,w_shape,strides", OPS, ids=IDS)
def test_every_tf1_keyword_is_taken(ours, theirs, x_shape, w_shape, strides):
    """Each keyword of tf.compat.v1.nn's signature (asked of TF) is ours too, and a call
    with TF1's names gives TF1's result."""
    params = inspect.signature(theirs).parameters
    missing = [name for name in params if name not in inspect.signature(ours).parameters]
    assert not missing, f"{ours.__name__} lacks TF1's keywords {missing}"
    x, w = random_case(x_shape, 0), random_case(w_shape, 1)
    operand = "value" if "value" in params else "input"
    operator = "filter" if "filter" in params else "filters"
    stride_name = "stride" if "stride" in params else "strides"
    kwargs = {operand: x, operator: w, stride_name: strides, "padding": "SAME"}
    if "use_cudnn_on_gpu" in params:
        kwargs["use_cudnn_on_gpu"] = False
    want = theirs(**kwargs)
    got = ours(**kwargs)
    assert got.shape == want.shape
    assert rel_l2(got, want) < 1e-5


@pytest.mark.parametrize("ours,theirs,x_shape,w_shape,strides", OPS, ids=IDS)
def test_tf1_names_and_mistakes_raise_as_tf(ours, theirs, x_shape, w_shape, strides):
    """Both a TF1 name and its TF2 name, a non-bool use_cudnn_on_gpu: TF1's class and
    words (asked of TF); strides None is 1 where TF1 reads it so."""
    params = inspect.signature(theirs).parameters
    x, w = random_case(x_shape, 0), random_case(w_shape, 1)
    stride_name = "stride" if "stride" in params else "strides"
    both = [dict(input=x, value=x, filters=w)] if "value" in params else [
        dict(input=x, filter=w, filters=w)]
    bad = [dict(input=x, filters=w, use_cudnn_on_gpu="yes")] if (
        "use_cudnn_on_gpu" in params) else []
    for kwargs in both + bad:
        kwargs = dict(kwargs, padding="SAME", **{stride_name: strides})
        with pytest.raises(Exception) as tf_error:
            theirs(**kwargs)
        with pytest.raises(type(tf_error.value)) as our_error:
            ours(**kwargs)
        assert type(our_error.value) is type(tf_error.value)
        assert str(our_error.value) == str(tf_error.value).split("\n")[0]
    if theirs is not tf.compat.v1.nn.conv3d:  # TF1's conv3d has no default strides
        want = theirs(x, w, padding="SAME")
        assert rel_l2(ours(x, w, padding="SAME"), want) < 1e-5


def test_reference_variable_dtype_mismatch_still_raises():
    """A float64 reference variable with float32 input: the dtype check sees the base
    dtype (and names it)."""
    code = """
    import numpy as np
    import tensorflow.compat.v1 as tf
    tf.disable_v2_behavior()
    import tfbigconv
    x = tf.placeholder(tf.float32, (1, 8, 8, 1))
    w = tf.Variable(np.ones((3, 3, 1, 1)))
    try:
        tfbigconv.bigconv2d(x, w, 1, "SAME")
    except TypeError as e:
        print("TypeError", e)
    """
    assert "filters dtype float64 must match input dtype float32" in run_python(code, TESTS_DIR)
