"""What bigconv2d and bigconv3d build from their parsed arguments (the front end,
ops/conv.py, hands the operands here once): the forward pass as planned at
trace time, and TensorFlow's forward kernel with each gradient pass planned on
its own."""
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


def forward(x, w, plan_in, spec, device):
    """The forward pass of the op `spec` (a ConvSpec with its operands) as planned:
    with static shapes (plan_in: the input's shape to plan with, else None), the
    planner's choice at trace time, TF's kernel routed with its gradient plan;
    otherwise our op, which chooses when it runs (or, for a forced "tf", TF's
    kernel unless an operand or the output is empty)."""
    if spec.algorithm == Algorithm.TF:
        if plan_in is not None:  # raises, saying why, where TF cannot run the case (tf_rules)
            plan_forward(plan_in, w.shape.as_list(), spec, x.dtype, device)
            return tf_forward_routed(x, w, plan_in, w.shape, spec, device)
        # Shapes known only when the graph runs: the planner could not rule out an
        # empty tensor, which TF's kernels mishandle (tf_rules.EMPTY_NOTE); our op
        # gives it its shape (and empty gradients).
        direct = spec.replace(algorithm=Algorithm.DIRECT)
        return tf.cond(_empty_at_run_time(x, w, spec),
                       lambda: candidates.forward(x, w, direct, Algorithm.AUTO),
                       lambda: tf_forward_routed(x, w, None, w.shape, spec, device))
    if spec.algorithm == Algorithm.AUTO and plan_in is not None:
        chosen = plan_forward(plan_in, w.shape.as_list(), spec, x.dtype, device).chosen
        if chosen == Algorithm.TF:
            return tf_forward_routed(x, w, plan_in, w.shape, spec, device)
        return candidates.forward(x, w, spec, chosen)
    return candidates.forward(x, w, spec, Algorithm.AUTO)


def _empty_at_run_time(x, w, spec):
    """Whether the convolution of x and w (`spec`, its ConvSpec) has an empty
    operand or output, as a boolean tensor: an output dimension is 0 where the
    (padded) input is smaller than the dilated filter, or is empty."""
    first = 1 if spec.channels_last else 2  # the input's first spatial axis
    xs, ws = tf.shape(x), tf.shape(w)
    empty = tf.logical_or(tf.equal(tf.size(x), 0), tf.equal(tf.size(w), 0))
    if spec.padding == "SAME":  # outputs ceil(input / stride): empty with the input
        return empty
    for i in range(spec.spatial):
        d = first + i
        pads = (spec.explicit_paddings[2 * d] + spec.explicit_paddings[2 * d + 1]
                if spec.explicit else 0)
        dilated = (ws[i] - 1) * spec.dilations[d] + 1
        empty = tf.logical_or(empty, xs[d] + pads < dilated)
    return empty
