"""A Keras model's training step as an OpGraph: its forward ops traced with
the batch dimension unknown (as Keras' fit traces it), then the gradient and
update ops TensorFlow would run, synthesized from the rules (rules.py: what
each op's gradient reads, BufferRules) with one gradient op per forward op
(one per pass for a convolution)."""
import collections
import contextlib
import math

import tensorflow as tf

from tfbigconv.memory.opgraph import (Kind, OpGraph, Phase, Row, Scope, Tensor, WeightMemory,
                                      affine, shapes_at)
from tfbigconv.memory.rules import (ALIASES, BUFFER_RULES, NO_GRADIENT, OPTIMIZER_UPDATE,
                                    optimizer_slots)
from tfbigconv.memory.workspaces import GRADIENT_PASSES, gradient_workspace
from tfbigconv.planning import planner
from tfbigconv.text import fmt_bytes


def differentiable(dtype):
    """Whether a tensor of `dtype` carries a gradient: real floating point or
    complex (tf.signal's FFTs: RFFT's output, the spectra multiplied, IRFFT's
    input)."""
    return dtype.is_floating or dtype.is_complex


def var_bytes(v):
    return int(math.prod(v.shape)) * tf.as_dtype(v.dtype).size


class LayerCall:
    """One call of a layer: its ops, and the layer itself."""

    def __init__(self, layer, call):
        self.layer, self.call = layer, call
        self.ops = []

    @property
    def label(self):
        return self.layer.name if self.call == 0 else f"{self.layer.name} (call {self.call + 1})"


@contextlib.contextmanager
def recording_layer_calls(model, calls, graph):
    """Wraps each layer's call() so that every graph op is assigned to the
    innermost layer call that created it."""
    layers = list(model._flatten_layers(include_self=True, recursive=True))
    counts = collections.Counter()
    owner = {}

    def wrap(layer, call):
        def wrapped(*args, **kwargs):
            start = len(graph.get_operations())
            entry = LayerCall(layer, counts[id(layer)])
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


def input_specs(model, input_shape):
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


class Trace:
    """The model's forward ops (an OpGraph, `forward`) with static shapes
    (batch unknown), layer calls and weights; with training, the loss
    (`loss`), else none (`loss` None). step() adds the gradient and update
    ops."""

    def __init__(self, model, input_shape=None, training=True):
        from tensorflow.python.framework import func_graph
        specs = input_specs(model, input_shape)
        graph = func_graph.FuncGraph("memory_report")
        self.calls = []
        with graph.as_default():
            xs = [tf.compat.v1.placeholder(tf.as_dtype(dt), [None] + shape, name=f"input_{i}")
                  for i, (shape, dt) in enumerate(specs)]
            # tfbigconv's layers plan without timing; a plan that does not fit
            # its workspace_limit is recorded (the report says so), not raised.
            with recording_layer_calls(model, self.calls, graph) as owner, \
                    planner.planning_only() as failures:
                ys = model(xs[0] if len(xs) == 1 else xs, training=training)
            self.plan_failures = failures
            # Training: the loss, mean squared error against a target of each
            # output's shape. Inference has no loss: its ops (under mixed
            # precision, Casts to float32 and a Sub of the output's size) are
            # not part of a forward pass.
            loss = None
            if training:
                with tf.name_scope("loss"):
                    losses = []
                    for y in tf.nest.flatten(ys):
                        t = tf.compat.v1.placeholder(y.dtype, y.shape, name="target")
                        losses.append(tf.reduce_mean(tf.square(tf.cast(y, tf.float32) -
                                                               tf.cast(t, tf.float32))))
                    loss = tf.add_n(losses) if len(losses) > 1 else losses[0]
        self.graph = graph
        self.training = training
        # The loss (None in inference) and the model's outputs: the step's results.
        self.loss = loss.name if loss is not None else None
        self.outputs = [y.name for y in tf.nest.flatten(ys)]
        self.input_names = [x.name for x in xs]
        self.notes, self.has_batch, self._steps = [], True, {}
        self._variables(model, graph)
        self._ops(graph, owner)
        self._size_unknown_dims()
        self._gradient_flow()

    def _variables(self, model, graph):
        by_handle = {}
        for v in model.weights:
            value = getattr(v, "value", v)  # Keras 3: the tf.Variable; tf_keras: a method
            handle = getattr(v if callable(value) else value, "handle", None)
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
        """The forward OpGraph: each op's layer call (LayerCall), or the
        "(loss)" or "(model)" scope for those outside every layer."""
        scopes = {"loss": Scope("(loss)"), "model": Scope("(model)")}
        layer_of = lambda op: owner.get(op.name) or scopes[
            "loss" if op.name.startswith("loss/") else "model"]
        self.forward = OpGraph()
        self.forward.add_tf_ops(graph.get_operations(), layer_of, lambda op: Phase.FORWARD)
        self.forward.input_names = list(self.input_names)
        self.ops, self.tensors = self.forward.ops, self.forward.tensors
        for op in self.ops:
            op.layer.ops.append(op)

    def _size_unknown_dims(self):
        """Sizes the dimensions that the static shapes leave unknown: not all are
        the batch (tf.signal's rfft pads to a length computed from tf.shape;
        Keras 3's Dense on a sequence multiplies a [batch * length, d] matrix):
        TensorFlow's shape inference at three batches (shapes_at), a dimension
        k * b + c at all three becomes (k, c) (dim_at). None stays the batch
        where that fails; a tensor of unknown rank counts as 0 bytes."""
        unknown = [t for t in self.tensors.values()
                   if t.kind == Kind.ACTIVATION and t.itemsize and
                   (t.dims is None or None in t.dims)]
        if not unknown:
            return
        inputs = {name: (self.tensors[name].dtype, self.tensors[name].dims)
                  for name in self.input_names}
        handles = {name: (tf.as_dtype(v.dtype), list(v.shape))
                   for name, v in self.variable_of.items()}
        batches = (2, 3, 4)
        try:
            found = [shapes_at(self.graph, inputs, handles, b) for b in batches]
        except (ValueError, tf.errors.OpError):
            return
        for t in unknown:
            shapes = [f.get(t.name) for f in found]
            if any(s is None for s in shapes) or len({len(s) for s in shapes}) != 1:
                continue
            dims = t.dims if t.dims is not None else [None] * len(shapes[0])
            sized = [d if d is not None else affine([s[i] for s in shapes], batches)
                     for i, d in enumerate(dims)]
            # (1, 0) is the batch itself, None in this trace's dimensions.
            t.dims = [None if d == (1, 0) else d for d in sized]

    def variable(self, tensor_name):
        """The Keras variable a ReadVariableOp output reads, or None."""
        t = self.tensors[tensor_name]
        if t.kind != Kind.PARAMETER:
            return None
        return self.variable_of.get(t.op.inputs[0])

    def _gradient_flow(self):
        """needs_grad: tensors that depend on a trainable weight; has_grad:
        tensors the loss depends on through differentiable ops."""
        self.needs_grad = set()
        for op in self.ops:
            if op.type in NO_GRADIENT:
                continue
            for name in op.outputs:
                t = self.tensors[name]
                if not differentiable(t.dtype):
                    continue
                if op.type == "ReadVariableOp":
                    v = self.variable(name)
                    if v is not None and id(v) in self.trainable:
                        self.needs_grad.add(name)
                elif any(i in self.needs_grad for i in op.inputs):
                    self.needs_grad.add(name)
        self.has_grad = {self.loss} if self.loss is not None else set()
        for op in reversed(self.ops):
            if op.type in NO_GRADIENT or not any(o in self.has_grad for o in op.outputs):
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
        if op.type in NO_GRADIENT or not any(o in self.has_grad for o in op.outputs):
            return []
        return [i for i, name in enumerate(op.inputs)
                if name in self.needs_grad and name in self.has_grad]

    def _find_saved(self, op):
        keep = []
        for i in self._grad_inputs[op.name]:
            keep += [n for n in self.saved_by_gradient(op, i) if n not in keep]
        # unknown: the gradient is assumed to keep every input and output
        return keep, op.type in BUFFER_RULES.saved_for_backward or not keep

    def saved_by_gradient(self, op, index):
        """The tensors the gradient of op's input `index` reads (all its
        differentiable inputs and outputs where no rule is known)."""
        refs = BUFFER_RULES.saved(op.type, index)
        if refs is None:
            return [n for n in op.inputs + op.outputs if differentiable(self.tensors[n].dtype)]
        return [op.inputs[int(r[2:])] if r.startswith("in") else op.outputs[int(r[3:])]
                for r in refs]

    def weight_memory(self, optimizer):
        """WeightMemory: the model's weights, and the slots `optimizer` (a Keras
        optimizer, its name, or None: plain SGD) keeps per trainable weight."""
        slots, name = optimizer_slots(optimizer) if self.training else (0, "")
        trainable = [v for v in self.weights if id(v) in self.trainable]
        return WeightMemory(sum(var_bytes(v) for v in self.weights),
                            slots * sum(var_bytes(v) for v in trainable), slots, name)

    def step(self, recompute=(), convert=()):
        """The step's OpGraph: in training the forward ops, then one gradient
        op per forward op that passes a gradient (one per pass of a
        convolution), an AddN where a tensor's gradient has several parts,
        and the optimizer's update (OPTIMIZER_UPDATE), which reads every
        weight's gradient; in inference the forward ops, the outputs fetched.
        recompute: layer calls under tf.recompute_grad (their kept tensors
        made again when their gradient starts); convert: ids of the Keras
        layers whose convolutions run as tfbigconv's. Cached."""
        key = (tuple(sorted(id(c) for c in recompute)), frozenset(convert))
        if key not in self._steps:
            step = self.forward.copy()
            step.convert = frozenset(convert)
            if self.loss is None:
                step.fetched = list(self.outputs)
            else:
                _Backward(self, step, {id(c) for c in recompute}).build()
            self._steps[key] = step
        return self._steps[key]

    def rows(self, batch, plans, slots_per_weight, step):
        """The report's rows (opgraph.Row; see MemoryReport.rows) and notes:
        one per layer call, then one per op of it with batch-sized outputs
        or a workspace; step: the simulated one (its oneDNN workspaces)."""
        rows, notes, seen_layers = [], [], set()
        for call in self.calls:
            if hasattr(call.layer, "layers") and not call.ops:
                continue
            first = id(call.layer) not in seen_layers
            seen_layers.add(id(call.layer))
            own = [] if hasattr(call.layer, "layers") else call.layer.weights
            params = sum(var_bytes(v) for v in own) if first else 0
            trainable = sum(var_bytes(v) for v in own if id(v) in self.trainable) if first else 0
            grads = trainable if self.training else 0
            op_rows, kept_all = [], {}
            made = [op for op in call.ops if op.outputs and op.type not in NO_GRADIENT
                    and op.type != "ReadVariableOp"]
            final = self.tensors[made[-1].outputs[0]] if made else None
            for op in call.ops:
                if op.type in ("Const", "Placeholder", "ReadVariableOp", "NoOp") or \
                        op.type in ALIASES:
                    continue
                outs = [self.tensors[o] for o in op.outputs]
                kept = self.saved(op)[0] + (step.extra_outputs.get(op.name, [])
                                            if self.grad_inputs(op) else [])
                kept = [(n, step.tensors[step.tensors[n].base]) for n in kept]
                kept = [(n, k) for n, k in kept if k.kind in (Kind.ACTIVATION, Kind.WORKSPACE)]
                for _, k in kept:
                    kept_all[k.name] = k.bytes(batch)
                tf_ws = big_ws = None
                if op.type in GRADIENT_PASSES:
                    tf_w = plans.tf_workspace(op, batch)
                    big = plans.runs(op, batch, True) if op.type != "Conv2DBackpropInput" \
                        else None
                    # The gradient passes that run: the input's only if it needs a gradient.
                    gi = set(self.grad_inputs(op)) if self.training else set()
                    grad_passes = [p for p, i in (("backprop_input", 0), ("backprop_filter", 1))
                                   if i in gi]
                    tf_ws = (tf_w["forward"], sum(tf_w[p] for p in grad_passes))
                    if big:
                        big_ws = (big["forward"][1], gradient_workspace(big, grad_passes)[0])
                    for p, (algorithm, _, note) in (big or {}).items():
                        if note and op.type == "BigConv2D":
                            notes.append(f"{call.label}, {p} ({algorithm}): {note}")
                if not any(o.batched for o in outs) and tf_ws is None:
                    continue
                what = ", ".join(("input " if n in op.inputs else "output " if n in op.outputs
                                  else f"oneDNN {op.type} workspace ") + fmt_bytes(k.bytes(batch))
                                 for n, k in kept)
                op_rows.append(Row(call.label, op.type, outs[0].shape(batch) if outs else None,
                                   sum(o.bytes(batch) for o in outs), 0, 0, 0,
                                   sum(k.bytes(batch) for _, k in kept), what, tf_ws, big_ws, ""))
            total = lambda pairs: (tuple(map(sum, zip(*pairs))) if pairs else None)
            rows.append(Row(call.label, "", final.shape(batch) if final else None,
                            self.tensors[final.base].bytes(batch) if final else 0,
                            params, grads, slots_per_weight * trainable, sum(kept_all.values()),
                            type(call.layer).__name__,
                            total([r.tf_workspace for r in op_rows if r.tf_workspace]),
                            total([r.bigconv_workspace for r in op_rows if r.bigconv_workspace]),
                            ""))
            if len(op_rows) > 1 or any(r.tf_workspace for r in op_rows):
                rows.extend(op_rows)
        return rows, notes


class _Backward:
    """Adds a trace's gradient and update ops to `step` (Trace.step)."""

    def __init__(self, trace, step, recompute):
        self.trace, self.step, self.recompute = trace, step, recompute
        self.parts = collections.defaultdict(list)  # forward tensor -> its gradient's parts
        self.done = {}  # forward tensor -> its complete gradient
        self.copies = {}  # forward buffer -> its recomputed copy (recompute)

    def build(self):
        t, step = self.trace, self.step
        expected = collections.Counter(op.inputs[i] for op in t.ops for i in t.grad_inputs(op))
        seed = Tensor("gradients/loss:0", None, t.tensors[t.loss].dtype, [],
                      what="gradient of the loss")
        loss_scope = t.tensors[t.loss].op.layer
        step.add_op("gradients/loss", "OnesLike", [t.loss], [seed], loss_scope, Phase.BACKWARD)
        self.parts[t.loss].append(seed.name)
        started = set()
        for f in reversed(t.ops):
            gi = t.grad_inputs(f)
            if not gi:
                continue
            if id(f.layer) in self.recompute and id(f.layer) not in started:
                started.add(id(f.layer))
                self._recompute(f.layer)
            outs = [self.gradient(o, f.layer) for o in f.outputs
                    if expected[o] or o == t.loss]
            passes = GRADIENT_PASSES.get(f.type)
            groups = [[i] for i in gi] if passes else [gi]
            for group in groups:
                saved = [n for i in group for n in t.saved_by_gradient(f, i)]
                saved = [self.copies.get(t.tensors[n].base, n) for n in dict.fromkeys(saved)]
                grads = [self._gradient_tensor(f, i, outs) for i in group]
                p = (passes[group[0]],) if passes else ()
                step.add_op(f"{f.name}/grad" + (f"/{p[0]}" if p else ""), f"{f.type}Grad",
                            outs + saved, grads, f.layer, Phase.BACKWARD, forward=f,
                            conv=f if p else None, passes=p)
                for i, g in zip(group, grads):
                    self.parts[f.inputs[i]].append(g.name)
        update = Scope("(optimizer)")
        weights = [self.gradient(n, update) for n in list(self.parts)
                   if t.variable(n) is not None]
        if weights:
            step.add_op("apply_gradients", OPTIMIZER_UPDATE, weights, [], update, Phase.UPDATE)

    def gradient(self, name, layer):
        """The complete gradient of forward tensor `name`: its one part, or an
        AddN of its parts."""
        if name not in self.done:
            parts = self.parts[name]
            if len(parts) > 1:
                t = self.trace.tensors[name]
                total = Tensor(f"{name}/grad_sum", None, t.dtype, t.dims,
                               what=f"gradient of {t.op.type} output (sum)")
                self.step.add_op(f"{name}/grad_sum", "AddN", parts, [total], layer,
                                 Phase.BACKWARD)
                parts = [total.name]
            self.done[name] = parts[0]
        return self.done[name]

    def _gradient_tensor(self, f, i, outs):
        """The gradient of f's input i: a view of the incoming gradient where
        it passes through, else a buffer of the input's size."""
        t = self.trace
        x = t.tensors[f.inputs[i]]
        name = f"{f.name}/grad_{i}"
        out = f.outputs[BUFFER_RULES.gradient_output(f.type, i)]
        incoming = self.done.get(out)
        if incoming and BUFFER_RULES.passes_gradient_through(f.type, i, x.dims,
                                                            t.tensors[out].dims):
            return Tensor(name, None, x.dtype, x.dims, base=self.step.tensors[incoming].base)
        v = t.variable(x.name)
        what = (f"gradient of {getattr(v, 'path', v.name)}" if v is not None  # Keras 3, tf_keras
                else f"gradient of {x.op.type} output")
        return Tensor(name, None, x.dtype, x.dims, what=what)

    def _recompute(self, call):
        """tf.recompute_grad around `call`: once the gradients reaching it are
        in, its kept tensors are made again (the forward ones are then not
        kept)."""
        t = self.trace
        kept = {t.tensors[n].base for op in call.ops for n in t.saved(op)[0]}
        kept = [b for b in kept if t.tensors[b].op.layer is call]
        incoming = [g for name, parts in self.parts.items()
                    if t.tensors[name].op.layer is call for g in parts]
        copies = []
        for base in sorted(kept, key=lambda b: t.tensors[b].op.index):
            x = t.tensors[base]
            copies.append(Tensor(f"{base}/recomputed", None, x.dtype, x.dims,
                                 what=f"{x.op.type} output (recomputed)"))
            self.copies[base] = copies[-1].name
        self.step.add_op(f"{call.label}/recompute", "Recompute", incoming or ["gradients/loss:0"],
                         copies, call, Phase.BACKWARD)
