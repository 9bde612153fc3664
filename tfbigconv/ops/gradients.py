"""The gradients of tfbigconv's ops, registered with TensorFlow (mirroring
TensorFlow's nn_grad.py for Conv2D and its backprops). Each gradient pass is
planned on its own (planner.choose_gradients) and emitted as its candidate."""
import tensorflow as tf

from tfbigconv import arguments, host
from tfbigconv.arguments import Algorithm
from tfbigconv._native import ops as native
from tfbigconv.planning import candidates, planner


def _spec(op):
    """The op's attributes as the Python side carries them: a ConvSpec."""
    decode = lambda v: v.decode() if isinstance(v, bytes) else v  # string attrs come as bytes
    return arguments.ConvSpec.of({name: decode(op.get_attr(name))
                                  for name in arguments.OP_ATTRS})


def _device_of(op):
    """Where an op's gradients run: its own device if placed, else the default placement."""
    # Eager and tf.function tapes hand gradient functions a mock op without a device.
    return host.device_kind(getattr(op, "device", "")) or host.resolve_device()


@tf.RegisterGradient("BigConv2D")
@tf.RegisterGradient("BigConv3D")
def _big_conv_grad(op, grad):
    x, w = op.inputs
    spec = _spec(op).with_operands(x.shape, w.shape)
    # Planning and TF's kernels follow it; ours need no device (3-D: the CPU's).
    device = None
    if spec.algorithm in (Algorithm.AUTO, Algorithm.TF):
        device = planner.planning_device(spec, _device_of(op))
    # A gradient the tape does not want (e.g. a model's input) is neither planned,
    # timed nor built: the tape's op says so (graph-mode tf.gradients' op does not).
    skip = set(getattr(op, "skip_input_indices", None) or ())
    chosen = planner.choose_gradients(x.shape, w.shape, spec, x.dtype, device,
                                      needed=(0 not in skip, 1 not in skip))
    # Both as fft where one op transforms dL/dy once for both (1-D depthwise, CPU).
    if chosen == (Algorithm.FFT, Algorithm.FFT) and planner.fused_backward(
            x.shape, w.shape, spec, x.dtype, _device_of(op), spec.workspace_limit_bytes):
        return native.big_conv2d_backprop(x, w, grad, **spec.op_attrs(Algorithm.FFT))
    return candidates.gradients(x, w, grad, spec, chosen, device)


@tf.RegisterGradient("BigConv2DBackprop")
def _fused_backprop_grad(op, grad_dx, grad_dw):
    """dx = BackpropInput(w, dy) is linear in w and dy, dw = BackpropFilter(x,
    dy) in x and dy: the sum of the two ops' gradients below."""
    x, w, dy = op.inputs
    a = _spec(op).op_attrs()
    d_x = d_w = d_dy = None
    if grad_dx is not None:
        d_w = native.big_conv2d_backprop_filter(grad_dx, tf.shape(w), dy, **a)
        d_dy = native.big_conv2d(grad_dx, w, **a)
    if grad_dw is not None:
        d_x = native.big_conv2d_backprop_input(tf.shape(x), grad_dw, dy, **a)
        from_dw = native.big_conv2d(x, grad_dw, **a)
        d_dy = from_dw if d_dy is None else d_dy + from_dw
    return d_x, d_w, d_dy


def _register_backprop_gradients(prefix, forward, backprop_input, backprop_filter):
    """The gradients of the ops <prefix>BackpropInput and <prefix>BackpropFilter (2-D
    and 3-D alike): dx = BackpropInput(sizes, w, dy) is linear in w and in dy, and
    dw = BackpropFilter(x, sizes, dy) in x and in dy."""
    @tf.RegisterGradient(prefix + "BackpropInput")
    def _input_grad(op, grad):
        _, w, dy = op.inputs
        a = _spec(op).op_attrs()
        return None, backprop_filter(grad, tf.shape(w), dy, **a), forward(grad, w, **a)

    @tf.RegisterGradient(prefix + "BackpropFilter")
    def _filter_grad(op, grad):
        x, _, dy = op.inputs
        a = _spec(op).op_attrs()
        return backprop_input(tf.shape(x), grad, dy, **a), None, forward(x, grad, **a)


_register_backprop_gradients("BigConv2D", native.big_conv2d, native.big_conv2d_backprop_input,
                             native.big_conv2d_backprop_filter)
_register_backprop_gradients("BigConv3D", native.big_conv3d, native.big_conv3d_backprop_input,
                             native.big_conv3d_backprop_filter)

