"""bigconv1d: tf.nn.conv1d's interface (plus Keras' CAUSAL padding) on tfbigconv's kernels.

As tf.nn.conv1d does, it runs the 2-D convolution with a height of 1 (bigconv2d), so
every planner rule, kernel, gradient and the XLA path apply unchanged. The FFT kernel
plans such a problem with FFTs of height 1, i.e. 1-D transforms (explain shows
"fft 1xN").
"""
import numbers

import numpy as np
import tensorflow as tf

from tfbigconv import arguments
from tfbigconv.ops.conv2d import bigconv2d

# 1-D data formats and the 2-D format each runs as (tf.nn.conv1d also takes the 2-D names).
DATA_FORMATS = {"NWC": "NHWC", "NHWC": "NHWC", "NCW": "NCHW", "NCHW": "NCHW"}


@tf.autograph.experimental.do_not_convert
def bigconv1d(input, filters, stride, padding, data_format="NWC", dilations=None, name=None,
              *, algorithm="auto", workspace_limit=0):
    """Computes a 1-D convolution like `tf.nn.conv1d`, without im2col.

    Arguments and semantics are tf.nn.conv1d's: `input` is [batch, width, channels]
    ("NWC", the default, also for None) or [batch, channels, width] ("NCW"), or
    batch_shape + those 2 dimensions; `filters` is [width, in_channels / groups,
    out_channels], where groups = input channels / filter in_channels (grouped and
    depthwise convolution: a filter [K, 1, C * multiplier] on C channels is depthwise).
    `stride` and `dilations` are an int or a list of 1 or 3 ints (data_format order,
    1 in the batch and channel entries).

    `padding` is "SAME", "VALID", "CAUSAL" (Keras Conv1D's: (width - 1) * dilation
    zeros before the sequence and none after, so output t sees inputs up to t) or an
    explicit list of 3 [before, after] pairs in data_format order (zeros in the batch
    and channel pairs).

    `algorithm` and `workspace_limit` are bigconv2d's, which runs the convolution with a
    height of 1 (as tf.nn.conv1d runs tf.nn.conv2d): the same dtypes, gradients of any
    order, planner ("auto" weighs TensorFlow's kernel for the case: Conv2D, or
    DepthwiseConv2dNative for depthwise filters), XLA path and errors.

    Raises:
      tf.nn.conv1d's exceptions (ValueError for the form of an argument, as bigconv2d
      for the rest); ValueError for CAUSAL padding with a filter width unknown when the
      op is built.
    """
    with tf.name_scope(name or "bigconv1d"):
        fmt = _data_format(data_format)
        channels_last = fmt == "NHWC"
        input = tf.convert_to_tensor(input, name="input")
        if input.shape.rank is not None and input.shape.rank < 3:
            raise arguments.graph_error(
                f"input must be rank 3 (or more, with batch dimensions first), got rank "
                f"{input.shape.rank}: shape {input.shape}")
        if not isinstance(filters, (tf.Tensor, tf.Variable)) or filters.dtype == input.dtype:
            filters = tf.convert_to_tensor(filters, dtype=input.dtype, name="filters")
        if filters.shape.rank is not None and filters.shape.rank != 3:
            raise arguments.graph_error(
                f"filters must be rank 3 [width, in_channels, out_channels], got rank "
                f"{filters.shape.rank}: shape {filters.shape}")
        strides = _expand(stride, "stride", channels_last)
        dils = _expand(1 if dilations is None else dilations, "dilations", channels_last)
        padding = _padding(padding, filters, dils, channels_last)
        # [N, W, C] -> [N, 1, W, C]; [N, C, W] -> [N, C, 1, W]; filters [1, K, I, O].
        spatial = -3 if channels_last else -2
        y = bigconv2d(tf.expand_dims(input, spatial), tf.expand_dims(filters, 0), strides,
                      padding, fmt, dils, algorithm=algorithm, workspace_limit=workspace_limit)
        return tf.squeeze(y, [spatial])


def _data_format(value):
    if value is None:
        return "NHWC"
    if not isinstance(value, str) or value.upper() not in DATA_FORMATS:
        raise ValueError(f"data_format must be 'NWC' or 'NCW', got {value!r}")
    return DATA_FORMATS[value.upper()]


def _expand(value, name, channels_last):
    """A 1-D stride or dilation (int, or 1 or 3 ints in data_format order) as bigconv2d's
    4 ints, height 1."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or len(value) not in (1, 3):
        raise ValueError(f"{name} must be an int or a list of 1 or 3 ints, got {value!r}")
    value = arguments.parse_ints(list(value), name)
    if len(value) == 1:
        return [1, 1, value[0], 1] if channels_last else [1, 1, 1, value[0]]
    n, w, c = value if channels_last else (value[0], value[2], value[1])
    if (n, c) != (1, 1) and all(v > 0 for v in value):
        cls = tf.errors.UnimplementedError if name == "stride" else tf.errors.InvalidArgumentError
        raise cls(None, None, f"Current implementation does not yet support {name} in the "
                  f"batch and depth dimensions: {name} must be 1 there, got {value}")
    return [n, 1, w, c] if channels_last else [n, c, 1, w]


def _padding(padding, filters, dilations, channels_last):
    """"SAME", "VALID", or bigconv2d's 4 explicit pairs (CAUSAL and 3 pairs)."""
    if isinstance(padding, str):
        if padding.upper() != "CAUSAL":
            return padding  # bigconv2d checks the name
        width = filters.shape[0] if filters.shape.rank == 3 else None
        if width is None:
            raise ValueError("CAUSAL padding needs the filter width when the op is built; "
                             f"filters has shape {filters.shape}")
        dilation = dilations[2] if channels_last else dilations[3]
        pair = [(width - 1) * dilation, 0]
    else:
        try:
            pairs = [list(p) for p in padding]
        except TypeError:
            pairs = None
        if pairs is None or isinstance(padding, bytes) or len(pairs) != 3 or any(
                len(p) != 2 for p in pairs):
            raise ValueError("padding must be 'SAME', 'VALID', 'CAUSAL' or a list of 3 "
                             f"[before, after] pairs (one per dimension), got {padding!r}")
        # bigconv2d checks the batch and channel pairs (zeros), with height [0, 0] added.
        return [pairs[0], [0, 0]] + pairs[1:] if channels_last else pairs[:2] + [[0, 0], pairs[2]]
    none = [0, 0]
    return [none, none, pair, none] if channels_last else [none, none, none, pair]
