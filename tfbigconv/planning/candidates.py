"""Each candidate of a pass as TensorFlow ops: "tf" (TensorFlow's own kernel
for the case, by tf_rules, for the device the pass was planned for), or
"direct" / "fft" (our ops), in 2-D or 3-D as the spec's data_format says.
timing.measure times them; the front end (ops/conv.py), the ops' gradients,
the planned gradients of TF's forward (ops/planned.py) and fusion emit them.

Each function takes the convolution's arguments.ConvSpec with its operands
(ConvSpec.with_operands), whose filter facts (depthwise, grouped) they read."""
import tensorflow as tf

from tfbigconv import _core, errors, host, kernels
from tfbigconv.arguments import Algorithm, ConvSpec, Pass
from tfbigconv._native import ops as native
from tfbigconv.planning import tf_rules


def output_shape(input_shape, filter_shape, attrs):
    """The forward output shape (data_format order) of static shapes; attrs: a
    ConvSpec or a mapping of the op's attributes."""
    return _core.conv_geometry(list(input_shape), list(filter_shape),
                               *ConvSpec.of(attrs).geometry_args()).output_shape


def depthwise(pass_, spec, dtype, device=None):
    """Whether TF's kernel for the pass is DepthwiseConv2dNative on `device` (the
    one the pass was planned for; None: where ops built here run)."""
    if not spec.depthwise:
        return False
    # Only a depthwise filter's kernel depends on the device: resolve it then.
    return tf_rules.uses_depthwise_kernel(pass_, spec, tf.as_dtype(dtype).name,
                                          host.kernel_device(device))


def filter_gradient_crashes(spec, dtype, device):
    return tf_rules.tf_filter_gradient_crashes(spec, tf.as_dtype(dtype).name,
                                               host.kernel_device(device))


# Our ops per number of spatial dimensions: forward, input gradient, filter gradient.
NATIVE = {2: (native.big_conv2d, native.big_conv2d_backprop_input,
              native.big_conv2d_backprop_filter),
          3: (native.big_conv3d, native.big_conv3d_backprop_input,
              native.big_conv3d_backprop_filter)}


def native_ops(spec):
    return NATIVE[spec.spatial]


def forward(x, w, spec, chosen, device=None):
    if chosen == Algorithm.TF:
        dw = depthwise(Pass.FORWARD, spec, x.dtype, device)
        per_group = not dw and tf_rules.grouped_fusion_fails(
            spec, tf.as_dtype(x.dtype).name, host.kernel_device(device))
        return kernels.tf_forward(x, w, spec, dw, per_group=per_group)
    return native_ops(spec)[0](input=x, filter=w, **spec.op_attrs(chosen))


def backprop_input(input_sizes, w, dy, spec, chosen, device=None):
    """dL/dinput: TF's own kernel (for `device`, as planned) where the planner
    chose it, else our op."""
    if chosen == Algorithm.TF:
        return kernels.tf_backprop_input(
            input_sizes, w, dy, spec, depthwise(Pass.BACKPROP_INPUT, spec, w.dtype, device))
    return native_ops(spec)[1](input_sizes, w, dy, **spec.op_attrs(chosen))


def backprop_filter(x, f_shape, dy, spec, chosen, device=None):
    """dL/dfilter: TF's own kernel (for `device`, as planned) where the planner
    chose it, else our op."""
    if chosen == Algorithm.TF:
        f_shape = tf.TensorShape(f_shape).as_list()
        if filter_gradient_crashes(spec, x.dtype, device):
            # Refused when the gradient is built, instead of TF's kernel, which
            # would kill the process when it runs.
            raise errors.invalid_argument("algorithm 'tf' is not available: "
                                          + tf_rules.ONEDNN_BF16_GROUPED_DILATED_NOTE)
        return kernels.tf_backprop_filter(
            x, f_shape, dy, spec, depthwise(Pass.BACKPROP_FILTER, spec, x.dtype, device))
    sizes = f_shape.as_list() if isinstance(f_shape, tf.TensorShape) else f_shape
    return native_ops(spec)[2](x, sizes, dy, **spec.op_attrs(chosen))


def gradients(x, w, dy, spec, chosen, device=None):
    """(dL/dinput, dL/dfilter) of the convolution of x and w, each pass as its
    planned candidate: chosen is (dL/dinput's, dL/dfilter's), None for a
    gradient not wanted (returned as None). The one wiring of the gradient
    passes: our ops' registered gradient, TF's planned forward (ops/planned.py)
    and fusion's backprop."""
    bpi, bpf = chosen
    f_shape = w.shape if w.shape.is_fully_defined() else tf.shape(w)
    return (backprop_input(tf.shape(x), w, dy, spec, bpi, device) if bpi else None,
            backprop_filter(x, f_shape, dy, spec, bpf, device) if bpf else None)


def run_pass(pass_, chosen, x, w, dy, attrs, device=None):
    """One pass with the candidate `chosen` ("tf", "direct" or "fft") on `device`
    ("CPU", "GPU"; the caller's tf.device scope places it); attrs: a ConvSpec or
    a mapping of our op's attributes."""
    spec = ConvSpec.of(attrs).with_operands(x.shape, w.shape)
    if pass_ == Pass.FORWARD:
        return forward(x, w, spec, chosen, device)
    if pass_ == Pass.BACKPROP_INPUT:
        return backprop_input(tf.shape(x), w, dy, spec, chosen, device)
    return backprop_filter(x, w.shape, dy, spec, chosen, device)
