"""bigconv3d: tf.nn.conv3d's interface (plus groups, explicit padding and NCDHW on the
CPU) on tfbigconv's kernels, whose core is 3-D (a 2-D problem has depth 1)."""
import tensorflow as tf

from tfbigconv import arguments
from tfbigconv.ops import conv


@tf.autograph.experimental.do_not_convert
def bigconv3d(input, filters=None, strides=None, padding=None, data_format="NDHWC",
              dilations=None, name=None, *, algorithm="auto", workspace_limit=0, filter=None):
    """Computes a 3-D convolution like `tf.nn.conv3d`, without im2col.

    `input` is 5-D in `data_format` ("NDHWC", the default, also for None, or
    "NCDHW"), or batch_shape + those 4 dimensions (rank 6 or more: the leading
    dimensions run as one batch, as tf.nn.conv3d runs them; an unknown rank is
    checked to be 5 when the graph runs); `filters` is [depth, height, width, in_channels / groups,
    out_channels], where groups = input channels / filter in_channels (grouped and
    depthwise convolution, which TensorFlow's CPU Conv3D refuses); `strides` and
    `dilations` are an int or a list of 1, 3 or 5 ints (5: data_format order, 1 in
    the batch and channel entries); `padding` is "SAME", "VALID" or an explicit list
    of 5 [before, after] pairs in data_format order. Dtypes: float16 and bfloat16
    (accumulated in float32), float32, float64. Gradients of any order. TF1's
    `filter=` (tf.compat.v1.nn.conv3d's) is taken for `filters` (ValueError for
    both, as TF says), and TF1's reference variables as operands.

    Keyword-only:
      algorithm: "auto" (default: the planner picks, per pass, the fastest of
        TensorFlow's Conv3D where its CPU kernel runs the case (not grouped; with
        dilations or NCDHW only where TF runs oneDNN; not in half precision
        without it), "direct" and "fft", as bigconv2d's auto does: with static
        shapes when the op is built, timing the candidates where estimates are
        close (TFBIGCONV_AUTOTUNE), else the op between direct and fft when it
        runs), "direct", "fft" (3-D overlap-save with 3-D transforms), or "tf"
        (TensorFlow's Conv3D and its gradients where TensorFlow can run the case,
        as planning.tf_rules says: on the CPU not grouped, not for an empty batch,
        and, without oneDNN, neither dilated nor NCDHW).
      workspace_limit: FFT workspace budget in bytes; 0 means half of the free
        host memory. ResourceExhaustedError, stating the minimum, if nothing fits.

    The ops run on the CPU (where the op would run on a GPU, they run on the CPU and
    a RuntimeWarning says so once per process). Under XLA or without the compiled
    library it is composed of TensorFlow ops (tfbigconv/pure_tf/): an FFT for large
    filters, else tf.nn.conv3d (outside XLA one per group and dilations by
    space-to-batch, which TF's CPU kernels run with gradients on every host).

    Raises:
      ValueError for the form of an argument; for what the shapes get wrong,
      ValueError while a graph is built and InvalidArgumentError eagerly; for
      strides or dilations in the batch or depth dimension the class TF's Conv3D
      raises on this host (tf_rules.tf_batch_depth_error); InvalidArgumentError
      for `algorithm`, `workspace_limit`, and "tf" where TensorFlow cannot run
      the case.
    """
    with tf.name_scope(name or "bigconv3d"):
        input, filters = arguments.tf1_operands(input, filters, padding, filter=filter)
        return conv.convolution(3, input, filters, strides, padding, data_format,
                                1 if dilations is None else dilations, algorithm,
                                workspace_limit)
