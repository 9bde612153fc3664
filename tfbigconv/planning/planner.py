"""The trace-time planner: per pass, TensorFlow's own kernel, direct or fft.

The estimates and the choice come from the planner in C++ (plan.cc, through
_core.plan_pass), so that they are the ones the ops use at run time. This
module adds what only Python knows: which TensorFlow kernel runs each case on
the device and whether it can (tf_rules), the host's facts (host), and
measured choices (autotune) where estimates are not to be trusted, and the
precision rule (_precision_rule: fft is not for auto where it is the less
precise), which both the estimated and the measured choice follow.
"""
import contextlib
import contextvars
import math

import tensorflow as tf
from absl import logging

from tfbigconv import _core, capabilities, errors, host
from tfbigconv.cost_model import probe
from tfbigconv.arguments import PASSES  # noqa: F401  (planner.PASSES: the passes planned)
from tfbigconv.arguments import Algorithm, ConvSpec, Pass
from tfbigconv.planning import autotune as tuner, tf_rules
from tfbigconv.planning.plan import Plan, Verdict

# With an unknown batch (Keras' usual None), passes are planned for this many
# images: the choice between algorithms depends little on the batch, and a
# training batch of 32 is Keras' default.
ASSUMED_BATCH = 32


# Set by planning_only() to the list of its plans' ResourceExhaustedError
# messages; None outside it. A context variable, so that it holds only for the
# thread (or task) that set it.
_planning_only = contextvars.ContextVar("tfbigconv_planning_only", default=None)


def planning_shape(shape):
    """A shape to plan with (rank 4, or 5 in 3-D): the static one, with an unknown
    batch read as ASSUMED_BATCH; None if any other dimension is unknown."""
    shape = tf.TensorShape(shape)
    if shape.rank not in (4, 5):
        return None
    dims = shape.as_list()
    if any(d is None for d in dims[1:]):
        return None
    return [ASSUMED_BATCH if dims[0] is None else dims[0]] + dims[1:]


def planning_device(spec, device):
    """The device the passes of the op `spec` (a ConvSpec) are planned for:
    `device` (where the op runs), or where our op of that rank runs instead
    (capabilities: the CPU in 3-D)."""
    return capabilities.of(spec.spatial, device).runs_on


def static_shape(shape):
    shape = tf.TensorShape(shape)
    return shape.as_list() if shape.is_fully_defined() else None


def plan(pass_, input_shape, filter_shape, attrs, dtype, algorithm, workspace_limit,
         device="CPU", kernel=None):
    """The planner's table and choice for one pass (a Plan; see _core.plan_pass).

    attrs: the convolution's arguments.ConvSpec (or a mapping of TF's op
    attributes: strides, padding, explicit_paddings, data_format, dilations;
    its algorithm and workspace limit are the arguments here). Raises
    InvalidArgumentError for bad arguments and ResourceExhaustedError when
    nothing requested fits the workspace limit.
    workspace_limit 0: the default budget (on the GPU, gpu_workspace_budget()).
    kernel: TF's kernel to estimate ("Conv2D", "DepthwiseConv2dNative") instead
    of tf_rules.tf_kernel's (memory_report: the kernel of an op already in a graph).
    """
    algorithm = Algorithm(algorithm)
    spec = ConvSpec.of(attrs)
    if device == "GPU" and not workspace_limit:
        workspace_limit = host.gpu_workspace_budget()
    args = (list(input_shape), list(filter_shape), *spec.geometry_args())
    try:
        geometry = _core.conv_geometry(*args)
    except ValueError as e:
        raise errors.invalid_argument(str(e)) from None
    if device == "CPU":
        probe.ensure()  # the shipped profile scaled to this host, once
    where = capabilities.of(len(input_shape) - 2, device)
    if not where.registered:
        raise errors.invalid_argument(f"{where.rank}-D convolutions run on the {where.runs_on} "
                                      f"only ({where.gap}): device must be '{where.runs_on}'")
    picked, for_auto, note = tf_rules.tf_kernel(pass_, geometry, spec, dtype, device)
    kernel = kernel or picked
    try:
        core_plan = _core.plan_pass(*args, pass_, dtype, device, algorithm.value, workspace_limit,
                            host.current().threads(),
                            kernel, for_auto == Verdict.TRUSTED, note,
                            tf_rules.tf_runs_onednn(kernel, spec, dtype, device))
    except ValueError as e:
        raise errors.invalid_argument(str(e)) from None
    except RuntimeError as e:
        raise errors.resource_exhausted(str(e)) from None
    return _precision_rule(Plan.from_core(core_plan, geometry, for_auto), algorithm)


# The precision rule. Rounding error per output, relative, measured against
# float64 (float32; ramp, uniform and normal data; 1-D to 3-D; sums of 18 to
# 3969 terms; FFTs of 60 to 40000 points): direct's grows with the square root
# of the terms it sums per output, K (0.2-0.3 x unit roundoff u x sqrt(K) from
# K = 600 on, less below), the FFT's with log2 of its transform size N
# (0.13-0.41 x u x log2(N)). fft is the less precise for certain where its
# smallest factor exceeds direct's largest: 0.13 log2(N) > 0.3 sqrt(K). Nearer
# the line both were measured as precise (4x97x89x6 by 17x13x2x9, stride 2,
# backprop_input: log2(N) 13.1 against sqrt(K) 12.8, fft 1.3e-7, direct 1.9e-7),
# and time decides.
# The FFT's error also differs in kind: it lands on every output and changes
# with any change of any operand, where direct's sums change only in the terms
# that changed. Numerical gradient checks see it as noise over their step: TF's
# 3-D filter gradient check (5x4x3 filter on a 5x4x3 input, K = 120, N = 60 to
# 168) missed its 5e-3 with fft in the forward pass (5.7e-3 to 6.1e-3), though
# that forward's error (5.8e-8) was under tf.nn.conv3d's (7.4e-8); direct gave
# 1.9e-3. Its depthwise float64 checks (K = 16) missed 1e-12 with fft (1.3e-12 to
# 1.8e-12; TF's kernels 4.8e-13 to 8.6e-13). Those are problems of 720 and
# 2560 multiply-adds; on problems under SMALL_PASS_MACS fft can save little
# time on any device, and it is not for auto either.
SMALL_PASS_MACS = 1 << 20
FFT_ROUNDING_LOW, DIRECT_ROUNDING_HIGH = 0.13, 0.3


def summed_terms(pass_, g):
    """K: how many products the pass sums into each of its outputs."""
    if pass_ == Pass.FORWARD:
        return g.filter_d * g.filter_h * g.filter_w * g.filter_in_c
    if pass_ == Pass.BACKPROP_INPUT:  # a stride s uses one tap in s per dimension
        taps = g.filter_d * g.filter_h * g.filter_w * (g.out_c // max(g.groups, 1))
        return max(1, taps // (g.stride_d * g.stride_h * g.stride_w))
    return g.batch * g.out_d * g.out_h * g.out_w


def fft_size(p):
    """N: the points of the pass's FFT, from its CPU plan (Plan.fft_points); None
    where there is none (the GPU's kernel tiles at run time)."""
    return p.fft_points if p.fft.available else None


def fft_less_precise(p):
    """Why the pass's fft is not for auto (see above), or "" where it may be."""
    n, k = fft_size(p), summed_terms(p.pass_, p.geometry)
    if n is not None and (FFT_ROUNDING_LOW * math.log2(max(n, 2))
                          > DIRECT_ROUNDING_HIGH * math.sqrt(k)):
        return (f"fft is less precise than direct here (rounding ~log2 of its {n} points "
                f"against ~sqrt of {k} terms)")
    if p.geometry.macs < SMALL_PASS_MACS:
        return (f"fft's rounding, unlike direct's, moves with every operand, on a problem of "
                f"{p.geometry.macs} multiply-adds")
    return ""


def _precision_rule(p, algorithm):
    """Where fft_less_precise says why and another candidate may run for auto
    (direct, or TF's kernel), fft is not for auto: p.fft.for_auto is False
    (autotune neither times nor picks it) and an estimated choice of fft goes to
    the fastest other one, the reason saying why. On a pass under SMALL_PASS_MACS
    only direct is for auto where it can run: there TF's kernels, too, missed
    TF's own gradient checks (its Conv2D for a one-channel depthwise filter in
    float64: 1.1e-12 to 1.3e-12 against 1e-12; direct 4.2e-13 to 6.2e-13), and the
    time at stake is microseconds. A requested algorithm runs as asked. Returns
    the plan, changed where the rule applies."""
    if not p.fft.available and not p.tf.available:
        return p
    others = [n for n in (Algorithm.TF, Algorithm.DIRECT)
              if p.estimate(n).available and p.estimate(n).fits
              and (n != Algorithm.TF or p.tf_for_auto != Verdict.NEVER)]
    small = p.geometry.macs < SMALL_PASS_MACS and Algorithm.DIRECT in others
    why = fft_less_precise(p) if p.fft.available else ""
    if small:
        why = (f"on a problem of {p.geometry.macs} multiply-adds precision decides: "
               f"direct sums each output in order")
        others = [Algorithm.DIRECT]
        p = p.with_estimate(Algorithm.TF, for_auto=False)
    if not why or not others:
        return p
    p = p.with_estimate(Algorithm.FFT, for_auto=False)
    if algorithm == Algorithm.AUTO and p.chosen not in others:
        usable = [n for n in others if n != Algorithm.TF or p.tf_trusted] or others
        chosen = min(usable, key=lambda n: p.estimate(n).seconds)
        p = p.replace(chosen=chosen, reason=f"auto: {chosen}: {why}; estimates: {p.reason}")
    return p


@contextlib.contextmanager
def planning_only():
    """Within it, and only in the thread (or task) that entered it, decide()
    plans from the estimates alone: nothing is timed or read from autotune's
    cache, and a pass that does not fit its workspace limit is planned without
    one instead of raising. Yields the list of those ResourceExhaustedError
    messages. memory_report traces a model under it."""
    failures = []
    token = _planning_only.set(failures)
    try:
        yield failures
    finally:
        _planning_only.reset(token)


def decide(pass_, input_shape, filter_shape, attrs, dtype, algorithm, workspace_limit,
           device="CPU", autotune=None):
    """plan(), then for "auto" a measured choice where the estimates cannot be trusted.

    autotune: None follows TFBIGCONV_AUTOTUNE (on unless "0"). The result's
    `measured` is {candidate: seconds} when timings decided, else None.
    Inside planning_only(): plan() alone, see there.
    """
    failures = _planning_only.get()
    if failures is not None:
        try:
            return plan(pass_, input_shape, filter_shape, attrs, dtype, algorithm,
                        workspace_limit, device)
        except tf.errors.ResourceExhaustedError as e:
            failures.append(e.message)
            return plan(pass_, input_shape, filter_shape, attrs, dtype, algorithm, 0, device)
    p = plan(pass_, input_shape, filter_shape, attrs, dtype, algorithm, workspace_limit, device)
    if algorithm == Algorithm.AUTO:
        p = tuner.refine(p, input_shape, filter_shape, ConvSpec.of(attrs).tf_attrs(), dtype,
                         device, workspace_limit, enabled=autotune)
    return p


def decide_gradients(input_shape, filter_shape, attrs, dtype, algorithm, workspace_limit,
                     device="CPU", autotune=None):
    """decide() for both gradient passes (dL/dinput, dL/dfilter), which run in
    one step; then, for "auto", autotune.refine_gradients: a pair other than
    TF's two kernels that won pass by pass must win again timed together."""
    plans = [decide(p, input_shape, filter_shape, attrs, dtype, algorithm, workspace_limit,
                    device, autotune) for p in PASSES[1:]]
    if algorithm == Algorithm.AUTO and _planning_only.get() is None:
        plans = tuner.refine_gradients(*plans, input_shape, filter_shape,
                                       ConvSpec.of(attrs).tf_attrs(), dtype, device,
                                       workspace_limit, enabled=autotune)
    return list(plans)


def fused_backward(input_shape, filter_shape, attrs, dtype, device, workspace_limit=0):
    """The plan of the fused FFT backward (BigConv2DBackprop: both gradients of a
    1-D depthwise convolution from one transform of dL/dy, _core.lane_backprop_plan)
    for static 2-D shapes on the CPU, or None where it does not serve the case.
    Used where both gradients are wanted and both are planned as fft."""
    input_shape, filter_shape = static_shape(input_shape), static_shape(filter_shape)
    if device != "CPU" or input_shape is None or filter_shape is None or len(input_shape) != 4:
        return None
    try:
        return _core.lane_backprop_plan(
            input_shape, filter_shape, *ConvSpec.of(attrs).geometry_args(),
            dtype=tf.as_dtype(dtype).name, workspace_limit=workspace_limit,
            workers=host.current().threads())
    except ValueError:  # it says why; the two gradients run on their own
        return None


def log_choice(spec, p):
    """Logs plan `p` of a pass of the op `spec` (a ConvSpec)."""
    how = "measured" if p.measured else "estimated"
    op_name = f"bigconv{spec.spatial}d"
    logging.vlog(1, "%s %s on %s: %s, %s (%s)", op_name, p.pass_, p.device, p.chosen, how,
                 p.reason)


def choose_gradients(in_shape, f_shape, spec, dtype, device, needed=(True, True)):
    """The algorithms of the two gradient passes (dL/dinput, dL/dfilter) of the op
    `spec` (a ConvSpec): planned together (decide_gradients) when shapes
    are static, else the op's. `needed`: which of the two are wanted; one that
    is not is neither planned nor timed (None), and the other is planned alone
    (a frozen filter, or a layer whose input needs no gradient)."""
    in_shape, f_shape = planning_shape(in_shape), static_shape(f_shape)
    if spec.algorithm != Algorithm.AUTO or in_shape is None or f_shape is None:
        return tuple(spec.algorithm if n else None for n in needed)
    args = (in_shape, f_shape, spec, dtype.name, spec.algorithm, spec.workspace_limit_bytes,
            device)
    if all(needed):
        plans = decide_gradients(*args)
    else:
        plans = [decide(p, *args) if n else None for p, n in zip(PASSES[1:], needed)]
    for p in plans:
        if p is not None:
            log_choice(spec, p)
    return tuple(p.chosen if p is not None else None for p in plans)
