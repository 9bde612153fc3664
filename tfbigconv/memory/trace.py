"""Tracing a Keras model's training step into ops and tensors, with the batch
dimension unknown (as Keras' fit traces it)."""
import collections
import contextlib

import tensorflow as tf

from tfbigconv.planning import planner
from tfbigconv.memory.rules import ALIASES, NO_GRADIENT, SAVED_FOR_BACKWARD, VARIADIC_NOTHING

# ---------------------------------------------------------------------------
# Tracing


def dim_at(d, batch):
    """A dimension's size at `batch`: d an int (fixed), None (the batch), or
    (k, c): k * batch + c (a graph's dimension as its shape inference scales
    it with the batch, graph.GraphTrace.size_unknown_dims)."""
    return batch if d is None else d if isinstance(d, int) else d[0] * batch + d[1]


class Tensor:
    __slots__ = ("name", "dims", "itemsize", "op", "kind", "base", "dtype")

    def bytes(self, batch):
        if self.dims is None:
            return 0
        n = self.itemsize
        for d in self.dims:
            n *= dim_at(d, batch)
        return n

    def shape(self, batch):
        return None if self.dims is None else [dim_at(d, batch) for d in self.dims]


class Op:
    __slots__ = ("index", "name", "type", "inputs", "outputs", "layer", "attrs", "tf_op")


def differentiable(dtype):
    """Whether a tensor of `dtype` carries a gradient: real floating point or
    complex (tf.signal's FFTs: RFFT's output, the spectra multiplied, IRFFT's
    input)."""
    return dtype.is_floating or dtype.is_complex


def affine(sizes, batches):
    """(k, c) where sizes[i] = k * batches[i] + c for all i (c alone where
    k is 0), else None (unknown somewhere, or not affine in the batch)."""
    if None in sizes:
        return None
    k, rest = divmod(sizes[1] - sizes[0], batches[1] - batches[0])
    c = sizes[0] - k * batches[0]
    if rest or any(s != k * b + c for s, b in zip(sizes, batches)):
        return None
    return (k, c) if k else c



def shapes_at(graph, inputs, handles, batch):
    """{tensor name: its shape as a list (None: unknown rank)} as TensorFlow's
    shape inference gives it with the inputs' unknown dimensions set to batch:
    the graph imported into a new one, its inputs ({name: (dtype, dims)})
    placeholders of those shapes, its captured variables ({handle tensor name:
    (dtype, shape)}) variable handles of their shapes, as the handles carry
    them. Raises ValueError where the shapes contradict the graph."""
    inferred = tf.Graph()
    with inferred.as_default():
        feeds = {}
        for i, (name, (dtype, dims)) in enumerate(inputs.items()):
            shape = None if dims is None else [batch if d is None else d for d in dims]
            feeds[name] = tf.compat.v1.placeholder(dtype, shape, name=f"input_{i}")
        for i, (name, (dtype, shape)) in enumerate(handles.items()):
            feeds[name] = tf.raw_ops.VarHandleOp(dtype=dtype, shape=shape,
                                                 shared_name=f"variable_{i}",
                                                 name=f"variable_{i}")
        tf.graph_util.import_graph_def(graph.as_graph_def(), input_map=feeds, name="graph")
    shape = lambda t: t.shape.as_list() if t.shape.rank is not None else None
    return {op.name[len("graph/"):] + f":{k}": shape(t)
            for op in inferred.get_operations() if op.name.startswith("graph/")
            for k, t in enumerate(op.outputs)}


def onednn_workspace(trace, op, per_element):
    """Registers the workspace oneDNN's kernel keeps beside op's first output (TF's
    graph rewrite adds it as an extra output), per_element bytes per output
    element, in trace.tensors and trace.extra_outputs; returns its name."""
    out = trace.tensors[op.outputs[0]]
    tensor = Tensor()
    tensor.name = tensor.base = f"{op.name}:workspace"
    tensor.op, tensor.dtype, tensor.kind = op, tf.uint8, "workspace"
    tensor.dims, tensor.itemsize = out.dims, per_element
    trace.tensors[tensor.name] = tensor
    trace.extra_outputs[op.name] = [tensor.name]
    return tensor.name


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


def flavour_of(model):
    """The Keras flavour (tfbigconv.keras.flavours: Keras 3 or tf_keras) of
    `model`, or None for neither."""
    from tfbigconv.keras import flavours
    try:
        return flavours.of(model)
    except ValueError:
        return None


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
    """The model's ops with static shapes (batch unknown), layer calls and
    weights; with training, the loss (`loss`), else none (`loss` None)."""

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
        self._variables(model, graph)
        self._ops(graph, owner)
        self._size_unknown_dims()

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
        self.ops, self.tensors = [], {}
        for i, tf_op in enumerate(graph.get_operations()):
            op = Op()
            op.index, op.name, op.type, op.tf_op = i, tf_op.name, tf_op.type, tf_op
            op.inputs = [t.name for t in tf_op.inputs]
            op.outputs = [t.name for t in tf_op.outputs]
            op.layer = owner.get(tf_op.name)
            if op.layer is not None:
                op.layer.ops.append(op)
            for index, t in enumerate(tf_op.outputs):
                tensor = Tensor()
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
                elif op.type in ALIASES and op.inputs:
                    tensor.base = self.tensors[op.inputs[0]].base
                elif op.type == "IdentityN" and index < len(op.inputs):
                    # tf.custom_gradient's IdentityN: output i is input i's buffer.
                    tensor.base = self.tensors[op.inputs[index]].base
                self.tensors[t.name] = tensor
            self.ops.append(op)
        self._gradient_flow()

    def _size_unknown_dims(self):
        """Sizes the dimensions that the static shapes leave unknown: not all are
        the batch (tf.signal's rfft pads to a length computed from tf.shape;
        Keras 3's Dense on a sequence multiplies a [batch * length, d] matrix):
        TensorFlow's shape inference at three batches (shapes_at), a dimension
        k * b + c at all three becomes (k, c) (dim_at). None stays the batch
        where that fails; a tensor of unknown rank counts as 0 bytes."""
        unknown = [t for t in self.tensors.values()
                   if t.kind == "activation" and t.itemsize and (t.dims is None or None in t.dims)]
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
        if t.kind != "parameter":
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
        # op name -> tensors the op makes beyond its graph outputs (a kernel's
        # workspace kept for the gradient: add_onednn_workspaces)
        self.extra_outputs = {}

    def add_onednn_workspaces(self, per_element_of):
        """Adds the tensors oneDNN's CPU kernels keep for the backward pass beyond
        the op's own outputs (TF's graph rewrite adds them as extra outputs):
        per_element_of(op) gives the bytes per output element of an op's
        (workspaces.onednn_maxpool_workspace), 0 for none. Once per trace."""
        if getattr(self, "onednn", False):
            return
        self.onednn = True
        for op in self.ops:
            per_element = per_element_of(op)
            names, known = self._saved[op.name]
            if not per_element or not self._grad_inputs[op.name]:
                continue
            self._saved[op.name] = (names + [onednn_workspace(self, op, per_element)], known)

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
        grads = self._grad_inputs[op.name]
        if not grads:
            return [], True
        rule = SAVED_FOR_BACKWARD.get(op.type)
        if rule is None:  # unknown: assume it keeps every input and output
            names = [n for n in op.inputs + op.outputs if differentiable(self.tensors[n].dtype)]
            return names, False
        keep = []
        for i in grads:
            for ref in rule.get(i, () if op.type in VARIADIC_NOTHING else None) or ():
                which, k = ref[:-1], int(ref[-1])
                name = op.inputs[k] if which == "in" else op.outputs[k]
                if name not in keep:
                    keep.append(name)
        return keep, True
