"""bigconv2d: tf.nn.conv2d's interface on tfbigconv's kernels."""
import tensorflow as tf

from tfbigconv import _core, arguments, errors, host, kernels
from tfbigconv._native import ops as native
from tfbigconv.arguments import ALGORITHMS  # noqa: F401  (tfbigconv.ALGORITHMS)
from tfbigconv import pure_tf
from tfbigconv.ops import planned
from tfbigconv.planning import planner, tf_rules


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
        data_format = arguments.parse_data_format(data_format)
        asked = algorithm  # before TFBIGCONV_ALGORITHM, which does not apply to int32
        algorithm = arguments.requested_algorithm(algorithm)
        workspace_limit = arguments.parse_byte_count(workspace_limit, "workspace_limit", 0)
        input = tf.convert_to_tensor(input, name="input")
        if input.shape.rank is not None and input.shape.rank > 4:
            return with_batch_flattened(input, 3, lambda x: bigconv2d(
                x, filters, strides, padding, data_format, dilations,
                algorithm=algorithm, workspace_limit=workspace_limit))
        input, filters = arguments.convert_operands(
            input, filters, arguments.DTYPES + arguments.TF_ONLY_DTYPES)
        # None: 1, as tf.nn.conv2d (TF1's and TF2's) reads it
        strides = arguments.parse_strides(1 if strides is None else strides, "strides",
                                          data_format)
        dilations = arguments.parse_strides(1 if dilations is None else dilations, "dilations",
                                            data_format)
        pad, explicit = arguments.parse_padding(padding)
        _check_kernel_limits(strides, dilations, data_format, input, filters.shape)
        pure = pure_tf.active()  # under XLA, or without the compiled library
        try:
            if pure_tf.missing_library is None:
                _core.validate_attrs(strides, pad, explicit, data_format, dilations)
            input, filters = arguments.with_ranks(input, filters, 2)
            in_shape = planner.static_shape(input.shape)
            f_shape = planner.static_shape(filters.shape)
            if in_shape is not None and f_shape is not None:
                if pure_tf.missing_library is None:
                    _core.conv_geometry(in_shape, f_shape, strides, pad, explicit, data_format,
                                        dilations)
                else:
                    pure_tf.check_geometry(in_shape, f_shape, strides, pad, explicit,
                                           data_format, dilations)
        except ValueError as e:
            raise arguments.graph_error(str(e)) from None
        a = dict(strides=strides, padding=pad, explicit_paddings=explicit,
                 data_format=data_format, dilations=dilations, algorithm=algorithm,
                 workspace_limit_bytes=int(workspace_limit))
        if input.dtype in arguments.TF_ONLY_DTYPES:
            if asked not in ("auto", "tf", "im2col"):
                raise errors.invalid_argument(
                    f"algorithm {asked!r} does not run {input.dtype.name}: only "
                    f"TensorFlow's kernel does (algorithm 'auto' or 'tf')")
            return tf.raw_ops.Conv2D(input=input, filter=filters, **kernels.tf_attrs(a))
        if pure:
            return pure_tf.conv2d(input, filters, strides, pad, explicit, data_format, dilations,
                                  algorithm, workspace_limit, why=pure)
        plan_in = planner.planning_shape(input.shape)
        static = plan_in is not None and f_shape is not None
        device = None  # where the op runs: resolved for planning, and TF's kernel follows it
        if static and algorithm in ("tf", "auto"):
            device = host.resolve_device(input)
        if algorithm == "tf":
            if static:  # raises, saying why, where TensorFlow cannot run the case
                planned.plan_forward(plan_in, f_shape, a, input.dtype, device)
            return planned.tf_forward_routed(input, filters, plan_in, filters.shape, a, device)
        if algorithm == "auto" and static:
            chosen = planned.plan_forward(plan_in, f_shape, a, input.dtype, device)["chosen"]
            if chosen == "tf":
                return planned.tf_forward_routed(input, filters, plan_in, f_shape, a, device)
            return native.big_conv2d(input=input, filter=filters, planned_algorithm=chosen, **a)
        return native.big_conv2d(input=input, filter=filters, **a)


def _check_kernel_limits(strides, dilations, data_format, input, filter_shape):
    """What only TF's kernel checks, with its exception class: for strides and
    dilations in the batch or depth dimension the one TF's Conv2D raises where
    `input` would run it (tf_rules.check_batch_depth: it depends on the host
    and dtype); for the filter InvalidArgumentError."""
    tf_rules.check_batch_depth("Conv2D", strides, dilations, data_format, input)
    arguments.check_filter_not_empty(filter_shape, 2)


def with_batch_flattened(x, inner_rank, conv):
    """An input with batch dimensions (batch_shape + inner_rank dimensions: 3 for
    tf.nn.conv2d (and conv1d, run as it), 4 for tf.nn.conv3d) as TF's
    squeeze_batch_dims runs it: conv on one batch of prod(batch_shape), the output
    with batch_shape again."""
    outer, shape = x.shape[:-inner_rank], tf.shape(x)
    count = (outer.num_elements() if outer.is_fully_defined()
             else tf.reduce_prod(shape[:-inner_rank]))
    y = conv(tf.reshape(x, tf.concat([[count], shape[-inner_rank:]], axis=0)))
    out = tf.reshape(y, tf.concat([shape[:-inner_rank], tf.shape(y)[1:]], axis=0))
    out.set_shape(outer.concatenate(y.shape[1:]))
    return out
