"""bigconv2d: tf.nn.conv2d's interface on tfbigconv's kernels."""
import numbers

import tensorflow as tf

from tfbigconv import _core, dispatch
from tfbigconv._ops import ops as _ops
from tfbigconv.dispatch import ALGORITHMS, invalid_argument as _invalid

DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
# The attributes TensorFlow's own Conv2D ops share with ours, and all of ours.
_TF_ATTRS = ("strides", "padding", "explicit_paddings", "data_format", "dilations")
_ATTRS = _TF_ATTRS + ("algorithm", "workspace_limit_bytes")


def _data_format(value):
    if not isinstance(value, str) or value.upper() not in ("NHWC", "NCHW"):
        raise _invalid(f"data_format must be 'NHWC' or 'NCHW', got {value!r}")
    return value.upper()


def _expand(value, name, data_format):
    """strides/dilations in tf.nn.conv2d's forms -> 4 ints in data_format order."""
    if value is None:
        return [1, 1, 1, 1]
    if isinstance(value, numbers.Integral):
        value = [int(value)]
    try:
        value = [int(v) for v in value]
    except (TypeError, ValueError):
        raise _invalid(f"{name} must be an int or a list of 1, 2 or 4 ints, got {value!r}")
    if len(value) == 1:
        value = value * 2
    if len(value) == 2:
        h, w = value
        return [1, h, w, 1] if data_format == "NHWC" else [1, 1, h, w]
    if len(value) == 4:
        return value
    raise _invalid(f"{name} must be an int or a list of 1, 2 or 4 ints, got {value!r}")


def _padding(padding):
    """'SAME' / 'VALID' / [[before, after]] * 4 -> (padding attr, explicit_paddings)."""
    if isinstance(padding, str):
        return padding.upper(), []
    try:
        pairs = [list(p) for p in padding]
        flat = [int(x) for p in pairs for x in p]
    except (TypeError, ValueError):
        raise _invalid(
            f"padding must be 'SAME', 'VALID' or a list of 4 [before, after] pairs, got {padding!r}")
    if len(pairs) != 4 or any(len(p) != 2 for p in pairs):
        raise _invalid(
            f"explicit padding must be a list of 4 [before, after] pairs (one per dimension), "
            f"got {padding!r}")
    return "EXPLICIT", flat


def _static_shape(t):
    shape = t.shape
    if shape.rank is None or any(d is None for d in shape.as_list()):
        return None
    return shape.as_list()


def bigconv2d(input, filters, strides, padding, data_format="NHWC", dilations=None, name=None,
              *, algorithm="auto", workspace_limit=0):
    """Computes a 2-D convolution like `tf.nn.conv2d`, without im2col.

    Arguments and semantics are tf.nn.conv2d's: `input` is 4-D in `data_format`
    ("NHWC" or "NCHW"); `filters` is [height, width, in_depth / groups, out_depth],
    where groups = input depth / filter in_depth (grouped and depthwise convolution);
    `strides` and `dilations` are an int or a list of 1, 2 or 4 ints; `padding` is
    "SAME", "VALID" or an explicit list of 4 [before, after] pairs in data_format
    order. Works in eager mode and in tf.function, also with unknown shapes.
    Supported dtypes: float16, bfloat16 (both accumulate in float32), float32, float64.

    Keyword-only:
      algorithm: "auto" (the default) lets the planner pick, per pass
        (forward, backprop_input, backprop_filter), the algorithm with the
        smallest estimated time whose workspace fits `workspace_limit`:
        "im2col" (tf.nn.conv2d itself, best for small filters), "direct" (the
        tiled direct convolution, about 1 MiB of scratch per thread) or
        "fft" (overlap-save FFT convolution, tiled and chunked to fit). With
        static shapes the choice is made when the op is built (see
        `tfbigconv.explain`); with unknown shapes the op chooses between
        direct and fft at run time. Forcing "im2col" gives tf.nn.conv2d and
        its gradients. The environment variable TFBIGCONV_ALGORITHM
        overrides this argument (for debugging).
      workspace_limit: workspace budget in bytes; 0 means half of the free
        host memory (cgroup-aware). If nothing requested fits, raises
        ResourceExhaustedError stating the minimum needed.

    Gradients of any order are registered (BigConv2DBackpropInput and
    BigConv2DBackpropFilter, with the same algorithm and workspace limit).

    Raises:
      tf.errors.InvalidArgumentError naming the bad argument.
    """
    with tf.name_scope(name or "bigconv2d"):
        data_format = _data_format(data_format)
        algorithm = dispatch.requested_algorithm(algorithm)
        if not isinstance(workspace_limit, numbers.Integral) or workspace_limit < 0:
            raise _invalid(f"workspace_limit must be a non-negative int, got {workspace_limit!r}")
        input = tf.convert_to_tensor(input, name="input")
        if input.dtype not in DTYPES:
            raise _invalid(
                f"input dtype must be one of float16, bfloat16, float32, float64, got {input.dtype.name}")
        if isinstance(filters, (tf.Tensor, tf.Variable)) and filters.dtype != input.dtype:
            raise _invalid(
                f"filters dtype {filters.dtype.name} must match input dtype {input.dtype.name}")
        filters = tf.convert_to_tensor(filters, dtype=input.dtype, name="filters")
        strides = _expand(strides, "strides", data_format)
        dilations = _expand(dilations, "dilations", data_format)
        pad, explicit = _padding(padding)
        try:
            _core.validate_attrs(strides, pad, explicit, data_format, dilations)
            for t, what in ((input, "input"), (filters, "filters")):
                if t.shape.rank is not None and t.shape.rank != 4:
                    raise ValueError(f"{what} must be rank 4, got rank {t.shape.rank}: shape {t.shape}")
            in_shape, f_shape = _static_shape(input), _static_shape(filters)
            if in_shape is not None and f_shape is not None:
                _core.conv_geometry(in_shape, f_shape, strides, pad, explicit, data_format, dilations)
        except ValueError as e:
            raise _invalid(str(e)) from None
        a = dict(strides=strides, padding=pad, explicit_paddings=explicit,
                 data_format=data_format, dilations=dilations, algorithm=algorithm,
                 workspace_limit_bytes=int(workspace_limit))
        if algorithm == "im2col":
            return _tf_conv2d(input, filters, a)
        if algorithm == "auto" and in_shape is not None and f_shape is not None:
            p = _plan("forward", in_shape, f_shape, a, input.dtype)
            if p["chosen"] == "im2col":
                return _im2col_forward(input, filters, in_shape, f_shape, a)
        return _ops.big_conv2d(input=input, filter=filters, **a)


def _op_attrs(a):
    return {k: a[k] for k in _TF_ATTRS}


def _tf_conv2d(x, w, a):
    return tf.raw_ops.Conv2D(input=x, filter=w, **_op_attrs(a))


def _plan(pass_, in_shape, f_shape, a, dtype):
    p = dispatch.plan(pass_, in_shape, f_shape, _op_attrs(a), dtype.name, a["algorithm"],
                      a["workspace_limit_bytes"])
    dispatch.log_choice("bigconv2d", p)
    return p


def _im2col_forward(x, w, in_shape, f_shape, a):
    """tf.nn.conv2d forward, with each gradient pass planned on its own."""
    bpi, bpf = (_plan(p, in_shape, f_shape, a, x.dtype)["chosen"] for p in dispatch.PASSES[1:])
    if bpi == bpf == "im2col":
        return _tf_conv2d(x, w, a)  # TF's own gradients

    @tf.custom_gradient
    def conv(x, w):
        def grad(dy):
            return (_backprop_input(tf.shape(x), w, dy, a, bpi),
                    _backprop_filter(x, tf.shape(w), dy, a, bpf))
        return _tf_conv2d(x, w, a), grad

    return conv(x, w)


def _static(shape):
    shape = tf.TensorShape(shape)
    return shape.as_list() if shape.is_fully_defined() else None


def _choose(pass_, in_shape, f_shape, a, dtype):
    """The algorithm of a gradient pass: planned when shapes are static, else the op's."""
    in_shape, f_shape = _static(in_shape), _static(f_shape)
    if a["algorithm"] != "auto" or in_shape is None or f_shape is None:
        return a["algorithm"]
    return _plan(pass_, in_shape, f_shape, a, dtype)["chosen"]


def _backprop_input(input_sizes, w, dy, a, chosen):
    """dL/dinput: TF's own kernel where the planner chose im2col, else our op."""
    if chosen == "im2col":
        return tf.raw_ops.Conv2DBackpropInput(input_sizes=input_sizes, filter=w, out_backprop=dy,
                                              **_op_attrs(a))
    return _ops.big_conv2d_backprop_input(input_sizes, w, dy, **a)


def _backprop_filter(x, filter_sizes, dy, a, chosen):
    """dL/dfilter: TF's own kernel where the planner chose im2col, else our op."""
    if chosen == "im2col":
        return tf.raw_ops.Conv2DBackpropFilter(input=x, filter_sizes=filter_sizes, out_backprop=dy,
                                               **_op_attrs(a))
    return _ops.big_conv2d_backprop_filter(x, filter_sizes, dy, **a)


# Gradients, mirroring TensorFlow's nn_grad.py for Conv2D and its backprops.


def _attrs(op):
    decode = lambda v: v.decode() if isinstance(v, bytes) else v  # string attrs come as bytes
    return {name: decode(op.get_attr(name)) for name in _ATTRS}


@tf.RegisterGradient("BigConv2D")
def _big_conv2d_grad(op, grad):
    x, w = op.inputs
    a = _attrs(op)
    return (_backprop_input(tf.shape(x), w, grad, a,
                            _choose("backprop_input", x.shape, w.shape, a, x.dtype)),
            _backprop_filter(x, tf.shape(w), grad, a,
                             _choose("backprop_filter", x.shape, w.shape, a, x.dtype)))


@tf.RegisterGradient("BigConv2DBackpropInput")
def _big_conv2d_backprop_input_grad(op, grad):
    # dx = BackpropInput(sizes, w, dy) is linear in w and in dy.
    _, w, dy = op.inputs
    a = _attrs(op)
    return (None,
            _ops.big_conv2d_backprop_filter(grad, tf.shape(w), dy, **a),
            _ops.big_conv2d(grad, w, **a))


@tf.RegisterGradient("BigConv2DBackpropFilter")
def _big_conv2d_backprop_filter_grad(op, grad):
    # dw = BackpropFilter(x, sizes, dy) is linear in x and in dy.
    x, _, dy = op.inputs
    a = _attrs(op)
    return (_ops.big_conv2d_backprop_input(tf.shape(x), grad, dy, **a),
            None,
            _ops.big_conv2d(x, grad, **a))
