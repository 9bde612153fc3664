"""bigconv2d: tf.nn.conv2d's interface on tfbigconv's kernels."""
import tensorflow as tf

from tfbigconv import arguments
from tfbigconv.arguments import ALGORITHMS  # noqa: F401  (tfbigconv.ALGORITHMS)
from tfbigconv.ops import conv


@tf.autograph.experimental.do_not_convert  # plain Python at trace time (planning, autotuning)
def bigconv2d(input, filters=None, strides=None, padding=None, data_format="NHWC",
              dilations=None, name=None, *, algorithm="auto", workspace_limit=0, filter=None,
              use_cudnn_on_gpu=None):
    """Computes a 2-D convolution like `tf.nn.conv2d`, without im2col.

    Arguments and semantics are tf.nn.conv2d's: `input` is 4-D in `data_format`
    ("NHWC", the default, also for None, or "NCHW"), or batch_shape + those 3
    dimensions (rank 5 or more: the leading dimensions run as one batch);
    `filters` is [height, width, in_depth / groups, out_depth],
    where groups = input depth / filter in_depth (grouped and depthwise convolution);
    `strides` and `dilations` are an int or a list of 1, 2 or 4 ints; `padding` is
    "SAME", "VALID" or an explicit list of 4 [before, after] pairs in data_format
    order. Works in eager mode and in tf.function, also with unknown shapes (and an
    unknown rank, checked when the graph runs, as TF's kernel checks it). TF1's
    keywords are taken too (tf.compat.v1.nn.conv2d's): `filter=` for `filters`
    (ValueError for both, as TF says), `use_cudnn_on_gpu` (a bool, ignored, as TF's
    CPU kernels ignore it), and strides None for 1; and TF1's reference variables
    (tf.Variable under tf.compat.v1.disable_v2_behavior()) as operands.
    Supported dtypes: float16, bfloat16 (both accumulate in float32), float32, float64;
    int32, which tf.nn.conv2d also takes, runs TensorFlow's own Conv2D.

    Keyword-only:
      algorithm: "auto" (the default) lets the planner pick, per pass
        (forward, backprop_input, backprop_filter) and for the device the op
        will run on (an explicit tf.device, also one around the call that
        traces a tf.function; else a visible GPU, else the CPU), the fastest
        candidate whose workspace fits `workspace_limit`:
        "tf" (TensorFlow's own kernel for the case: Conv2D, or on the CPU
        DepthwiseConv2dNative for depthwise filters, for dilated ones as
        tf.nn.depthwise_conv2d runs them (SpaceToBatchND around the undilated
        kernel; the forward pass from a dilated side of 15); on the GPU these run as
        grouped Conv2D, which is cuDNN in every dtype; best for small filters),
        "direct" (the tiled direct convolution) or "fft" (overlap-save FFT
        convolution, tiled and chunked to fit). Where estimates are close or
        not to be trusted, the candidates are timed once and the result is
        cached (docs/planner.md, section 5; TFBIGCONV_AUTOTUNE=0 turns it off).
        With static shapes the choice is made when the op is built (see
        `tfbigconv.explain`); an unknown batch dimension (Keras' usual None)
        is planned as a batch of 32 images; with other dimensions unknown, the
        op chooses between direct and fft at run time. In float16 and
        bfloat16, auto never picks a TF CPU kernel that accumulates in half
        precision. Forcing "tf" gives TensorFlow's kernels and gradients
        ("im2col" is its earlier name), but for one that crashed TF 2.21 (its
        oneDNN bfloat16 grouped filter gradient with dilations), which raises
        InvalidArgumentError when the gradient is built. The environment variable
        TFBIGCONV_ALGORITHM overrides this argument (for debugging).
      workspace_limit: workspace budget in bytes; 0 means half of the free
        host memory (cgroup-aware) on the CPU, and a share of what
        TensorFlow's GPU allocator has left on the GPU. If nothing requested
        fits, raises ResourceExhaustedError stating the minimum needed.

    Gradients of any order are registered (BigConv2DBackpropInput and
    BigConv2DBackpropFilter, each pass planned on its own).

    Raises:
      tf.nn.conv2d's exception for each bad argument, with a message naming it:
      ValueError for the form of an argument (a padding list of the wrong
      shape); for what TensorFlow's shape function checks (ranks, depths,
      attribute values), ValueError while a graph is built (tf.function,
      tf.Graph) and tf.errors.InvalidArgumentError eagerly (TypeError and
      InvalidArgumentError for dtypes); for strides or dilations in the batch or
      depth dimension the class TF's Conv2D raises on this host for the dtype
      (tf_rules.tf_batch_depth_error: strides UnimplementedError; dilations
      InvalidArgumentError where oneDNN runs it, else UnimplementedError);
      InvalidArgumentError for a filter of zero height, width or in_depth (an
      out_depth of 0 gives an empty output), and for `algorithm` and
      `workspace_limit`.
    """
    with tf.name_scope(name or "bigconv2d"):
        input, filters = arguments.tf1_operands(input, filters, padding, use_cudnn_on_gpu,
                                                filter=filter)
        # strides None: 1, as tf.nn.conv2d (TF1's and TF2's) reads it
        return conv.convolution(2, input, filters, 1 if strides is None else strides, padding,
                                data_format, 1 if dilations is None else dilations, algorithm,
                                workspace_limit)
