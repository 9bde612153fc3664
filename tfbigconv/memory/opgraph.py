"""The op graph of one step as the memory report simulates it: ops and the
tensors they make, each tensor on a buffer (its own, or the one it views). One
builder (OpGraph.add_tf_ops) reads TensorFlow's ops for both a Keras model's
trace (trace.py, which then adds the gradient and update ops it synthesizes:
OpGraph.add_op) and a graph that holds its own (graph.py); simulate.simulate
runs either."""
import collections
import copy
import dataclasses
import enum

import tensorflow as tf

from tfbigconv.memory.rules import BUFFER_RULES, GRADIENT_OPS
from tfbigconv.memory.workspaces import CONV_OPERANDS, conv_passes


class Phase(enum.StrEnum):
    """Which part of the step an op runs in."""
    FORWARD = "forward"
    BACKWARD = "backward"
    UPDATE = "update"


class Kind(enum.StrEnum):
    """What a tensor's buffer is: the step allocates activations and workspaces;
    constants, inputs and parameters live across steps (or are not counted)."""
    ACTIVATION = "activation"
    WORKSPACE = "workspace"
    CONSTANT = "constant"
    INPUT = "input"
    PARAMETER = "parameter"


# The kinds of what a step allocates, as the timeline stacks them (the
# persistent kinds, weights, slots and the batch, are the report's).
KEPT = "activations kept for backward"   # and oneDNN workspaces kept for a gradient
OUTPUTS = "other forward outputs"        # read by later forward ops (or returned), not kept
PARAM_GRADS = "weight gradients"
GRADS = "activation gradients"
WORKSPACES = "workspaces"                # kernels' transient buffers, optimizer temporaries
STEP_KINDS = (KEPT, OUTPUTS, PARAM_GRADS, GRADS, WORKSPACES)

VARIABLE_OPS = ("VarHandleOp", "VariableV2", "Variable")


def dim_at(d, batch):
    """A dimension's size at `batch`: d an int (fixed), None (the batch), or
    (k, c): k * batch + c (as TensorFlow's shape inference scales it)."""
    return batch if d is None else d if isinstance(d, int) else d[0] * batch + d[1]


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


class Tensor:
    """A tensor: dims (ints, None for the batch, (k, c) for k * batch + c;
    None for an unknown rank), the buffer it is on (base: its own name, or the
    tensor it views), its Kind, and `what`: how the report names it (None:
    from its op and phase, OpGraph.describe)."""
    __slots__ = ("name", "dims", "itemsize", "op", "kind", "base", "dtype", "what")

    def __init__(self, name, op, dtype, dims, kind=Kind.ACTIVATION, base=None, what=None):
        self.name, self.op, self.dtype, self.dims, self.kind = name, op, dtype, dims, kind
        base_dtype = dtype.base_dtype
        self.itemsize = base_dtype.size if base_dtype not in (tf.resource, tf.variant,
                                                              tf.string) else 0
        self.base, self.what = base or name, what

    def bytes(self, batch):
        if self.dims is None:
            return 0
        n = self.itemsize
        for d in self.dims:
            n *= dim_at(d, batch)
        return n

    def shape(self, batch):
        return None if self.dims is None else [dim_at(d, batch) for d in self.dims]

    @property
    def batched(self):
        """Whether its size scales with the batch (a dim None or (k, c))."""
        return self.dims is not None and any(not isinstance(d, int) for d in self.dims)


class Op:
    """An op: TensorFlow's (tf_op) or one the trace synthesizes (tf_op None).
    layer: its layer call or scope (a `label`); forward: the forward op a
    gradient op differentiates (for its temporaries, GRADIENT_TEMPORARIES);
    conv, passes: the convolution op whose geometry and plan its workspace
    comes from, and the passes it runs (ConvPlans.runs); () for no workspace."""
    __slots__ = ("index", "name", "type", "inputs", "outputs", "layer", "tf_op", "phase",
                 "forward", "conv", "passes")

    def __init__(self, index, name, type_, inputs, outputs, layer, phase, tf_op=None,
                 forward=None, conv=None, passes=()):
        self.index, self.name, self.type, self.tf_op = index, name, type_, tf_op
        self.inputs, self.outputs, self.layer, self.phase = inputs, outputs, layer, phase
        self.forward, self.conv, self.passes = forward, conv, passes


class Scope:
    """A group of ops the report names: a graph's name scope, or a Keras
    trace's ops outside every layer ("(loss)", "(model)", "(optimizer)")."""

    def __init__(self, label):
        self.label, self.ops, self.layer = label, [], None


class OpGraph:
    """Ops in the order they were added (a topological order), tensors by name,
    who reads what. fetched: tensors alive to the end (returned); input_names:
    the batch's placeholders; convert: ids of the Keras layers whose
    convolutions run as tfbigconv's (the advice's re-runs); extra_outputs,
    extra_inputs: {op name: [tensor names]} beyond TF's (oneDNN's
    workspaces)."""

    def __init__(self):
        self.ops, self.tensors, self.op_named = [], {}, {}
        self.consumers = collections.defaultdict(list)
        self.producers = {}
        self.fetched, self.input_names, self.convert = [], [], frozenset()
        self.extra_outputs, self.extra_inputs = {}, {}
        self.onednn = False
        self._readers = None  # readers(), until an op or a read is added

    def copy(self):
        """A copy to add ops to: the ops and tensors shared, the lists its own."""
        other = copy.copy(self)
        other.ops, other.tensors, other.op_named = list(self.ops), dict(self.tensors), \
            dict(self.op_named)
        other.consumers = collections.defaultdict(list, {k: list(v) for k, v in
                                                         self.consumers.items()})
        other.producers = dict(self.producers)
        other.extra_outputs = {k: list(v) for k, v in self.extra_outputs.items()}
        other.extra_inputs = {k: list(v) for k, v in self.extra_inputs.items()}
        other.fetched, other._readers = list(self.fetched), None
        return other

    def _link(self, op, producers):
        self._readers = None
        self.ops.append(op)
        self.op_named[op.name] = op
        self.producers[op.name] = producers
        for p in producers:
            self.consumers[p].append(op.name)

    def add_tf_ops(self, tf_ops, layer_of, phase_of):
        """Adds TensorFlow's ops (producers first): layer_of(tf_op) and
        phase_of(tf_op) give each one's layer and Phase; its outputs' buffers
        follow BUFFER_RULES, their kinds the op type."""
        names = {op.name for op in tf_ops}
        for tf_op in tf_ops:
            phase = phase_of(tf_op)
            op = Op(len(self.ops), tf_op.name, tf_op.type, [t.name for t in tf_op.inputs],
                    [t.name for t in tf_op.outputs], layer_of(tf_op), phase, tf_op)
            if op.type in CONV_OPERANDS:
                op.conv, op.passes = op, conv_passes(op.type)
            if op.type in GRADIENT_OPS:
                forward_type, index = GRADIENT_OPS[op.type]
                forward = self.tensors[op.inputs[index]].op
                op.forward = forward if forward.type == forward_type else None
            for index, t in enumerate(tf_op.outputs):
                tensor = Tensor(t.name, op, t.dtype,
                                t.shape.as_list() if t.shape.rank is not None else None)
                if op.type == "Const":
                    tensor.kind = Kind.CONSTANT
                elif op.type == "Placeholder":
                    tensor.kind = Kind.INPUT
                elif op.type in VARIABLE_OPS or op.type == "ReadVariableOp":
                    tensor.kind = Kind.PARAMETER  # the variable's own buffer
                else:
                    viewed = BUFFER_RULES.viewed_input(op.type, index, len(op.inputs),
                                                       t.dtype._is_ref_dtype)
                    if viewed is not None:
                        tensor.base = self.tensors[op.inputs[viewed]].base
                self.tensors[t.name] = tensor
            producers = {t.op.name for t in tf_op.inputs} | {c.name for c in tf_op.control_inputs}
            self._link(op, producers & names)

    def add_op(self, name, type_, inputs, outputs, layer, phase, forward=None, conv=None,
               passes=()):
        """Adds a synthesized op reading `inputs` (tensor names); outputs:
        [Tensor] (their op set here). Returns the Op."""
        op = Op(len(self.ops), name, type_, list(inputs), [t.name for t in outputs], layer,
                phase, forward=forward, conv=conv, passes=passes)
        for t in outputs:
            t.op = op
            self.tensors[t.name] = t
        self._link(op, {self.tensors[n].op.name for n in inputs})
        return op

    def reads(self, op):
        """The tensors op reads: its inputs and extra inputs."""
        return op.inputs + self.extra_inputs.get(op.name, [])

    def makes(self, op):
        """The tensors op makes: its outputs and extra outputs."""
        return op.outputs + self.extra_outputs.get(op.name, [])

    def readers(self):
        """{buffer: phases of the ops that read it, through views}."""
        if self._readers is None:
            self._readers = collections.defaultdict(set)
            for op in self.ops:
                for name in self.reads(op):
                    self._readers[self.tensors[name].base].add(op.phase)
        return self._readers

    def add_onednn_workspaces(self, per_element_of):
        """The workspace oneDNN's kernels keep for a gradient (TF's graph rewrite
        adds it as an extra output; _MklNativeMaxPoolGrad reads it):
        per_element_of(op) gives the bytes per output element of a forward
        op's (workspaces.onednn_maxpool_workspace), 0 for none. Each gradient
        op of such a forward op reads it. Once per graph."""
        if self.onednn:
            return
        self.onednn, self._readers = True, None
        made = {}
        for op in self.ops:
            forward = op.forward
            if forward is None or forward.phase != Phase.FORWARD or \
                    not per_element_of(forward):
                continue
            if forward.name not in made:
                out = self.tensors[forward.outputs[0]]
                name = f"{forward.name}:workspace"
                tensor = Tensor(name, forward, tf.uint8, out.dims, Kind.WORKSPACE)
                tensor.itemsize = per_element_of(forward)
                self.tensors[name] = tensor
                self.extra_outputs[forward.name] = [name]
                made[forward.name] = name
            self.extra_inputs.setdefault(op.name, []).append(made[forward.name])

    def kind_of(self, name, readers):
        """The timeline's kind (STEP_KINDS) of a buffer the step allocates;
        readers: self.readers()."""
        phase = self.tensors[name].op.phase
        if phase == Phase.FORWARD:
            return KEPT if Phase.BACKWARD in readers[name] else OUTPUTS
        if phase == Phase.BACKWARD:
            return PARAM_GRADS if Phase.UPDATE in readers[name] else GRADS
        return WORKSPACES

    def describe(self, name):
        """How the report names a tensor: its `what`, or its op's type and phase."""
        tensor = self.tensors[name]
        if tensor.what:
            return tensor.what
        if tensor.kind == Kind.WORKSPACE:
            return f"oneDNN {tensor.op.type} workspace"
        return {Phase.FORWARD: f"{tensor.op.type} output",
                Phase.BACKWARD: f"{tensor.op.type} output (gradient)",
                Phase.UPDATE: f"{tensor.op.type} output (update)"}[tensor.op.phase]


# What a step's source (a Keras trace, a graph) gives the report.
Row = collections.namedtuple(
    "Row", "layer op output_shape output_bytes param_bytes grad_bytes slot_bytes kept_bytes "
           "kept tf_workspace bigconv_workspace note")


@dataclasses.dataclass(frozen=True)
class WeightMemory:
    """What lives across steps besides the batch: the weights' bytes, the
    optimizer's slot variables' bytes, slots per trainable weight, and the
    optimizer as the report names it."""
    param_bytes: int
    slot_bytes: int
    slots_per_weight: int
    optimizer: str
