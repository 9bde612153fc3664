"""tfbigconv.route: raw convolution calls with large filters run on tfbigconv inside the
scope (eagerly, traced by tf.function, Keras' fit and predict, a TF1 graph, an export
under portable()), with TF's arguments and gradients; nothing changes outside it.
Every routed result is compared with TensorFlow's own function in float64."""
import re
import threading
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from conftest import random_case, rel_l2

OURS = {"BigConv2D", "BigConv2DBackpropInput", "BigConv2DBackpropFilter", "BigConv2DBackprop",
        "BigConv3D", "BigConv3DBackpropInput", "BigConv3DBackpropFilter"}
TF_CONVS = {"Conv2D", "Conv3D", "DepthwiseConv2dNative"}


def t64(shape, seed):
    return tf.constant(random_case(shape, seed, np.float64))


def value_and_grads(fn, x, f):
    with tf.GradientTape() as tape:
        tape.watch([x, f])
        y = fn(x, f)
    dy = t64(y.shape, 7)
    return [y, *tape.gradient(y, [x, f], output_gradients=dy)]


def traced_types(fn, x, f):
    """The op types of fn's value and gradients traced by tf.function."""
    return {op.type for op in tf.function(lambda x, f: value_and_grads(fn, x, f))
            .get_concrete_function(x, f).graph.get_operations()}


def nchw(x):
    return tf.transpose(x, [0, x.shape.rank - 1, *range(1, x.shape.rank - 1)])


def nhwc(x):
    return tf.transpose(x, [0, *range(2, x.shape.rank), 1])


X1, F1 = (2, 40, 3), (17, 3, 4)
X2, F2, FD = (2, 24, 22, 3), (17, 15, 3, 4), (17, 16, 3, 2)
X3, F3 = (1, 5, 18, 17, 2), (3, 15, 16, 2, 3)
# (call under route, the same call on TF's own function in channels-last terms
# (None: the same call), input shape, filter shape, what the report names)
CASES = {
    "conv1d": (lambda x, f: tf.nn.conv1d(x, f, 2, "SAME", dilations=1), None, X1, F1,
               "tf.nn.conv1d"),
    "v1.conv1d": (lambda x, f: tf.compat.v1.nn.conv1d(value=x, filters=f, stride=1,
                                                      padding="VALID"), None, X1, F1,
                  "tf.compat.v1.nn.conv1d"),
    "conv2d explicit": (lambda x, f: tf.nn.conv2d(x, f, [1, 2, 2, 1],
                                                  [[0, 0], [3, 4], [5, 1], [0, 0]]),
                        None, X2, F2, "tf.nn.conv2d"),
    "v1.conv2d positional": (lambda x, f: tf.compat.v1.nn.conv2d(
        x, f, [1, 1, 2, 1], "SAME", True, "NHWC", [1, 1, 1, 1]), None, X2, F2,
        "tf.compat.v1.nn.conv2d"),
    "conv3d": (lambda x, f: tf.nn.conv3d(x, f, [1, 1, 1, 1, 1], "SAME"), None, X3, F3,
               "tf.nn.conv3d"),
    "v1.conv3d": (lambda x, f: tf.compat.v1.nn.conv3d(x, filter=f, strides=[1, 1, 2, 2, 1],
                                                      padding="VALID"), None, X3, F3,
                  "tf.compat.v1.nn.conv3d"),
    "convolution 1d": (lambda x, f: tf.nn.convolution(x, f, padding="SAME", data_format="NWC",
                                                      dilations=2), None, X1, F1,
                       "tf.nn.convolution"),
    "convolution 2d": (lambda x, f: tf.nn.convolution(x, f, 2, "VALID"), None, X2, F2,
                       "tf.nn.convolution"),
    # TF's own gradient of this call fails eagerly (TF 2.21: data_format None)
    "convolution 3d": (lambda x, f: tf.nn.convolution(x, f, padding="SAME"),
                       lambda x, f: tf.nn.conv3d(x, f, [1] * 5, "SAME"), X3, F3,
                       "tf.nn.convolution"),
    "v1.convolution": (lambda x, f: tf.compat.v1.nn.convolution(x, f, "SAME",
                                                                dilation_rate=[1, 2]),
                       None, X2, F2, "tf.compat.v1.nn.convolution"),
    "depthwise": (lambda x, f: tf.nn.depthwise_conv2d(x, f, [1, 1, 1, 1], "SAME",
                                                      dilations=[2, 1]), None, X2, FD,
                  "tf.nn.depthwise_conv2d"),
    "depthwise strides": (lambda x, f: tf.nn.depthwise_conv2d(x, f, [1, 2, 2, 1], "VALID"),
                          None, X2, FD, "tf.nn.depthwise_conv2d"),
    "v1.depthwise rate": (lambda x, f: tf.compat.v1.nn.depthwise_conv2d(
        x, f, [1, 1, 1, 1], "SAME", rate=[1, 2]), None, X2, FD,
        "tf.compat.v1.nn.depthwise_conv2d"),
    "keras conv": (lambda x, f: keras.ops.conv(x, f, (2, 1), "same"), None, X2, F2,
                   "keras.ops.conv"),
    "keras conv channels_first": (
        lambda x, f: keras.ops.conv(nchw(x), f, 1, "valid", "channels_first", (1, 2)),
        lambda x, f: nchw(keras.ops.conv(x, f, 1, "valid", "channels_last", (1, 2))),
        (2, 24, 40, 3), F2,
        "keras.ops.conv"),
    "keras conv 1d": (lambda x, f: keras.ops.conv(x, f, 3, "same"), None, X1, F1,
                      "keras.ops.conv"),
    "keras conv 3d": (lambda x, f: keras.ops.conv(x, f, 1, "same"), None, X3, F3,
                      "keras.ops.conv"),
    "keras conv grouped": (lambda x, f: keras.ops.conv(x, f, 1, "same"),
                           lambda x, f: tf.concat([tf.nn.conv2d(
                               x[..., i:i + 1], f[..., 2 * i:2 * i + 2], 1, "SAME")
                               for i in range(3)], -1),
                           X2, (17, 15, 1, 6), "keras.ops.conv"),
    "keras depthwise": (lambda x, f: keras.ops.depthwise_conv(x, f, 1, "same", None, (1, 2)),
                        None, X2, FD, "keras.ops.depthwise_conv"),
    "keras depthwise channels_first": (
        lambda x, f: keras.ops.depthwise_conv(nchw(x), f, 2, "valid", "channels_first"),
        lambda x, f: nchw(keras.ops.depthwise_conv(x, f, 2, "valid")), X2, FD,
        "keras.ops.depthwise_conv"),
    "keras depthwise 1d": (lambda x, f: keras.ops.depthwise_conv(x, f, 2, "same"), None,
                           X1, (17, 3, 2), "keras.ops.depthwise_conv"),
    # strides with dilations: Keras' own decomposition, whose tf.nn call routes
    "keras depthwise strides and dilations": (
        lambda x, f: keras.ops.depthwise_conv(x, f, 2, "same", None, 2), None, X2, FD,
        "tf.nn.depthwise_conv2d"),
}


@pytest.mark.parametrize("case", CASES)
def test_routed_calls_match_tensorflow(case):
    """Value and both gradients (float64) as TF's own function gives them, on our ops,
    named in the report."""
    call, tf_call, x_shape, f_shape, name = CASES[case]
    x, f = t64(x_shape, 1), t64(f_shape, 2)
    expected = value_and_grads(tf_call or call, x, f)
    with tfbigconv.route(algorithm="direct") as routed:
        got = value_and_grads(call, x, f)
        types = traced_types(call, x, f)
    for g, e in zip(got, expected):
        assert rel_l2(g, e) < 1e-10
    assert types & OURS and not types & TF_CONVS, types
    assert [(c.name, c.kernel_size) for c in routed.routed] == [(name, f_shape[:-2])]
    assert not routed.missed
    assert not traced_types(call, x, f) & OURS  # outside the scope: TF's own ops


def test_small_filters_run_tensorflow():
    x, f = t64(X2, 1), t64((14, 15, 3, 4), 2)
    call = CASES["conv2d explicit"][0]
    with tfbigconv.route(min_kernel_size=15) as routed:
        types = traced_types(call, x, f)
    assert types & TF_CONVS and not types & OURS
    assert not routed.report.counts
    with tfbigconv.route(min_kernel_size=(14, 15)) as routed:  # height, width
        assert traced_types(call, x, f) & OURS
    assert len(routed.routed) == 1


@pytest.mark.parametrize("value", [0, -3, 1.5, "15", (15,), (15, 0), (15, 15, 15), True, None])
def test_bad_min_kernel_size(value):
    with pytest.raises(ValueError, match="min_kernel_size"):
        tfbigconv.route(min_kernel_size=value)


def test_bad_options():
    with pytest.raises(ValueError, match="algorithm"):
        tfbigconv.route(algorithm="fast")
    with pytest.raises(ValueError, match="workspace_limit"):
        tfbigconv.route(workspace_limit=-1)


def test_report_names_what_it_could_not_route():
    """A large int32 convolution runs TF's Conv2D: the report names it, its size, its
    name scope and why; with nothing routed, exiting warns."""
    x, f = tf.ones([1, 20, 20, 2], tf.int32), tf.ones([16, 16, 2, 1], tf.int32)
    with pytest.warns(RuntimeWarning, match=r"tf\.nn\.conv2d 16x16 in block/conv"):
        with tfbigconv.route() as routed:
            with tf.name_scope("block"), tf.name_scope("conv"):
                y = tf.nn.conv2d(x, f, 1, "VALID")
    np.testing.assert_array_equal(y, tf.nn.conv2d(x, f, 1, "VALID"))
    [missed] = routed.missed
    assert (missed.name, missed.kernel_size, missed.where) == ("tf.nn.conv2d", (16, 16),
                                                               "block/conv")
    assert "int32" in missed.reason and not missed.converted
    assert "not converted: tf.nn.conv2d 16x16 in block/conv: dtype int32" in str(routed)


def test_no_warning_when_something_routed():
    x = t64(X2, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with tfbigconv.route() as routed:
            tf.nn.conv2d(x, t64(F2, 2), 1, "SAME")
            tf.nn.conv2d(tf.cast(x, tf.int32), tf.ones(F2, tf.int32), 1, "SAME")
    assert len(routed.routed) == 1 and len(routed.missed) == 1
    assert "1 converted, 1 not" in str(routed)


def test_calls_from_tfbigconv_are_not_routed():
    """tfbigconv's pure-TF path (here under portable()) calls tf.nn.conv2d itself: it
    must reach TF's function, not route into tfbigconv again."""
    x, f = t64(X2, 1), t64(F2, 2)
    with tfbigconv.route() as routed, tfbigconv.portable():
        y = tfbigconv.bigconv2d(x, f, 1, "SAME")
        types = traced_types(lambda x, f: tf.nn.conv2d(x, f, 1, "SAME"), x, f)
    assert [(c.name, n) for c, n in routed.report.counts.items()] == [("tf.nn.conv2d", 1)]
    assert not types & OURS  # portable(): stock TF ops only
    assert rel_l2(y, tf.nn.conv2d(x, f, 1, "SAME")) < 1e-10


def test_nested_scopes_and_exceptions_restore():
    originals = {n: getattr(tf.nn, n) for n in ("conv2d", "depthwise_conv2d", "convolution")}
    x, f = t64(X2, 1), t64((7, 7, 3, 4), 2)
    call = lambda x, f: tf.nn.conv2d(x, f, 1, "SAME")  # noqa: E731
    with tfbigconv.route(15) as outer:
        assert not traced_types(call, x, f) & OURS
        with tfbigconv.route(5) as inner:
            assert traced_types(call, x, f) & OURS
        assert not traced_types(call, x, f) & OURS  # the outer scope again
    assert len(inner.routed) == 1 and not outer.report.counts
    with pytest.raises(KeyError):
        with tfbigconv.route(5):
            raise KeyError("inside")
    assert {n: getattr(tf.nn, n) for n in originals} == originals
    assert tf.compat.v1.nn.conv2d.__module__ == "tensorflow.python.ops.nn_ops"
    assert not traced_types(call, x, f) & OURS
    scope = tfbigconv.route()
    with scope, pytest.raises(RuntimeError, match="already active"):
        scope.__enter__()
    assert tf.nn.conv2d is originals["conv2d"]


def test_only_the_thread_that_entered_routes():
    """The functions are replaced process-wide, but another thread gets TF's ops, both
    while this one is inside a scope and inside one it started itself."""
    x, f = t64(X2, 1), t64(F2, 2)
    call = CASES["conv2d explicit"][0]
    seen = {}
    inside, done = threading.Event(), threading.Event()

    def other():
        inside.wait()
        seen["other"] = traced_types(call, x, f)
        with tfbigconv.route() as own:
            seen["own"] = traced_types(call, x, f)
        seen["own report"] = len(own.routed)
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with tfbigconv.route() as routed:
        inside.set()
        done.wait(300)
        seen["main"] = traced_types(call, x, f)
    thread.join()
    assert seen["other"] & TF_CONVS and not seen["other"] & OURS
    assert seen["own"] & OURS and seen["own report"] == 1
    assert seen["main"] & OURS and len(routed.routed) == 1


class RawDepthwise(keras.layers.Layer):
    """A custom layer as large-kernel models write them: raw depthwise calls in `call`."""

    def __init__(self, use_ops=False, **kwargs):
        super().__init__(**kwargs)
        self.use_ops = use_ops

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(17, 17, input_shape[-1], 1),
                                      initializer="glorot_uniform", name="kernel")

    def call(self, x):
        if self.use_ops:
            return keras.ops.depthwise_conv(x, self.kernel, 1, "same")
        return tf.nn.depthwise_conv2d(x, self.kernel, [1, 1, 1, 1], "SAME")


def raw_model(seed):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((20, 20, 3))
    h = RawDepthwise(name="raw_tf")(inputs)
    h = RawDepthwise(use_ops=True, name="raw_ops")(h)
    outputs = keras.layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def test_fit_and_predict_route_raw_calls_in_custom_layers():
    """One step of fit from the same weights gives TF's weights (the gradients are
    right); the report names both layers' calls; predict routes too."""
    x = random_case((4, 20, 20, 3), 1)
    y = random_case((4, 3), 2)
    stock, routed_model = raw_model(3), raw_model(3)
    stock.fit(x, y, batch_size=4, epochs=1, verbose=0)
    with tfbigconv.route() as routed:
        routed_model.fit(x, y, batch_size=4, epochs=1, verbose=0)
        predicted = routed_model.predict(x, verbose=0)
    for a, b in zip(stock.get_weights(), routed_model.get_weights()):
        assert rel_l2(b, a) < 1e-5
    # (the name scope is the layer's, uniquified by the traces: "raw_tf_1")
    names = {(c.name, re.sub(r"_\d+$", "", c.where.split("/")[-1])) for c in routed.routed}
    assert names == {("tf.nn.depthwise_conv2d", "raw_tf"),
                     ("keras.ops.depthwise_conv", "raw_ops")}, str(routed)
    assert not routed.missed
    assert rel_l2(predicted, stock.predict(x, verbose=0)) < 1e-5


def test_tf1_graph():
    """A TF1 graph built inside the scope holds our ops (forward and gradients), one
    built outside TF's, and both compute the same."""
    x_value, f_value = random_case(X2, 1, np.float64), random_case(FD, 2, np.float64)

    def build(routed):
        graph = tf.Graph()
        with graph.as_default():
            x = tf.compat.v1.placeholder(tf.float64, [None, *X2[1:]])
            f = tf.compat.v1.Variable(f_value)
            with tfbigconv.route() if routed else tf.name_scope("stock"):
                y = tf.compat.v1.nn.depthwise_conv2d(x, f, [1, 1, 1, 1], "SAME", rate=[2, 1])
                grads = tf.compat.v1.gradients(tf.reduce_sum(y * y), [x, f])
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                values = session.run([y, *grads], {x: x_value})
        return {op.type for op in graph.get_operations()}, values

    types, values = build(routed=True)
    stock_types, stock_values = build(routed=False)
    assert {"BigConv2D"} <= types and types & {"BigConv2DBackprop", "BigConv2DBackpropFilter"}
    assert "DepthwiseConv2dNative" not in types and "DepthwiseConv2dNative" in stock_types
    for got, expected in zip(values, stock_values):
        assert rel_l2(got, expected) < 1e-10


def test_export_under_portable(tmp_path):
    """model.export inside route() and portable(): the routed convolutions trace as stock
    TensorFlow ops, the SavedModel computes the model."""
    model = raw_model(4)
    x = random_case((2, 20, 20, 3), 5)
    path = str(tmp_path / "exported")
    with tfbigconv.route() as routed, tfbigconv.portable():
        model.export(path, format="tf_saved_model", verbose=False)
    assert len(routed.routed) == 2
    loaded = tf.saved_model.load(path)
    graphs = [fn.graph.as_graph_def() for fn in loaded.signatures.values()]
    types = {n.op for g in graphs for n in g.node} | {
        n.op for g in graphs for f in g.library.function for n in f.node_def}
    assert not types & OURS
    assert rel_l2(loaded.serve(x), model(x)) < 1e-5


def test_keras_own_layers_route():
    """keras.layers.DepthwiseConv2D calls keras.ops.depthwise_conv: it routes too."""
    layer = keras.layers.DepthwiseConv2D(17, padding="same")
    x = tf.constant(random_case((2, 20, 20, 3), 1))
    expected = layer(x)
    with tfbigconv.route() as routed:
        got = layer(x)
    assert rel_l2(got, expected) < 1e-5
    assert [c.name for c in routed.routed] == ["keras.ops.depthwise_conv"]


@pytest.mark.parametrize("name", ["conv1d", "conv2d", "conv3d", "depthwise_conv2d"])
@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_tf_keras_backend(name, data_format):
    """tf_keras' backend functions route through the tf.nn functions they call."""
    tf_keras = pytest.importorskip("tf_keras")
    fn = getattr(tf_keras.backend, name)
    x_shape, f_shape = {"conv1d": (X1, F1), "conv2d": (X2, F2), "conv3d": (X3, F3),
                        "depthwise_conv2d": (X2, FD)}[name]
    x, f = t64(x_shape, 1), t64(f_shape, 2)
    # (tf_keras pads "causal" on the wrong axis with channels_first)
    padding = "causal" if name == "conv1d" and data_format == "channels_last" else "same"
    xin = nchw(x) if data_format == "channels_first" else x

    def call(x, f):
        y = fn(x, f, padding=padding, data_format=data_format)
        return nhwc(y) if data_format == "channels_first" else y
    expected = value_and_grads(lambda x, f: fn(x, f, padding=padding), x, f)
    with tfbigconv.route() as routed:
        got = value_and_grads(call, xin, f)
        types = traced_types(call, xin, f)
    got[1] = nhwc(got[1]) if data_format == "channels_first" else got[1]
    for g, e in zip(got, expected):
        assert rel_l2(g, e) < 1e-10
    assert types & OURS, types
    assert len(routed.routed) == 1 and not routed.missed

