"""Two ways to train a fused linear subgraph, and the choice between them.

A linear subgraph (a program, see tfbigconv.fuse) keeps only its input for
backprop in either mode:

  "fused": the kernel is composed from the branch weights on every step
    (steps.compose_program) and one convolution runs (steps.apply_fused). Its cost
    is the fused convolution's, which can be several times the branches' (the
    seed block's 1x1 reduction C -> C/2 folded into its KxK conv makes it C -> C),
    plus the composition.
  "recompute": the branches run as they are (fuse.run_program), under a
    tf.custom_gradient that keeps only the subgraph's input and weights. Its
    backward pass recomputes the tensors that convolutions (and affine maps)
    inside the subgraph read, since their weight gradients need them, and
    nothing else: a linear op's gradient needs only its inputs, so the outputs
    of the terminal convolutions are never recomputed. For the seed block that
    is p = 1x1 conv(x) alone. Cost: the unfused step plus one forward of those
    convolutions.

choose_mode picks the one with the smaller estimated step time, from the
planner's estimates (tfbigconv.explain: the algorithm each pass would get, and
its estimated seconds; a cached autotune measurement where there is one) for
every convolution either mode runs, plus, for "fused", the composition's
multiply-adds at the planner's direct-convolution flop rate, the bias map (the
branches on one zero image) and, for patched borders, the branches on the
border strips. It does not time anything.
"""
import collections
import dataclasses
from typing import Optional, Tuple

import tensorflow as tf

from tfbigconv import _core, host
from tfbigconv.arguments import Pass
from tfbigconv.fusion import algebra, program as steps
from tfbigconv.planning import planner
from tfbigconv.planning.explain import explain

__all__ = ["MODES", "ModeChoice", "FusedConvShape", "recomputed_values", "run_recompute",
           "value_shapes", "fused_conv_shape", "estimate_seconds", "choose_mode"]

MODES = ("auto", "fused", "recompute")

ModeChoice = collections.namedtuple("ModeChoice", "mode reason seconds")
ModeChoice.__doc__ = """mode: "fused" or "recompute"; reason: one line; seconds: {mode:
estimated seconds per step (training: forward and backward; else forward)}."""


def recomputed_values(program):
    """The intermediate values (step indices) recompute mode recomputes in backward: those
    a live convolution or affine map reads (their weight gradients need them)."""
    live = steps.live_values(program, [len(program)])
    return sorted({program[i - 1]["src"] for i in live
                   if i and program[i - 1]["op"] in ("conv", "affine")} - {0})


def run_recompute(x, program, weights, algorithm="auto", workspace_limit=0):
    """The program run branch-wise on x, keeping only x and the weights for backprop
    (see the module doc). weights: {name: tensor or variable}."""
    names = sorted(weights)

    @tf.custom_gradient
    def subgraph(x, *values):
        y = steps.run_program(program, dict(zip(names, values)), x, algorithm, workspace_limit)

        def grad(dy):  # closes over x and the weights only
            dx, dw = _backprop(program, dict(zip(names, values)), x, dy, algorithm,
                               workspace_limit)
            return [dx] + [dw[name] for name in names]

        return y, grad

    return subgraph(x, *[tf.convert_to_tensor(weights[name]) for name in names])


def _backprop(program, weights, x, dy, algorithm, workspace_limit):
    """(dL/dx, {weight name: dL/dweight}) for the program's output gradient dy."""
    values = steps.run_values(program, weights, x, recomputed_values(program), algorithm,
                              workspace_limit)
    return steps.backprop(program, weights, values, x, dy, algorithm, workspace_limit)


# ----- shapes and estimates ------------------------------------------------------------

def _filter_shape(step, weight_shapes):
    """A conv step's filter shape as bigconv2d sees it, and its groups."""
    kh, kw, a, b = weight_shapes[step["kernel"]]
    if step["depthwise"]:
        return (kh, kw, 1, a * b), a
    return (kh, kw, a, b), step["groups"]


def value_shapes(program, weight_shapes, in_size, channels):
    """(height, width, channels) of every value of the program (0: its input)."""
    return steps.value_shapes(program, weight_shapes, in_size, channels)


@dataclasses.dataclass(frozen=True)
class FusedConvShape:
    """What fused mode runs, without its weights: the fused convolution's filter shape,
    strides, input padding (top, bottom, left, right; negative: cropped), whether a
    bias map and border strips (border_strips: ((top, bottom, rows), (left, right,
    cols))) are needed, and the composition's multiply-adds."""
    filter_shape: Tuple[int, int, int, int]
    strides: Tuple[int, int]
    pads: Tuple[int, int, int, int]
    out_size: Tuple[int, int]
    bias_map: bool
    strips: Optional[tuple]
    compose_macs: int


def fused_conv_shape(program, weight_shapes, in_size, channels):
    """FusedConvShape of the program, or None where it cannot be fused. The composition
    is traced in a scratch graph that never runs, so it costs no arithmetic."""
    with tf.Graph().as_default():
        weights = {k: tf.zeros(shape, tf.float32) for k, shape in weight_shapes.items()}
        try:
            m = steps.compose_program(program, weights, tuple(in_size), channels,
                                     patch_borders=True)
        except algebra.NotFusable:
            return None
        return FusedConvShape(
            filter_shape=tuple(int(d) for d in m.kernel.shape), strides=m.strides,
            pads=algebra.fused_padding(m), out_size=m.out_size,
            bias_map=m.bias_padded and not m.patched,
            strips=algebra.border_strips(m) if m.patched else None, compose_macs=m.compose_macs)


def _conv_seconds(input_shape, filter_shape, strides, pads, dilations, passes, algorithm,
                  workspace_limit):
    """The planner's estimate (or cached measurement) for these passes of one conv."""
    t, b, l, r = pads
    try:
        e = explain(list(input_shape), list(filter_shape), strides=list(strides),
                    padding=[[0, 0], [t, b], [l, r], [0, 0]], dilations=list(dilations),
                    algorithm=algorithm, budget=workspace_limit or None,
                    device=host.resolve_device())
    except tf.errors.OpError:  # e.g. a forced algorithm that does not fit
        return float("inf")
    return sum(row.measured_seconds if row.measured_seconds is not None else row.seconds
               for row in e.rows if row.chosen and row.pass_ in passes)


def _passes(training):
    return planner.PASSES if training else (Pass.FORWARD,)


def _branch_seconds(program, weight_shapes, in_size, channels, batch, training, algorithm,
                    workspace_limit):
    """Estimated seconds of the program run branch-wise (recompute mode) on `batch`
    images of in_size."""
    shapes = value_shapes(program, weight_shapes, in_size, channels)
    live = steps.live_values(program, [len(program)])
    again = steps.live_values(program, recomputed_values(program)) if training else set()
    total = 0.0
    for i, step in enumerate(program, 1):
        if step["op"] != "conv" or i not in live:
            continue
        h, w, c = shapes[step["src"]]
        f, _ = _filter_shape(step, weight_shapes)
        pads = steps.conv_pads(step, (h, w), f[:2])
        passes = _passes(training) + ((Pass.FORWARD,) if i in again else ())
        for p in set(passes):
            total += passes.count(p) * _conv_seconds(
                (batch, h, w, c), f, step["strides"], pads, step["dilations"], (p,), algorithm,
                workspace_limit)
    return total


def estimate_seconds(program, weight_shapes, in_size, channels, batch, training=True,
                     algorithm="auto", workspace_limit=0, fused_shape=None):
    """{"recompute": s, "fused": s (absent where it cannot be fused)}: estimated seconds per
    step (training: forward and backward) for `batch` images; see the module doc."""
    weight_shapes = {k: tuple(int(d) for d in v) for k, v in dict(weight_shapes).items()}
    args = (program, weight_shapes, tuple(in_size), int(channels))
    seconds = {"recompute": _branch_seconds(*args, batch, training, algorithm, workspace_limit)}
    fs = fused_shape or fused_conv_shape(*args)
    if fs is None:
        return seconds
    (h, w), (t, b, l, r) = in_size, fs.pads
    h, w = h - max(-t, 0) - max(-b, 0), w - max(-l, 0) - max(-r, 0)  # cropped
    s = _conv_seconds((batch, h, w, channels), fs.filter_shape, fs.strides,
                      tuple(max(p, 0) for p in fs.pads), (1, 1), _passes(training), algorithm,
                      workspace_limit)
    model = dict(zip(_core.cost_model_fields(), _core.get_cost_model()))
    s += 2 * fs.compose_macs * (3 if training else 1) / model["direct_flops_per_second"]
    if fs.bias_map:  # the branches on one zero image, and their weight gradients
        s += _branch_seconds(*args, 1, training, algorithm, workspace_limit)
    if fs.strips:  # the branches on full-height and full-width strips of K + 1
        (_, _, rows), (_, _, cols) = fs.strips
        for size in ((rows, in_size[1]), (in_size[0], cols)):
            s += _branch_seconds(program, weight_shapes, size, channels, 2 * batch, training,
                                 algorithm, workspace_limit)
    seconds["fused"] = s
    return seconds


def choose_mode(program, weight_shapes, in_size, channels, batch=None, training=True,
                algorithm="auto", workspace_limit=0, fused_shape=None):
    """ModeChoice: the mode with the smaller estimated step time (estimate_seconds) for
    `batch` images (None: planner.ASSUMED_BATCH, as the planner assumes)."""
    batch = batch or planner.ASSUMED_BATCH
    seconds = estimate_seconds(program, weight_shapes, in_size, channels, batch, training,
                               algorithm, workspace_limit, fused_shape)
    what = "training step" if training else "forward pass"
    if "fused" not in seconds:
        return ModeChoice("recompute", "the subgraph cannot be fused exactly", seconds)
    mode = min(seconds, key=seconds.get)
    other = "fused" if mode == "recompute" else "recompute"
    reason = (f"est. {what} {seconds[mode] * 1e3:.3g} ms {mode} vs {seconds[other] * 1e3:.3g} "
              f"ms {other} at batch {batch} (planner estimates)")
    return ModeChoice(mode, reason, seconds)
