"""bigconv1d: tf.nn.conv1d's interface (plus Keras' CAUSAL padding) on tfbigconv's kernels.

As tf.nn.conv1d does, it runs the 2-D convolution with a height of 1 (bigconv2d), so
every planner rule, kernel, gradient and the XLA path apply unchanged. The FFT kernel
plans such a problem with FFTs of height 1, i.e. 1-D transforms (explain shows
"fft 1xN").
"""
import tensorflow as tf

from tfbigconv import arguments
from tfbigconv.ops.conv2d import bigconv2d


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
        fmt = arguments.conv1d_data_format(data_format)
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
        width = filters.shape[0] if filters.shape.rank == 3 else None
        strides, padding, dils = arguments.conv1d_as_conv2d(stride, padding, fmt, dilations,
                                                            width)
        # [N, W, C] -> [N, 1, W, C]; [N, C, W] -> [N, C, 1, W]; filters [1, K, I, O].
        spatial = -3 if fmt == "NHWC" else -2
        y = bigconv2d(tf.expand_dims(input, spatial), tf.expand_dims(filters, 0), strides,
                      padding, fmt, dils, algorithm=algorithm, workspace_limit=workspace_limit)
        return tf.squeeze(y, [spatial])
