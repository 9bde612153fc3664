"""Each candidate of a pass as TensorFlow ops: "tf" (TensorFlow's own kernel
for the case, by tf_rules, for the device the pass was planned for), or
"direct" / "fft" (our ops), in 2-D or 3-D as the attributes' data_format says.
timing.measure times them; the front end (ops/conv.py) and the gradients emit them."""
import tensorflow as tf

from tfbigconv import _core, arguments, errors, host, kernels
from tfbigconv.arguments import Algorithm
from tfbigconv._native import ops as native
from tfbigconv.planning import tf_rules


def output_shape(input_shape, filter_shape, a):
    """The forward output shape (data_format order) of static shapes."""
    return _core.conv_geometry(list(input_shape), list(filter_shape), a["strides"], a["padding"],
                               a["explicit_paddings"], a["data_format"],
                               a["dilations"]).output_shape


def filter_dims(f_shape, a):
    """A filter shape as a list (None where unknown), also of unknown rank: then
    as many unknown dimensions as the attributes `a` say (4 in 2-D, 5 in 3-D)."""
    f_shape = tf.TensorShape(f_shape)
    return f_shape.as_list() if f_shape.rank is not None else [None] * len(a["strides"])


def depthwise(pass_, in_depth, f_shape, a, dtype, device=None):
    """Whether TF's kernel for the pass is DepthwiseConv2dNative on `device` (the
    one the pass was planned for; None: where ops built here run)."""
    f_shape = filter_dims(f_shape, a)
    if f_shape[2] != 1:
        return False
    # Only a depthwise filter's kernel depends on the device: resolve it then.
    return tf_rules.uses_depthwise_kernel(pass_, in_depth, f_shape, a, tf.as_dtype(dtype).name,
                                          host.kernel_device(device))


def filter_gradient_crashes(in_depth, f_shape, a, dtype, device):
    return tf_rules.tf_filter_gradient_crashes(in_depth, filter_dims(f_shape, a), a,
                                               tf.as_dtype(dtype).name,
                                               host.kernel_device(device))


def ours(a, chosen=Algorithm.AUTO):
    """Our op's attributes for a pass planned as `chosen` ("auto": at run time), the
    algorithms as the op attributes' strings (the op boundary)."""
    out = dict(a, algorithm=str(a["algorithm"]))
    if a["algorithm"] == Algorithm.AUTO and chosen in (Algorithm.DIRECT, Algorithm.FFT):
        out["planned_algorithm"] = str(chosen)
    return out


# Our ops per number of spatial dimensions: forward, input gradient, filter gradient.
NATIVE = {2: (native.big_conv2d, native.big_conv2d_backprop_input,
              native.big_conv2d_backprop_filter),
          3: (native.big_conv3d, native.big_conv3d_backprop_input,
              native.big_conv3d_backprop_filter)}


def native_ops(a):
    return NATIVE[arguments.spatial_dims(a["data_format"])]


def forward(x, w, a, chosen, device=None):
    if chosen == Algorithm.TF:
        c = kernels.in_depth(x.shape, a["data_format"])
        dw = depthwise("forward", c, w.shape, a, x.dtype, device)
        per_group = not dw and tf_rules.grouped_fusion_fails(
            c, w.shape, a, tf.as_dtype(x.dtype).name, host.kernel_device(device))
        return kernels.tf_forward(x, w, a, dw, per_group=per_group)
    return native_ops(a)[0](input=x, filter=w, **ours(a, chosen))


def backprop_input(input_sizes, w, dy, a, chosen, x_shape, device=None):
    """dL/dinput: TF's own kernel (for `device`, as planned) where the planner
    chose it, else our op."""
    if chosen == Algorithm.TF:
        c = kernels.in_depth(x_shape, a["data_format"])
        return kernels.tf_backprop_input(
            input_sizes, w, dy, a, c, depthwise("backprop_input", c, w.shape, a, w.dtype, device))
    return native_ops(a)[1](input_sizes, w, dy, **ours(a, chosen))


def backprop_filter(x, f_shape, dy, a, chosen, device=None):
    """dL/dfilter: TF's own kernel (for `device`, as planned) where the planner
    chose it, else our op."""
    if chosen == Algorithm.TF:
        f_shape = tf.TensorShape(f_shape).as_list()
        c = kernels.in_depth(x.shape, a["data_format"])
        if filter_gradient_crashes(c, f_shape, a, x.dtype, device):
            # Refused when the gradient is built, instead of TF's kernel, which
            # would kill the process when it runs.
            raise errors.invalid_argument("algorithm 'tf' is not available: "
                                          + tf_rules.ONEDNN_BF16_GROUPED_DILATED_NOTE)
        return kernels.tf_backprop_filter(
            x, f_shape, dy, a, depthwise("backprop_filter", c, f_shape, a, x.dtype, device))
    sizes = f_shape.as_list() if isinstance(f_shape, tf.TensorShape) else f_shape
    return native_ops(a)[2](x, sizes, dy, **ours(a, chosen))


def run_pass(pass_, chosen, x, w, dy, a, device=None):
    """One pass with the candidate `chosen` ("tf", "direct" or "fft") on `device`
    ("CPU", "GPU"; the caller's tf.device scope places it)."""
    if pass_ == "forward":
        return forward(x, w, a, chosen, device)
    if pass_ == "backprop_input":
        return backprop_input(tf.shape(x), w, dy, a, chosen, x.shape, device)
    return backprop_filter(x, w.shape, dy, a, chosen, device)
