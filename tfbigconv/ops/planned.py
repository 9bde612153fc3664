"""What bigconv2d and bigconv3d build once the planner has chosen at trace time:
the forward pass's plan, and TensorFlow's forward kernel with each gradient
pass planned on its own."""
import tensorflow as tf

from tfbigconv.arguments import Algorithm, Pass
from tfbigconv.planning import candidates, planner


def plan_forward(in_shape, f_shape, spec, dtype, device):
    """The planner's decision (planner.decide) for the forward pass of the op
    `spec` (a ConvSpec), logged."""
    p = planner.decide(Pass.FORWARD, in_shape, f_shape, spec, dtype.name, spec.algorithm,
                       spec.workspace_limit_bytes, device)
    planner.log_choice(spec, p)
    return p


def tf_forward_routed(x, w, in_shape, f_shape, spec, device):
    """TensorFlow's forward kernel, with its gradient passes planned as our op's
    gradient plans them (planner.choose_gradients; algorithm="tf": TF's kernels
    for the passes). spec: the ConvSpec with its operands."""
    chosen = planner.choose_gradients(in_shape, f_shape, spec, x.dtype, device)
    used = {candidates.depthwise(p, spec, x.dtype, device) for p in planner.PASSES}
    crashes = candidates.filter_gradient_crashes(spec, x.dtype, device)
    if chosen == (Algorithm.TF, Algorithm.TF) and len(used) == 1 and not crashes:
        # TF's own gradients, the planned kernels (not so for dilated depthwise
        # filters: a grouped Conv2D forward, depthwise gradients).
        return candidates.forward(x, w, spec, Algorithm.TF, device)

    @tf.custom_gradient
    def conv(x, w):
        def grad(dy):
            return candidates.gradients(x, w, dy, spec, chosen, device)
        return candidates.forward(x, w, spec, Algorithm.TF, device), grad

    return conv(x, w)
