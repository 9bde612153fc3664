"""bigconv3d: tf.nn.conv3d's interface (plus groups, explicit padding and NCDHW on the
CPU) on tfbigconv's kernels, whose core is 3-D (a 2-D problem has depth 1)."""
import warnings

import tensorflow as tf

from tfbigconv import _core, arguments, errors, host, pure_tf
from tfbigconv._native import ops as native
from tfbigconv.ops import planned
from tfbigconv.ops.conv2d import with_batch_flattened
from tfbigconv.planning import planner, tf_rules


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
        (tf.nn.conv3d, where TensorFlow can run the case: on the CPU not grouped,
        and, without oneDNN, not dilated).
      workspace_limit: FFT workspace budget in bytes; 0 means half of the free
        host memory. ResourceExhaustedError, stating the minimum, if nothing fits.

    The ops run on the CPU (where the op would run on a GPU, they run on the CPU and
    a RuntimeWarning says so once per process). Under XLA or without the compiled
    library it is composed of TensorFlow ops (tfbigconv/pure_tf.py): an FFT for large
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
        fmt = arguments.parse_data_format_3d(data_format)
        asked = arguments.requested_algorithm(algorithm)
        workspace_limit = arguments.parse_byte_count(workspace_limit, "workspace_limit", 0)
        input = tf.convert_to_tensor(input, name="input")
        if input.shape.rank is not None and input.shape.rank > 5:
            return with_batch_flattened(input, 4, lambda x: bigconv3d(
                x, filters, strides, padding, fmt, dilations, algorithm=asked,
                workspace_limit=workspace_limit))
        input, filters = arguments.convert_operands(input, filters, arguments.DTYPES)
        strides = arguments.parse_strides(strides, "strides", fmt)
        dilations = arguments.parse_strides(1 if dilations is None else dilations, "dilations",
                                            fmt)
        pad, explicit = arguments.parse_padding(padding, dims=5)
        # TF's kernel checks these, with a class that depends on the host and dtype
        tf_rules.check_batch_depth("Conv3D", strides, dilations, fmt, input)
        try:
            input, filters = arguments.with_ranks(input, filters, 3)
        except ValueError as e:
            raise arguments.graph_error(str(e)) from None
        arguments.check_filter_not_empty(filters.shape, 3)
        in_shape, f_shape = planner.static_shape(input.shape), planner.static_shape(filters.shape)
        if pure_tf.missing_library is None:
            try:
                _core.validate_attrs(strides, pad, explicit, fmt, dilations)
                if in_shape is not None and f_shape is not None:
                    _core.conv_geometry(in_shape, f_shape, strides, pad, explicit, fmt, dilations)
            except ValueError as e:
                raise arguments.graph_error(str(e)) from None
        why = pure_tf.active()
        if asked == "tf":
            _check_tf_conv3d(input, filters, fmt, dilations)
        if asked == "tf" or why:
            return pure_tf.conv3d(input, filters, strides, pad, explicit, fmt, dilations, asked,
                                  workspace_limit, why=why or "algorithm 'tf'")
        if host.resolve_device(input) == "GPU":
            _warn_cpu_only()
        a = dict(strides=strides, padding=pad, explicit_paddings=explicit, data_format=fmt,
                 dilations=dilations, algorithm=asked, workspace_limit_bytes=int(workspace_limit))
        plan_in = planner.planning_shape(input.shape)
        if asked == "auto" and plan_in is not None and f_shape is not None:
            # Planned at trace time, as bigconv2d: TF's Conv3D or ours (the ops' CPU).
            chosen = planned.plan_forward(plan_in, f_shape, a, input.dtype, "CPU")["chosen"]
            if chosen == "tf":
                return planned.tf_forward_routed(input, filters, plan_in, f_shape, a, "CPU")
            return native.big_conv3d(input=input, filter=filters, planned_algorithm=chosen, **a)
        return native.big_conv3d(input=input, filter=filters, **a)


_warned = []


def _warn_cpu_only():
    """Said once per process: a GPU user would not expect the CPU."""
    if not _warned:
        _warned.append(True)
        warnings.warn("tfbigconv: bigconv3d runs on the CPU: its ops have no GPU kernels yet. "
                      "algorithm='tf' runs tf.nn.conv3d, which runs on the GPU.",
                      RuntimeWarning, stacklevel=3)


def _check_tf_conv3d(x, w, fmt, dilations):
    """Algorithm "tf" is tf.nn.conv3d: refuse what TF's CPU kernel cannot run, where the
    static channels tell (pure_tf.conv3d then runs it, with TF's gradients)."""
    channels = x.shape[4 if fmt == "NDHWC" else 1] if x.shape.rank == 5 else None
    f_in = w.shape[3] if w.shape.rank == 5 else None
    groups = channels // f_in if channels is not None and f_in else None
    if groups is not None and groups != 1:
        raise errors.invalid_argument(
            f"algorithm 'tf' runs tf.nn.conv3d, whose CPU kernel takes no groups: this case "
            f"has {groups}")
    if any(d != 1 for d in dilations) and not tf_rules.tf_cpu_onednn(
            "Conv3D", x.dtype.name, False):
        raise errors.invalid_argument(
            "algorithm 'tf' runs tf.nn.conv3d, whose CPU kernel (without oneDNN) takes no "
            f"dilations: this case has dilations {dilations}")

