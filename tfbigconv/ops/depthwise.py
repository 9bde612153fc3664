"""depthwise_conv2d: tf.nn.depthwise_conv2d's interface (and TF1's) on bigconv2d.

A depthwise filter [KH, KW, C, M] is bigconv2d's grouped filter [KH, KW, 1, C*M]
on C groups: in both, output channel c*M + m is input channel c convolved with
filter[:, :, c, m] (kernels.py), so the filter is reshaped, never transposed.
"""
import numbers
import warnings

import numpy as np
import tensorflow as tf

from tfbigconv import arguments
from tfbigconv.ops import conv
from tfbigconv.planning import tf_rules

FILTER_LAYOUT = "[filter_height, filter_width, in_channels, channel_multiplier]"


@tf.autograph.experimental.do_not_convert  # plain Python at trace time (planning, autotuning)
def depthwise_conv2d(input, filter, strides, padding, data_format=None, dilations=None,
                     name=None, *, algorithm="auto", workspace_limit=0, rate=None):
    """Computes a depthwise 2-D convolution like `tf.nn.depthwise_conv2d`, without im2col.

    Arguments and semantics are tf.nn.depthwise_conv2d's: `input` is 4-D in
    `data_format` ("NHWC", the default, also for None, or "NCHW"); `filter` is
    [filter_height, filter_width, in_channels, channel_multiplier], in_channels equal
    to the input's channels; output channel c * channel_multiplier + m is input
    channel c convolved with filter[:, :, c, m]. `strides` is a list of 4 ints in
    data_format order, 1 in the batch and channel entries; `dilations` a list of 2
    ints (height, width); `padding` "SAME", "VALID" or an explicit list of 4
    [before, after] pairs in data_format order (zeros in the batch and channel pairs).
    Dilations with a stride other than 1 are what tf.nn.depthwise_conv2d computes
    then, with its UserWarning: TF's documentation asks for strides of 1 there, and
    it runs the strided convolution on the dilated input's space-to-batch blocks
    (tf.nn.with_space_to_batch), which is not the strided dilated convolution
    (bigconv2d computes that, for a grouped filter). Works in eager mode and in
    tf.function, also with unknown shapes (then the filter's in_channels is checked
    against the input's when the graph runs).

    TF1's form (tf.compat.v1.nn.depthwise_conv2d) is taken by keyword: `rate=` for
    `dilations` (ValueError for both, as TF says). Its positional order differs from
    TF2's (rate is its 5th argument, data_format here), so a 5th positional argument
    that is not a string raises TypeError saying to pass rate= by keyword.

    Keyword-only `algorithm` and `workspace_limit` are bigconv2d's, which runs the
    convolution on the grouped filter [KH, KW, 1, C * M]: the same dtypes (float16,
    bfloat16, float32, float64), planner ("auto" weighs TensorFlow's
    DepthwiseConv2dNative among the candidates; "tf" forces it, dilations as
    tf.nn.depthwise_conv2d runs them), every algorithm ("auto", "tf", "direct",
    "fft"), XLA and pure-TensorFlow path, batch 0, and gradients of any order
    (bigconv2d's ops). Beyond TF's CPU kernel, NCHW and unequal strides run too.

    Raises:
      tf.nn.depthwise_conv2d's exception for each bad argument, with a message naming
      it: TypeError for strides that are not a list and for dilations that are not a
      sequence; ValueError for dilations (or rate) not of 2 positive ints, and for both
      rate and dilations; for what TF's shape function checks (strides not of 4
      elements, ranks other than 4, the filter's in_channels not the input's
      channels, padding), ValueError while a graph is built and InvalidArgumentError
      eagerly (TypeError and InvalidArgumentError for dtypes); for strides other than
      1 in the batch or channel entries the class TF's DepthwiseConv2dNative raises on
      this host for the dtype (InvalidArgumentError, UnimplementedError under oneDNN);
      otherwise bigconv2d's (InvalidArgumentError for a filter of zero height or
      width, which TF's depthwise kernel takes).
    """
    with tf.name_scope(name or "depthwise_conv2d"):
        if data_format is not None and not isinstance(data_format, str):
            raise TypeError(
                f"data_format must be 'NHWC' or 'NCHW', got {data_format!r}: the 5th "
                "positional argument is data_format, as in tf.nn.depthwise_conv2d; TF1's "
                f"(tf.compat.v1.nn.depthwise_conv2d's) is rate, given here as rate={data_format!r}")
        dilations = _dilations(dilations, rate)
        strides = _strides(strides)
        data_format = arguments.parse_data_format(data_format)
        input, filter = arguments.tf1_operands(input, filter, padding)
        input, filter = arguments.convert_operands(input, filter, arguments.DTYPES)
        input, filter = _with_ranks(input, filter)
        # What only TF's kernel checks, with the class it raises on this host and dtype.
        tf_rules.check_batch_depth("DepthwiseConv2dNative", strides, [1, 1, 1, 1],
                                   data_format, input)
        input, grouped = _grouped_operands(input, filter, data_format)
        if max(dilations) > 1 and any(s != 1 for s in strides):
            warnings.warn("When dilation rate is greater than 1, then all values of strides "
                          f"must be 1. Received: `dilation rate` {dilations} and `strides` "
                          f"{strides} (computed as tf.nn.depthwise_conv2d computes it)",
                          UserWarning, stacklevel=3)  # the caller's line
            return tf.nn.with_space_to_batch(
                input, dilations, padding, filter_shape=tf.shape(filter),
                data_format=data_format, op=lambda x, _, p: conv.convolution(2, x, grouped, strides, p, data_format, 1,
                                                    algorithm, workspace_limit))
        return conv.convolution(2, input, grouped, strides, padding, data_format, dilations,
                                algorithm, workspace_limit)


def _dilations(dilations, rate):
    """[height, width] from dilations or TF1's rate (None: 1, 1)."""
    if rate is not None and dilations is not None:
        raise ValueError("Cannot specify both 'rate' and 'dilations'.")  # TF's words
    name, value = ("rate", rate) if rate is not None else ("dilations", dilations)
    if value is None:
        return [1, 1]
    if not isinstance(value, (list, tuple, np.ndarray)):
        raise TypeError(f"{name} must be a list of 2 ints [height, width], got {value!r}")
    values = list(np.asarray(value).ravel()) if isinstance(value, np.ndarray) else list(value)
    if (len(values) != 2 or not all(isinstance(v, numbers.Integral) for v in values)
            or min(values) < 1):
        raise ValueError(f"{name} must be 2 positive ints [height, width], got {value!r}")
    return [int(v) for v in values]


def _strides(strides):
    """strides as tf.nn.depthwise_conv2d takes them: a list of 4 ints."""
    if not isinstance(strides, (list, tuple, np.ndarray)):
        raise TypeError(f"Expected list for 'strides' argument to 'depthwise_conv2d', "
                        f"not {strides!r}: 4 ints in data_format order")
    values = list(np.asarray(strides).ravel()) if isinstance(strides, np.ndarray) else list(strides)
    if len(values) != 4:
        raise arguments.graph_error(f"strides must have 4 elements (data_format order), "
                                    f"got {strides!r}")
    return [arguments.parse_int(v, "strides", minimum=1) for v in values]


def _with_ranks(input, filter):
    """input and filter of rank 4 (a known wrong rank raises as TF's shape function;
    an unknown one is checked when the graph runs)."""
    if filter.shape.rank is not None and filter.shape.rank != 4:
        raise arguments.graph_error(f"filter must be rank 4 {FILTER_LAYOUT}, got shape "
                                    f"{filter.shape}")
    try:
        return arguments.with_ranks(input, filter, 2)
    except ValueError as e:
        raise arguments.graph_error(str(e)) from None


def _grouped_operands(input, filter, data_format):
    """(input, the filter [KH, KW, C, M] as bigconv2d's grouped filter [KH, KW, 1, C*M]),
    C checked against the input's channels (when the graph runs where unknown; the
    input then takes the filter's C as its static depth, which lets the planner
    and algorithm "tf" see a depthwise filter)."""
    axis = 3 if data_format == "NHWC" else 1
    channels = input.shape[axis]
    kh, kw, in_channels, multiplier = filter.shape.as_list()
    if channels is not None and in_channels is not None:
        if channels != in_channels:
            raise arguments.graph_error(
                f"input and filter must have the same depth: {channels} vs {in_channels} "
                f"(filter {FILTER_LAYOUT} of shape {filter.shape}, input channels "
                f"{channels} in {data_format})")
    else:
        check = tf.debugging.assert_equal(
            tf.shape(input)[axis], tf.shape(filter)[2],
            message=f"input and filter must have the same depth (filter {FILTER_LAYOUT}, "
                    f"input in {data_format}): input channels vs filter in_channels")
        with tf.control_dependencies([check]):
            filter, input = tf.identity(filter), tf.identity(input)
        if in_channels is not None:
            shape = input.shape.as_list()
            shape[axis] = in_channels
            input.set_shape(shape)
    if filter.shape.is_fully_defined():
        return input, tf.reshape(filter, [kh, kw, 1, in_channels * multiplier])
    s = tf.shape(filter)
    grouped = tf.reshape(filter, tf.stack([s[0], s[1], 1, s[2] * s[3]]))
    grouped.set_shape([kh, kw, 1, in_channels * multiplier
                       if in_channels is not None and multiplier is not None else None])
    return input, grouped
