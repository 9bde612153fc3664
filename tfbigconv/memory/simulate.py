"""The liveness simulations: a Keras model's trace (simulate: the forward ops in
graph order, then the gradient ops in reverse, with what each keeps) and a
graph that holds its own gradients (simulate_graph: its ops as TensorFlow's
executor runs them); the largest total is the peak."""
import collections

from tfbigconv.memory.rules import (ALIASES, CONVS, FORWARDS_INPUT, GRADIENT_OPS,
                                    GRADIENT_TEMPORARIES, SAVED_FOR_BACKWARD)
from tfbigconv.memory.workspaces import CONV_OPERANDS, gradient_workspace

# ---------------------------------------------------------------------------
# Simulation

Alive = collections.namedtuple("Alive", "bytes what layer shape")
Step = collections.namedtuple("Step", "phase layer op")

# The kinds of what a step allocates, as the timeline stacks them (the
# persistent kinds, weights, slots and the batch, are the report's).
KEPT = "activations kept for backward"   # and oneDNN workspaces kept for a gradient
OUTPUTS = "other forward outputs"        # read by later forward ops (or returned), not kept
PARAM_GRADS = "weight gradients"
GRADS = "activation gradients"
WORKSPACES = "workspaces"                # kernels' transient buffers, optimizer temporaries
STEP_KINDS = (KEPT, OUTPUTS, PARAM_GRADS, GRADS, WORKSPACES)
_KEY_KINDS = {"ws": WORKSPACES, "optimizer": WORKSPACES, "param": PARAM_GRADS, "grad": GRADS}


class Result:
    def __init__(self):
        self.peak, self.step, self.alive = -1, None, []
        # With record=True: [(Step, {kind: bytes}, total)], one per step: its
        # live bytes by kind (STEP_KINDS; persistent excluded), and in all.
        self.timeline = []


class Live(dict):
    """The buffers alive (key -> Alive) and their kinds; check(step) takes the
    total with the persistent bytes into the Result's peak (and, with record,
    its timeline). Both simulations below allocate and free through it."""

    def __init__(self, persistent, record):
        super().__init__()
        self.persistent, self.record = persistent, record
        self.kinds = {}  # key -> its kind (STEP_KINDS)
        self.result = Result()

    def alloc(self, key, n, what, layer, shape, kind):
        if n > 0:
            self[key] = Alive(n, what, layer, shape)
            self.kinds[key] = kind

    def check(self, step):
        res = self.result
        total = self.persistent + sum(a.bytes for a in self.values())
        if self.record:
            by_kind = dict.fromkeys(STEP_KINDS, 0)
            for key, a in self.items():
                by_kind[self.kinds[key]] += a.bytes
            res.timeline.append((step, by_kind, total))
        if total > res.peak:
            res.peak, res.step = total, step
            res.alive = sorted(self.values(), key=lambda a: -a.bytes)


def passes_gradient_through(op, index, trace):
    """Whether the gradient of op's input `index` is the incoming gradient
    itself (TensorFlow returns it unchanged, no new buffer): aliases, BiasAdd's
    value, and AddV2/Sub/AddN operands of the output's own shape."""
    if op.type in ALIASES:
        return True
    if op.type == "BiasAdd":
        return index == 0
    if (op.type in ("AddV2", "AddN") or (op.type == "Sub" and index == 0)):
        return trace.tensors[op.inputs[index]].dims == trace.tensors[op.outputs[0]].dims
    return False


def gradient_temporary(op, trace, batch):
    """(bytes, what) of the transient buffer op's gradient kernel allocates
    while it runs (GRADIENT_TEMPORARIES), or (0, ""): none where oneDNN's
    kernel keeps a workspace from the forward pass instead."""
    rule = GRADIENT_TEMPORARIES.get(op.type)
    if rule is None or trace.extra_outputs.get(op.name):
        return 0, ""
    which, k = rule[0][:-1], int(rule[0][-1])
    tensor = trace.tensors[(op.inputs if which == "in" else op.outputs)[k]]
    return tensor.bytes(batch) // tensor.itemsize * rule[1] if tensor.itemsize else 0, rule[2]


def simulate(trace, plans, batch, persistent, convert=(), recompute=(), slots=0,
             overlap=False, record=False):
    """Live bytes through forward, backward and the optimizer's update.

    persistent: bytes alive throughout (weights, optimizer slots, the batch);
    convert: layers whose TF convolutions run as tfbigconv's; recompute: layer
    calls whose internal saved tensors are recomputed in the backward pass;
    overlap: TensorFlow's executor has more than one thread, so a
    convolution's filter gradient, which nothing in the backward pass waits
    for, runs on beside the ops that follow its input gradient (see below).
    record: also keep each step's live bytes by kind (Result.timeline).
    Returns a Result: peak (including persistent), its step, the tensors alive
    then (largest first), the timeline if recorded.
    """
    t = trace
    live = Live(persistent, record)  # buffer key -> Alive
    res = live.result
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
    # The loss is held until the backward pass starts; inference's outputs
    # (a trace without a loss) are returned, alive to the end.
    for name in ([t.loss] if t.loss is not None else t.outputs):
        uses[t.tensors[name].base] += 1

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

    def alloc(key, n, what, op, shape=None, kind=None):
        live.alloc(key, n, what, label(op), shape, kind or key_kind(key))

    def key_kind(key):
        if not isinstance(key, tuple):
            return KEPT  # tensor-named buffers allocated without a kind: kept for a gradient
        if key[0] == "grad" and t.tensors[t.tensors[key[1]].base].kind == "parameter":
            return PARAM_GRADS  # the gradient of a view of a weight (a bias's Squeeze)
        return _KEY_KINDS[key[0]]

    check = live.check

    # Forward.
    for op in t.ops:
        if op.type in CONVS:
            runs = plans.runs(op, batch, op.layer is not None and
                              id(op.layer.layer) in convert)
            key = "backprop_input" if op.type == "Conv2DBackpropInput" else "forward"
            alloc(("ws", op.name), runs[key][1], f"workspace of {op.type} ({runs[key][0]})", op)
        for name in op.outputs:
            tensor = t.tensors[name]
            if tensor.kind == "activation" and tensor.base == name:
                kept = bool(saved_by.get(name)) and name not in recomputed_bases
                alloc(name, tensor.bytes(batch), f"{op.type} output", op, tensor.shape(batch),
                      KEPT if kept else OUTPUTS)
        for name in t.extra_outputs.get(op.name, ()):
            if name in op_saved[op.name]:  # kept for the gradient (not in inference)
                tensor = t.tensors[name]
                alloc(name, tensor.bytes(batch), f"oneDNN {op.type} workspace", op,
                      tensor.shape(batch))
        check(Step("forward", label(op), op.name))
        live.pop(("ws", op.name), None)
        for name in op.inputs + op.outputs + t.extra_outputs.get(op.name, []):
            base = t.tensors[name].base
            if name in op.inputs:
                uses[base] -= 1
            if uses[base] <= 0 and (not saved_by.get(base) or base in recomputed_bases):
                live.pop(base, None)
    if t.loss is None:  # inference: no backward pass
        return res
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

    # Filter gradients still running: [(gradient keys, saved buffers, workspace key)].
    # With more than one executor thread, a convolution's filter gradient runs
    # beside the ops that take its input gradient, holding its inputs (the
    # forward input and the incoming gradient) and its workspace; it is taken
    # to finish before the next convolution's gradients start, the next long
    # ops. TF's allocator log of a U-Net step (oneDNN on, batch 4) showed the
    # concatenation's forward output and the conv's incoming gradient alive
    # through the concat's and the upsampling's gradients.
    running = []

    def finish_running():
        while running:
            keys, bases, ws_key = running.pop()
            live.pop(ws_key, None)
            for key in keys:
                release(key)
            for base in bases:
                readers_left[base] -= 1
                if readers_left[base] <= 0:
                    live.pop(base, None)

    while ready:
        op = ready.popleft()
        call = op.layer
        if call is not None and id(call) in recompute_ids and id(call) not in started:
            started.add(id(call))
            for base in recomputed[id(call)]:
                tensor = t.tensors[base]
                alloc(base, tensor.bytes(batch), f"{tensor.op.type} output (recomputed)",
                      tensor.op, tensor.shape(batch))
        if op.type in CONVS:
            runs = plans.runs(op, batch, call is not None and id(call.layer) in convert)
            gi = set(t.grad_inputs(op))
            if op.type == "Conv2DBackpropInput":
                parts = [("forward", 2 in gi), ("backprop_filter", 1 in gi)]
            else:
                parts = [("backprop_input", 0 in gi), ("backprop_filter", 1 in gi)]
            finish_running()
            # Both gradient passes are ready together; TensorFlow's executor
            # may run them at the same time.
            used = [p for p, u in parts if u]
            ws, passes = gradient_workspace(runs, used)
            alloc(("ws", op.name), ws, f"workspace of {op.type}'s gradient: {passes}", op)
            # Two ops (not one fused op) whose filter gradient can run on.
            filter_runs_on = overlap and len(used) == 2 and "fused" not in passes
        else:
            filter_runs_on = False
            temp, what = gradient_temporary(op, t, batch)
            alloc(("ws", op.name), temp, what, op)
        out_grad = grads.get(op.outputs[0]) if op.outputs else None
        made = []
        for i in t.grad_inputs(op):
            name = op.inputs[i]
            tensor = t.tensors[name]
            v = t.variable(name)
            if passes_gradient_through(op, i, t):
                key = out_grad  # the incoming gradient itself, no new buffer
            elif v is not None:
                key = ("param", name, op.name)
                path = getattr(v, "path", v.name)  # Keras 3's path, tf_keras' name
                alloc(key, tensor.bytes(batch), f"gradient of {path}", op, tensor.shape(batch))
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
        held_keys, held_bases = [], []
        if filter_runs_on:
            # The filter (input 1) gradient's reads, as the rule states them.
            reads = [op.inputs[int(r[-1])] if r.startswith("in") else op.outputs[int(r[-1])]
                     for r in SAVED_FOR_BACKWARD[op.type].get(1, ())]
            held_bases = list({t.tensors[n].base for n in reads if n in op_saved[op.name]})
            ws_key = ("ws", op.name, "filter")
            alloc(ws_key, runs["backprop_filter"][1],
                  f"workspace of {op.type}'s filter gradient ({runs['backprop_filter'][0]}), "
                  "still running", op)
        for o in op.outputs:
            if o in grads:
                key = grads.pop(o)
                if filter_runs_on and key is not None:
                    held_keys.append(key)
                else:
                    release(key)
        for name in op_saved[op.name]:
            base = t.tensors[name].base
            if base in held_bases:
                continue
            readers_left[base] -= 1
            if readers_left[base] <= 0:
                live.pop(base, None)
        if filter_runs_on:
            running.append((held_keys, held_bases, ws_key))
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
    finish_running()
    # The optimizer's update: every weight's gradient is alive; a few
    # temporaries of one weight's size each at a time.
    if param_grad_bytes:
        live.alloc(("optimizer", "temporaries"), (1 + min(slots, 2)) * max(param_grad_bytes),
                   "optimizer update temporaries", "(optimizer)", None, WORKSPACES)
        check(Step("update", "(optimizer)", "apply_gradients"))
    return res


def forwarded_input(op, out, trace, uses, live, batch, taken=()):
    """The buffer of op's input that its kernel writes its output `out` into
    (FORWARDS_INPUT), or None: a buffer the step allocated (alive), of out's
    dtype and size, that no other reader needs (its reads left are op's own)."""
    indices = FORWARDS_INPUT.get(op.type, ())
    if indices is None:
        indices = range(len(op.inputs))
    for i in indices:
        if i >= len(op.inputs):
            continue
        base = trace.tensors[op.inputs[i]].base
        buffer = trace.tensors[base]
        if base in live and base not in taken and buffer.dtype == out.dtype and \
                buffer.bytes(batch) == out.bytes(batch) and \
                uses[base] == sum(trace.tensors[n].base == base for n in op.inputs):
            return base
    return None


def simulate_graph(trace, plans, batch, persistent, overlap=False, record=False):
    """Live bytes through a graph that holds its own gradient and update ops
    (a GraphTrace: a tf.function's or a TF1 graph's training step): its ops
    run one at a time, each once its inputs and control inputs have run,
    first ready first run (TensorFlow's executor runs ready ops in that
    order). An op allocates its outputs (or writes one into the buffer of an
    input that nothing else reads: forwarded_input), and while it runs its
    transient workspace: a convolution's (ConvPlans.graph_run), a gradient
    kernel's temporary (gradient_temporary, for the forward op it
    differentiates). A
    tensor lives until its last reader has run (a view until its buffer's);
    the fetched ones to the end; oneDNN's MaxPool workspace until its
    MaxPoolGrad has run. Convolutions made ready by the same op run together,
    as simulate() runs a convolution's two gradient passes; with overlap
    (more than one executor thread), a filter gradient among them runs on
    beside the ops after them, holding its inputs and workspace, until the
    next convolution starts, as in simulate(). Returns a Result as
    simulate() does."""
    t = trace
    live = Live(persistent, record)
    uses = collections.Counter()  # buffer -> reads left
    for op in t.ops:
        for name in op.inputs + t.extra_inputs.get(op.name, []):
            uses[t.tensors[name].base] += 1
    for name in t.fetched:
        uses[t.tensors[name].base] += 1
    waiting = {op.name: len(t.producers[op.name]) for op in t.ops}
    # (op, the op whose completion made it ready)
    ready = collections.deque((op, None) for op in t.ops if not waiting[op.name])
    running = []  # filter gradients still running (overlap)

    def finish(op):
        live.pop(("ws", op.name), None)
        reads = op.inputs + t.extra_inputs.get(op.name, [])
        for name in reads:
            uses[t.tensors[name].base] -= 1
        for name in reads + op.outputs + t.extra_outputs.get(op.name, []):
            base = t.tensors[name].base
            if uses[base] <= 0:
                live.pop(base, None)
        for consumer in t.consumers[op.name]:
            waiting[consumer] -= 1
            if not waiting[consumer]:
                ready.append((t.op_named[consumer], op.name))

    while ready or running:
        if not ready:
            finish(running.pop(0))
            continue
        op, by = ready.popleft()
        group = [op]
        if op.type in CONV_OPERANDS:
            while running:
                finish(running.pop(0))
            group += [o for o, b in ready if b == by and b is not None and o.type in CONV_OPERANDS]
            ready = collections.deque(e for e in ready if e[0] not in group)
        for op in group:
            label = op.layer.label
            if op.type in CONV_OPERANDS:
                what, n = plans.graph_run(op, batch)
                live.alloc(("ws", op.name), n, f"workspace of {op.type} ({what})", label, None,
                           WORKSPACES)
            elif op.type in GRADIENT_OPS:
                forward_type, index = GRADIENT_OPS[op.type]
                forward = t.tensors[op.inputs[index]].op
                if forward.type == forward_type:
                    n, what = gradient_temporary(forward, t, batch)
                    live.alloc(("ws", op.name), n, what, label, None, WORKSPACES)
            taken = set()  # input buffers an output took over
            for name in op.outputs + t.extra_outputs.get(op.name, []):
                tensor = t.tensors[name]
                if tensor.kind in ("activation", "workspace") and tensor.base == name:
                    base = forwarded_input(op, tensor, t, uses, live, batch, taken)
                    if base is not None:  # written in place: the input's buffer is the output's
                        taken.add(base)
                        live.pop(base)
                    live.alloc(name, tensor.bytes(batch), t.describe(name), label,
                               tensor.shape(batch), t.kind_of(name))
        live.check(Step(t.phase[group[0].name], group[0].layer.label, group[0].name))
        for op in group:
            if overlap and len(group) > 1 and CONV_OPERANDS[op.type][2] == "backprop_filter":
                running.append(op)
            else:
                finish(op)
    return live.result
