"""What bigconv2d and bigconv3d build once the planner has chosen at trace time:
the forward pass's plan, and TensorFlow's forward kernel with each gradient
pass planned on its own."""
import tensorflow as tf

from tfbigconv import kernels
from tfbigconv.arguments import Algorithm
from tfbigconv.planning import candidates, planner


def plan_forward(in_shape, f_shape, a, dtype, device):
    """The planner's decision (planner.decide) for the forward pass of an op with
    attributes `a` (ours), logged."""
    p = planner.decide("forward", in_shape, f_shape, kernels.tf_attrs(a), dtype.name,
                       a["algorithm"], a["workspace_limit_bytes"], device)
    planner.log_choice(a, p)
    return p


def tf_forward_routed(x, w, in_shape, f_shape, a, device):
    """TensorFlow's forward kernel, with its gradient passes planned as our op's
    gradient plans them (planner.choose_gradients; algorithm="tf": TF's kernels
    for the passes)."""
    bpi, bpf = planner.choose_gradients(in_shape, f_shape, a, x.dtype, device)
    c = kernels.in_depth(x.shape, a["data_format"])
    used = {candidates.depthwise(p, c, w.shape, a, x.dtype, device) for p in planner.PASSES}
    crashes = candidates.filter_gradient_crashes(c, w.shape, a, x.dtype, device)
    if bpi == bpf == Algorithm.TF and len(used) == 1 and not crashes:
        # TF's own gradients, the planned kernels (not so for dilated depthwise
        # filters: a grouped Conv2D forward, depthwise gradients).
        return candidates.forward(x, w, a, Algorithm.TF, device)

    @tf.custom_gradient
    def conv(x, w):
        def grad(dy):
            return (candidates.backprop_input(tf.shape(x), w, dy, a, bpi, x.shape, device),
                    candidates.backprop_filter(x, w.shape, dy, a, bpf, device))
        return candidates.forward(x, w, a, Algorithm.TF, device), grad

    return conv(x, w)
