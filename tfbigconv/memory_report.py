"""memory_report(): which tensors a Keras model's training step keeps, its peak, and what to change.

How it works:
- The model is traced symbolically into a graph of TensorFlow ops, with the
  batch dimension left unknown (as Keras' fit traces it); no data is needed.
  Each tensor's size at any batch size follows from its static shape.
- Every op's gradient reads some of the op's inputs and outputs; those are
  kept from the forward pass until the gradient runs. SAVED_FOR_BACKWARD holds
  these rules, one entry per op type, as TensorFlow's gradient functions
  (nn_grad.py, math_grad.py, array_grad.py) and tfbigconv's own define them.
- A liveness simulation runs the forward ops in graph order, then the gradient
  ops in reverse order. A tensor lives while a forward op still reads it or a
  gradient rule keeps it. Gradients live until their producer's gradient has
  used them; the parameters' gradients until the optimizer's update. Each
  convolution adds its transient workspace while it runs: TensorFlow's kernel
  (CPU: the gradient kernels' col_buffer, as tfbigconv's planner estimates
  it) or tfbigconv's planned algorithm. The largest total is the peak.
- Advice re-runs the simulation with one change at a time: a layer converted
  by `convert_model`, a batch size, a mixed-precision clone of the model, a
  layer wrapped in `tf.recompute_grad`.
"""
import collections
import contextlib
import math
import sys

import tensorflow as tf

from tfbigconv import _core, dispatch

# Op type -> {index of an input that gets a gradient: the op's tensors its
# gradient reads ("in<i>" for input i, "out<k>" for output k)}. Only data
# reads count: a gradient that reads a tensor's shape (tf.shape) does not keep
# its buffer. tests/test_memory_report.py checks every entry against the
# gradient TensorFlow registers for the op type.
SAVED_FOR_BACKWARD = {
    # Convolutions: the input gradient needs the filter, the filter gradient the input.
    "Conv2D": {0: ("in1",), 1: ("in0",)},
    "DepthwiseConv2dNative": {0: ("in1",), 1: ("in0",)},
    "BigConv2D": {0: ("in1",), 1: ("in0",)},
    "Conv2DBackpropInput": {1: ("in2",), 2: ("in1",)},  # Conv2DTranspose
    "MatMul": {0: ("in1",), 1: ("in0",)},
    "BatchMatMulV2": {0: ("in1",), 1: ("in0",)},
    # Elementwise arithmetic.
    "BiasAdd": {0: (), 1: ()},
    "AddV2": {0: (), 1: ()},
    "Sub": {0: (), 1: ()},
    "AddN": {},  # every input: nothing (filled in below)
    "Neg": {0: ()},
    "Mul": {0: ("in1",), 1: ("in0",)},
    "RealDiv": {0: ("in1",), 1: ("in0", "in1")},
    "Maximum": {0: ("in0", "in1"), 1: ("in0", "in1")},
    "Minimum": {0: ("in0", "in1"), 1: ("in0", "in1")},
    "SquaredDifference": {0: ("in0", "in1"), 1: ("in0", "in1")},
    "Square": {0: ("in0",)},
    "Sqrt": {0: ("out0",)},
    "Rsqrt": {0: ("out0",)},
    "Exp": {0: ("out0",)},
    "Log": {0: ("in0",)},
    "Abs": {0: ("in0",)},
    "Erf": {0: ("in0",)},
    "Erfc": {0: ("in0",)},
    # Activations.
    "Relu": {0: ("out0",)},
    "Relu6": {0: ("out0",)},
    "Elu": {0: ("out0",)},
    "Selu": {0: ("out0",)},
    "LeakyRelu": {0: ("in0",)},
    "Softplus": {0: ("in0",)},
    "Sigmoid": {0: ("out0",)},
    "Tanh": {0: ("out0",)},
    "Softmax": {0: ("out0",)},
    "LogSoftmax": {0: ("out0",)},
    # Pooling, resizing, reductions.
    "MaxPool": {0: ("in0", "out0")},
    "AvgPool": {0: ()},
    "Mean": {0: ()},
    "Sum": {0: ()},
    "ResizeNearestNeighbor": {0: ()},
    "ResizeBilinear": {0: ("in0",)},
    # Data movement: gradients are slices, pads, sums or reshapes of the incoming one.
    "ConcatV2": {},  # every value input: nothing (filled in below)
    "Pack": {},
    "Tile": {0: ()},
    "Pad": {0: ()},
    "PadV2": {0: ()},
    "MirrorPad": {0: ()},
    "Slice": {0: ()},
    "StridedSlice": {0: ()},
    "Transpose": {0: ()},
    "Cast": {0: ()},
    "Identity": {0: ()},
    "Reshape": {0: ()},
    "Squeeze": {0: ()},
    "ExpandDims": {0: ()},
    "DepthToSpace": {0: ()},
    "SpaceToDepth": {0: ()},
}
_VARIADIC_NOTHING = ("AddN", "ConcatV2", "Pack")  # any input index: nothing kept

# Ops whose output shares its input's buffer (TensorFlow forwards it).
_ALIASES = ("Identity", "Reshape", "Squeeze", "ExpandDims", "StopGradient", "Snapshot",
            "PreventGradient")
# Ops without a gradient, and ops that only read shapes.
_NO_GRADIENT = ("Shape", "ShapeN", "Size", "Rank", "StopGradient", "PreventGradient",
                "ArgMax", "ArgMin", "ZerosLike", "OnesLike", "Fill", "RandomUniform",
                "RandomStandardNormal", "StatelessRandomUniformV2", "StatelessRandomNormalV2",
                "BroadcastGradientArgs", "AssignVariableOp", "AssignAddVariableOp",
                "AssignSubVariableOp", "NoOp", "Const", "Placeholder", "VarHandleOp")
_CONVS = ("Conv2D", "DepthwiseConv2dNative", "BigConv2D", "Conv2DBackpropInput")
# max_batch_size keeps this fraction of the simulated peak in reserve: the
# simulation has been 17% under measured peaks on the CPU (a ResNet-style
# model at batch 15; benchmarks/RESULTS.md).
SAFETY_MARGIN = 0.2
# TensorFlow's default cap on a cuDNN workspace (TF_CUDNN_WORKSPACE_LIMIT_IN_MB).
CUDNN_WORKSPACE_LIMIT = 4 << 30
# Optimizer class -> slot variables per trainable weight (Keras 3).
OPTIMIZER_SLOTS = {"SGD": 0, "Adam": 2, "AdamW": 2, "Adamax": 2, "Nadam": 2, "Lamb": 2,
                   "Adadelta": 2, "Ftrl": 2, "Adagrad": 1, "RMSprop": 1, "Lion": 1,
                   "Adafactor": 2}


def _fmt_bytes(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def optimizer_slots(optimizer):
    """Slot variables per trainable weight that `optimizer` (a Keras optimizer,
    its name, or None for plain SGD) keeps; (count, note)."""
    if optimizer is None:
        return 0, "none (plain SGD assumed)"
    if isinstance(optimizer, str):
        import keras
        optimizer = keras.optimizers.get(optimizer)
    name = type(optimizer).__name__
    if name not in OPTIMIZER_SLOTS:
        return 2, f"{name}: slots unknown, 2 per weight assumed"
    slots = OPTIMIZER_SLOTS[name]
    if name == "SGD" and getattr(optimizer, "momentum", 0):
        slots = 1
    if name == "RMSprop":
        slots += bool(getattr(optimizer, "momentum", 0)) + bool(getattr(optimizer, "centered", False))
    if getattr(optimizer, "amsgrad", False):
        slots += 1
    if getattr(optimizer, "use_ema", False):
        slots += 1
    return slots, name


# ---------------------------------------------------------------------------
# Tracing


class _Tensor:
    __slots__ = ("name", "dims", "itemsize", "op", "kind", "base", "dtype")

    def bytes(self, batch):
        if self.dims is None:
            return 0
        n = self.itemsize
        for d in self.dims:
            n *= batch if d is None else d
        return n

    def shape(self, batch):
        return None if self.dims is None else [batch if d is None else d for d in self.dims]


class _Op:
    __slots__ = ("index", "name", "type", "inputs", "outputs", "layer", "attrs", "tf_op")


class _LayerCall:
    """One call of a layer: its ops, and the layer itself."""

    def __init__(self, layer, call):
        self.layer, self.call = layer, call
        self.ops = []

    @property
    def label(self):
        return self.layer.name if self.call == 0 else f"{self.layer.name} (call {self.call + 1})"


@contextlib.contextmanager
def _recording_layer_calls(model, calls, graph):
    """Wraps each layer's call() so that every graph op is assigned to the
    innermost layer call that created it."""
    layers = list(model._flatten_layers(include_self=True, recursive=True))
    counts = collections.Counter()
    owner = {}

    def wrap(layer, call):
        def wrapped(*args, **kwargs):
            start = len(graph.get_operations())
            entry = _LayerCall(layer, counts[id(layer)])
            counts[id(layer)] += 1
            calls.append(entry)
            result = call(*args, **kwargs)
            for op in graph.get_operations()[start:]:
                if op.name not in owner:  # inner layers have claimed theirs
                    owner[op.name] = entry
            return result
        return wrapped

    for layer in layers:
        object.__setattr__(layer, "call", wrap(layer, layer.call))
    try:
        yield owner
    finally:
        for layer in layers:
            object.__delattr__(layer, "call")


def _input_specs(model, input_shape):
    """[(shape without batch, dtype)] for each model input."""
    if input_shape is not None:
        shapes = input_shape
        if not shapes or isinstance(shapes[0], (int, type(None))):
            shapes = [shapes]
        return [(list(s), "float32") for s in shapes]
    inputs = getattr(model, "inputs", None)
    if not inputs:
        raise ValueError("memory_report: the model has no known inputs (a subclassed model?); "
                         "pass input_shape=, the shape of one example without the batch")
    return [(list(t.shape)[1:], t.dtype) for t in inputs]


class _Trace:
    """The model's ops with static shapes (batch unknown), layer calls and weights."""

    def __init__(self, model, input_shape=None, training=True):
        from tensorflow.python.framework import func_graph
        specs = _input_specs(model, input_shape)
        graph = func_graph.FuncGraph("memory_report")
        self.calls = []
        with graph.as_default():
            xs = [tf.compat.v1.placeholder(tf.as_dtype(dt), [None] + shape, name=f"input_{i}")
                  for i, (shape, dt) in enumerate(specs)]
            # tfbigconv's layers plan without timing; a plan that does not fit
            # its workspace_limit is recorded (the report says so), not raised.
            with _recording_layer_calls(model, self.calls, graph) as owner, \
                    dispatch.planning_only() as failures:
                ys = model(xs[0] if len(xs) == 1 else xs, training=training)
            self.plan_failures = failures
            # The loss: mean squared error against a target of each output's shape.
            with tf.name_scope("loss"):
                losses = []
                for y in tf.nest.flatten(ys):
                    t = tf.compat.v1.placeholder(y.dtype, y.shape, name="target")
                    losses.append(tf.reduce_mean(tf.square(tf.cast(y, tf.float32) -
                                                           tf.cast(t, tf.float32))))
                loss = tf.add_n(losses) if len(losses) > 1 else losses[0]
        self.graph = graph
        self.loss = loss.name
        self.input_names = [x.name for x in xs]
        self._variables(model, graph)
        self._ops(graph, owner)

    def _variables(self, model, graph):
        by_handle = {}
        for v in model.weights:
            handle = getattr(getattr(v, "value", v), "handle", None)
            if handle is not None:
                by_handle[id(handle)] = v
        # resource placeholder name -> Keras variable
        self.variable_of = {}
        for external, internal in graph.captures:
            v = by_handle.get(id(external))
            if v is not None:
                self.variable_of[internal.name] = v
        self.trainable = {id(v) for v in model.trainable_weights}
        self.weights = list(model.weights)

    def _ops(self, graph, owner):
        self.ops, self.tensors = [], {}
        for i, tf_op in enumerate(graph.get_operations()):
            op = _Op()
            op.index, op.name, op.type, op.tf_op = i, tf_op.name, tf_op.type, tf_op
            op.inputs = [t.name for t in tf_op.inputs]
            op.outputs = [t.name for t in tf_op.outputs]
            op.layer = owner.get(tf_op.name)
            if op.layer is not None:
                op.layer.ops.append(op)
            for index, t in enumerate(tf_op.outputs):
                tensor = _Tensor()
                tensor.name, tensor.op, tensor.dtype = t.name, op, t.dtype
                tensor.dims = t.shape.as_list() if t.shape.rank is not None else None
                tensor.itemsize = t.dtype.size if t.dtype not in (tf.resource, tf.variant,
                                                                   tf.string) else 0
                tensor.kind, tensor.base = "activation", t.name
                if op.type == "Const":
                    tensor.kind = "constant"
                elif op.type == "Placeholder":
                    tensor.kind = "input"
                elif op.type == "ReadVariableOp":
                    tensor.kind = "parameter"
                elif op.type in _ALIASES and op.inputs:
                    tensor.base = self.tensors[op.inputs[0]].base
                elif op.type == "IdentityN" and index < len(op.inputs):
                    # tf.custom_gradient's IdentityN: output i is input i's buffer.
                    tensor.base = self.tensors[op.inputs[index]].base
                self.tensors[t.name] = tensor
            self.ops.append(op)
        self._gradient_flow()

    def variable(self, tensor_name):
        """The Keras variable a ReadVariableOp output reads, or None."""
        t = self.tensors[tensor_name]
        if t.kind != "parameter":
            return None
        return self.variable_of.get(t.op.inputs[0])

    def _gradient_flow(self):
        """needs_grad: tensors that depend on a trainable weight; has_grad:
        tensors the loss depends on through differentiable ops."""
        self.needs_grad = set()
        for op in self.ops:
            if op.type in _NO_GRADIENT:
                continue
            for name in op.outputs:
                t = self.tensors[name]
                if not t.dtype.is_floating:
                    continue
                if op.type == "ReadVariableOp":
                    v = self.variable(name)
                    if v is not None and id(v) in self.trainable:
                        self.needs_grad.add(name)
                elif any(i in self.needs_grad for i in op.inputs):
                    self.needs_grad.add(name)
        self.has_grad = {self.loss}
        for op in reversed(self.ops):
            if op.type in _NO_GRADIENT or not any(o in self.has_grad for o in op.outputs):
                continue
            for name in op.inputs:
                if name in self.needs_grad:
                    self.has_grad.add(name)

        self._grad_inputs = {op.name: self._find_grad_inputs(op) for op in self.ops}
        self._saved = {op.name: self._find_saved(op) for op in self.ops}

    def grad_inputs(self, op):
        """Indices of op's inputs that receive a gradient in the backward pass."""
        return self._grad_inputs[op.name]

    def saved(self, op):
        """(names of the tensors op's gradient keeps, whether a rule exists)."""
        return self._saved[op.name]

    def _find_grad_inputs(self, op):
        if op.type in _NO_GRADIENT or not any(o in self.has_grad for o in op.outputs):
            return []
        return [i for i, name in enumerate(op.inputs)
                if name in self.needs_grad and name in self.has_grad]

    def _find_saved(self, op):
        grads = self._grad_inputs[op.name]
        if not grads:
            return [], True
        rule = SAVED_FOR_BACKWARD.get(op.type)
        if rule is None:  # unknown: assume it keeps every input and output
            names = [n for n in op.inputs + op.outputs if self.tensors[n].dtype.is_floating]
            return names, False
        keep = []
        for i in grads:
            for ref in rule.get(i, () if op.type in _VARIADIC_NOTHING else None) or ():
                which, k = ref[:-1], int(ref[-1])
                name = op.inputs[k] if which == "in" else op.outputs[k]
                if name not in keep:
                    keep.append(name)
        return keep, True


# ---------------------------------------------------------------------------
# Convolution workspaces


def _decode(v):
    return v.decode() if isinstance(v, bytes) else v


class _ConvPlans:
    """Each convolution's transient workspace per pass under TensorFlow's kernel
    and under tfbigconv's plan, cached per (op, batch, device)."""

    def __init__(self, trace, device):
        self.trace, self.device = trace, device
        self.cache = {}

    def geometry(self, op, batch):
        """(input shape, filter shape in tfbigconv's form, attrs, dtype) or None."""
        t = self.trace
        a = op.tf_op
        attrs = {k: _decode(a.get_attr(k)) for k in ("strides", "padding", "data_format",
                                                         "dilations")}
        try:
            attrs["explicit_paddings"] = list(a.get_attr("explicit_paddings"))
        except ValueError:
            attrs["explicit_paddings"] = []
        attrs["strides"], attrs["dilations"] = list(attrs["strides"]), list(attrs["dilations"])
        if op.type == "Conv2DBackpropInput":  # a transposed conv: the forward conv's geometry
            x, w = t.tensors[op.outputs[0]], t.tensors[op.inputs[1]]
        else:
            x, w = t.tensors[op.inputs[0]], t.tensors[op.inputs[1]]
        xs, ws = x.shape(batch), w.shape(batch)
        if xs is None or ws is None or None in xs or None in ws:
            return None
        if op.type == "DepthwiseConv2dNative":
            ws = [ws[0], ws[1], 1, ws[2] * ws[3]]
        return xs, ws, attrs, x.dtype.name

    def tf_workspace(self, op, batch):
        """{pass: bytes} of TensorFlow's kernels for the op's geometry."""
        key = ("tf", op.name, batch)
        if key not in self.cache:
            g = self.geometry(op, batch)
            out = {p: 0 for p in dispatch.PASSES}
            if g is not None:
                # The CPU planner's estimate of TF's kernel: the gradient kernels'
                # col_buffer (plan.cc, TfColBufferImages). On the GPU, cuDNN's
                # workspace is estimated, unmeasured, as one image's patch matrix
                # (the forward estimate), capped as TF caps it.
                # The op's registered gradients run its own kind of kernel.
                kernel = "DepthwiseConv2dNative" if op.type == "DepthwiseConv2dNative" else "Conv2D"
                plans = {p: dispatch.plan(p, g[0], g[1], g[2], g[3], "tf", 0, "CPU", kernel)
                         for p in dispatch.PASSES}
                for p in dispatch.PASSES:
                    if self.device == "GPU":
                        out[p] = min(plans["forward"]["tf"]["workspace_bytes"],
                                     CUDNN_WORKSPACE_LIMIT)
                    else:
                        out[p] = plans[p]["tf"]["workspace_bytes"]
            self.cache[key] = out
        return self.cache[key]

    def bigconv(self, op, batch, algorithm="auto", limit=0):
        """{pass: (algorithm that runs, bytes, note)} under tfbigconv's planner."""
        key = ("big", op.name, batch, algorithm, limit)
        if key not in self.cache:
            g = self.geometry(op, batch)
            out = {}
            for p in dispatch.PASSES:
                if g is None:
                    out[p] = ("auto", 0, "shape unknown: planned at run time")
                    continue
                xs, ws, attrs, dtype = g
                # bigconv2d plans an unknown batch as ASSUMED_BATCH, then runs that choice.
                chosen_for = [dispatch.ASSUMED_BATCH] + xs[1:]
                note = ""
                try:
                    chosen = (dispatch.plan(p, chosen_for, ws, attrs, dtype, algorithm, limit,
                                            self.device)["chosen"]
                              if algorithm == "auto" else algorithm)
                except tf.errors.ResourceExhaustedError as e:
                    chosen, note = algorithm, e.message
                if chosen in ("tf", "im2col"):
                    out[p] = (self._tf_name(op), self.tf_workspace(op, batch)[p], note)
                    continue
                if chosen == "auto":
                    chosen = dispatch.plan(p, xs, ws, attrs, dtype, "auto", 0, self.device)["chosen"]
                try:
                    plan = dispatch.plan(p, xs, ws, attrs, dtype, chosen, limit, self.device)
                except tf.errors.ResourceExhaustedError as e:
                    note = note or e.message
                    plan = dispatch.plan(p, xs, ws, attrs, dtype, chosen, 0, self.device)
                out[p] = (chosen, plan[chosen]["workspace_bytes"], note)
            self.cache[key] = out
        return self.cache[key]

    @staticmethod
    def _tf_name(op):
        return "tf.DepthwiseConv2dNative" if op.type == "DepthwiseConv2dNative" else "tf.Conv2D"

    def runs(self, op, batch, convert):
        """{pass: (algorithm, bytes, note)} of what runs for op; convert: as
        tfbigconv's BigConv2D (auto, no limit) instead of TF's kernel."""
        if op.type == "BigConv2D":
            a = op.tf_op
            return self.bigconv(op, batch, _decode(a.get_attr("algorithm")),
                                int(a.get_attr("workspace_limit_bytes")))
        if convert and op.type in ("Conv2D", "DepthwiseConv2dNative"):
            return self.bigconv(op, batch)
        ws = self.tf_workspace(op, batch)
        name = "cuDNN (est.)" if self.device == "GPU" else self._tf_name(op)
        runs = {p: (name, ws[p], "") for p in dispatch.PASSES}
        if _gradients_routed(op):
            ours = self.bigconv(op, batch)
            runs.update({p: ours[p] for p in dispatch.PASSES[1:]})
        return runs


def _gradients_routed(op):
    """Whether a TF convolution's gradients are tfbigconv's: bigconv2d runs TF's
    forward kernel with its own gradient plan through tf.custom_gradient
    (conv.py's _tf_forward_routed), whose IdentityN takes the forward's output."""
    return op.type in ("Conv2D", "DepthwiseConv2dNative") and any(
        c.type == "IdentityN" for c in op.tf_op.outputs[0].consumers())


# ---------------------------------------------------------------------------
# Simulation

Alive = collections.namedtuple("Alive", "bytes what layer shape")
Step = collections.namedtuple("Step", "phase layer op")


class _Result:
    def __init__(self):
        self.peak, self.step, self.alive = -1, None, []


def _passes_gradient_through(op, index, trace):
    """Whether the gradient of op's input `index` is the incoming gradient
    itself (TensorFlow returns it unchanged, no new buffer): aliases, BiasAdd's
    value, and AddV2/Sub/AddN operands of the output's own shape."""
    if op.type in _ALIASES:
        return True
    if op.type == "BiasAdd":
        return index == 0
    if (op.type in ("AddV2", "AddN") or (op.type == "Sub" and index == 0)):
        return trace.tensors[op.inputs[index]].dims == trace.tensors[op.outputs[0]].dims
    return False


def _simulate(trace, plans, batch, persistent, convert=(), recompute=(), slots=0):
    """Live bytes through forward, backward and the optimizer's update.

    persistent: bytes alive throughout (weights, optimizer slots, the batch);
    convert: layers whose TF convolutions run as tfbigconv's; recompute: layer
    calls whose internal saved tensors are recomputed in the backward pass.
    Returns a _Result: peak (including persistent), its step, the tensors alive
    then (largest first).
    """
    t = trace
    live = {}  # buffer key -> (bytes, what, layer call, shape)
    res = _Result()
    saved_by = collections.defaultdict(list)  # buffer -> backward ops that read it
    uses = collections.Counter()              # buffer -> forward reads left
    op_saved = {}
    recompute_ids = {id(c) for c in recompute}
    recomputed = collections.defaultdict(list)  # layer call -> buffers it recomputes
    recomputed_bases = set()
    for op in t.ops:
        for name in op.inputs:
            uses[t.tensors[name].base] += 1
        names, _ = t.saved(op)
        op_saved[op.name] = names
        for name in names:
            base = t.tensors[name].base
            saved_by[base].append(op.index)
    uses[t.tensors[t.loss].base] += 1  # held until the backward pass starts

    for base in list(saved_by):
        producer = t.tensors[base].op
        call = producer.layer
        if call is not None and id(call) in recompute_ids:
            recomputed[id(call)].append(base)
            recomputed_bases.add(base)

    def label(op):
        if op.layer is not None:
            return op.layer.label
        return "(loss)" if op.name.startswith("loss/") else "(model)"

    def alloc(key, n, what, op, shape=None):
        if n > 0:
            live[key] = Alive(n, what, label(op), shape)

    def check(step):
        total = persistent + sum(a.bytes for a in live.values())
        if total > res.peak:
            res.peak, res.step = total, step
            res.alive = sorted(live.values(), key=lambda a: -a.bytes)

    # Forward.
    for op in t.ops:
        if op.type in _CONVS:
            runs = plans.runs(op, batch, op.layer is not None and
                              id(op.layer.layer) in convert)
            key = "backprop_input" if op.type == "Conv2DBackpropInput" else "forward"
            alloc(("ws", op.name), runs[key][1], f"workspace of {op.type} ({runs[key][0]})", op)
        for name in op.outputs:
            tensor = t.tensors[name]
            if tensor.kind == "activation" and tensor.base == name:
                alloc(name, tensor.bytes(batch), f"{op.type} output", op, tensor.shape(batch))
        check(Step("forward", label(op), op.name))
        live.pop(("ws", op.name), None)
        for name in op.inputs + op.outputs:
            base = t.tensors[name].base
            if name in op.inputs:
                uses[base] -= 1
            if uses[base] <= 0 and (not saved_by.get(base) or base in recomputed_bases):
                live.pop(base, None)
    live.pop(t.tensors[t.loss].base, None)

    # Backward: each op's gradient runs once the gradients of all its outputs
    # are complete, first ready first run (TensorFlow's executor runs ready
    # ops in that order).
    grads = {}       # tensor -> its complete gradient's buffer key
    pending = collections.defaultdict(list)  # tensor -> contributions so far
    expected = collections.Counter()
    backward_ops = [op for op in t.ops if t.grad_inputs(op)]
    for op in backward_ops:
        for i in t.grad_inputs(op):
            expected[op.inputs[i]] += 1
    readers_left = collections.Counter()  # saved buffer -> gradients still to read it
    for op in backward_ops:
        for name in op_saved[op.name]:
            readers_left[t.tensors[name].base] += 1
    holders = collections.Counter()  # gradient buffer -> tensors whose gradient it is
    started = set()
    param_grad_bytes = []
    grads[t.loss] = None
    waiting = {op.name: sum(1 for o in op.outputs if expected[o] or o == t.loss)
               for op in backward_ops}
    ready = collections.deque(op for op in backward_ops if t.loss in op.outputs)

    def release(key):
        if key is None:
            return
        holders[key] -= 1
        if holders[key] <= 0 and not (isinstance(key, tuple) and key[0] == "param"):
            live.pop(key, None)

    while ready:
        op = ready.popleft()
        call = op.layer
        if call is not None and id(call) in recompute_ids and id(call) not in started:
            started.add(id(call))
            for base in recomputed[id(call)]:
                tensor = t.tensors[base]
                alloc(base, tensor.bytes(batch), f"{tensor.op.type} output (recomputed)",
                      tensor.op, tensor.shape(batch))
        if op.type in _CONVS:
            runs = plans.runs(op, batch, call is not None and id(call.layer) in convert)
            gi = set(t.grad_inputs(op))
            if op.type == "Conv2DBackpropInput":
                parts = [("forward", 2 in gi), ("backprop_filter", 1 in gi)]
            else:
                parts = [("backprop_input", 0 in gi), ("backprop_filter", 1 in gi)]
            # Both gradient passes are ready together; TensorFlow's executor
            # may run them at the same time.
            ws = sum(runs[p][1] for p, used in parts if used)
            passes = " + ".join(f"{p} ({runs[p][0]})" for p, used in parts if used)
            alloc(("ws", op.name), ws, f"workspace of {op.type}'s gradient: {passes}", op)
        out_grad = grads.get(op.outputs[0]) if op.outputs else None
        made = []
        for i in t.grad_inputs(op):
            name = op.inputs[i]
            tensor = t.tensors[name]
            v = t.variable(name)
            if _passes_gradient_through(op, i, t):
                key = out_grad  # the incoming gradient itself, no new buffer
            elif v is not None:
                key = ("param", name, op.name)
                alloc(key, tensor.bytes(batch), f"gradient of {v.path}", op, tensor.shape(batch))
                param_grad_bytes.append(tensor.bytes(batch))
            else:
                key = ("grad", name, op.name)
                alloc(key, tensor.bytes(batch), f"gradient of {tensor.op.type} output", op,
                      tensor.shape(batch))
            holders[key] += 1
            pending[name].append(key)
            made.append(name)
        check(Step("backward", label(op), op.name))
        live.pop(("ws", op.name), None)
        for o in op.outputs:
            if o in grads:
                release(grads.pop(o))
        for name in op_saved[op.name]:
            base = t.tensors[name].base
            readers_left[base] -= 1
            if readers_left[base] <= 0:
                live.pop(base, None)
        for name in made:
            if len(pending[name]) < expected[name]:
                continue
            parts = pending.pop(name)
            if len(parts) > 1:  # AddN of the contributions
                tensor = t.tensors[name]
                key = ("grad", name, "sum")
                alloc(key, tensor.bytes(batch), f"gradient of {tensor.op.type} output (sum)",
                      op, tensor.shape(batch))
                check(Step("backward", label(op), f"AddN of {name}'s gradients"))
                for part in parts:
                    release(part)
                holders[key] += 1
            else:
                key = parts[0]
            grads[name] = key
            producer = t.tensors[name].op
            if producer.name in waiting:
                waiting[producer.name] -= 1
                if waiting[producer.name] == 0:
                    ready.append(producer)
    # The optimizer's update: every weight's gradient is alive; a few
    # temporaries of one weight's size each at a time.
    if param_grad_bytes:
        alloc(("optimizer", "temporaries"), (1 + min(slots, 2)) * max(param_grad_bytes),
              "optimizer update temporaries", t.ops[-1])
        check(Step("update", "(optimizer)", "apply_gradients"))
    return res


# ---------------------------------------------------------------------------
# The report

Row = collections.namedtuple(
    "Row", "layer op output_shape output_bytes param_bytes grad_bytes slot_bytes kept_bytes "
           "kept tf_workspace bigconv_workspace note")


class MemoryReport:
    """Where a training step's memory goes; print it for the table.

    Attributes:
      peak_bytes: the simulated peak of one step: weights, optimizer slots and
        the batch, plus the step's activations, gradients and workspaces at
        their largest.
      step_peak_bytes: peak_bytes less what lives across steps (weights,
        slots, the batch): what one step adds.
      peak_step: Step(phase "forward"/"backward"/"update", layer, op).
      alive_at_peak: [Alive(bytes, what, layer, shape)], largest first.
      rows: [Row] one per layer call (op "") then one per op that allocates
        batch-sized tensors or a workspace (when the layer has several ops or
        a convolution). output_shape at batch_size;
        param/grad/slot bytes on a layer's first call; kept_bytes and kept:
        the tensors this op's gradient reads (inputs, outputs); tf_workspace
        and bigconv_workspace: (forward, backward) bytes under TensorFlow's
        kernel and tfbigconv's plan (None for non-convolutions; a layer row
        sums its ops'); backward counts the gradient passes that run.
      batch_size, device, training, optimizer, notes.
      advice: list of lines, computed (see `advise`).
    """

    def __init__(self, trace, batch_size, device, training, optimizer, budget, advise=True,
                 model=None, input_shape=None):
        self._trace, self.batch_size, self.device = trace, batch_size, device
        self.training, self.budget = training, budget
        self._model, self._input_shape, self._optimizer = model, input_shape, optimizer
        self.slots_per_weight, self.optimizer = optimizer_slots(optimizer) if training else (0, "")
        self._plans = _ConvPlans(trace, device)
        self.param_bytes = sum(_var_bytes(v) for v in trace.weights)
        trainable = [v for v in trace.weights if id(v) in trace.trainable]
        self.slot_bytes = self.slots_per_weight * sum(_var_bytes(v) for v in trainable)
        self.notes = []
        unknown = sorted({op.type for op in trace.ops if not trace.saved(op)[1]})
        if unknown:
            self.notes.append("no saved-for-backward rule for " + ", ".join(unknown) +
                              ": assumed to keep all their inputs and outputs")
        if device == "GPU":
            self.notes.append("GPU: cuDNN's and tfbigconv's workspaces are estimates, and the "
                              "simulation has not been checked against measured GPU peaks")
        for message in dict.fromkeys(trace.plan_failures):
            self.notes.append(f"a tfbigconv layer does not fit its workspace_limit: {message}")
        result = self._run(batch_size)
        self.peak_bytes = result.peak
        self.step_peak_bytes = result.peak - self._persistent(batch_size)
        self.peak_step, self.alive_at_peak = result.step, result.alive
        self.rows = self._rows(batch_size)
        self.notes = list(dict.fromkeys(self.notes))
        self.advice = self.advise() if advise else []

    def persistent_bytes(self, batch_size=None):
        """What lives across steps: weights, optimizer slots and the input batch."""
        batch = batch_size or self.batch_size
        data = sum(self._trace.tensors[n].bytes(batch) for n in self._trace.input_names)
        return self.param_bytes + self.slot_bytes + data

    _persistent = persistent_bytes

    def _run(self, batch, **kw):
        trace = self._trace
        if not self.training:
            trace = _inference_view(trace)
        return _simulate(trace, self._plans, batch, self._persistent(batch),
                         slots=self.slots_per_weight, **kw)

    def peak_at(self, batch_size, convert=(), recompute=()):
        """The simulated peak in bytes at another batch size, optionally with the
        Keras layers `convert` run by tfbigconv and the layer calls `recompute`
        (from recompute_effect) under tf.recompute_grad."""
        return self._run(batch_size, convert={id(layer) for layer in convert},
                         recompute=recompute).peak

    def max_batch_size(self, budget_bytes=None, margin=SAFETY_MARGIN):
        """The largest batch size whose simulated peak, plus `margin` of it,
        fits budget_bytes (default: the budget given to memory_report, else
        the device's free memory); 0 if not even one example fits. The margin
        covers the simulation's error against measured peaks (see
        SAFETY_MARGIN)."""
        budget = budget_bytes or self.budget or _free_memory(self.device)
        if budget is None:
            raise ValueError("max_batch_size: no budget given, and the free memory of "
                             f"{self.device} is unknown here")
        fits = lambda b: self._run(b).peak * (1 + margin) <= budget
        if not fits(1):
            return 0
        lo, hi = 1, 2
        while fits(hi):
            lo, hi = hi, hi * 2
            if hi > 1 << 24:
                return lo
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        return lo

    def per_example_bytes(self, batch_size=None):
        """(batch-independent bytes, bytes per example) of the peak near
        batch_size: peak(b) = fixed + b * per_example, from peak(b) and peak(b + 1)."""
        b = batch_size or self.batch_size
        p0, p1 = self._run(b).peak, self._run(b + 1).peak
        return p0 - b * (p1 - p0), p1 - p0

    # --- advice -----------------------------------------------------------

    def convertible_layers(self):
        """Layers convert_model would swap for tfbigconv's (exact Conv2D and
        DepthwiseConv2D), in model order."""
        import keras
        seen, out = set(), []
        for call in self._trace.calls:
            layer = call.layer
            if type(layer) in (keras.layers.Conv2D, keras.layers.DepthwiseConv2D) \
                    and id(layer) not in seen:
                seen.add(id(layer))
                out.append(layer)
        return out

    def conversion_effect(self, batch_size=None):
        """[(layer, peak after converting only it)] and the peak with all converted
        whose conversion lowers the peak: ([(layer, bytes)], bytes, [layers])."""
        b = batch_size or self.batch_size
        base = self._run(b).peak
        each = [(layer, self._run(b, convert={id(layer)}).peak)
                for layer in self.convertible_layers()]
        helping = [layer for layer, peak in each if peak < base]
        together = self._run(b, convert={id(l) for l in helping}).peak if helping else base
        return each, together, helping

    def recompute_effect(self, batch_size=None):
        """[(layer call, peak with it under tf.recompute_grad)] for calls that keep
        tensors of their own for the backward pass, lowest peak first."""
        b = batch_size or self.batch_size
        out = []
        for call in self._trace.calls:
            if hasattr(call.layer, "layers"):  # models: their layers are listed themselves
                continue
            own = [op for op in call.ops if self._trace.saved(op)[0]]
            if not own:
                continue
            out.append((call, self._run(b, recompute=[call]).peak))
        return sorted(out, key=lambda x: x[1])

    def mixed_precision_peak(self, policy=None):
        """(policy, peak) of a clone of the model under a mixed-precision policy
        (default: mixed_float16 on the GPU, mixed_bfloat16 on the CPU)."""
        import keras
        policy = policy or ("mixed_float16" if self.device == "GPU" else "mixed_bfloat16")
        if self._model is None:
            raise ValueError("the report was made without the model")

        def clone(layer):
            config = layer.get_config()
            config["dtype"] = policy
            return layer.__class__.from_config(config)

        copy = keras.models.clone_model(self._model, clone_function=clone)
        trace = _Trace(copy, self._input_shape, self.training)
        report = MemoryReport(trace, self.batch_size, self.device, self.training,
                              self._optimizer, self.budget, advise=False)
        return policy, report.peak_bytes

    def advise(self):
        lines = []
        base = self.peak_bytes
        pct = lambda new: f"{_fmt_bytes(base)} -> {_fmt_bytes(new)} ({100 * (new - base) / base:+.0f}%)"
        if self.training:
            each, together, helping = self.conversion_effect()
            for layer, peak in sorted(each, key=lambda x: x[1]):
                if peak < base:
                    lines.append(f"convert_model: converting {layer.name} "
                                 f"({layer.kernel_size[0]}x{layer.kernel_size[1]}) lowers the peak "
                                 f"{pct(peak)}")
            if len(helping) > 1:
                k = min(min(l.kernel_size) for l in helping)
                lines.append(f"convert_model(model, min_kernel_size={k}) converts them; "
                             f"together: {pct(together)}")
            if not helping and each:
                lines.append("convert_model: converting any one convolution leaves the peak "
                             "as it is or raises it")
        budget = self.budget or _free_memory(self.device)
        if budget:
            fits = self.max_batch_size(budget)
            fixed, each = self.per_example_bytes(max(fits, 1))
            line = (f"largest batch within {_fmt_bytes(budget)}: {fits} (peak at {fits}: "
                    f"{_fmt_bytes(self._run(max(fits, 1)).peak)}, {SAFETY_MARGIN:.0%} margin "
                    f"kept); the peak is {_fmt_bytes(fixed)} + {_fmt_bytes(each)} per example")
            over = -(-5 * max(fits, 1) // 4)
            if self._run(over).peak <= budget:
                line += (f"; batch {over} is predicted at {_fmt_bytes(self._run(over).peak)}, "
                         f"also within the budget: only the margin keeps it out")
            lines.append(line)
        if self._model is not None and not _is_mixed(self._model):
            try:
                policy, peak = self.mixed_precision_peak()
                lines.append(f"mixed precision ({policy}): {pct(peak)}")
            except Exception as e:  # noqa: BLE001 - e.g. a subclassed model cannot be cloned
                lines.append(f"mixed precision: not computed ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:100]})")
        if self.training:
            best = [(c, p) for c, p in self.recompute_effect() if p < 0.97 * base][:3]
            for call, peak in best:
                lines.append(f"tf.recompute_grad around {call.label}: {pct(peak)}")
            if not best:
                lines.append("tf.recompute_grad: no single layer lowers the peak by 3% or more")
        return lines

    # --- rows -------------------------------------------------------------

    def _rows(self, batch):
        t, rows, seen_layers = self._trace, [], set()
        slot = self.slots_per_weight if self.training else 0
        for call in t.calls:
            if hasattr(call.layer, "layers") and not call.ops:
                continue
            first = id(call.layer) not in seen_layers
            seen_layers.add(id(call.layer))
            own = [] if hasattr(call.layer, "layers") else call.layer.weights
            params = sum(_var_bytes(v) for v in own) if first else 0
            trainable = sum(_var_bytes(v) for v in own if id(v) in t.trainable) if first else 0
            grads = trainable if self.training else 0
            op_rows, kept_all = [], {}
            made = [op for op in call.ops if op.outputs and op.type not in _NO_GRADIENT
                    and op.type != "ReadVariableOp"]
            final = t.tensors[made[-1].outputs[0]] if made else None
            for op in call.ops:
                if op.type in ("Const", "Placeholder", "ReadVariableOp", "NoOp") or op.type in _ALIASES:
                    continue
                outs = [t.tensors[o] for o in op.outputs]
                batched = any(o.dims is not None and None in o.dims for o in outs)
                kept_names = t.saved(op)[0] if self.training else []
                kept = [(n, t.tensors[t.tensors[n].base]) for n in kept_names]
                kept = [(n, k) for n, k in kept if k.kind == "activation"]
                for n, k in kept:
                    kept_all[k.name] = k.bytes(batch)
                tf_ws = big_ws = None
                if op.type in _CONVS:
                    tf_w = self._plans.tf_workspace(op, batch)
                    big = self._plans.runs(op, batch, True) if op.type != "Conv2DBackpropInput" \
                        else None
                    # The gradient passes that run: the input's only if it needs a gradient.
                    gi = set(t.grad_inputs(op)) if self.training else set()
                    grad_passes = [p for p, i in (("backprop_input", 0), ("backprop_filter", 1))
                                   if i in gi]
                    tf_ws = (tf_w["forward"], sum(tf_w[p] for p in grad_passes))
                    if big:
                        big_ws = (big["forward"][1], sum(big[p][1] for p in grad_passes))
                    for p, (algorithm, _, note) in (big or {}).items():
                        if note and op.type == "BigConv2D":
                            self.notes.append(f"{call.label}, {p} ({algorithm}): {note}")
                if not batched and tf_ws is None:
                    continue
                what = ", ".join(("input " if n in op.inputs else "output ") +
                                 _fmt_bytes(k.bytes(batch)) for n, k in kept)
                op_rows.append(Row(call.label, op.type, outs[0].shape(batch) if outs else None,
                                   sum(o.bytes(batch) for o in outs), 0, 0, 0,
                                   sum(k.bytes(batch) for _, k in kept), what, tf_ws, big_ws, ""))
            total = lambda pairs: (tuple(map(sum, zip(*pairs))) if pairs else None)
            rows.append(Row(call.label, "", final.shape(batch) if final else None,
                            t.tensors[final.base].bytes(batch) if final else 0,
                            params, grads, slot * trainable, sum(kept_all.values()),
                            type(call.layer).__name__,
                            total([r.tf_workspace for r in op_rows if r.tf_workspace]),
                            total([r.bigconv_workspace for r in op_rows if r.bigconv_workspace]),
                            ""))
            if len(op_rows) > 1 or any(r.tf_workspace for r in op_rows):
                rows.extend(op_rows)
        return rows

    def table(self, max_alive=10, ops=True):
        """The report as text: the table (ops=False: layer rows only), the peak,
        the max_alive largest tensors alive at it, the advice and notes."""
        head = ["layer / op", "output shape", "output", "params", "grads", "opt. slots",
                "kept for backward", "workspace TF (fwd/bwd)", "workspace tfbigconv (fwd/bwd)"]
        b = lambda n: _fmt_bytes(n) if n else "-"
        pair = lambda p: f"{_fmt_bytes(p[0])} / {_fmt_bytes(p[1])}" if p else ""
        lines = []
        for r in self.rows:
            if r.op and not ops:
                continue
            if r.op:
                name = "  " + r.op
                kept = r.kept or "-"
            else:
                name = f"{r.layer} ({r.kept})"
                kept = b(r.kept_bytes)
            shape = "x".join(str(d) for d in r.output_shape) if r.output_shape else ""
            lines.append([name, shape, b(r.output_bytes), b(r.param_bytes), b(r.grad_bytes),
                          b(r.slot_bytes), kept, pair(r.tf_workspace), pair(r.bigconv_workspace)])
        widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
        fmt = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"
        out = [f"Memory report: batch {self.batch_size}, "
               f"{'training' if self.training else 'inference'}, device {self.device}"
               + (f", optimizer {self.optimizer} ({self.slots_per_weight} slots per weight)"
                  if self.training else ""),
               fmt(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        out += [fmt(line) for line in lines]
        s = self.peak_step
        out.append(f"Peak: {_fmt_bytes(self.peak_bytes)} = weights {_fmt_bytes(self.param_bytes)}"
                   f" + optimizer slots {_fmt_bytes(self.slot_bytes)} + batch "
                   f"{_fmt_bytes(self._persistent(self.batch_size) - self.param_bytes - self.slot_bytes)}"
                   f" + step {_fmt_bytes(self.step_peak_bytes)}; at the {s.phase} step of "
                   f"{s.layer} ({s.op})")
        out.append("Alive at the peak, largest first:")
        for a in self.alive_at_peak[:max_alive]:
            shape = f" {'x'.join(map(str, a.shape))}" if a.shape else ""
            out.append(f"  {_fmt_bytes(a.bytes):>10}  {a.layer}: {a.what}{shape}")
        if len(self.alive_at_peak) > max_alive:
            rest = sum(a.bytes for a in self.alive_at_peak[max_alive:])
            out.append(f"  {_fmt_bytes(rest):>10}  {len(self.alive_at_peak) - max_alive} more")
        if self.advice:
            out.append("Advice:")
            out += [f"  - {line}" for line in self.advice]
        out += [f"Note: {n}" for n in self.notes]
        return "\n".join(out)

    __str__ = table

    def __repr__(self):
        return f"<MemoryReport batch={self.batch_size} peak={_fmt_bytes(self.peak_bytes)}>"


def _var_bytes(v):
    return int(math.prod(v.shape)) * tf.as_dtype(v.dtype).size


def _is_mixed(model):
    policy = getattr(model, "dtype_policy", None)
    return policy is not None and getattr(policy, "compute_dtype", "float32") != \
        getattr(policy, "variable_dtype", "float32")


def _inference_view(trace):
    """The trace with no gradients: nothing kept for backward."""
    view = object.__new__(_Trace)
    view.__dict__.update(trace.__dict__)
    view.has_grad, view.needs_grad = set(), set()
    view._grad_inputs = {op.name: [] for op in trace.ops}
    view._saved = {op.name: ([], True) for op in trace.ops}
    return view


def _free_memory(device):
    """Free bytes on the device: host memory (cgroup-aware) for the CPU; for a
    GPU, TensorFlow's allocator limit less what it uses (None if unknown)."""
    if device == "CPU":
        return int(_core.free_host_memory())
    try:
        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            return None
        info = tf.config.experimental.get_memory_info("GPU:0")
        details = tf.config.experimental.get_device_details(gpus[0])
        total = details.get("memory_limit") or None
        return None if total is None else int(total - info["current"])
    except (ValueError, tf.errors.OpError):
        return None


def memory_report(model, batch_size, training=True, optimizer=None, device=None, *,
                  budget=None, input_shape=None, advice=True):
    """Which tensors a Keras model's step keeps, its simulated peak, and what to change.

    Args:
      model: a built Keras 3 model (Sequential, functional, or subclassed; a
        subclassed one needs `input_shape`).
      batch_size: the batch to report on (positive int).
      training: True for a training step (forward, backward, optimizer
        update); False for inference (forward only).
      optimizer: a Keras optimizer or its name, for its slot variables
        (default: the model's compiled optimizer; none: plain SGD).
      device: "CPU" or "GPU" (default: a visible GPU, else the CPU). It picks
        the convolution workspaces (TensorFlow's CPU col_buffer; cuDNN's;
        tfbigconv's plan for that device) and the default budget. The GPU
        numbers are estimates that have never been checked against a
        measured peak: cuDNN's workspace is taken as one image's patch
        matrix capped at 4 GiB (cuDNN picks its own algorithm and
        workspace), tfbigconv's GPU fft workspace is its smallest plan (the
        kernel may take more within its budget), and TensorFlow's GPU
        allocator's rounding and pooling are not modelled. Only the CPU
        simulation is validated (benchmarks/RESULTS.md).
      budget: bytes for the advice's largest batch (default: the device's
        free memory).
      input_shape: shape of one example without the batch (a list of shapes
        for several inputs); needed when the model has no `inputs`.
      advice: False skips the advice (faster).

    Returns a MemoryReport; print it for the table. Raises ValueError for bad
    arguments.
    """
    import keras
    if not isinstance(model, keras.Model):
        raise ValueError(f"memory_report: model must be a Keras model, got {type(model).__name__}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"memory_report: batch_size must be a positive int, got {batch_size!r}")
    if device is None:
        device = "GPU" if dispatch.gpu_available() else "CPU"
    device = str(device).upper()
    if device not in dispatch.DEVICES:
        raise ValueError(f"memory_report: device must be 'CPU' or 'GPU', got {device!r}")
    if budget is not None and (not isinstance(budget, int) or budget <= 0):
        raise ValueError(f"memory_report: budget must be a positive number of bytes, got {budget!r}")
    if not model.built:
        raise ValueError("memory_report: the model is not built; call it once or give it an Input")
    if optimizer is None and training:
        optimizer = getattr(model, "optimizer", None)
    trace = _Trace(model, input_shape, training)
    return MemoryReport(trace, batch_size, device, training, optimizer, budget, advice, model,
                        input_shape)


class explain_oom(contextlib.ContextDecorator):
    """Prints the memory report when a step runs out of memory, then re-raises.

        with tfbigconv.explain_oom(model, batch_size=16):
            model.fit(x, y, batch_size=16)

    On tf.errors.ResourceExhaustedError (TensorFlow's out-of-memory error,
    also raised by tfbigconv's ops when nothing fits their workspace_limit)
    it writes to `file` (default: stderr) the report for `batch_size`: the
    step and layer at the simulated peak, the tensors alive then, and the
    largest batch that fits `budget` (default: the device's free memory).
    The error is re-raised unchanged; a failure while reporting is noted and
    never replaces it. Other exceptions pass through untouched.
    """

    def __init__(self, model, batch_size, *, budget=None, optimizer=None, device=None,
                 input_shape=None, file=None):
        self.model, self.batch_size, self.budget = model, batch_size, budget
        self.optimizer, self.device, self.input_shape = optimizer, device, input_shape
        self.file = file
        self.report = None  # the MemoryReport printed, after an OOM

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if kind is not None and issubclass(kind, tf.errors.ResourceExhaustedError):
            out = self.file or sys.stderr
            try:
                self.report = memory_report(self.model, self.batch_size, optimizer=self.optimizer,
                                            device=self.device, budget=self.budget,
                                            input_shape=self.input_shape)
                fits = self.report.max_batch_size(self.budget)
                s = self.report.peak_step
                top = self.report.alive_at_peak[0] if self.report.alive_at_peak else None
                print(f"tfbigconv.explain_oom: ResourceExhaustedError at batch {self.batch_size}. "
                      f"Simulated peak {_fmt_bytes(self.report.peak_bytes)} at the {s.phase} step "
                      f"of {s.layer}"
                      + (f"; largest tensor then: {top.what} of {top.layer} "
                         f"({_fmt_bytes(top.bytes)})" if top else "")
                      + f"; largest batch that fits: {fits}.", file=out)
                print(self.report, file=out)
            except Exception as e:  # noqa: BLE001 - never hide the user's error
                print(f"tfbigconv.explain_oom: could not make the report ({type(e).__name__}: "
                      f"{e})", file=out)
        return False  # re-raise
