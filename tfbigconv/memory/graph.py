"""A graph that holds its own gradients as ops, as the memory report reads it:
a tf.function's ConcreteFunction (a training step with tf.GradientTape and an
optimizer's update, or any step) or a TF1 tf.Graph with the tensors and ops
it fetches (tf.gradients, an optimizer's minimize). Its "layers" are its name
scopes; its weights are its variables, and the variables only its update
reads (an optimizer's slots, its step counter) are the optimizer's slots.

A GraphTrace is the step's OpGraph itself (opgraph.py's builder reads its
ops); simulate.simulate runs it."""
import math
import re

import tensorflow as tf

from tfbigconv.memory.opgraph import (KEPT, PARAM_GRADS, VARIABLE_OPS, Kind, OpGraph, Phase, Row,
                                      Scope, WeightMemory, affine, shapes_at)
from tfbigconv.memory.rules import ALIASES, NO_GRADIENT
from tfbigconv.text import fmt_bytes

# The name scope TensorFlow builds gradients under: tf.gradients' "gradients"
# (or "gradients_1", ...), GradientTape's "gradient_tape", maybe nested.
GRADIENT_SCOPE = re.compile(r"^(?:.*/)?(?:gradients(?:_\d+)?|gradient_tape)/")
# Ops whose memory is inside them (a called function, a loop): counted by
# their outputs only.
OPAQUE = ("PartitionedCall", "StatefulPartitionedCall", "While", "StatelessWhile", "If",
          "StatelessIf", "Case")
UPDATE = "(optimizer)"


# The name scopes tfbigconv's functions open around their ops (bigconv1d's,
# bigconv2d's, bigconv3d's; TF makes a second one in a scope "bigconv2d_1"):
# inside a caller's scope (a layer's), their ops are the caller's.
OP_SCOPE = re.compile(r"/bigconv[123]d(?:_\d+)?(?:/|$)")


def scope_of(name, depth):
    """The report's scope of an op (or variable) name: its name scope, an op
    scope (OP_SCOPE) folded into the scope that holds it, cut to `depth`
    components."""
    scope = name.rsplit("/", 1)[0] if "/" in name else "(top level)"
    inner = OP_SCOPE.search(scope)
    scope = scope[:inner.start()] if inner else scope
    return "/".join(scope.split("/")[:depth]) if depth else scope


def variable_bytes(op):
    """Bytes of the variable a VarHandleOp or VariableV2 op creates."""
    shape = tf.TensorShape(op.get_attr("shape"))
    dtype = tf.as_dtype(op.get_attr("dtype"))
    return int(math.prod(shape.as_list())) * dtype.base_dtype.size if shape.is_fully_defined() \
        else 0


class GraphTrace(OpGraph):
    """The ops a graph runs for its fetches, with static shapes (the batch
    may be unknown), phases (forward, backward, update), scopes (the report's
    layers: `calls`) and variables.

    Build it with from_function or from_graph."""

    @classmethod
    def from_function(cls, fn, scope_depth=None):
        """From a tf.function with an input_signature, or a ConcreteFunction."""
        concrete = fn
        if not hasattr(fn, "graph"):
            if getattr(fn, "input_signature", None) is None:
                raise ValueError("memory_report: a tf.function needs an input_signature (or "
                                 "pass its ConcreteFunction: fn.get_concrete_function(...))")
            concrete = fn.get_concrete_function()
        graph = concrete.graph
        captured = {id(internal): external for external, internal in graph.captures}
        variables = {}  # internal handle tensor name -> (name, bytes)
        handles = {}  # internal handle tensor name -> (dtype, shape), for shape inference
        by_handle = {id(v.handle): v for v in graph.variables}
        for external, internal in graph.captures:
            v = by_handle.get(id(external))
            if v is not None:
                variables[internal.name] = (v.name, int(math.prod(v.shape)) * v.dtype.size)
                handles[internal.name] = (v.dtype, v.shape)
        inputs = [t for t in graph.inputs if id(t) not in captured]
        fetched = [t for t in tf.nest.flatten(graph.outputs) if isinstance(t, tf.Tensor)]
        return cls(graph, fetched, list(graph.control_outputs), inputs, variables, scope_depth,
                   handles)

    @classmethod
    def from_graph(cls, graph, fetches, scope_depth=None):
        """From a TF1 tf.Graph and what a session run fetches (tensors,
        operations or their names)."""
        if not fetches:
            raise ValueError("memory_report: a tf.Graph needs fetches=[...], the tensors and "
                             "operations one step runs (e.g. the train op and the loss)")
        tensors, ops = [], []
        for f in tf.nest.flatten(fetches):
            try:
                element = graph.as_graph_element(f)
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"memory_report: fetches: {f!r} is not in the graph ({e})") \
                    from None
            (tensors if isinstance(element, tf.Tensor) else ops).append(element)
        needed = cls._ancestors(tensors, ops)
        inputs = [op.outputs[0] for op in graph.get_operations()
                  if op.name in needed and op.type == "Placeholder"]
        variables = {op.outputs[0].name: (op.name, variable_bytes(op))
                     for op in graph.get_operations()
                     if op.name in needed and op.type in VARIABLE_OPS}
        return cls(graph, tensors, ops, inputs, variables, scope_depth)

    @staticmethod
    def _ancestors(tensors, ops):
        """Names of the ops the fetches need, their control inputs included."""
        seen, stack = set(), [t.op for t in tensors] + list(ops)
        while stack:
            op = stack.pop()
            if op.name in seen:
                continue
            seen.add(op.name)
            stack.extend(t.op for t in op.inputs)
            stack.extend(op.control_inputs)
        return seen

    def __init__(self, graph, fetched, fetched_ops, inputs, variables, scope_depth,
                 handles=None):
        super().__init__()
        self.graph = graph
        self._handles = handles or {}
        needed = self._ancestors(fetched, fetched_ops)
        self.add_tf_ops([op for op in graph.get_operations() if op.name in needed],
                        lambda op: None, lambda op: Phase.FORWARD)
        self.fetched = [t.name for t in fetched]
        self.input_names = [t.name for t in inputs]
        self.plan_failures, self.notes = [], []
        self._phases()
        self._variables(variables)
        self._scopes(scope_depth)
        batched = [n for n in self.input_names
                   if self.tensors[n].dims is not None and None in self.tensors[n].dims]
        self.has_batch = bool(batched)
        opaque = sorted({op.type for op in self.ops if op.type in OPAQUE})
        if opaque:
            self.notes.append("the memory inside " + ", ".join(opaque) + " ops (a called "
                              "function, a loop) is not simulated: their outputs count only")

    def size_unknown_dims(self, batch):
        """Gives the dimensions the graph's static shapes leave unknown (None)
        their sizes as TensorFlow's shape inference finds them with the
        inputs' unknown dimensions set to the batch: the graph's ops imported
        again (shape_inference_at) at batch, 2 * batch and 3 * batch. A
        dimension that is k * b + c at all three is (k, c) (opgraph.dim_at); the
        inputs' unknown dimensions are the batch, (1, 0). What stays unknown
        (a data-dependent size: Where, Unique) is sized as the batch, and a
        note names it. Once, before the simulation."""
        unknown = [t for t in self.tensors.values()
                   if t.itemsize and (t.dims is None or None in t.dims)]
        batches = (batch, 2 * batch, 3 * batch)
        inputs = set(self.input_names)
        try:
            shapes = [self.shape_inference_at(b) for b in batches] if unknown else []
        except (ValueError, tf.errors.OpError) as e:
            reason = (str(e).splitlines() or [type(e).__name__])[0][:200]
            self.notes.append(f"TensorFlow's shape inference failed at batch {batch} ({reason}): "
                              f"{len(unknown)} tensors' unknown dimensions are sized as the batch")
            unknown = []
        left = []
        for t in unknown:
            if t.name in inputs:
                t.dims = [(1, 0) if d is None else d for d in t.dims] \
                    if t.dims is not None else None
                continue
            found = [s[t.name] for s in shapes]
            if t.dims is None and len({len(f) if f is not None else None for f in found}) == 1 \
                    and found[0] is not None:
                t.dims = [None] * len(found[0])
            if t.dims is None:
                continue  # unknown rank: 0 bytes (a note says so)
            t.dims = [d if d is not None else
                      affine([f[i] for f in found], batches) for i, d in enumerate(t.dims)]
            if t.op.type == "BroadcastGradientArgs" and None in t.dims:
                # reduction indices: at most one per axis of its operands
                t.dims = list(self.tensors[t.op.inputs[0]].dims or [None])
            if None in t.dims:
                left.append(t.name)
        if left:
            named = ", ".join(left[:4]) + (f" and {len(left) - 4} more" if len(left) > 4 else "")
            self.notes.append(f"{len(left)} tensors have dimensions TensorFlow's shape inference "
                              f"cannot know before the step runs ({named}): each such "
                              "dimension is sized as the batch")
        rankless = sum(1 for t in self.tensors.values()
                       if t.dims is None and t.kind == Kind.ACTIVATION and t.itemsize)
        if rankless:
            self.notes.append(f"{rankless} tensors of unknown rank count as 0 bytes")

    def shape_inference_at(self, batch):
        """{tensor name: its shape as a list (None: unknown rank)} as
        TensorFlow's shape inference gives it with the inputs' unknown
        dimensions set to batch (opgraph.shapes_at). Raises ValueError where the
        shapes contradict the graph."""
        inputs = {name: (self.tensors[name].dtype, self.tensors[name].dims)
                  for name in self.input_names}
        handles = {name: h for name, h in self._handles.items() if name in self.tensors}
        found = shapes_at(self.graph, inputs, handles, batch)
        return {name: found[name] for name in self.tensors}

    def _phases(self):
        """phase[op]: "backward" for the gradient ops (under a gradient name
        scope); "update" for the ops that run after them and for those that
        only feed such ops (an optimizer's reads of its slots); else "forward"
        (op.phase)."""
        backward = {op.name for op in self.ops if GRADIENT_SCOPE.match(op.name)}
        update = set()
        for op in self.ops:  # graph order: producers first
            if op.name not in backward and any(p in backward or p in update
                                               for p in self.producers[op.name]):
                update.add(op.name)
        fetched_ops = {self.tensors[n].op.name for n in self.fetched}
        for op in reversed(self.ops):
            users = self.consumers[op.name]
            if op.name not in backward and op.name not in fetched_ops and users and \
                    all(u in update for u in users):
                update.add(op.name)
        for op in self.ops:
            op.phase = Phase.BACKWARD if op.name in backward else \
                Phase.UPDATE if op.name in update else Phase.FORWARD
        self.training = bool(backward)

    def _variables(self, variables):
        """weights: [(name, bytes, scope)] of the variables the forward or
        backward pass reads; slots: [(name, bytes)] of those only the update
        reads; updated_bytes: the weights the update writes."""
        self.weights, self.slots, updated = [], [], 0
        for handle, (name, size) in variables.items():
            t = self.tensors.get(handle)
            users = set(self.consumers[t.op.name]) if t is not None else set()
            # ReadVariableOps and ref reads (Identity): who reads the variable's value
            readers = set(users)
            for u in users:
                readers |= set(self.consumers[u]) if self.op_named[u].type in (
                    "ReadVariableOp", "Identity") else set()
            if readers and all(self.op_named[r].phase == Phase.UPDATE for r in readers):
                self.slots.append((name, size))
            else:
                # its forward readers, those that compute with its value first
                self.weights.append((name, size, sorted(
                    (r for r in readers if self.op_named[r].phase == Phase.FORWARD),
                    key=lambda r: (self.op_named[r].type in ("ReadVariableOp", "Identity"), r))))
                if any(self.op_named[u].phase == Phase.UPDATE and
                       self.op_named[u].type != "ReadVariableOp"
                       for u in users):
                    updated += size
        self.param_bytes = sum(w[1] for w in self.weights)
        self.slot_bytes = sum(s for _, s in self.slots)
        self.updated_bytes = updated

    def _scopes(self, depth):
        """Each op's Scope: its name scope; a gradient op's is the forward op's
        it differentiates (found by name: "gradients/<op>_grad/..." or
        "gradient_tape/<op>/..."), the update's "(optimizer)"."""
        scopes = {}

        def scope(label):
            if label not in scopes:
                scopes[label] = Scope(label)
            return scopes[label]

        def resolve(label):
            """A scope that is an op's name (its ReadVariableOp, its Shape) is that op's."""
            while label in self.op_named and self.op_named[label].phase == Phase.FORWARD:
                label = scope_of(label, depth)
            return label

        for op in self.ops:
            phase = op.phase
            if phase == Phase.UPDATE:
                label = UPDATE
            elif phase == Phase.BACKWARD:
                label = None
                rest = op.name[GRADIENT_SCOPE.match(op.name).end():].split("/")
                for k in range(len(rest) - 1, 0, -1):
                    name = "/".join(rest[:k])
                    name = name[:-5] if name.endswith("_grad") else name
                    forward = self.op_named.get(name)
                    if forward is not None and self.op_named[name].phase == Phase.FORWARD:
                        label = forward.layer.label
                        break
                for k in range(len(rest) - 1, 0, -1) if label is None else ():
                    name = "/".join(rest[:k])  # a forward scope's gradient (a Relu's ReluGrad)
                    if name in scopes:
                        label = name
                        break
                label = label or "(top level)"
            else:
                label = resolve(scope_of(op.name, depth))
            op.layer = scope(label)
            op.layer.ops.append(op)
        order = {UPDATE: (1, 0)}
        # A weight's scope: its first forward reader's.
        self.weights = [(name, size, self.op_named[readers[0]].layer.label if readers else
                         resolve(scope_of(name.split(":")[0], depth)))
                        for name, size, readers in self.weights]
        self.calls = sorted(scopes.values(),
                            key=lambda s: order.get(s.label, (0, s.ops[0].index)))

    def step(self, recompute=(), convert=()):
        """The step's OpGraph: the graph itself. recompute and convert change a
        Keras model (ValueError here)."""
        if recompute or convert:
            raise ValueError("peak_at: convert and recompute need a Keras model's report, "
                             "not a graph's (its ops are given)")
        return self

    def weight_memory(self, optimizer=None):
        """WeightMemory: the variables its forward or backward pass reads, and
        those only its update reads (an optimizer's slots)."""
        return WeightMemory(self.param_bytes, self.slot_bytes,
                            round(self.slot_bytes / self.updated_bytes) if self.updated_bytes
                            else 0,
                            f"{len(self.slots)} slot variables" if self.slots else
                            "no slot variables")

    def rows(self, batch, plans, slots_per_weight, step):
        """The report's rows and notes (graph_rows; no notes); step is self."""
        return graph_rows(self, batch, plans), []

    def saved(self, op):
        """(op's buffers that a gradient op reads, True): kept for the backward pass."""
        if op.phase != Phase.FORWARD:
            return [], True
        readers = self.readers()
        names = [n for n in self.makes(op)
                 if self.tensors[n].base == n and self.kind_of(n, readers) == KEPT]
        return names, True


def kept_label(tensor, batch):
    """A kept buffer in a row's "kept for backward": oneDNN's workspace (an
    output TF's rewrite adds) or the op's output, and its bytes."""
    what = f"oneDNN {tensor.op.type} workspace" if tensor.kind == Kind.WORKSPACE else "output"
    return f"{what} {fmt_bytes(tensor.bytes(batch))}"


def graph_rows(t, batch, plans):
    """The report's rows for a graph (GraphTrace.rows): one per name scope
    (its forward output: its last forward op's largest output; params: the
    variables named under it; kept: its forward buffers a gradient reads;
    workspaces: forward / backward), then one per op with a batch-sized
    output or a workspace."""
    rows, readers = [], t.readers()
    for s in t.calls:
        op_rows, kept_all = [], 0
        forward = [op for op in s.ops if op.phase == Phase.FORWARD
                   and op.type not in NO_GRADIENT and op.type != "ReadVariableOp"]
        final = None
        for op in reversed(forward):
            outs = [t.tensors[n] for n in op.outputs if t.tensors[n].kind == Kind.ACTIVATION]
            if outs:
                final = max(outs, key=lambda o: o.bytes(batch))
                break
        params = sum(b for _, b, scope in t.weights if scope == s.label)
        slots = t.slot_bytes if s.label == UPDATE else 0
        for op in s.ops:
            if op.type in ("Const", "Placeholder", "ReadVariableOp", "NoOp") or \
                    op.type in ALIASES or op.type in VARIABLE_OPS:
                continue
            outs = [t.tensors[n] for n in op.outputs]
            kept = [t.tensors[n] for n in t.saved(op)[0]]
            kept_all += sum(k.bytes(batch) for k in kept)
            ws = None
            if op.passes:
                n, what = plans.workspace(op, batch)
                ws = (n, 0) if op.phase == Phase.FORWARD else (0, n)
            if ws is None and not any(o.batched for o in outs):
                continue
            ours = op.type.startswith("BigConv")
            op_rows.append(Row(s.label, op.type if op.phase == Phase.FORWARD else
                               f"{op.type} ({op.phase})",
                               outs[0].shape(batch) if outs else None,
                               sum(o.bytes(batch) for o in outs if o.base == o.name), 0, 0, 0,
                               sum(k.bytes(batch) for k in kept),
                               ", ".join(kept_label(k, batch) for k in kept),
                               None if ours else ws, ws if ours else None, ""))
        total = lambda pairs: tuple(map(sum, zip(*pairs))) if pairs else None
        # The scope's main op: the one whose outputs take the most memory of their own.
        main = max((op for op in forward if op.type not in ALIASES),
                   key=lambda op: sum(t.tensors[n].bytes(batch) for n in op.outputs
                                      if t.tensors[n].base == n), default=None)
        grads = sum(t.tensors[n].bytes(batch) for op in s.ops for n in op.outputs
                    if op.phase == Phase.BACKWARD and t.tensors[n].base == n
                    and t.kind_of(n, readers) == PARAM_GRADS)
        if not (op_rows or params or grads or slots or final):
            continue  # a scope of small ops (shapes, constants)
        rows.append(Row(s.label, "", final.shape(batch) if final else None,
                        final.bytes(batch) if final else 0, params, grads, slots, kept_all,
                        main.type if main is not None else "scope",
                        total([r.tf_workspace for r in op_rows if r.tf_workspace]),
                        total([r.bigconv_workspace for r in op_rows if r.bigconv_workspace]),
                        ""))
        if len(op_rows) > 1 or any(r.tf_workspace or r.bigconv_workspace for r in op_rows):
            rows.extend(op_rows)
    return rows
