"""The trace-time dispatcher: per pass, im2col (TensorFlow's own conv2d), direct or fft.

The estimates and the choice come from the planner in C++ (plan.cc, through
_core.plan_pass), so that they are the ones the ops use at run time. This
module adds what only Python knows: which cases TensorFlow's kernels support,
the TFBIGCONV_ALGORITHM override, and TF's thread count.
"""
import os

import tensorflow as tf
from absl import logging

from tfbigconv import _core

ALGORITHMS = ("auto", "im2col", "direct", "fft")
PASSES = ("forward", "backprop_input", "backprop_filter")
ENV_ALGORITHM = "TFBIGCONV_ALGORITHM"


def invalid_argument(message):
    return tf.errors.InvalidArgumentError(None, None, message)


def requested_algorithm(algorithm):
    """`algorithm`, unless TFBIGCONV_ALGORITHM forces another (for debugging)."""
    forced = os.environ.get(ENV_ALGORITHM)
    if forced:
        if forced not in ALGORITHMS:
            raise invalid_argument(f"{ENV_ALGORITHM} must be one of {ALGORITHMS}, got {forced!r}")
        return forced
    if algorithm not in ALGORITHMS:
        raise invalid_argument(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    return algorithm


def im2col_unsupported(pass_, geometry, data_format):
    """Why TensorFlow's CPU kernels cannot run this pass, or "" if they can.

    Conservative: true with oneDNN on (TF's default) and off. Without oneDNN,
    Conv2D runs only NHWC on CPU, and its backprops reject groups and dilations.
    With oneDNN, TF 2.21's Conv2D returns an input-shaped result for empty
    inputs, and rejects empty filters.
    """
    sizes = ("batch", "in_h", "in_w", "in_c", "filter_h", "filter_w", "out_c")
    if any(geometry[k] == 0 for k in sizes):
        return "TensorFlow's CPU Conv2D mishandles empty tensors"
    if data_format != "NHWC":
        return "TensorFlow's CPU Conv2D runs only NHWC"
    if pass_ != "forward" and geometry["groups"] > 1:
        return "TensorFlow's CPU gradients reject grouped convolution"
    if pass_ != "forward" and (geometry["dilation_h"] > 1 or geometry["dilation_w"] > 1):
        return "TensorFlow's CPU gradients reject dilations"
    return ""


def workers():
    """The worker count of the ops' ParallelFor: TF's intra-op threads + 1 (the caller)."""
    threads = tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count() or 1
    return threads + 1


def plan(pass_, input_shape, filter_shape, attrs, dtype, algorithm, workspace_limit):
    """The planner's table and choice for one pass (a dict; see _core.plan_pass).

    attrs: strides, padding, explicit_paddings, data_format, dilations as the
    op takes them. Raises InvalidArgumentError for bad arguments and
    ResourceExhaustedError when nothing requested fits the workspace limit.
    """
    args = (list(input_shape), list(filter_shape), attrs["strides"], attrs["padding"],
            attrs["explicit_paddings"], attrs["data_format"], attrs["dilations"])
    try:
        geometry = _core.conv_geometry(*args)
    except ValueError as e:
        raise invalid_argument(str(e)) from None
    why_not = im2col_unsupported(pass_, geometry, attrs["data_format"])
    try:
        p = _core.plan_pass(*args, pass_, dtype, algorithm, workspace_limit, workers(),
                            not why_not)
    except ValueError as e:
        raise invalid_argument(str(e)) from None
    except RuntimeError as e:
        raise tf.errors.ResourceExhaustedError(None, None, str(e)) from None
    if why_not:
        p["im2col"]["note"] = why_not
    p["geometry"] = geometry
    return p


def log_choice(op_name, p):
    logging.vlog(1, "%s %s: %s (%s)", op_name, p["pass"], p["chosen"], p["reason"])
