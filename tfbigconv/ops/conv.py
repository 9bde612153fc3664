"""One N-d convolution front end: bigconv1d, bigconv2d and bigconv3d are thin faces of
`convolution`, which parses, validates and plans once for 1, 2 and 3 spatial
dimensions (explain reads its arguments as it does: arguments.parse_attrs).

As jax.lax.conv_general_dilated names the layout by dimension numbers, the
data_format names it here ("NWC", "NHWC", "NDHWC" or their channels-first forms);
its length tells the rank. A 1-D convolution runs as a 2-D one of height 1, as
tf.nn.conv1d runs tf.nn.conv2d (arguments.conv1d_as_conv2d), so every rule,
kernel and gradient of 2-D applies to it; our ops' core is 3-D (a 2-D problem has
depth 1). Which of TensorFlow's kernels runs a case, and whether it can, is
planning.tf_rules' decision for every rank, also for a forced algorithm "tf".
"""
import dataclasses
import warnings

import tensorflow as tf

from tfbigconv import _core, arguments, capabilities, errors, host, pure_tf
from tfbigconv.arguments import Algorithm
from tfbigconv.ops import planned
from tfbigconv.planning import planner, tf_rules


@dataclasses.dataclass(frozen=True)
class Rank:
    """What differs between the ranks the faces take."""
    spatial: int        # spatial dimensions, as the caller sees them
    tf_kernel: str      # TensorFlow's convolution the op's rank runs as
    dtypes: tuple       # what the op takes (int32 runs TF's kernel only)


RANKS = {
    1: Rank(1, "Conv2D", arguments.DTYPES + arguments.TF_ONLY_DTYPES),
    2: Rank(2, "Conv2D", arguments.DTYPES + arguments.TF_ONLY_DTYPES),
    3: Rank(3, "Conv3D", arguments.DTYPES),
}


@tf.autograph.experimental.do_not_convert  # plain Python at trace time (planning, autotuning)
def convolution(spatial, input, filters, strides, padding, data_format, dilations,
                algorithm="auto", workspace_limit=0):
    """The convolution of `input` and `filters` with `spatial` dimensions; arguments
    in the forms of tf.nn.conv1d, conv2d or conv3d (the faces' docstrings), operands
    as tf1_operands returned them; strides None is the face's to resolve."""
    rank = RANKS[spatial]
    data_format = arguments.parse_format(spatial, data_format)
    asked = algorithm  # before TFBIGCONV_ALGORITHM, which does not apply to int32
    algorithm = arguments.requested_algorithm(algorithm)
    workspace_limit = arguments.parse_byte_count(workspace_limit, "workspace_limit", 0)
    input = tf.convert_to_tensor(input, name="input")
    if input.shape.rank is not None and input.shape.rank > spatial + 2:
        return with_batch_flattened(input, spatial + 1, lambda x: convolution(
            spatial, x, filters, strides, padding, data_format, dilations, algorithm,
            workspace_limit))
    input, filters = arguments.convert_operands(input, filters, rank.dtypes)
    try:
        input, filters = arguments.with_ranks(input, filters, spatial)
    except ValueError as e:
        raise arguments.graph_error(str(e)) from None
    arguments.check_filter_not_empty(filters.shape, spatial)
    spec = arguments.parse_attrs(spatial, strides, padding, data_format, dilations,
                                 filters.shape[0] if spatial == 1 else None)
    # What only TF's kernel checks, with the class it raises on this host and dtype.
    tf_rules.check_batch_depth(rank.tf_kernel, list(spec.strides), list(spec.dilations),
                               data_format, input)
    spec = spec.replace(algorithm=algorithm, workspace_limit_bytes=int(workspace_limit))
    if spatial == 1:  # [N, W, C] -> [N, 1, W, C]; [N, C, W] -> [N, C, 1, W]; filters [1, K, I, O]
        axis = -3 if data_format == "NHWC" else -2
        y = _convolve(RANKS[2], tf.expand_dims(input, axis), tf.expand_dims(filters, 0), spec,
                      asked)
        return tf.squeeze(y, [axis])
    return _convolve(rank, input, filters, spec, asked)


def _convolve(rank, input, filters, spec, asked):
    """The op's convolution (2-D or 3-D) of operands of its rank, arguments parsed
    (spec: the ConvSpec, without its operands)."""
    in_shape, f_shape = planner.static_shape(input.shape), planner.static_shape(filters.shape)
    geometry_args = spec.geometry_args()
    algorithm, workspace_limit = spec.algorithm, spec.workspace_limit_bytes
    try:
        if pure_tf.missing_library is None:
            _core.validate_attrs(*geometry_args)
        if in_shape is not None and f_shape is not None:
            if pure_tf.missing_library is None:
                _core.conv_geometry(in_shape, f_shape, *geometry_args)
            else:
                pure_tf.check_geometry(in_shape, f_shape, *geometry_args)
    except ValueError as e:
        raise arguments.graph_error(str(e)) from None
    spec = spec.with_operands(input.shape, filters.shape)
    if input.dtype in arguments.TF_ONLY_DTYPES:
        if asked not in (Algorithm.AUTO, Algorithm.TF, "im2col"):
            raise errors.invalid_argument(
                f"algorithm {asked!r} does not run {input.dtype.name}: only "
                f"TensorFlow's kernel does (algorithm 'auto' or 'tf')")
        return tf.raw_ops.Conv2D(input=input, filter=filters, **spec.tf_attrs())
    why = pure_tf.active()  # under XLA, or without the compiled library
    if why:
        run = pure_tf.conv3d if rank.spatial == 3 else pure_tf.conv2d
        return run(input, filters, *geometry_args, algorithm.value, workspace_limit, why=why)
    if algorithm != Algorithm.TF and capabilities.unregistered(rank.spatial):
        _warn_if_elsewhere(capabilities.of(rank.spatial, host.resolve_device(input)))
    plan_in = planner.planning_shape(input.shape)
    static = plan_in is not None and f_shape is not None
    device = None  # where the op runs: resolved for planning, and TF's kernel follows it
    if static and algorithm in (Algorithm.TF, Algorithm.AUTO):
        device = planner.planning_device(spec, host.resolve_device(input))
    return planned.forward(input, filters, plan_in if static else None, spec, device)


def with_batch_flattened(x, inner_rank, conv):
    """An input with batch dimensions (batch_shape + inner_rank dimensions) as TF's
    squeeze_batch_dims runs it: conv on one batch of prod(batch_shape), the output
    with batch_shape again."""
    outer, shape = x.shape[:-inner_rank], tf.shape(x)
    count = (outer.num_elements() if outer.is_fully_defined()
             else tf.reduce_prod(shape[:-inner_rank]))
    y = conv(tf.reshape(x, tf.concat([[count], shape[-inner_rank:]], axis=0)))
    out = tf.reshape(y, tf.concat([shape[:-inner_rank], tf.shape(y)[1:]], axis=0))
    out.set_shape(outer.concatenate(y.shape[1:]))
    return out


_warned = []


def _warn_if_elsewhere(where):
    """Where our op of the rank is not registered on the device (capabilities), said
    once per process: a GPU user would not expect the CPU."""
    if not where.registered and not _warned:
        _warned.append(True)
        warnings.warn(f"tfbigconv: bigconv{where.rank}d runs on the {where.runs_on}: its ops have "
                      f"no {where.device} kernels yet. algorithm='tf' runs "
                      f"tf.nn.conv{where.rank}d, which runs on the {where.device}.",
                      RuntimeWarning, stacklevel=5)
