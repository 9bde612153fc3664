"""bigconv3d: tf.nn.conv3d's interface (plus groups, explicit padding and NCDHW on the
CPU) on tfbigconv's kernels, whose core is 3-D (a 2-D problem has depth 1)."""
import numbers

import numpy as np
import tensorflow as tf

from tfbigconv import _core, arguments, errors, pure_tf
from tfbigconv._native import ops as native

DATA_FORMATS = ("NDHWC", "NCDHW")


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
      algorithm: "auto" (default: the op picks direct or FFT convolution by the
        planner's estimates when it runs), "direct", "fft" (3-D overlap-save with
        3-D transforms), or "tf" (tf.nn.conv3d, where TensorFlow can run the case:
        on the CPU not grouped and not dilated). Unlike bigconv2d, "auto" does not
        weigh TensorFlow's kernel yet, nor autotune.
      workspace_limit: FFT workspace budget in bytes; 0 means half of the free
        host memory. ResourceExhaustedError, stating the minimum, if nothing fits.

    The ops run on the CPU (a GPU placement runs them on the CPU); under XLA or
    without the compiled library the convolution is tf.nn.conv3d.

    Raises:
      ValueError for the form of an argument; for what the shapes get wrong,
      ValueError while a graph is built and InvalidArgumentError eagerly;
      InvalidArgumentError for `algorithm`, `workspace_limit`, and "tf" where
      TensorFlow cannot run the case.
    """
    with tf.name_scope(name or "bigconv3d"):
        fmt = _data_format(data_format)
        asked = arguments.requested_algorithm(algorithm)
        workspace_limit = arguments.parse_byte_count(workspace_limit, "workspace_limit", 0)
        input = tf.convert_to_tensor(input, name="input")
        if input.dtype not in arguments.DTYPES:
            raise arguments.graph_error(
                f"input dtype must be one of float16, bfloat16, float32 or float64, got "
                f"{input.dtype.name}", TypeError)
        if isinstance(filters, (tf.Tensor, tf.Variable)) and filters.dtype != input.dtype:
            raise arguments.graph_error(
                f"filters dtype {filters.dtype.name} must match input dtype {input.dtype.name}",
                TypeError)
        filters = tf.convert_to_tensor(filters, dtype=input.dtype, name="filters")
        strides = _five(strides, "strides", fmt)
        dilations = _five(1 if dilations is None else dilations, "dilations", fmt)
        pad, explicit = _padding(padding)
        for t, what in ((input, "input"), (filters, "filters")):
            if t.shape.rank is not None and t.shape.rank != 5:
                raise arguments.graph_error(
                    f"{what} must be rank 5, got rank {t.shape.rank}: shape {t.shape}")
        in_shape, f_shape = _static(input.shape), _static(filters.shape)
        groups = None
        if pure_tf.missing_library is None:
            try:
                _core.validate_attrs(strides, pad, explicit, fmt, dilations)
                if in_shape is not None and f_shape is not None:
                    _core.conv_geometry(in_shape, f_shape, strides, pad, explicit, fmt, dilations)
            except ValueError as e:
                raise arguments.graph_error(str(e)) from None
        if in_shape is not None and f_shape is not None:
            groups = in_shape[4 if fmt == "NDHWC" else 1] // max(f_shape[3], 1)
        if asked == "tf" or pure_tf.active():
            if asked == "tf" and (groups != 1 or any(d != 1 for d in dilations)):
                raise errors.invalid_argument(
                    "algorithm 'tf' runs tf.nn.conv3d, whose CPU kernel takes neither groups "
                    f"nor dilations: this case has groups {groups} and dilations {dilations}")
            return tf.nn.conv3d(input, filters, strides, pad if pad != "EXPLICIT" else
                                _pairs(explicit), fmt, dilations)
        return native.big_conv3d(
            input=input, filter=filters, strides=strides, padding=pad,
            explicit_paddings=explicit, data_format=fmt, dilations=dilations,
            algorithm=asked, workspace_limit_bytes=int(workspace_limit))


def _data_format(value):
    if value is None:
        return "NDHWC"
    if not isinstance(value, str) or value.upper() not in DATA_FORMATS:
        raise ValueError(f"data_format must be 'NDHWC' or 'NCDHW', got {value!r}")
    return value.upper()


def _five(value, name, fmt):
    """strides/dilations: an int, or 1, 3 or 5 ints, as 5 in data_format order."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or len(value) not in (1, 3, 5):
        raise ValueError(f"{name} must be an int or a list of 1, 3 or 5 ints, got {value!r}")
    value = arguments.parse_ints(list(value), name)
    if len(value) == 1:
        value = value * 3
    if len(value) == 3:
        return [1, *value, 1] if fmt == "NDHWC" else [1, 1, *value]
    return value


def _padding(padding):
    if isinstance(padding, str):
        if padding.upper() not in ("SAME", "VALID"):
            raise ValueError(f"padding must be 'SAME', 'VALID' or a list of 5 [before, after] "
                             f"pairs, got {padding!r}")
        return padding.upper(), []
    try:
        pairs = [list(p) for p in padding]
    except TypeError:
        pairs = None
    if pairs is None or isinstance(padding, bytes) or len(pairs) != 5 or any(
            len(p) != 2 for p in pairs):
        raise ValueError("padding must be 'SAME', 'VALID' or a list of 5 [before, after] pairs "
                         f"(one per dimension), got {padding!r}")
    return "EXPLICIT", [arguments.parse_int(v, "explicit padding", 0, arguments.INT32_MAX)
                        for p in pairs for v in p]


def _pairs(flat):
    return [flat[i:i + 2] for i in range(0, len(flat), 2)]


def _static(shape):
    return shape.as_list() if shape.rank is not None and shape.is_fully_defined() else None
