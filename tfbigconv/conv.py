"""bigconv2d: tf.nn.conv2d's interface on tfbigconv's kernels."""
import numbers

import numpy as np
import tensorflow as tf

from tfbigconv import _core, dispatch
from tfbigconv._ops import ops as _ops
from tfbigconv.dispatch import ALGORITHMS, invalid_argument as _invalid

DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
# Dtypes tf.nn.conv2d takes that our kernels lack: they run TensorFlow's Conv2D.
TF_ONLY_DTYPES = (tf.int32,)
# The attributes TensorFlow's own Conv2D ops share with ours, and all of ours.
_TF_ATTRS = ("strides", "padding", "explicit_paddings", "data_format", "dilations")
_ATTRS = _TF_ATTRS + ("algorithm", "workspace_limit_bytes")


# The exception classes are tf.nn.conv2d's (tests/test_errors.py holds the table):
# - the form of an argument (a padding list of the wrong shape, strides of
#   length 3): ValueError, which tf.nn.conv2d raises in Python;
# - what TensorFlow's shape function and op definition check (ranks, depths,
#   attribute values, dtypes): ValueError (TypeError for dtypes) while a graph
#   is built, InvalidArgumentError eagerly, where TF's kernel finds it
#   (_graph_error);
# - what only TF's kernel checks (strides or dilations in the batch or depth
#   dimension, a filter with no elements): its class, UnimplementedError or
#   InvalidArgumentError, raised here at once.
def _graph_error(message, graph_class=ValueError):
    return graph_class(message) if not tf.executing_eagerly() else _invalid(message)


def _data_format(value):
    """"NHWC" or "NCHW" (None: "NHWC", as tf.nn.conv2d reads it)."""
    if value is None:
        return "NHWC"
    if not isinstance(value, str) or value.upper() not in ("NHWC", "NCHW"):
        raise _graph_error(f"data_format must be 'NHWC' or 'NCHW', got {value!r}")
    return value.upper()


# Argument parsing shared by bigconv2d and explain: every bad argument raises
# ValueError naming it (explain: InvalidArgumentError) before anything reaches
# the compiled code (whose int64 arguments would otherwise raise a raw TypeError).
_INT64_MAX = 2**63 - 1
# The ops' list attributes (strides, dilations, explicit_paddings) are int32
# in TensorFlow, as tf.nn.conv2d's are.
_INT32_MAX = 2**31 - 1


def _int(value, name, minimum=-_INT64_MAX - 1, maximum=_INT64_MAX):
    """An int (Python or NumPy, not bool) in [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int, got {value!r} of type {type(value).__name__}")
    value = int(value)
    if not minimum <= value <= maximum:
        what = "non-negative " if minimum == 0 else "positive " if minimum == 1 else ""
        bits = 31 if maximum == _INT32_MAX else 63
        raise ValueError(f"{name} must be a {what}int below 2**{bits}, got {value}")
    return value


def _ints(value, name):
    """A list or tuple of int32 attribute values (strings are not lists)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a list of ints, got {value!r}")
    return [_int(v, f"{name} entry", -_INT32_MAX - 1, _INT32_MAX) for v in value]


def _byte_count(value, name, minimum):
    """A size in bytes: an int in [minimum, 2**63); InvalidArgumentError if not
    (our own arguments, not tf.nn.conv2d's)."""
    try:
        return _int(value, name, minimum)
    except ValueError as e:
        raise _invalid(str(e)) from None


def _shape(value, name):
    """A fully known shape (list, tuple or TensorShape) as a list of non-negative ints."""
    if isinstance(value, tf.TensorShape):
        if value.rank is None or not value.is_fully_defined():
            raise ValueError(f"{name} must be fully known, got {value}")
        value = value.as_list()
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a list of ints, got {value!r}")
    if any(v is None for v in value):
        raise ValueError(f"{name} must be fully known, got {value!r}")
    return [_int(v, f"{name} dimension", 0) for v in value]


def _expand(value, name, data_format):
    """strides/dilations in tf.nn.conv2d's forms -> 4 ints in data_format order."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    if isinstance(value, tf.TensorShape) or not isinstance(value, (list, tuple)) \
            or len(value) not in (1, 2, 4):
        raise ValueError(f"{name} must be an int or a list of 1, 2 or 4 ints, got {value!r}")
    value = _ints(value, name)
    if len(value) == 1:
        value = value * 2
    if len(value) == 2:
        h, w = value
        return [1, h, w, 1] if data_format == "NHWC" else [1, 1, h, w]
    return value


def _padding(padding):
    """'SAME' / 'VALID' / [[before, after]] * 4 -> (padding attr, explicit_paddings)."""
    if isinstance(padding, str):
        if padding.upper() == "EXPLICIT":  # as tf.nn.conv2d: the pairs say it
            raise ValueError("padding 'EXPLICIT' is not a value to pass: for explicit padding, "
                             "padding must be a list of 4 [before, after] pairs")
        return padding.upper(), []
    try:
        pairs = [p for p in padding]
    except TypeError:
        pairs = None
    if pairs is None or isinstance(padding, bytes) or len(pairs) != 4 or any(
            isinstance(p, (str, bytes)) or not hasattr(p, "__len__") or len(p) != 2
            for p in pairs):
        raise ValueError(
            f"padding must be 'SAME', 'VALID' or a list of 4 [before, after] pairs (one per "
            f"dimension), got {padding!r}")
    return "EXPLICIT", [_int(x, "explicit padding", -_INT32_MAX - 1, _INT32_MAX)
                        for p in pairs for x in p]


def _planning_shape(shape):
    """A shape to plan with: the static one, with an unknown batch read as
    dispatch.ASSUMED_BATCH; None if any other dimension is unknown."""
    shape = tf.TensorShape(shape)
    if shape.rank != 4:
        return None
    dims = shape.as_list()
    if any(d is None for d in dims[1:]):
        return None
    return [dispatch.ASSUMED_BATCH if dims[0] is None else dims[0]] + dims[1:]


@tf.autograph.experimental.do_not_convert  # plain Python at trace time (planning, autotuning)
def bigconv2d(input, filters, strides, padding, data_format="NHWC", dilations=None, name=None,
              *, algorithm="auto", workspace_limit=0):
    """Computes a 2-D convolution like `tf.nn.conv2d`, without im2col.

    Arguments and semantics are tf.nn.conv2d's: `input` is 4-D in `data_format`
    ("NHWC", the default, also for None, or "NCHW"), or batch_shape + those 3
    dimensions (rank 5 or more: the leading dimensions run as one batch);
    `filters` is [height, width, in_depth / groups, out_depth],
    where groups = input depth / filter in_depth (grouped and depthwise convolution);
    `strides` and `dilations` are an int or a list of 1, 2 or 4 ints; `padding` is
    "SAME", "VALID" or an explicit list of 4 [before, after] pairs in data_format
    order. Works in eager mode and in tf.function, also with unknown shapes.
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
        cached (see `tfbigconv.autotune`; TFBIGCONV_AUTOTUNE=0 turns it off).
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
      InvalidArgumentError for dtypes); tf.errors.UnimplementedError for strides
      in the batch or depth dimension; InvalidArgumentError for dilations there,
      a filter with no elements, and for `algorithm` and `workspace_limit`.
    """
    with tf.name_scope(name or "bigconv2d"):
        data_format = _data_format(data_format)
        algorithm = dispatch.requested_algorithm(algorithm)
        workspace_limit = _byte_count(workspace_limit, "workspace_limit", 0)
        input = tf.convert_to_tensor(input, name="input")
        if input.shape.rank is not None and input.shape.rank > 4:
            return _with_batch_flattened(input, lambda x: bigconv2d(
                x, filters, strides, padding, data_format, dilations,
                algorithm=algorithm, workspace_limit=workspace_limit))
        if input.dtype not in DTYPES + TF_ONLY_DTYPES:
            raise _graph_error(
                f"input dtype must be one of float16, bfloat16, float32, float64 or int32, got "
                f"{input.dtype.name}", TypeError)
        if isinstance(filters, (tf.Tensor, tf.Variable)) and filters.dtype != input.dtype:
            raise _graph_error(
                f"filters dtype {filters.dtype.name} must match input dtype {input.dtype.name}",
                TypeError)
        filters = tf.convert_to_tensor(filters, dtype=input.dtype, name="filters")
        strides = _expand(strides, "strides", data_format)
        dilations = _expand(1 if dilations is None else dilations, "dilations", data_format)
        pad, explicit = _padding(padding)
        _check_kernel_limits(strides, dilations, data_format, filters.shape)
        try:
            _core.validate_attrs(strides, pad, explicit, data_format, dilations)
            for t, what in ((input, "input"), (filters, "filters")):
                if t.shape.rank is not None and t.shape.rank != 4:
                    raise ValueError(f"{what} must be rank 4, got rank {t.shape.rank}: shape {t.shape}")
            in_shape, f_shape = _static(input.shape), _static(filters.shape)
            if in_shape is not None and f_shape is not None:
                _core.conv_geometry(in_shape, f_shape, strides, pad, explicit, data_format, dilations)
        except ValueError as e:
            raise _graph_error(str(e)) from None
        a = dict(strides=strides, padding=pad, explicit_paddings=explicit,
                 data_format=data_format, dilations=dilations, algorithm=algorithm,
                 workspace_limit_bytes=int(workspace_limit))
        if input.dtype in TF_ONLY_DTYPES:
            if algorithm not in ("auto", "tf"):
                raise _invalid(f"algorithm {algorithm!r} does not run {input.dtype.name}: only "
                               f"TensorFlow's kernel does (algorithm 'auto' or 'tf')")
            return tf.raw_ops.Conv2D(input=input, filter=filters, **_op_attrs(a))
        plan_in = _planning_shape(input.shape)
        planned = plan_in is not None and f_shape is not None
        device = None  # where the op runs: resolved for planning, and TF's kernel follows it
        if planned and algorithm in ("tf", "auto"):
            device = dispatch.resolve_device(input)
        if algorithm == "tf":
            if planned:  # raises, saying why, where TensorFlow cannot run the case
                _plan("forward", plan_in, f_shape, a, input.dtype, device)
            return _tf_forward_routed(input, filters, plan_in, filters.shape, a, device)
        if algorithm == "auto" and planned:
            chosen = _plan("forward", plan_in, f_shape, a, input.dtype, device)["chosen"]
            if chosen == "tf":
                return _tf_forward_routed(input, filters, plan_in, f_shape, a, device)
            return _ops.big_conv2d(input=input, filter=filters, planned_algorithm=chosen, **a)
        return _ops.big_conv2d(input=input, filter=filters, **a)


def _check_kernel_limits(strides, dilations, data_format, filter_shape):
    """What only TF's kernel checks, with its exception class (see _graph_error)."""
    depth = 3 if data_format == "NHWC" else 1
    for name, values, error in (("strides", strides, tf.errors.UnimplementedError),
                                ("dilations", dilations, tf.errors.InvalidArgumentError)):
        if all(v > 0 for v in values) and (values[0] != 1 or values[depth] != 1):
            # TF's words, which code and tests match
            raise error(None, None, f"Current implementation does not yet support {name} in "
                        f"the batch and depth dimensions: {name} must be 1 there, got {values} "
                        f"for data_format {data_format}")
    dims = filter_shape.as_list() if filter_shape.rank == 4 else []
    if 0 in dims[:3]:  # an empty out_depth gives an empty output
        raise _invalid(f"filter must not have zero elements (i.e. all dimensions must be "
                       f"non-zero) in height, width and in_depth: filters has shape {dims}")


def _with_batch_flattened(x, conv):
    """tf.nn.conv2d's input of rank 5 or more: batch_shape + 3 dimensions runs
    as one batch of prod(batch_shape), and the output keeps batch_shape."""
    outer = x.shape[:-3]
    count = outer.num_elements() if outer.is_fully_defined() else tf.reduce_prod(tf.shape(x)[:-3])
    inner = [d if d is not None else tf.shape(x)[i - 3] for i, d in enumerate(x.shape[-3:])]
    y = conv(tf.reshape(x, tf.stack([count] + inner) if not all(
        isinstance(d, int) for d in [count] + inner) else [count] + inner))
    outer_dims = outer.as_list() if outer.is_fully_defined() else tf.shape(x)[:-3]
    inner_out = y.shape[1:]
    if outer.is_fully_defined() and inner_out.is_fully_defined():
        return tf.reshape(y, outer_dims + inner_out.as_list())
    out = tf.reshape(y, tf.concat([tf.shape(x)[:-3], tf.shape(y)[1:]], axis=0))
    out.set_shape(outer.concatenate(inner_out))
    return out


def _op_attrs(a):
    return {k: a[k] for k in _TF_ATTRS}


def output_shape(input_shape, filter_shape, a):
    """The forward output shape (data_format order) of static shapes."""
    return _core.conv_geometry(list(input_shape), list(filter_shape), a["strides"], a["padding"],
                               a["explicit_paddings"], a["data_format"],
                               a["dilations"])["output_shape"]


def _plan(pass_, in_shape, f_shape, a, dtype, device):
    p = dispatch.decide(pass_, in_shape, f_shape, _op_attrs(a), dtype.name, a["algorithm"],
                        a["workspace_limit_bytes"], device)
    dispatch.log_choice("bigconv2d", p)
    return p


# TensorFlow's own kernels: DepthwiseConv2dNative for depthwise filters (one
# input channel per group) on the CPU, else Conv2D (dispatch.uses_depthwise_kernel).
# A depthwise filter [KH, KW, 1, C*m] is TF's [KH, KW, C, m]: output channel
# c*m + j belongs to group c in both.


def _in_depth(shape, data_format):
    shape = tf.TensorShape(shape)
    return shape[3 if data_format == "NHWC" else 1]


def _depthwise(pass_, in_depth, f_shape, a, dtype, given=None, device=None):
    """Whether TF's kernel for the pass is DepthwiseConv2dNative on `device` (the
    one the pass was planned for; None: where ops built here run), by
    dispatch.uses_depthwise_kernel, unless `given` says."""
    if given is not None:
        return given
    f_shape = tf.TensorShape(f_shape).as_list()
    if f_shape[2] != 1:
        return False
    # Only a depthwise filter's kernel depends on the device: resolve it then.
    return dispatch.uses_depthwise_kernel(pass_, in_depth, f_shape, a, tf.as_dtype(dtype).name,
                                          _kernel_device(device))


def _kernel_device(device):
    """Where TF's kernel emitted for `device` (None: where ops built here run)
    will run: a GPU scope without a GPU runs it on the CPU (soft placement),
    where TF's kernels have the CPU's limits."""
    if device is None:
        device = dispatch.resolve_device()
    return "CPU" if device == "GPU" and not dispatch.gpu_available() else device


def _tf_filter_gradient_crashes(in_depth, f_shape, a, dtype, device):
    return dispatch.tf_filter_gradient_crashes(in_depth, tf.TensorShape(f_shape).as_list(), a,
                                               tf.as_dtype(dtype).name, _kernel_device(device))


def _depthwise_filter_shape(in_depth, f_shape):
    kh, kw, _, out = tf.TensorShape(f_shape).as_list()
    return [kh, kw, in_depth, out // in_depth]


def _spatial(x):
    """An NHWC tensor's height and width: static where known (the results keep
    their static shape), else a tensor."""
    hw = x.shape[1:3]
    return hw.as_list() if hw.is_fully_defined() else tf.shape(x)[1:3]


def _space_to_batch(a, f_shape, input_hw):
    """How tf.nn.depthwise_conv2d runs dilations (nn_ops.with_space_to_batch), for
    NHWC at stride 1: the input padded as the convolution pads it, then up to a
    multiple of the dilations, becomes dh*dw undilated images (SpaceToBatchND);
    the kernel runs VALID on them; BatchToSpaceND crops the result. Where all
    three passes run it and both gradients are planned "tf"
    (dispatch.uses_depthwise_kernel), TF's registered gradients reuse the
    forward's copy of the input, as tf.nn.depthwise_conv2d's do. Returns
    (block, paddings, crops, undilated attrs)."""
    block = a["dilations"][1:3]
    if a["padding"] == "EXPLICIT":
        base = [a["explicit_paddings"][2:4], a["explicit_paddings"][4:6]]
    elif a["padding"] == "SAME":  # stride 1: (K - 1) * d in all, the odd one after
        extra = [(k - 1) * d for k, d in zip(f_shape[:2], block)]
        base = [[e // 2, e - e // 2] for e in extra]
    else:
        base = [[0, 0], [0, 0]]
    paddings, crops = tf.required_space_to_batch_paddings(input_hw, block, base_paddings=base)
    undilated = dict(_op_attrs(a), padding="VALID", explicit_paddings=[], dilations=[1, 1, 1, 1])
    return block, paddings, crops, undilated


def _tf_forward(x, w, a, depthwise=None, device=None):
    c = _in_depth(x.shape, a["data_format"])
    if not _depthwise("forward", c, w.shape, a, x.dtype, depthwise, device):
        return tf.raw_ops.Conv2D(input=x, filter=w, **_op_attrs(a))
    w = tf.reshape(w, _depthwise_filter_shape(c, w.shape))
    if all(d == 1 for d in a["dilations"]):
        return tf.raw_ops.DepthwiseConv2dNative(input=x, filter=w, **_op_attrs(a))
    block, paddings, crops, undilated = _space_to_batch(a, w.shape, _spatial(x))
    y = tf.raw_ops.DepthwiseConv2dNative(input=tf.space_to_batch_nd(x, block, paddings),
                                         filter=w, **undilated)
    return tf.batch_to_space(y, block, crops)


def _tf_backprop_input(input_sizes, w, dy, a, in_depth, depthwise=None, device=None):
    if not _depthwise("backprop_input", in_depth, w.shape, a, w.dtype, depthwise, device):
        return tf.raw_ops.Conv2DBackpropInput(input_sizes=input_sizes, filter=w, out_backprop=dy,
                                              **_op_attrs(a))
    w = tf.reshape(w, _depthwise_filter_shape(in_depth, w.shape))
    if all(d == 1 for d in a["dilations"]):
        return tf.raw_ops.DepthwiseConv2dNativeBackpropInput(
            input_sizes=input_sizes, filter=w, out_backprop=dy, **_op_attrs(a))
    # The gradients of SpaceToBatchND and BatchToSpaceND are each other.
    static = tf.get_static_value(input_sizes)
    input_sizes = tf.cast(input_sizes, tf.int32)
    block, paddings, crops, undilated = _space_to_batch(
        a, w.shape, list(static[1:3]) if static is not None else input_sizes[1:3])
    padded = input_sizes[1:3] + tf.reduce_sum(paddings, axis=1)
    sizes = tf.concat([input_sizes[:1] * tf.reduce_prod(block), padded // block,
                       input_sizes[3:]], axis=0)
    dx = tf.raw_ops.DepthwiseConv2dNativeBackpropInput(
        input_sizes=sizes, filter=w, out_backprop=tf.space_to_batch_nd(dy, block, crops),
        **undilated)
    return tf.batch_to_space(dx, block, paddings)


def _tf_backprop_filter(x, f_shape, dy, a, depthwise=None, device=None):
    c = _in_depth(x.shape, a["data_format"])
    if not _depthwise("backprop_filter", c, f_shape, a, x.dtype, depthwise, device):
        return tf.raw_ops.Conv2DBackpropFilter(input=x, filter_sizes=f_shape, out_backprop=dy,
                                               **_op_attrs(a))
    sizes = _depthwise_filter_shape(c, f_shape)
    if all(d == 1 for d in a["dilations"]):
        dw = tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
            input=x, filter_sizes=sizes, out_backprop=dy, **_op_attrs(a))
    else:
        block, paddings, crops, undilated = _space_to_batch(a, f_shape, _spatial(x))
        dw = tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
            input=tf.space_to_batch_nd(x, block, paddings), filter_sizes=sizes,
            out_backprop=tf.space_to_batch_nd(dy, block, crops), **undilated)
    return tf.reshape(dw, f_shape)


def _tf_forward_routed(x, w, in_shape, f_shape, a, device):
    """TensorFlow's forward kernel, with its gradient passes planned as
    bigconv2d's gradient plans them (_choose_gradients; algorithm="tf": TF's
    kernels for the passes)."""
    bpi, bpf = _choose_gradients(in_shape, f_shape, a, x.dtype, device)
    c = _in_depth(x.shape, a["data_format"])
    kernels = {_depthwise(p, c, w.shape, a, x.dtype, device=device) for p in dispatch.PASSES}
    crashes = _tf_filter_gradient_crashes(c, w.shape, a, x.dtype, device)
    if bpi == bpf == "tf" and len(kernels) == 1 and not crashes:
        # TF's own gradients, the planned kernels (not so for dilated depthwise
        # filters: a grouped Conv2D forward, depthwise gradients).
        return _tf_forward(x, w, a, device=device)

    @tf.custom_gradient
    def conv(x, w):
        def grad(dy):
            return (_backprop_input(tf.shape(x), w, dy, a, bpi, x.shape, device),
                    _backprop_filter(x, w.shape, dy, a, bpf, device))
        return _tf_forward(x, w, a, device=device), grad

    return conv(x, w)


def _ours(a, chosen):
    """Our op's attributes for a pass planned as `chosen` (or "auto": at run time)."""
    if a["algorithm"] == "auto" and chosen in ("direct", "fft"):
        return dict(a, planned_algorithm=chosen)
    return a


def run_pass(pass_, chosen, x, w, dy, a, device=None):
    """One pass with the candidate `chosen` ("tf", "direct" or "fft") on `device`
    ("CPU", "GPU"; the caller's tf.device scope places it): for timing."""
    if pass_ == "forward":
        if chosen == "tf":
            return _tf_forward(x, w, a, device=device)
        return _ops.big_conv2d(input=x, filter=w, **_ours(a, chosen))
    if pass_ == "backprop_input":
        return _backprop_input(tf.shape(x), w, dy, a, chosen, x.shape, device)
    return _backprop_filter(x, w.shape, dy, a, chosen, device)


def _choose_gradients(in_shape, f_shape, a, dtype, device):
    """The algorithms of the two gradient passes (dL/dinput, dL/dfilter):
    planned together (dispatch.decide_gradients) when shapes are static, else the op's."""
    in_shape, f_shape = _planning_shape(in_shape), _static(f_shape)
    if a["algorithm"] != "auto" or in_shape is None or f_shape is None:
        return a["algorithm"], a["algorithm"]
    plans = dispatch.decide_gradients(in_shape, f_shape, _op_attrs(a), dtype.name, a["algorithm"],
                                      a["workspace_limit_bytes"], device)
    for p in plans:
        dispatch.log_choice("bigconv2d", p)
    return tuple(p["chosen"] for p in plans)


def _static(shape):
    shape = tf.TensorShape(shape)
    return shape.as_list() if shape.is_fully_defined() else None


def _backprop_input(input_sizes, w, dy, a, chosen, x_shape, device=None):
    """dL/dinput: TF's own kernel (for `device`, as planned) where the planner
    chose it, else our op."""
    if chosen == "tf":
        return _tf_backprop_input(input_sizes, w, dy, a, _in_depth(x_shape, a["data_format"]),
                                  device=device)
    return _ops.big_conv2d_backprop_input(input_sizes, w, dy, **_ours(a, chosen))


def _backprop_filter(x, f_shape, dy, a, chosen, device=None):
    """dL/dfilter: TF's own kernel (for `device`, as planned) where the planner
    chose it, else our op."""
    if chosen == "tf":
        f_shape = tf.TensorShape(f_shape).as_list()
        if _tf_filter_gradient_crashes(_in_depth(x.shape, a["data_format"]), f_shape, a, x.dtype,
                                       device):
            # Refused when the gradient is built, instead of TF's kernel, which
            # would kill the process when it runs.
            raise _invalid("algorithm 'tf' is not available: "
                           + dispatch.ONEDNN_BF16_GROUPED_DILATED_NOTE)
        return _tf_backprop_filter(x, f_shape, dy, a, device=device)
    sizes = f_shape.as_list() if isinstance(f_shape, tf.TensorShape) else f_shape
    return _ops.big_conv2d_backprop_filter(x, sizes, dy, **_ours(a, chosen))


# Gradients, mirroring TensorFlow's nn_grad.py for Conv2D and its backprops.


def _attrs(op):
    decode = lambda v: v.decode() if isinstance(v, bytes) else v  # string attrs come as bytes
    return {name: decode(op.get_attr(name)) for name in _ATTRS}


def _device_of(op):
    """Where an op's gradients run: its own device if placed, else the default placement."""
    # Eager and tf.function tapes hand gradient functions a mock op without a device.
    return dispatch.device_kind(getattr(op, "device", "")) or dispatch.resolve_device()


@tf.RegisterGradient("BigConv2D")
def _big_conv2d_grad(op, grad):
    x, w = op.inputs
    a = _attrs(op)
    # Planning and TF's kernels follow it; ours need no device.
    device = _device_of(op) if a["algorithm"] in ("auto", "tf") else None
    bpi, bpf = _choose_gradients(x.shape, w.shape, a, x.dtype, device)
    return (_backprop_input(tf.shape(x), w, grad, a, bpi, x.shape, device),
            _backprop_filter(x, w.shape if w.shape.is_fully_defined() else tf.shape(w), grad, a,
                             bpf, device))


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
