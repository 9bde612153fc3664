"""bigconv3d: tf.nn.conv3d's interface (plus groups, explicit padding and NCDHW on the
CPU) on tfbigconv's kernels, whose core is 3-D (a 2-D problem has depth 1)."""
import warnings

import tensorflow as tf

from tfbigconv import _core, arguments, errors, host, pure_tf
from tfbigconv._native import ops as native
from tfbigconv.ops import planned
from tfbigconv.planning import planner, tf_rules


@tf.autograph.experimental.do_not_convert
def bigconv3d(input, filters, strides, padding, data_format="NDHWC", dilations=None, name=None,
              *, algorithm="auto", workspace_limit=0):
    """Computes a 3-D convolution like `tf.nn.conv3d`, without im2col.

    `input` is 5-D in `data_format` ("NDHWC", the default, also for None, or
    "NCDHW"); `filters` is [depth, height, width, in_channels / groups,
    out_channels], where groups = input channels / filter in_channels (grouped and
    depthwise convolution, which TensorFlow's CPU Conv3D refuses); `strides` and
    `dilations` are an int or a list of 1, 3 or 5 ints (5: data_format order, 1 in
    the batch and channel entries); `padding` is "SAME", "VALID" or an explicit list
    of 5 [before, after] pairs in data_format order. Dtypes: float16 and bfloat16
    (accumulated in float32), float32, float64. Gradients of any order.

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
    a RuntimeWarning says so once per process); under XLA or
    without the compiled library the convolution is tf.nn.conv3d (one per group
    outside XLA, whose CPU kernel has no groups).

    Raises:
      ValueError for the form of an argument; for what the shapes get wrong,
      ValueError while a graph is built and InvalidArgumentError eagerly;
      InvalidArgumentError for `algorithm`, `workspace_limit`, and "tf" where
      TensorFlow cannot run the case.
    """
    with tf.name_scope(name or "bigconv3d"):
        fmt = arguments.parse_data_format_3d(data_format)
        asked = arguments.requested_algorithm(algorithm)
        workspace_limit = arguments.parse_byte_count(workspace_limit, "workspace_limit", 0)
        input, filters = arguments.convert_operands(input, filters, arguments.DTYPES)
        strides = arguments.parse_strides(strides, "strides", fmt)
        dilations = arguments.parse_strides(1 if dilations is None else dilations, "dilations",
                                            fmt)
        pad, explicit = arguments.parse_padding(padding, dims=5)
        for t, what in ((input, "input"), (filters, "filters")):
            if t.shape.rank is not None and t.shape.rank != 5:
                raise arguments.graph_error(
                    f"{what} must be rank 5, got rank {t.shape.rank}: shape {t.shape}")
        in_shape, f_shape = planner.static_shape(input.shape), planner.static_shape(filters.shape)
        if pure_tf.missing_library is None:
            try:
                _core.validate_attrs(strides, pad, explicit, fmt, dilations)
                if in_shape is not None and f_shape is not None:
                    _core.conv_geometry(in_shape, f_shape, strides, pad, explicit, fmt, dilations)
            except ValueError as e:
                raise arguments.graph_error(str(e)) from None
        if asked == "tf" or pure_tf.active():
            return _tf_conv3d(input, filters, strides, pad, explicit, fmt, dilations,
                              check=asked == "tf")
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


def _tf_conv3d(x, w, strides, pad, explicit, fmt, dilations, check):
    """tf.nn.conv3d for algorithm "tf" (check: refuse what TF's CPU kernel cannot run,
    where the static channels tell) and for the pure-TF path: explicit padding becomes
    tf.pad and NCDHW a transpose, which TF's Eigen CPU kernel needs, and outside XLA (whose
    convolution has groups) a grouped filter runs one tf.nn.conv3d per group."""
    channels = x.shape[4 if fmt == "NDHWC" else 1] if x.shape.rank == 5 else None
    f_in = w.shape[3] if w.shape.rank == 5 else None
    groups = channels // f_in if channels is not None and f_in else None
    if check and groups is not None and groups != 1:
        raise errors.invalid_argument(
            f"algorithm 'tf' runs tf.nn.conv3d, whose CPU kernel takes no groups: this case "
            f"has {groups}")
    if check and any(d != 1 for d in dilations) and not tf_rules.tf_cpu_onednn(
            "Conv3D", x.dtype.name, False):
        raise errors.invalid_argument(
            "algorithm 'tf' runs tf.nn.conv3d, whose CPU kernel (without oneDNN) takes no "
            f"dilations: this case has dilations {dilations}")
    if fmt == "NCDHW":
        x = tf.transpose(x, [0, 2, 3, 4, 1])
        strides = [strides[0], *strides[2:], strides[1]]
        dilations = [dilations[0], *dilations[2:], dilations[1]]
        explicit = explicit[:2] + explicit[4:] + explicit[2:4] if explicit else explicit
    if pad == "EXPLICIT":
        x = tf.pad(x, [explicit[i:i + 2] for i in range(0, 10, 2)])
        pad = "VALID"
    x, extra = pure_tf.with_zero_image(x)  # oneDNN's Conv3D, as its Conv2D
    if groups is not None and groups > 1 and not pure_tf.in_xla():
        # TF's CPU Conv3D has no groups (XLA's convolution has): one call per group.
        xs, ws = tf.split(x, groups, axis=4), tf.split(w, groups, axis=4)
        y = tf.concat([tf.nn.conv3d(a, b, strides, pad, "NDHWC", dilations)
                       for a, b in zip(xs, ws)], axis=4)
    else:
        y = tf.nn.conv3d(x, w, strides, pad, "NDHWC", dilations)
    if extra:
        y = y[:-1]
    return tf.transpose(y, [0, 4, 1, 2, 3]) if fmt == "NCDHW" else y

