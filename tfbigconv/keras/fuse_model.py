"""fuse_linear: replace linear subgraphs of a Keras model (Keras 3 or tf_keras) by
one large-kernel convolution. The kernel algebra is tfbigconv.fusion; this module
reads the model's graph and rebuilds it in the model's flavour (flavours.py)."""
import dataclasses
from typing import List, Optional, Tuple

import numpy as np
import tensorflow as tf

from tfbigconv import timer
from tfbigconv.fusion import algebra, program as steps
from tfbigconv.keras import flavours
from tfbigconv.keras.base import check_options
from tfbigconv.keras.fused import check_mode


class _Kinds:
    """The layer classes fuse_linear reads, in one Keras flavour."""

    def __init__(self, flavour):
        L, big = flavour.keras.layers, flavour.layers
        self.convs = (L.Conv2D, big.BigConv2D)
        self.depthwise = (L.DepthwiseConv2D, big.BigDepthwiseConv2D)
        self.merges = {L.Add: "add", L.Subtract: "subtract", L.Concatenate: "concat"}
        self.pad, self.batchnorm = L.ZeroPadding2D, L.BatchNormalization
        self.concat = L.Concatenate
        # Convolutions of other ranks: fuse_linear composes 2-D kernels only, and
        # reports chains of these as refused.
        self.other_ranks = (L.Conv1D, L.Conv3D, L.DepthwiseConv1D, big.BaseDepthwiseConv)
        self.linear = flavour.keras.activations.linear


@dataclasses.dataclass
class SubgraphReport:
    """What fuse_linear did with one linear subgraph.

    layers: the merged layers' names, in order. status: "fused" or "refused"
    (then `reason` says why and the layers are kept as they were).
    kernel_size, groups, strides: the fused convolution's. bias: "none",
    "vector" or "map" (a bias map: biases met zero padding, so the exact bias
    varies near the borders; FusedBiasMap adds it). exact: how borders are
    exact ("borders exact: ..." or "borders patched: ..."). macs_before/after: multiply-adds per image of the direct
    convolutions. kept_bytes_before/after: bytes per image of the distinct
    tensors the convolutions keep for backprop (float32). seconds_before/after:
    measured forward time of the subgraph on `measure` images (None unless
    measured). mode: how a FusedLinearConv runs it ("fused" or "recompute", see
    tfbigconv.fuse_train; "" where the subgraph became a plain BigConv2D), with
    mode_reason (for "auto": the estimated step times, for the model's batch
    size or 32 images) and mode_seconds ({mode: estimated seconds}).
    """
    layers: List[str]
    status: str
    reason: str = ""
    kernel_size: Optional[Tuple[int, int]] = None
    groups: Optional[int] = None
    strides: Optional[Tuple[int, int]] = None
    bias: str = "none"
    exact: str = ""
    macs_before: int = 0
    macs_after: int = 0
    kept_bytes_before: int = 0
    kept_bytes_after: int = 0
    seconds_before: Optional[float] = None
    seconds_after: Optional[float] = None
    mode: str = ""
    mode_reason: str = ""
    mode_seconds: dict = dataclasses.field(default_factory=dict)

    def __str__(self):
        head = f"{'+'.join(self.layers)}: {self.status}"
        if self.status != "fused":
            return f"{head} ({self.reason})"
        text = (f"{head} into {self.kernel_size[0]}x{self.kernel_size[1]} groups={self.groups} "
                f"strides={self.strides}, bias {self.bias}; {self.exact}; MACs/image "
                f"{self.macs_before:,} -> {self.macs_after:,}; kept for backprop/image "
                f"{self.kept_bytes_before:,} -> {self.kept_bytes_after:,} B")
        if self.seconds_before is not None:
            text += f"; measured {self.seconds_before * 1e3:.2f} -> {self.seconds_after * 1e3:.2f} ms"
        if self.mode:
            text += f"; runs in {self.mode} mode ({self.mode_reason})"
        return text


def _is_linear(layer, trainable, kinds):
    """Whether the layer is one fuse_linear can merge (and, if not, nothing)."""
    t = type(layer)
    if t in kinds.convs or t in kinds.depthwise:
        return (layer.data_format == "channels_last"
                and layer.activation is kinds.linear
                and layer.compute_dtype == "float32"
                and not (trainable and _has_regularizer_or_constraint(layer)))
    if t in kinds.merges:
        return t is not kinds.concat or layer.axis in (-1, 3)
    if t is kinds.pad:
        return layer.data_format == "channels_last"
    if t is kinds.batchnorm:  # inference only: a fixed affine map
        axis = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
        return not trainable and list(axis) in ([-1], [3])
    return False


OTHER_RANK_REASON = ("fuse_linear composes 2-D convolutions only; these 1-D or 3-D "
                     "convolutions are kept as they are")


def _other_rank_chains(graph):
    """Chains of at least two linear 1-D or 3-D convolutions, each reading only the
    previous one's output: what fuse_linear would merge in 2-D."""
    kinds = graph.kinds

    def linear_other(node):
        layer = node.layer
        return (isinstance(layer, kinds.other_ranks) and not isinstance(layer, kinds.depthwise)
                and layer.activation is kinds.linear)
    chains, seen = [], set()
    for node in graph.nodes:
        if not linear_other(node) or id(node) in seen:
            continue
        chain = [node]
        while True:
            users = graph.consumers.get(id(chain[-1].outputs[0]), [])
            if len(users) != 1 or not linear_other(users[0]) or \
                    len(users[0].inputs) != 1:
                break
            chain.append(users[0])
        seen.update(id(n) for n in chain)
        if len(chain) >= 2:
            chains.append(chain)
    return chains


def _has_regularizer_or_constraint(layer):
    """FusedLinearConv does not carry these over, so training would differ."""
    return any(v is not None for k, v in layer.get_config().items()
               if k.endswith(("_regularizer", "_constraint")))


class _Graph:
    """The model's layer calls (flavours.Call), in execution order, with who consumes
    each tensor, and the flavour's layer classes."""

    def __init__(self, flavour, functional):
        self.kinds = _Kinds(flavour)
        self.nodes = flavour.calls(functional)
        self.consumers = {}
        for node in self.nodes:
            for t in node.inputs:
                self.consumers.setdefault(id(t), []).append(node)
        self.outputs = {id(t) for t in functional.outputs}
        self.producer = {id(t): node for node in self.nodes for t in node.outputs}


def _regions(graph, trainable):
    """Yields (input tensor, [nodes in order]) for maximal linear subgraphs with one input
    and one output, and (None, nodes, reason) for ones that cannot be cut out."""
    uses = {}
    for node in graph.nodes:
        uses[id(node.layer)] = uses.get(id(node.layer), 0) + 1
    kinds = graph.kinds
    linear = {id(n) for n in graph.nodes
              if uses[id(n.layer)] == 1 and _is_linear(n.layer, trainable, kinds)}
    claimed = set()
    for start in graph.nodes:  # every tensor a node reads, in execution order
        for t in start.inputs:
            region, inside = [], {id(t)}
            for node in graph.nodes:  # closure: linear nodes reading only t and the region
                if (id(node) in linear and id(node) not in claimed
                        and all(id(x) in inside for x in node.inputs)):
                    region.append(node)
                    inside.update(id(x) for x in node.outputs)
            if not any(isinstance(n.layer, kinds.convs + kinds.depthwise) for n in region):
                continue
            picked = _one_output(graph, region)
            if picked is None:
                claimed.update(id(n) for n in region)
                yield None, region, "its tensors are used outside it in several places"
                continue
            if len(picked) >= 2:
                claimed.update(id(n) for n in picked)
                yield t, picked, ""


def _one_output(graph, region):
    """The largest part of region (an output and its ancestors in the region) whose
    intermediate tensors are used only inside it; None if there is none."""
    ids = {id(n) for n in region}
    candidates = []
    for node in region:
        part = _ancestors(graph, node, ids)
        made = {id(x) for n in part for x in n.outputs}
        part_ids = {id(n) for n in part}
        out = node.outputs[0]
        escapes = any(
            tid != id(out) and (tid in graph.outputs or any(
                id(c) not in part_ids for c in graph.consumers.get(tid, [])))
            for tid in made)
        if not escapes:
            candidates.append(part)
    return max(candidates, key=len) if candidates else None


def _ancestors(graph, node, ids):
    seen, stack = {}, [node]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen[id(n)] = n
        for x in n.inputs:
            p = graph.producer.get(id(x))
            if p is not None and id(p) in ids:
                stack.append(p)
    return [n for n in graph.nodes if id(n) in seen]  # in execution order


def _program(input_tensor, nodes, flavour, kinds):
    """(program, weights as float64 numpy, trainable weights' names)."""
    value = {id(input_tensor): 0}
    program, weights, variables = [], {}, []

    def src(t):
        return value[id(t)]

    for node in nodes:
        layer = node.layer
        ins = node.inputs
        if isinstance(layer, kinds.convs + kinds.depthwise):
            depthwise = isinstance(layer, kinds.depthwise)
            kname = f"{layer.name}_kernel"
            weights[kname] = getattr(layer, flavour.depthwise_kernel if depthwise else "kernel")
            variables.append(kname)
            bname = None
            if layer.use_bias:
                bname = f"{layer.name}_bias"
                weights[bname] = layer.bias
                variables.append(bname)
            program.append(dict(op="conv", src=src(ins[0]), kernel=kname, bias=bname,
                                groups=1 if depthwise else layer.groups, depthwise=depthwise,
                                strides=list(layer.strides), dilations=list(layer.dilation_rate),
                                padding=layer.padding))
        elif isinstance(layer, kinds.pad):
            (t, b), (l, r) = layer.padding
            program.append(dict(op="pad", src=src(ins[0]), pads=[t, b, l, r]))
        elif isinstance(layer, kinds.batchnorm):
            scale, shift = algebra.batchnorm_affine(
                layer.gamma if layer.scale else None, layer.beta if layer.center else None,
                layer.moving_mean, layer.moving_variance, layer.epsilon)
            weights[f"{layer.name}_scale"], weights[f"{layer.name}_shift"] = scale, shift
            program.append(dict(op="affine", src=src(ins[0]), scale=f"{layer.name}_scale",
                                shift=f"{layer.name}_shift"))
        else:
            program.append(dict(op=kinds.merges[type(layer)], srcs=[src(x) for x in ins]))
        value[id(node.outputs[0])] = len(program)
    weights = {k: np.asarray(tf.convert_to_tensor(v), np.float64) for k, v in weights.items()}
    return program, weights, variables


def _estimates(program, nodes, weights, in_size, channels, m):
    """(macs before, after, kept bytes before, after) per image."""
    sizes = [tuple(in_size) + (channels,)] + [tuple(n.outputs[0].shape[1:]) for n in nodes]
    macs, kept = 0, set()
    for i, step in enumerate(program):
        if step["op"] == "conv":
            kh, kw, cin_g, _ = weights[step["kernel"]].shape
            macs += int(np.prod(sizes[i + 1])) * kh * kw * (1 if step["depthwise"] else cin_g)
            kept.add(step["src"])
    kept_before = sum(4 * int(np.prod(sizes[v])) for v in kept)
    kh, kw = m.kernel_size
    macs_after = m.out_size[0] * m.out_size[1] * m.out_channels * kh * kw * int(m.kernel.shape[2])
    return macs, macs_after, kept_before, 4 * int(np.prod(sizes[0]))


def _time(fn, x, reps=3):
    """The fastest of `reps` calls of fn(x), after a warm-up call."""
    return min(timer.calls_seconds(lambda: fn(x), reps))


def fuse_linear(model, trainable=False, *, max_mac_ratio=None, measure=0, algorithm="auto",
                workspace_limit=0, mode="auto"):
    """Returns (fused_model, reports): `model` with each linear subgraph as one convolution.

    A linear subgraph is a connected set of layers, reading one tensor and
    producing one, made of Conv2D, DepthwiseConv2D, BigConv2D and
    BigDepthwiseConv2D without activation (channels_last, float32), Add,
    Subtract, Concatenate on channels, ZeroPadding2D and, when not
    `trainable`, BatchNormalization (in inference: its moving statistics);
    each layer called once. Its intermediate tensors may not be used outside
    it. The whole subgraph is one affine map, computed as one convolution of
    the composed kernel (size d1 (K1 - 1) + s1 d2 (K2 - 1) + 1 for a chain,
    the largest for branches), only where that is exact at every output
    position, borders included (see tfbigconv.fuse). Where the kernel cannot
    reproduce an intermediate zero padding (e.g. a chain of SAME convs) and
    every stride is 1, the outputs near the borders are computed by the
    original layers on strips of the input (a FusedLinearConv, also for
    inference); otherwise the subgraph is kept as it was and its report says
    why.

    Args:
      model: a built Functional or Sequential Keras model, Keras 3 or tf_keras,
        with static input height and width (the border checks and bias maps
        depend on them). A tf_keras model gives a tf_keras model whose new
        layers are those of `tfbigconv.keras.keras2`.
      trainable: False: each subgraph becomes ZeroPadding2D (when needed) +
        BigConv2D with the composed kernel [+ FusedBiasMap], for inference.
        True: a FusedLinearConv layer that keeps the original weights as its
        variables, so training updates the same parameters as the unfused
        model, and keeps only its input for backprop (BatchNormalization is
        then not merged, since in training it uses batch statistics).
      mode: how each FusedLinearConv runs: "fused" (the kernel composed on
        every call, one convolution), "recompute" (the original convolutions;
        backprop recomputes the intermediates they read) or "auto" (the one
        with the smaller estimated step time; the report says which and why).
        See tfbigconv.fuse_train.
      measure: if > 0, times each subgraph's forward pass unfused and fused on
        that many random images and puts the times in the report.
      algorithm, workspace_limit: for the fused convolutions (see BigConv2D).

    Returns:
      (fused_model, reports): a new, uncompiled Keras model (the original is
      unchanged; other layers are cloned with their weights) and a list of
      SubgraphReport, one per linear subgraph with at least one convolution
      and two layers. Chains of linear 1-D or 3-D convolutions are reported
      as refused: fuse_linear composes 2-D kernels only.

    Raises:
      ValueError: a bad argument (named), or a model that cannot be rebuilt.
    """
    algorithm, workspace_limit = check_options(algorithm, workspace_limit)
    mode = check_mode(mode)
    flavour = flavours.of(model)
    functional = flavour.functional(model)
    if functional is None or not model.built:
        raise ValueError("Invalid value for argument `model`: expected a built Functional or "
                         "Sequential model (subclassed models have no graph to rewrite)")
    if max_mac_ratio is not None and (isinstance(max_mac_ratio, bool) or not isinstance(
            max_mac_ratio, (int, float)) or not max_mac_ratio > 0):
        raise ValueError("Invalid value for argument `max_mac_ratio`: expected None or a "
                         f"positive number, received max_mac_ratio={max_mac_ratio!r}")
    if isinstance(measure, bool) or not isinstance(measure, int) or measure < 0:
        raise ValueError(f"Invalid value for argument `measure`: expected a non-negative int "
                         f"(images), received measure={measure!r}")
    graph = _Graph(flavour, functional)
    reports, replace = [], {}  # replace: id(output node) -> (input tensor, build function)
    skip = set()
    for chain in _other_rank_chains(graph):
        reports.append(SubgraphReport([n.layer.name for n in chain], "refused",
                                      OTHER_RANK_REASON))
    for input_tensor, nodes, reason in _regions(graph, trainable):
        names = [n.layer.name for n in nodes]
        if input_tensor is None:
            reports.append(SubgraphReport(names, "refused", reason))
            continue
        report, build = _fuse_region(flavour, graph.kinds, input_tensor, nodes, trainable,
                                     max_mac_ratio, measure, algorithm, workspace_limit, mode)
        reports.append(report)
        if build is not None:
            replace[id(nodes[-1])] = (input_tensor, build)
            skip.update(id(n) for n in nodes)

    tensors, pairs = {}, []
    new_inputs = []
    for x in functional.inputs:
        y = flavour.input_like(x)
        tensors[id(x)] = y
        new_inputs.append(y)
    for node in graph.nodes:
        if id(node) in replace:
            input_tensor, build = replace[id(node)]
            tensors[id(node.outputs[0])] = build(tensors[id(input_tensor)])
            continue
        if id(node) in skip:
            continue
        layer = node.layer
        new = layer.__class__.from_config(layer.get_config())
        pairs.append((layer, new))
        for x, y in zip(node.outputs, flavour.replay(node, new, tensors)):
            tensors[id(x)] = y
    inputs_struct, outputs_struct = flavour.structures(functional)
    outputs = flavour.pack(outputs_struct, [tensors[id(x)] for x in functional.outputs])
    inputs = flavour.pack(inputs_struct, new_inputs)
    fused = flavour.keras.Model(inputs, outputs, name=model.name)
    for old, new in pairs:
        new.set_weights(old.get_weights())
    return fused, reports


def _fuse_region(flavour, kinds, input_tensor, nodes, trainable, max_mac_ratio, measure,
                 algorithm, workspace_limit, mode):
    """(SubgraphReport, build function or None) for one region."""
    names = [n.layer.name for n in nodes]
    shape = input_tensor.shape
    if len(shape) != 4 or None in shape[1:]:
        return SubgraphReport(names, "refused", f"input shape {shape}: the height, width and "
                              "channels must be static to check the borders"), None
    in_size, channels = (int(shape[1]), int(shape[2])), int(shape[3])
    program, weights, variables = _program(input_tensor, nodes, flavour, kinds)
    w64 = {k: tf.constant(v) for k, v in weights.items()}
    try:
        if trainable and not measure:  # only the fused map's shapes are needed: trace the
            with tf.Graph().as_default():  # composition in a graph that never runs
                m = steps.compose_program(program, {k: tf.zeros(v.shape, tf.float64)
                                                   for k, v in weights.items()},
                                         in_size, channels, tf.float64, patch_borders=True)
        else:
            m = steps.compose_program(program, w64, in_size, channels, tf.float64,
                                     patch_borders=True)
    except algebra.NotFusable as e:
        return SubgraphReport(names, "refused", str(e)), None
    out_shape = tuple(nodes[-1].outputs[0].shape[1:])
    if m.out_size + (m.out_channels,) != out_shape:  # a layer this module misreads
        return SubgraphReport(names, "refused", f"fused output {m.out_size + (m.out_channels,)}"
                              f" differs from the model's {out_shape}"), None
    use_map = m.bias_padded and not m.patched
    bmap = steps.bias_map(program, w64, in_size, channels, tf.float64) if use_map else None
    pads = algebra.fused_padding(m)
    if m.patched:
        (top, bottom, rows), (left, right, cols) = algebra.border_strips(m)
        exact = (f"borders patched: the kernel does not reproduce the intermediates' zero "
                 f"padding, so the output rows/columns within {top}/{m.out_size[0] - bottom} "
                 f"(top/bottom) and {left}/{m.out_size[1] - right} (left/right) of the borders "
                 f"come from the unfused layers run on {rows}-row and {cols}-column input strips")
    else:
        exact = ("borders exact: intermediates are never padded where they are nonzero"
                 + ("; biases that meet padding are added as an exact bias map" if use_map
                    else ""))
    report = SubgraphReport(
        names, "fused", kernel_size=m.kernel_size, groups=m.groups, strides=m.strides,
        bias="map" if use_map else ("vector" if m.bias is not None else "none"),
        exact=exact)
    (report.macs_before, report.macs_after, report.kept_bytes_before,
     report.kept_bytes_after) = _estimates(program, nodes, weights, in_size, channels, m)
    if max_mac_ratio is not None and report.macs_after > max_mac_ratio * report.macs_before:
        report.status = "refused"
        report.reason = (f"the fused kernel needs {report.macs_after / report.macs_before:.2f}x "
                         f"the multiply-adds (max_mac_ratio={max_mac_ratio})")
        return report, None
    name = "fused_" + nodes[-1].layer.name

    if trainable or m.patched:  # patched borders need the branch weights at run time
        kept = variables if trainable else sorted(weights)

        layer = flavour.layers.FusedLinearConv(program, [[k, list(weights[k].shape)] for k in kept],
                                in_size, channels, algorithm=algorithm,
                                workspace_limit=workspace_limit, mode=mode, trainable=trainable,
                                name=name)
        choice = layer.choose_mode(shape[0])
        report.mode, report.mode_reason, report.mode_seconds = choice

        def build(x):
            y = layer(x)
            layer.set_weights([weights[k].astype(np.float32) for k in kept])
            return y
    else:
        kernel = m.kernel.numpy().astype(np.float32)
        vector = m.bias is not None and not m.bias_padded

        def build(x):
            same = algebra.same_pads(in_size, m.kernel_size, m.strides)
            padding = "valid"
            if pads == same and any(pads):
                padding = "same"
            elif any(p < 0 for p in pads):
                x = flavour.keras.layers.Cropping2D(((max(-pads[0], 0), max(-pads[1], 0)),
                                             (max(-pads[2], 0), max(-pads[3], 0))),
                                            name=name + "_crop")(x)
            if padding == "valid" and any(p > 0 for p in pads):
                x = flavour.keras.layers.ZeroPadding2D(((max(pads[0], 0), max(pads[1], 0)),
                                                (max(pads[2], 0), max(pads[3], 0))),
                                               name=name + "_pad")(x)
            conv = flavour.layers.BigConv2D(m.out_channels, m.kernel_size, strides=m.strides, padding=padding,
                             groups=m.groups, use_bias=vector, algorithm=algorithm,
                             workspace_limit=workspace_limit, name=name)
            y = conv(x)
            conv.set_weights([kernel] + ([m.bias.numpy().astype(np.float32)] if vector else []))
            if bmap is not None:
                add = flavour.layers.FusedBiasMap(bmap.shape, name=name + "_bias_map")
                y = add(y)
                add.set_weights([bmap.numpy().astype(np.float32)])
            return y

    if measure:
        x = tf.constant(np.random.default_rng(0).standard_normal(
            (measure,) + in_size + (channels,)).astype(np.float32))
        w32 = {k: tf.constant(v.astype(np.float32)) for k, v in weights.items()}
        report.seconds_before = _time(tf.function(lambda x: steps.run_program(program, w32, x)), x)
        m32 = dataclasses.replace(m, kernel=tf.constant(m.kernel.numpy().astype(np.float32)))
        b32 = tf.cast(bmap if bmap is not None else (m.bias if m.bias is not None else 0.0),
                      tf.float32)
        report.seconds_after = _time(tf.function(
            lambda x: steps.apply_fused(x, m32, b32, algorithm, workspace_limit, program, w32)), x)
    return report, build
