"""The liveness simulation of one step: an OpGraph (a Keras model's trace with
its synthesized gradient and update ops, or a graph that holds its own) run
as TensorFlow's executor runs it; the largest total is the peak."""
import collections

from tfbigconv.memory.opgraph import STEP_KINDS, WORKSPACES, Kind
from tfbigconv.memory.rules import BUFFER_RULES, GRADIENT_TEMPORARIES, OPTIMIZER_UPDATE
from tfbigconv.memory.workspaces import FUSED, gradient_workspace

Alive = collections.namedtuple("Alive", "bytes what layer shape")
Step = collections.namedtuple("Step", "phase layer op")


class Result:
    def __init__(self):
        self.peak, self.step, self.alive = -1, None, []
        # With record=True: [(Step, {kind: bytes}, total)], one per step: its
        # live bytes by kind (STEP_KINDS; persistent excluded), and in all.
        self.timeline = []


class Live(dict):
    """The buffers alive (key -> Alive) and their kinds; check(step) takes the
    total with the persistent bytes into the Result's peak (and, with record,
    its timeline)."""

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


def gradient_temporary(forward, step, batch):
    """(bytes, what) of the transient buffer the gradient kernel of op
    `forward` allocates while it runs (GRADIENT_TEMPORARIES), or (0, ""):
    none where oneDNN's kernel keeps a workspace from the forward pass."""
    rule = GRADIENT_TEMPORARIES.get(forward.type)
    if rule is None or step.extra_outputs.get(forward.name):
        return 0, ""
    which, k = rule[0][:-1], int(rule[0][-1])
    tensor = step.tensors[(forward.inputs if which == "in" else forward.outputs)[k]]
    return tensor.bytes(batch) // tensor.itemsize * rule[1] if tensor.itemsize else 0, rule[2]


def update_temporaries(op, step, batch, slots):
    """Bytes of the temporaries of the optimizer's update (OPTIMIZER_UPDATE): one
    of the largest weight gradient's size per slot, at most 2. Its element-wise
    arithmetic writes into buffers nothing else reads, as the step's does:
    Adam's holds m * alpha and sqrt(v) + epsilon before the division writes
    into one (TF's allocator log, oneDNN on: 2.0 and 2.5 times a U-Net's
    largest kernel at its update); plain SGD's lr * g writes into g."""
    largest = max((step.tensors[n].bytes(batch) for n in op.inputs), default=0)
    return min(slots, 2) * largest


def forwarded_input(op, out, step, uses, live, batch, taken=()):
    """The buffer of op's input that its kernel writes its output `out` into
    (BufferRules.forwardable), or None: a buffer the step allocated (alive),
    of out's dtype and size, that no other reader needs (its reads left are
    op's own)."""
    reads = step.reads(op)
    for i in BUFFER_RULES.forwardable(op.type, len(op.inputs)):
        base = step.tensors[op.inputs[i]].base
        buffer = step.tensors[base]
        if base in live and base not in taken and buffer.dtype == out.dtype and \
                buffer.bytes(batch) == out.bytes(batch) and \
                uses[base] == sum(step.tensors[n].base == base for n in reads):
            return base
    return None


def conv_workspaces(group, step, plans, batch):
    """[(op, bytes, what)] of the convolutions in a group of ops that run
    together, and whether their gradient passes are fused: two passes of one
    convolution (a trace's synthesized gradients) take its fused op's
    workspace where it serves them (ConvPlans.runs, FUSED), once."""
    by_conv = collections.defaultdict(list)
    for op in group:
        if op.passes:
            by_conv[op.conv.name].append(op)
    out, fused = [], False
    for ops in by_conv.values():
        conv = ops[0].conv
        convert = conv.layer is not None and id(conv.layer.layer) in step.convert
        passes = [p for op in ops for p in op.passes]
        runs = plans.runs(conv, batch, convert, planned=conv is ops[0])
        if len(ops) > 1 and FUSED in runs:
            n, what = gradient_workspace(runs, passes)
            fused = fused or what == runs[FUSED][0]
            out.append((ops[0], n, f"workspace of {conv.type}'s gradient: {what}"))
            continue
        for op in ops:
            n, what = plans.workspace(op, batch, convert)
            out.append((op, n, f"workspace of {op.type} ({what})" if conv is op else
                        f"workspace of {conv.type}'s gradient: {' + '.join(op.passes)} "
                        f"({what})"))
    return out, fused


def simulate(step, plans, batch, persistent, slots=0, overlap=False, record=False):
    """Live bytes through one step (an OpGraph): its ops run one at a time,
    each once its inputs and control inputs have run, first ready first run
    (TensorFlow's executor runs ready ops in that order). An op allocates
    its outputs (or writes one into the buffer of an input nothing else
    reads: forwarded_input), and while it runs its transient workspace: a
    convolution's (ConvPlans), a gradient kernel's temporary
    (gradient_temporary), the optimizer update's (update_temporaries). A
    tensor lives until its last reader has run (a view until its buffer's);
    the fetched ones to the end. Convolutions made ready by the same op run
    together (a convolution's two gradient passes); with overlap (more than
    one executor thread), a filter gradient among them runs on beside the
    ops after them, holding its inputs and workspace, until the next
    convolution starts.

    persistent: bytes alive throughout (weights, optimizer slots, the
    batch); slots: optimizer slots per weight; record: also keep each
    step's live bytes by kind (Result.timeline). Returns a Result: peak
    (including persistent), its Step, the tensors alive then (largest
    first), the timeline if recorded."""
    t = step
    live = Live(persistent, record)
    readers = t.readers()
    uses = collections.Counter()  # buffer -> reads left
    for op in t.ops:
        for name in t.reads(op):
            uses[t.tensors[name].base] += 1
    for name in t.fetched:
        uses[t.tensors[name].base] += 1
    waiting = {op.name: len(t.producers[op.name]) for op in t.ops}
    # (op, the op whose completion made it ready)
    ready = collections.deque((op, None) for op in t.ops if not waiting[op.name])
    running = []  # filter gradients still running (overlap)

    def finish(op):
        live.pop(("ws", op.name), None)
        reads = t.reads(op)
        for name in reads:
            uses[t.tensors[name].base] -= 1
        for name in reads + t.makes(op):
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
        if op.passes:
            while running:
                finish(running.pop(0))
            group += [o for o, b in ready if b == by and b is not None and o.passes]
            ready = collections.deque(e for e in ready if e[0] not in group)
        convs, fused = conv_workspaces(group, t, plans, batch)
        for o, n, what in convs:
            live.alloc(("ws", o.name), n, what, o.layer.label, None, WORKSPACES)
        for op in group:
            label = op.layer.label
            if op.forward is not None and not op.passes:
                n, what = gradient_temporary(op.forward, t, batch)
                live.alloc(("ws", op.name), n, what, label, None, WORKSPACES)
            elif op.type == OPTIMIZER_UPDATE:
                live.alloc(("ws", op.name), update_temporaries(op, t, batch, slots),
                           "optimizer update temporaries", label, None, WORKSPACES)
            taken = set()  # input buffers an output took over
            for name in t.makes(op):
                tensor = t.tensors[name]
                if tensor.kind in (Kind.ACTIVATION, Kind.WORKSPACE) and tensor.base == name:
                    base = forwarded_input(op, tensor, t, uses, live, batch, taken)
                    if base is not None:  # written in place: the input's buffer is the output's
                        taken.add(base)
                        live.pop(base)
                    live.alloc(name, tensor.bytes(batch), t.describe(name), label,
                               tensor.shape(batch), t.kind_of(name, readers))
        live.check(Step(group[0].phase, group[0].layer.label, group[0].name))
        passes = sum(len(o.passes) for o in group)
        for op in group:
            if overlap and passes > 1 and not fused and op.passes == ("backprop_filter",):
                running.append(op)
            else:
                finish(op)
    return live.result
