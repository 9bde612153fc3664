"""bigconv2d's arguments (tfbigconv/arguments.py): every invalid argument
raises tf.nn.conv2d's exception class, with a message naming the problem: at
trace time with static shapes, at run time with unknown shapes
(arguments.graph_error says which class when); the algorithm and its
TFBIGCONV_ALGORITHM override (arguments.requested_algorithm)."""
import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from conftest import graph_ops, op_types, rand, random_case

X = random_case((1, 8, 8, 2), 0)
W = random_case((3, 3, 2, 4), 1)
IAE, VE, TE = tf.errors.InvalidArgumentError, ValueError, TypeError
UNIMPLEMENTED = tf.errors.UnimplementedError

# (arguments, class while a graph is built (tf.function, tf.Graph), class
# eagerly, a fragment of our message). The graph column is tf.nn.conv2d's, and
# test_tf_raises_the_same checks it against TensorFlow where TF's op is
# involved (None: an argument of ours). Eagerly, TF's kernel raises
# InvalidArgumentError for what its shape function finds when a graph is
# built; its oneDNN kernels there aborted on a rank-3 input, and ran batch
# padding and too-large filters without an error (TF_ENABLE_ONEDNN_OPTS=0:
# TF's Eigen kernels raise these classes), so TF's eager column is not run.
# HOST: the class of the kernel that runs the dtype here, which tf.nn.conv2d is
# asked for (tf_class): TF 2.21's oneDNN Conv2D raises InvalidArgumentError for
# dilations in the batch or depth dimension, its own UnimplementedError.
HOST = "the class tf.nn.conv2d raises here"
BAD = [
    (dict(input=random_case((8, 8, 2), 0)), VE, IAE, "input must be rank 4"),
    (dict(filters=random_case((3, 3, 2), 0)), VE, IAE, "filters must be rank 4"),
    (dict(filters=random_case((3, 3, 3, 4), 0)), VE, IAE, "multiple of the filter's in_depth"),
    (dict(input=random_case((1, 8, 8, 4), 0), filters=random_case((3, 3, 2, 3), 0)),
     VE, IAE, "multiple of groups"),
    (dict(strides=0), VE, IAE, "strides must be positive"),
    (dict(strides=[1, 2, 3]), VE, VE, "strides must be an int or a list of 1, 2 or 4"),
    (dict(strides=[2, 1, 1, 1]), UNIMPLEMENTED, UNIMPLEMENTED, "support strides in the batch and depth"),
    (dict(strides=[1, 1, 1, 2]), UNIMPLEMENTED, UNIMPLEMENTED, "support strides in the batch and depth"),
    (dict(dilations=-2), VE, IAE, "dilations must be positive"),
    (dict(dilations=[2, 1, 1, 1]), HOST, HOST, "support dilations in the batch and depth"),
    (dict(padding="FULL"), VE, IAE, "padding must be one of"),
    (dict(padding="EXPLICIT"), VE, VE, "list of 4 \\[before, after\\] pairs"),
    (dict(padding=[[0, 0], [1, 1], [1, 1]]), VE, VE, "4 \\[before, after\\] pairs"),
    (dict(padding=[[0, 0, 0], [1, 1], [1, 1], [0, 0]]), VE, VE, "4 \\[before, after\\] pairs"),
    (dict(padding=[[0, 0], [1, -1], [1, 1], [0, 0]]), VE, IAE, "non-negative"),
    (dict(padding=[[1, 0], [1, 1], [1, 1], [0, 0]]), VE, IAE, "batch and depth"),
    (dict(padding=[[0, 0], [1, 1], [1, 1], [0, 1]]), VE, IAE, "batch and depth"),
    (dict(filters=random_case((0, 3, 2, 4), 0)), IAE, IAE, "must not have zero elements"),
    (dict(filters=random_case((10, 3, 2, 4), 0)), VE, IAE,
     "larger than the padded input along height"),
    (dict(data_format="NWHC"), VE, IAE, "data_format"),
    (dict(input=tf.zeros((1, 8, 8, 2), tf.int64), filters=tf.zeros((3, 3, 2, 4), tf.int64)),
     TE, IAE, "input dtype"),
    (dict(filters=tf.zeros((3, 3, 2, 4), tf.float64)), TE, IAE, "filters dtype"),
    (dict(algorithm="magic"), None, IAE, "algorithm"),
    (dict(workspace_limit=-1), None, IAE, "workspace_limit"),
]
IDS = [f"{i}-{frag[:24]}" for i, (_, _, _, frag) in enumerate(BAD)]


def tf_class(cls, kwargs):
    """cls, or for HOST the class tf.nn.conv2d raises for `kwargs` eagerly here."""
    if cls != HOST:
        return cls
    try:
        call(tf.nn.conv2d, **kwargs)
    except tf.errors.OpError as e:
        return type(e)
    pytest.fail(f"tf.nn.conv2d ran {kwargs}")


def call(conv2d=tfbigconv.bigconv2d, **kw):
    args = dict(input=X, filters=W, strides=1, padding="VALID")
    args.update(kw)
    if conv2d is tf.nn.conv2d:
        args.pop("algorithm", None), args.pop("workspace_limit", None)
    return conv2d(**args)


@pytest.mark.parametrize("kwargs,graph,eager,fragment", BAD, ids=IDS)
def test_eager_errors(kwargs, graph, eager, fragment):
    eager = tf_class(eager, kwargs)
    with pytest.raises(eager, match=fragment) as info:
        call(**kwargs)
    assert type(info.value) is eager or eager is VE  # not a subclass of a neighbour


@pytest.mark.parametrize("kwargs,graph,eager,fragment", BAD, ids=IDS)
def test_tf_function_errors(kwargs, graph, eager, fragment):
    with pytest.raises(tf_class(graph or eager, kwargs), match=fragment):
        tf.function(lambda: call(**kwargs))()


@pytest.mark.parametrize("kwargs,graph,eager,fragment", BAD, ids=IDS)
def test_tf1_graph_errors(kwargs, graph, eager, fragment):
    cls = tf_class(graph or eager, kwargs)
    with tf.Graph().as_default(), pytest.raises(cls, match=fragment):
        # the table's tensors are eager ones: a graph takes constants
        y = call(**{k: tf.constant(v.numpy()) if isinstance(v, tf.Tensor) else v
                    for k, v in kwargs.items()})
        with tf.compat.v1.Session() as session:
            session.run(y)


@pytest.mark.parametrize("kwargs,graph,eager,fragment",
                         [b for b in BAD if b[1] is not None], ids=[
                             i for i, b in zip(IDS, BAD) if b[1] is not None])
def test_tf_raises_the_same(kwargs, graph, eager, fragment):
    """The table's graph column is what tf.nn.conv2d raises in a tf.function
    (HOST: the class it raises eagerly here, both depending on the host)."""
    with pytest.raises(tf_class(graph, kwargs)) as info:
        tf.function(lambda: call(tf.nn.conv2d, **kwargs))()
    assert type(info.value) is tf_class(graph, kwargs) or graph != HOST


@pytest.mark.parametrize("x,w,fragment", [
    (random_case((1, 8, 8, 3), 0), W, "multiple of the filter"),
    (X, random_case((10, 3, 2, 4), 0), "larger than the padded input"),
    (random_case((1, 8, 8, 4), 0), random_case((3, 3, 2, 3), 0), "multiple of groups"),
    (random_case((1, 8, 8), 0), W, "input must be rank 4"),
])
def test_runtime_errors_with_unknown_shapes(x, w, fragment):
    fn = tf.function(lambda x, w: tfbigconv.bigconv2d(x, w, 1, "VALID"),
                     input_signature=[tf.TensorSpec(None), tf.TensorSpec(None)])
    with pytest.raises(tf.errors.InvalidArgumentError, match=fragment):
        fn(x, w)


def test_raw_op_rejects_bad_attrs():
    """The op itself (not only the Python wrapper) validates its attributes."""
    with pytest.raises(tf.errors.InvalidArgumentError, match="strides"):
        tfbigconv._raw_ops.big_conv2d(input=X, filter=W, strides=[1, 1, 1], padding="VALID")
    with pytest.raises(tf.errors.InvalidArgumentError, match="explicit_paddings"):
        tfbigconv._raw_ops.big_conv2d(input=X, filter=W, strides=[1, 1, 1, 1], padding="EXPLICIT",
                                      explicit_paddings=[1, 1])


def test_int32_runs_tensorflows_kernel():
    """tf.nn.conv2d computes int32 on the CPU; our kernels lack it, so TF's runs."""
    rng = np.random.default_rng(0)
    x = rng.integers(-5, 5, (2, 9, 8, 3)).astype(np.int32)
    w = rng.integers(-3, 3, (4, 3, 3, 5)).astype(np.int32)
    for pad in ("SAME", "VALID", [[0, 0], [2, 1], [0, 3], [0, 0]]):
        want = tf.nn.conv2d(x, w, [1, 2], pad, dilations=1)
        got = tfbigconv.bigconv2d(x, w, [1, 2], pad)
        assert got.dtype == tf.int32
        np.testing.assert_array_equal(got, want)
    with pytest.raises(tf.errors.InvalidArgumentError, match="algorithm 'fft' does not run int32"):
        tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm="fft")


def test_int32_ignores_the_debugging_override(monkeypatch):
    """TFBIGCONV_ALGORITHM forces our kernels for debugging; int32 still runs TF's."""
    x = np.arange(2 * 6 * 5 * 2, dtype=np.int32).reshape(2, 6, 5, 2) % 7
    w = np.ones((3, 3, 2, 4), np.int32)
    monkeypatch.setenv("TFBIGCONV_ALGORITHM", "direct")
    np.testing.assert_array_equal(tfbigconv.bigconv2d(x, w, 1, "SAME"),
                                  tf.nn.conv2d(x, w, 1, "SAME"))


def test_data_format_none_is_nhwc():
    want = tfbigconv.bigconv2d(X, W, 1, "SAME", data_format="NHWC", algorithm="direct")
    got = tfbigconv.bigconv2d(X, W, 1, "SAME", data_format=None, algorithm="direct")
    np.testing.assert_array_equal(got, want)


@pytest.mark.native
def test_environment_override(monkeypatch):
    x, w = rand((1, 16, 16, 2), 12), rand((3, 3, 2, 2), 13)
    conv = lambda x: tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm="fft")
    monkeypatch.setenv("TFBIGCONV_ALGORITHM", "direct")
    ops = [op for op in graph_ops(conv, x) if op.type == "BigConv2D"]
    assert ops[0].get_attr("algorithm") == b"direct"
    for name in ("tf", "im2col"):
        monkeypatch.setenv("TFBIGCONV_ALGORITHM", name)
        types = op_types(conv, x)
        assert "Conv2D" in types and "BigConv2D" not in types
    monkeypatch.setenv("TFBIGCONV_ALGORITHM", "fastest")
    with pytest.raises(tf.errors.InvalidArgumentError, match="TFBIGCONV_ALGORITHM"):
        conv(x)


# Messages that name what the op (1-D, 2-D or 3-D) takes (issue 52, item 8).
X1, W1 = random_case((1, 30, 2), 0), random_case((9, 2, 2), 1)


@pytest.mark.parametrize("kwargs,error,fragment", [
    (dict(padding="EXPLICIT"), VE, "list of 3 \\[before, after\\] pairs"),
    (dict(padding=[[0, 0], [1, 1]]), VE, "'CAUSAL' or a list of 3 \\[before, after\\] pairs"),
    (dict(padding=[[0, 0], [1, -1], [0, 0]]), IAE,
     "non-negative, got \\[\\[0, 0\\], \\[1, -1\\], \\[0, 0\\]\\] for data_format NWC"),
    (dict(padding=[[1, 0], [1, 1], [0, 0]]), IAE,
     "batch and channel dimensions must be 0, got \\[\\[1, 0\\], \\[1, 1\\], \\[0, 0\\]\\] "
     "for data_format NWC"),
    (dict(padding=[[0, 0], [2**31, 0], [0, 0]]), VE, "an int of at least -2\\*\\*31 below"),
    (dict(padding="CAUSAL", dilations=2**29), VE,
     "CAUSAL padding puts \\(filter width - 1\\) \\* dilation = \\(9 - 1\\) \\* 536870912"),
    (dict(stride=0), IAE, "stride must be positive, got 0$"),
    (dict(dilations=[1, -2, 1]), IAE, "dilations must be positive, got -2$"),
    (dict(filters=random_case((0, 2, 2), 1)), IAE,
     "must not have zero elements .* in width and in_channels: filters has shape \\[0, 2, 2\\]"),
])
def test_conv1d_messages_name_1d_arguments(kwargs, error, fragment):
    args = dict(input=X1, filters=W1, stride=1, padding="VALID")
    args.update(kwargs)
    with pytest.raises(error, match=fragment) as info:
        tfbigconv.bigconv1d(**args)
    assert "4 [before" not in str(info.value) and "explicit_paddings" not in str(info.value)


# ---- ConvSpec: the parsed arguments every layer reads -----------------------
from tfbigconv.arguments import Algorithm, ConvSpec  # noqa: E402


def test_parse_attrs_gives_a_frozen_spec_and_the_ops_lists():
    spec = tfbigconv.arguments.parse_attrs(2, 2, [[0, 0], [1, 2], [3, 4], [0, 0]], "NHWC", 1)
    assert spec == ConvSpec((1, 2, 2, 1), "EXPLICIT", (0, 0, 1, 2, 3, 4, 0, 0), "NHWC",
                            (1, 1, 1, 1))
    assert hash(spec) == hash(ConvSpec.of(spec.tf_attrs()))
    with pytest.raises(AttributeError):
        spec.padding = "SAME"
    assert spec.tf_attrs() == dict(strides=[1, 2, 2, 1], padding="EXPLICIT",
                                   explicit_paddings=[0, 0, 1, 2, 3, 4, 0, 0],
                                   data_format="NHWC", dilations=[1, 1, 1, 1])
    assert ConvSpec.of(spec.op_attrs()) == spec
    with pytest.raises(TypeError, match="attrs must be a ConvSpec or a mapping"):
        ConvSpec.of([1, 1, 1, 1])


def test_op_attrs_carry_the_planned_algorithm_for_auto_only_as_strings():
    auto = tfbigconv.arguments.parse_attrs(2, 1, "SAME", "NHWC", 1)
    got = auto.op_attrs(Algorithm.FFT)
    assert got == dict(auto.tf_attrs(), algorithm="auto", workspace_limit_bytes=0,
                       planned_algorithm="fft")
    assert type(got["algorithm"]) is str and type(got["planned_algorithm"]) is str
    assert auto.op_attrs(Algorithm.DIRECT)["planned_algorithm"] == "direct"
    assert "planned_algorithm" not in auto.op_attrs(Algorithm.AUTO)  # the op chooses at run time
    forced = auto.replace(algorithm=Algorithm.DIRECT, workspace_limit_bytes=7)
    assert forced.op_attrs(Algorithm.DIRECT) == dict(auto.tf_attrs(), algorithm="direct",
                                                     workspace_limit_bytes=7)


@pytest.mark.parametrize("data_format,x_shape,f_shape,groups,depthwise", [
    ("NHWC", [2, 9, 9, 8], [3, 3, 1, 16], 8, True),
    ("NCHW", [2, 8, 9, 9], [3, 3, 1, 8], 8, True),
    ("NHWC", [2, 9, 9, 8], [3, 3, 2, 8], 4, False),
    ("NHWC", [2, 9, 9, 1], [3, 3, 1, 4], 1, False),      # one channel: dense
    ("NHWC", [2, 9, 9, 8], [3, 3, 8, 4], 1, False),
    ("NDHWC", [2, 5, 9, 9, 8], [3, 3, 3, 1, 8], 8, False),  # no 3-D depthwise kernel
    ("NCDHW", [2, 8, 5, 9, 9], [3, 3, 1, 2, 8], 4, False),  # width 1 is no channel
])
def test_the_filters_facts_come_from_the_operands(data_format, x_shape, f_shape, groups,
                                                 depthwise):
    spatial = len(x_shape) - 2
    spec = tfbigconv.arguments.parse_attrs(spatial, 1, "SAME", data_format, 1).with_operands(
        tf.TensorShape(x_shape), tf.TensorShape(f_shape))
    assert spec.in_depth == (x_shape[-1] if data_format.endswith("C") else x_shape[1])
    assert spec.filter_dims == f_shape and spec.filter_in_depth == f_shape[-2]
    assert (spec.groups, spec.grouped, spec.depthwise) == (groups, groups > 1, depthwise)


def test_unknown_operands_leave_the_filters_facts_unknown():
    spec = tfbigconv.arguments.parse_attrs(2, 1, "SAME", "NHWC", 1)
    assert spec.filter_dims == [None] * 4 and spec.groups is None
    assert not spec.grouped and not spec.depthwise
    spec = spec.with_operands(tf.TensorShape([None, None, None, None]), tf.TensorShape(None))
    assert spec.in_depth is None and spec.filter_dims == [None] * 4
    spec = spec.with_operands(tf.TensorShape([None, 9, 9, 8]), tf.TensorShape([3, 3, None, 8]))
    assert spec.in_depth == 8 and spec.groups is None and not spec.grouped
