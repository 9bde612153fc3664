"""bigconv1d: tf.nn.conv1d's interface (plus Keras' CAUSAL padding) on tfbigconv's kernels.

As tf.nn.conv1d does, it runs the 2-D convolution with a height of 1 (ops/conv.py), so
every planner rule, kernel, gradient and the XLA path apply unchanged. The FFT kernel
plans such a problem with FFTs of height 1, i.e. 1-D transforms (explain shows
"fft 1xN").
"""
import tensorflow as tf

from tfbigconv import arguments
from tfbigconv.ops import conv


@tf.autograph.experimental.do_not_convert
def bigconv1d(input=None, filters=None, stride=None, padding=None, data_format="NWC",
              dilations=None, name=None, *, algorithm="auto", workspace_limit=0, value=None,
              use_cudnn_on_gpu=None):
    """Computes a 1-D convolution like `tf.nn.conv1d`, without im2col.

    Arguments and semantics are tf.nn.conv1d's: `input` is [batch, width, channels]
    ("NWC", the default, also for None) or [batch, channels, width] ("NCW"), or
    batch_shape + those 2 dimensions; `filters` is [width, in_channels / groups,
    out_channels], where groups = input channels / filter in_channels (grouped and
    depthwise convolution: a filter [K, 1, C * multiplier] on C channels is depthwise).
    `stride` and `dilations` are an int or a list of 1 or 3 ints (data_format order,
    1 in the batch and channel entries). An unknown rank is checked to be 3 when the
    graph runs, as TF's kernel checks it. TF1's keywords are taken too
    (tf.compat.v1.nn.conv1d's): `value=` for `input` (ValueError for both, as TF
    says), `use_cudnn_on_gpu` (a bool, ignored, as TF's CPU kernels ignore it), and
    stride None for 1; and TF1's reference variables as operands.

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
        input, filters = arguments.tf1_operands(input, filters, padding, use_cudnn_on_gpu,
                                                value=value)
        # stride None: 1, as tf.nn.conv1d (TF1's and TF2's) reads it
        return conv.convolution(1, input, filters, 1 if stride is None else stride, padding,
                                data_format, dilations, algorithm, workspace_limit)
