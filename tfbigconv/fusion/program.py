"""A linear subgraph as a program of steps, and what can be done with one.

A program is a list of steps; value 0 is the subgraph input and step i makes
value i + 1; the last value is the output. Steps are plain dicts (JSON-able:
FusedLinearConv keeps them in its config):
  {"op": "conv", "src": v, "kernel": name, "bias": name or None, "groups": g,
   "depthwise": bool, "strides": [sh, sw], "dilations": [dh, dw],
   "padding": "same" | "valid" | [top, bottom, left, right]}
     kernel: Keras' shape (Conv2D [kh, kw, cin/g, cout], DepthwiseConv2D
     [kh, kw, cin, multiplier] when depthwise)
  {"op": "pad", "src": v, "pads": [top, bottom, left, right]}
  {"op": "add" | "subtract" | "concat", "srcs": [v, ...]}
  {"op": "affine", "src": v, "scale": name, "shift": name}
Weights are looked up by name in a dict.

Each op is one Step object (STEPS) that knows, for its dict, its sources, its
output shape, its LinearMap (compose), how to run it, and its backprop; the
functions below walk a program through them.
"""
import dataclasses

import tensorflow as tf

from tfbigconv import _core, arguments, host
from tfbigconv.arguments import Algorithm
from tfbigconv.fusion import algebra
from tfbigconv.ops.conv2d import bigconv2d
from tfbigconv.planning import candidates, planner


def conv_kernel(step, weights):
    """A conv step's kernel as bigconv2d takes it, and its groups."""
    kernel = weights[step["kernel"]]
    if step["depthwise"]:
        kh, kw, c, mult = kernel.shape
        return tf.reshape(kernel, (kh, kw, 1, c * mult)), int(c)
    return kernel, step["groups"]


def conv_pads(step, size, kernel_size):
    """A conv step's (top, bottom, left, right) padding on an input of `size`."""
    padding = step["padding"]
    if padding == "valid":
        return (0, 0, 0, 0)
    if padding == "same":
        return algebra.same_pads(size, kernel_size, step["strides"], step["dilations"])
    return tuple(padding)


def conv_padding(step):
    """A conv step's padding in bigconv2d's form."""
    padding = step["padding"]
    if isinstance(padding, str):
        return padding.upper()
    t, b, l, r = padding
    return [[0, 0], [t, b], [l, r], [0, 0]]


def _conv_spec(step, algorithm, workspace_limit):
    """bigconv2d's ConvSpec for a conv step (without its operands)."""
    return arguments.parse_attrs(2, list(step["strides"]), conv_padding(step), "NHWC",
                                 list(step["dilations"])).replace(
        algorithm=arguments.requested_algorithm(algorithm),
        workspace_limit_bytes=int(workspace_limit))


@dataclasses.dataclass
class Backprop:
    """What a step's backprop reads and writes: the forward values (those it
    needs), the weights, every value's channels, send(value, gradient) and
    weight_grad(name, gradient)."""
    values: list
    weights: dict
    channels: list
    send: object
    weight_grad: object
    algorithm: str
    workspace_limit: int


class Step:
    """One op of a program; subclasses implement each method for their dicts."""

    def srcs(self, step):
        return [step["src"]]

    def shape(self, step, shapes, weight_shapes):
        """(height, width, channels) of the step's output, from its sources'."""
        return shapes[step["src"]]

    def channels(self, step, channels, weights):
        return channels[step["src"]]

    def compose(self, step, maps, weights, patch_borders):
        """(LinearMap of the output, multiply-adds the composition costs)."""
        raise NotImplementedError

    def run(self, step, values, weights, algorithm, workspace_limit):
        raise NotImplementedError

    def backprop(self, step, g, b):
        raise NotImplementedError


class ConvStep(Step):
    def shape(self, step, shapes, weight_shapes):
        h, w, c = shapes[step["src"]]
        kh, kw, a, b = weight_shapes[step["kernel"]]
        f = (kh, kw, 1, a * b) if step["depthwise"] else (kh, kw, a, b)
        t, bottom, l, r = conv_pads(step, (h, w), (kh, kw))
        (sh, sw), (dh, dw) = step["strides"], step["dilations"]
        g = _core.conv_geometry([1, h, w, c], [int(d) for d in f], [1, sh, sw, 1], "EXPLICIT",
                                [0, 0, t, bottom, l, r, 0, 0], "NHWC", [1, dh, dw, 1])
        return tuple(g.output_shape[1:])

    def channels(self, step, channels, weights):
        return int(conv_kernel(step, weights)[0].shape[-1])

    def compose(self, step, maps, weights, patch_borders):
        kernel, groups = conv_kernel(step, weights)
        m = maps[step["src"]]
        m = algebra.pad(m, conv_pads(step, m.out_size, kernel.shape[:2]), patch_borders)
        bias = weights[step["bias"]] if step["bias"] else None
        (kh, kw, ci, co), (dh, dw) = kernel.shape, step["dilations"]
        macs = algebra.composition_macs(m.kernel.shape, m.groups, m.strides,
                                        ((kh - 1) * dh + 1, (kw - 1) * dw + 1, ci, co), groups)
        return algebra.convolve(m, kernel, groups, tuple(step["strides"]),
                                tuple(step["dilations"]), bias), macs

    def run(self, step, values, weights, algorithm, workspace_limit):
        kernel, _ = conv_kernel(step, weights)
        src = values[step["src"]]
        kernel = tf.cast(kernel, src.dtype)
        y = bigconv2d(src, kernel, strides=list(step["strides"]), padding=conv_padding(step),
                      dilations=list(step["dilations"]), algorithm=algorithm,
                      workspace_limit=workspace_limit)
        if step["bias"]:
            y = y + tf.cast(weights[step["bias"]], y.dtype)
        return y

    def backprop(self, step, g, b):
        # The same passes, planned the same way, as bigconv2d's registered gradient.
        src = b.values[step["src"]]
        kernel, _ = conv_kernel(step, b.weights)
        kernel = tf.cast(kernel, src.dtype)
        spec = _conv_spec(step, b.algorithm, b.workspace_limit).with_operands(src.shape,
                                                                               kernel.shape)
        device = (host.resolve_device(src) if spec.algorithm in (Algorithm.AUTO, Algorithm.TF)
                  else None)
        chosen = planner.choose_gradients(src.shape, kernel.shape, spec, src.dtype, device)
        dsrc, dkernel = candidates.gradients(src, kernel, g, spec, chosen, device)
        b.send(step["src"], dsrc)
        w = b.weights[step["kernel"]]
        b.weight_grad(step["kernel"], tf.cast(tf.reshape(dkernel, w.shape), w.dtype))
        if step["bias"]:
            b.weight_grad(step["bias"], tf.cast(tf.reduce_sum(g, (0, 1, 2)),
                                                b.weights[step["bias"]].dtype))


class PadStep(Step):
    def shape(self, step, shapes, weight_shapes):
        h, w, c = shapes[step["src"]]
        t, b, l, r = step["pads"]
        return (h + t + b, w + l + r, c)

    def compose(self, step, maps, weights, patch_borders):
        return algebra.pad(maps[step["src"]], tuple(step["pads"]), patch_borders), 0

    def run(self, step, values, weights, algorithm, workspace_limit):
        t, b, l, r = step["pads"]
        return tf.pad(values[step["src"]], [[0, 0], [t, b], [l, r], [0, 0]])

    def backprop(self, step, g, b):
        t, bottom, l, r = step["pads"]
        h, w = (tf.shape(g)[i] if g.shape[i] is None else g.shape[i] for i in (1, 2))
        b.send(step["src"], g[:, t:h - bottom, l:w - r])


class SumStep(Step):
    """add (signs None) and subtract (signs [1, -1])."""

    def __init__(self, signs=None):
        self.signs = signs

    def srcs(self, step):
        return list(step["srcs"])

    def shape(self, step, shapes, weight_shapes):
        return shapes[step["srcs"][0]]

    def channels(self, step, channels, weights):
        return channels[step["srcs"][0]]

    def compose(self, step, maps, weights, patch_borders):
        return algebra.add([maps[v] for v in step["srcs"]], self.signs), 0

    def run(self, step, values, weights, algorithm, workspace_limit):
        if self.signs is None:
            return tf.add_n([values[v] for v in step["srcs"]])
        a, b = step["srcs"]
        return values[a] - values[b]

    def backprop(self, step, g, b):
        for v, sign in zip(step["srcs"], self.signs or [1] * len(step["srcs"])):
            b.send(v, g if sign > 0 else -g)


class ConcatStep(Step):
    def srcs(self, step):
        return list(step["srcs"])

    def shape(self, step, shapes, weight_shapes):
        h, w, _ = shapes[step["srcs"][0]]
        return (h, w, sum(shapes[v][2] for v in step["srcs"]))

    def channels(self, step, channels, weights):
        return sum(channels[v] for v in step["srcs"])

    def compose(self, step, maps, weights, patch_borders):
        return algebra.concat([maps[v] for v in step["srcs"]]), 0

    def run(self, step, values, weights, algorithm, workspace_limit):
        return tf.concat([values[v] for v in step["srcs"]], axis=-1)

    def backprop(self, step, g, b):
        sizes = [b.channels[v] for v in step["srcs"]]
        for v, part in zip(step["srcs"], tf.split(g, sizes, axis=-1)):
            b.send(v, part)


class AffineStep(Step):
    def compose(self, step, maps, weights, patch_borders):
        return algebra.affine(maps[step["src"]], weights[step["scale"]],
                              weights[step["shift"]]), 0

    def run(self, step, values, weights, algorithm, workspace_limit):
        src = values[step["src"]]
        return src * tf.cast(weights[step["scale"]], src.dtype) + tf.cast(
            weights[step["shift"]], src.dtype)

    def backprop(self, step, g, b):
        src = b.values[step["src"]]
        scale, shift = b.weights[step["scale"]], b.weights[step["shift"]]
        b.send(step["src"], g * tf.cast(scale, g.dtype))
        b.weight_grad(step["scale"], tf.cast(tf.reduce_sum(g * src, (0, 1, 2)), scale.dtype))
        b.weight_grad(step["shift"], tf.cast(tf.reduce_sum(g, (0, 1, 2)), shift.dtype))


STEPS = {"conv": ConvStep(), "pad": PadStep(), "add": SumStep(), "subtract": SumStep([1, -1]),
         "concat": ConcatStep(), "affine": AffineStep()}


def step_of(step):
    """The Step object of a step dict; ValueError for an unknown op."""
    try:
        return STEPS[step["op"]]
    except KeyError:
        raise ValueError(f"unknown program step {step['op']!r}") from None


def compose_program(program, weights, in_size, channels, dtype=tf.float32, patch_borders=False):
    """The LinearMap of a program's output (see above); raises NotFusable saying why.

    patch_borders: where a padding is not exact, mark the map `patched` instead of
    refusing (stride 1 only: then the border outputs can be taken from the unfused
    program on strips of the input, see algebra.border_strips)."""
    maps = [algebra.identity(channels, in_size, dtype)]
    macs = 0
    for step in program:
        m, cost = step_of(step).compose(step, maps, weights, patch_borders)
        maps.append(m)
        macs += cost
    m = dataclasses.replace(maps[-1], compose_macs=macs)
    if m.patched and m.strides != (1, 1):
        raise algebra.NotFusable(
            f"zero padding of intermediate tensors that the fused kernel does not reproduce, "
            f"and strides {m.strides}: border patching needs stride 1")
    return m


def live_values(program, targets):
    """The values (0 = input, i = step i's output) that `targets` depend on, targets included."""
    live = set(targets)
    for i in range(len(program), 0, -1):
        if i in live:
            step = program[i - 1]
            live.update(step_of(step).srcs(step))
    return live


def run_values(program, weights, x, targets, algorithm="auto", workspace_limit=0):
    """Runs only the steps `targets` (value indices) depend on; returns every value,
    None for those not computed."""
    live = live_values(program, targets)
    values = [x]
    for i, step in enumerate(program, 1):
        values.append(step_of(step).run(step, values, weights, algorithm, workspace_limit)
                      if i in live else None)
    return values


def run_program(program, weights, x, algorithm="auto", workspace_limit=0):
    """Runs the program unfused on x (NHWC): the reference the fused conv must equal.
    Steps the output does not depend on are skipped (on a border strip they might
    not even fit). algorithm, workspace_limit: for its convolutions (bigconv2d's)."""
    return run_values(program, weights, x, [len(program)], algorithm, workspace_limit)[-1]


def value_shapes(program, weight_shapes, in_size, channels):
    """(height, width, channels) of every value of the program (0: its input)."""
    shapes = [tuple(in_size) + (channels,)]
    for step in program:
        shapes.append(step_of(step).shape(step, shapes, weight_shapes))
    return shapes


def value_channels(program, weights, channels):
    """Every value's channels (what concat's gradient splits by)."""
    out = [channels]
    for step in program:
        out.append(step_of(step).channels(step, out, weights))
    return out


def backprop(program, weights, values, x, dy, algorithm="auto", workspace_limit=0):
    """(dL/dx, {weight name: dL/dweight}) for the program's output gradient dy,
    given the forward `values` the steps' backprops read (run_values)."""
    grads = {len(program): [dy]}
    wgrads = {name: [] for name in weights}
    b = Backprop(values, weights, value_channels(program, weights, int(x.shape[-1])),
                 lambda v, g: grads.setdefault(v, []).append(g),
                 lambda name, g: wgrads[name].append(g), algorithm, workspace_limit)
    for i in range(len(program), 0, -1):
        if i in grads:
            step = program[i - 1]
            step_of(step).backprop(step, tf.add_n(grads.pop(i)), b)
    dx = tf.add_n(grads[0]) if 0 in grads else tf.zeros_like(x)
    return dx, {name: tf.add_n(gs) if gs else tf.zeros_like(weights[name])
                for name, gs in wgrads.items()}


def bias_map(program, weights, in_size, channels, dtype=tf.float32):
    """The program's exact affine part, out_size x out_size x out_channels: its output on
    a zero input (a linear map is zero there)."""
    zeros = tf.zeros((1,) + tuple(in_size) + (channels,), dtype)
    return run_program(program, weights, zeros)[0]


def apply_fused(x, m, bias=None, algorithm="auto", workspace_limit=0, program=None,
                weights=None):
    """Runs the fused map on x (NHWC): pad (or crop), one bigconv2d, then the bias
    (a vector, or a bias_map output broadcast over the batch). A patched map needs
    its program and weights: its border rows and columns come from the unfused
    program on strips of x (algebra.border_strips)."""
    if m.patched:
        return _apply_patched(x, m, bias, algorithm, workspace_limit, program, weights)
    top, bottom, left, right = algebra.fused_padding(m)
    if min(top, bottom, left, right) < 0:
        h, w = x.shape[1], x.shape[2]
        x = x[:, max(-top, 0):h - max(-bottom, 0), max(-left, 0):w - max(-right, 0)]
        top, bottom, left, right = (max(v, 0) for v in (top, bottom, left, right))
    kernel = tf.cast(m.kernel, x.dtype)
    y = bigconv2d(x, kernel, strides=list(m.strides),
                  padding=[[0, 0], [top, bottom], [left, right], [0, 0]],
                  algorithm=algorithm, workspace_limit=workspace_limit)
    if bias is not None:
        y = y + tf.cast(bias, y.dtype)
    return y


def _apply_patched(x, m, bias, algorithm, workspace_limit, program, weights):
    if program is None or weights is None:
        raise ValueError("apply_fused: a patched map needs its program and weights")
    unpatched = dataclasses.replace(m, patched=False)
    (top, bottom, rows), (left, right, cols) = algebra.border_strips(m)
    (h, w), (oh, ow) = m.in_size, m.out_size
    if top >= bottom or left >= right or rows >= h or cols >= w:
        return run_program(program, weights, x)  # the strips would cover it all
    y = apply_fused(x, unpatched, bias, algorithm, workspace_limit)
    if left or right < ow:  # columns first, from full-height strips
        parts = [run_program(program, weights, x[:, :, :cols])[:, :, :left], y[:, :, left:right]]
        if right < ow:
            parts.append(run_program(program, weights, x[:, :, w - cols:])[:, :, right - (w - cols):])
        y = tf.concat(parts, axis=2)
    if top or bottom < oh:
        parts = [run_program(program, weights, x[:, :rows])[:, :top], y[:, top:bottom]]
        if bottom < oh:
            parts.append(run_program(program, weights, x[:, h - rows:])[:, bottom - (h - rows):])
        y = tf.concat(parts, axis=1)
    return y
