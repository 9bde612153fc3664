"""MemoryReport: which tensors a step keeps, its peak, and what to change
(memory_report in api.py makes it; the advice is advice.py's, explain_oom
oom.py's). A Keras model's step is simulated as below; a graph that holds its
own gradients (graph.py) runs its ops as they are (simulate.simulate_graph).

How it works:
- The model is traced symbolically into a graph of TensorFlow ops, with the
  batch dimension left unknown (as Keras' fit traces it); no data is needed.
  Each tensor's size at any batch size follows from its static shape.
- Every op's gradient reads some of the op's inputs and outputs; those are
  kept from the forward pass until the gradient runs. SAVED_FOR_BACKWARD holds
  these rules, one entry per op type, as TensorFlow's gradient functions
  (nn_grad.py, math_grad.py, array_grad.py) and tfbigconv's own define them.
- A liveness simulation runs the forward ops in graph order, then the gradient
  ops in reverse order (with more than one CPU thread, a convolution's filter
  gradient runs on beside the ops after it, as TF's executor runs it). A
  tensor lives while a forward op still reads it or a gradient rule keeps it.
  Gradients live until their producer's gradient has used them; the
  parameters' gradients until the optimizer's update. Each convolution adds
  its transient workspace while it runs: TensorFlow's kernel (CPU: the
  gradient kernels' col_buffer, as tfbigconv's planner estimates it; none
  where TF runs oneDNN, its default on many CPUs, whose MaxPool instead keeps
  a workspace for its gradient) or tfbigconv's planned algorithm. The largest
  total is the peak.
- Advice re-runs the simulation with one change at a time: a layer converted
  by `convert_model`, a batch size, a mixed-precision clone of the model, a
  layer wrapped in `tf.recompute_grad`.
"""
import collections
import math
import warnings

import tensorflow as tf

from tfbigconv import _core, host
from tfbigconv.memory.advice import Advice
from tfbigconv.memory.rules import ALIASES, CONVS, NO_GRADIENT, fmt_bytes, optimizer_slots
from tfbigconv.memory.rules import SAFETY_MARGIN
from tfbigconv.memory.trace import Trace
from tfbigconv.memory.workspaces import (ConvPlans, decode, gradient_workspace,
                                         onednn_maxpool_workspace,
                                         tf_conv2d_onednn)
from tfbigconv.memory.simulate import simulate, simulate_graph
from tfbigconv.memory.timeline import BATCH, SLOTS, WEIGHTS, MemoryTimeline

# ---------------------------------------------------------------------------
# The report

LimitFailure = collections.namedtuple(
    "LimitFailure", "layer op pass_ algorithm limit message auto_fits")
Row = collections.namedtuple(
    "Row", "layer op output_shape output_bytes param_bytes grad_bytes slot_bytes kept_bytes "
           "kept tf_workspace bigconv_workspace note")


class MemoryReport(Advice):
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
      timeline: MemoryTimeline, the simulated step's live bytes at each op by
        kind (weights, optimizer slots, input batch, activations kept for
        backward, other forward outputs, weight and activation gradients,
        workspaces); its peak is peak_bytes at peak_step. `plot` draws it.
      batch_size, device, training, optimizer, notes.
      advice: list of lines, computed (see `advise`).
    """

    def __init__(self, trace, batch_size, device, training, optimizer, budget, advise=True,
                 model=None, input_shape=None):
        self._trace, self.batch_size, self.device = trace, batch_size, device
        self.training, self.budget = training, budget
        self._model, self._input_shape, self._optimizer = model, input_shape, optimizer
        self._plans = ConvPlans(trace, device)
        self.notes = []
        # TF's CPU executor runs ready ops on as many threads as the host has
        # workers (inter-op threads default to the cores, as intra-op ones);
        # a GPU's kernels queue on one stream.
        self._overlap = device == "CPU" and host.current().threads() > 1
        if getattr(trace, "is_graph", False):
            # A graph's variables: its weights, and those only its update reads.
            self.param_bytes, self.slot_bytes = trace.param_bytes, trace.slot_bytes
            self.slots_per_weight = (round(trace.slot_bytes / trace.updated_bytes)
                                     if trace.updated_bytes else 0)
            self.optimizer = (f"{len(trace.slots)} slot variables" if trace.slots else
                              "no slot variables")
            self.notes += trace.notes
        else:
            self.slots_per_weight, self.optimizer = (optimizer_slots(optimizer) if training
                                                     else (0, ""))
            self.param_bytes = sum(var_bytes(v) for v in trace.weights)
            trainable = [v for v in trace.weights if id(v) in trace.trainable]
            self.slot_bytes = self.slots_per_weight * sum(var_bytes(v) for v in trainable)
        if device == "CPU" and host.current().runs_onednn():
            trace.add_onednn_workspaces(onednn_maxpool_workspace)
            onednn_convs = any(
                tf_conv2d_onednn(op.tf_op.get_attr("T").name,
                                  decode(op.tf_op.get_attr("padding")) == "EXPLICIT")
                for op in trace.ops
                if op.type in ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"))
            what = (["its Conv2D kernels hold no patch matrices"] if onednn_convs else []) + \
                (["MaxPool keeps a workspace for its gradient"] if trace.extra_outputs else [])
            if what:
                self.notes.append("TensorFlow runs oneDNN here (TF_ENABLE_ONEDNN_OPTS=0 turns it "
                                  "off): " + "; ".join(what))
        unknown = sorted({op.type for op in trace.ops if not trace.saved(op)[1]})
        if unknown:
            self.notes.append("no saved-for-backward rule for " + ", ".join(unknown) +
                              ": assumed to keep all their inputs and outputs")
        if device == "GPU":
            self.notes.append("GPU: cuDNN's and tfbigconv's workspaces are estimates, and the "
                              "simulation has not been checked against measured GPU peaks")
        for message in dict.fromkeys(trace.plan_failures):
            self.notes.append(f"a tfbigconv layer does not fit its workspace_limit: {message}")
        result = self._run(batch_size, record=True)
        self.timeline = MemoryTimeline.from_simulation(result.timeline, {
            WEIGHTS: self.param_bytes, SLOTS: self.slot_bytes,
            BATCH: self._persistent(batch_size) - self.param_bytes - self.slot_bytes})
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
        if getattr(trace, "is_graph", False):
            if kw.get("convert") or kw.get("recompute"):
                raise ValueError("peak_at: convert and recompute need a Keras model's report, "
                                 "not a graph's (its ops are given)")
            return simulate_graph(trace, self._plans, batch, self._persistent(batch),
                                  overlap=self._overlap, record=kw.get("record", False))
        if not self.training:
            trace = inference_view(trace)
        return simulate(trace, self._plans, batch, self._persistent(batch),
                         slots=self.slots_per_weight, overlap=self._overlap, **kw)

    def peak_at(self, batch_size, convert=(), recompute=()):
        """The simulated peak in bytes at another batch size, optionally with the
        Keras layers `convert` run by tfbigconv and the layer calls `recompute`
        (from recompute_effect) under tf.recompute_grad."""
        return self._run(batch_size, convert={id(layer) for layer in convert},
                         recompute=recompute).peak

    def default_budget(self):
        """The budget of the advice and of max_batch_size when given none: the
        one given to memory_report, else the device's free memory (None if
        unknown), read once per report. Read again later, the free memory has
        moved with the process's own allocations: explain_oom's summary once
        said 6144 where the advice beside it said 6158."""
        if self.budget:
            return self.budget
        if "_free" not in self.__dict__:
            self._free = free_memory(self.device)
        return self._free

    def varies_with_batch(self):
        """Whether the step's shapes depend on the batch size: False for a
        graph whose inputs' shapes are all known (its batch is fixed)."""
        return not getattr(self._trace, "is_graph", False) or self._trace.has_batch

    def batch_fit(self, budget_bytes=None, margin=SAFETY_MARGIN):
        """(budget, largest batch) as max_batch_size finds it, without its
        warning: the one computation behind the advice's "largest batch" and
        explain_oom's summary. (None, None) when no budget is known."""
        budget = budget_bytes or self.default_budget()
        if budget is None:
            return None, None
        cache = self.__dict__.setdefault("_batch_fits", {})
        if (budget, margin) not in cache:
            cache[budget, margin] = self._largest_batch(budget, margin)
        return budget, cache[budget, margin]

    def _largest_batch(self, budget, margin):
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

    def max_batch_size(self, budget_bytes=None, margin=SAFETY_MARGIN):
        """The largest batch size whose simulated peak, plus `margin` of it,
        fits budget_bytes (default: default_budget(), the budget given to
        memory_report, else the device's free memory). The margin covers the
        simulation's error against measured peaks (see SAFETY_MARGIN).

        Returns 0 when not even one example fits, and then also warns (a
        UserWarning, through `warnings`) why: the peak at batch 1 with the
        margin against the budget, and how much of that peak does not depend
        on the batch (no_batch_fits_reason; the advice prints the same).
        Raises ValueError when no budget is given and the free memory is
        unknown."""
        if not self.varies_with_batch():
            raise ValueError("max_batch_size: the graph's input shapes are all known, so its "
                             "batch is fixed; give its placeholders or input_signature an "
                             "unknown batch dimension (None)")
        budget, fits = self.batch_fit(budget_bytes, margin)
        if budget is None:
            raise ValueError("max_batch_size: no budget given, and the free memory of "
                             f"{self.device} is unknown here")
        if fits == 0:
            warnings.warn("max_batch_size returns 0: " + self.no_batch_fits_reason(budget, margin),
                          stacklevel=2)
        return fits

    def no_batch_fits_reason(self, budget_bytes, margin=SAFETY_MARGIN):
        """Why not even batch 1 fits budget_bytes (text): its peak, with the
        margin, and the part of it that does not depend on the batch."""
        one = self._run(1)
        fixed, _ = self.per_example_bytes(1)
        text = (f"not even batch 1 fits {fmt_bytes(budget_bytes)}: its simulated peak is "
                f"{fmt_bytes(one.peak)}, {fmt_bytes(one.peak * (1 + margin))} with the "
                f"{margin:.0%} margin kept in reserve; {fmt_bytes(fixed)} of it does not "
                f"depend on the batch (weights {fmt_bytes(self.param_bytes)}, optimizer "
                f"slots {fmt_bytes(self.slot_bytes)}")
        top = one.alive[0] if one.alive else None
        if top is not None:
            text += (f"; the largest tensor then: {top.what} of {top.layer}, "
                     f"{fmt_bytes(top.bytes)}")
        return text + ")"

    def growth_text(self, other_batch=None):
        """How the peak grows with the batch, in numbers that add up: near a
        batch b, peak(b) = fixed + b * per_example exactly (per_example_bytes).
        Given at the report's batch; if that line misses the peak at
        other_batch by more than 1%, the peak is not affine in the batch (a
        batch-sized tensor overtakes a fixed workspace, or the peak moves to
        another step), and the text says so and gives the line near each."""
        b = self.batch_size
        fixed, each = self.per_example_bytes(b)
        line = lambda f, e, n, p: (f"{fmt_bytes(f)} + {fmt_bytes(e)} per example near batch "
                                   f"{n} ({fmt_bytes(p)} at {n})")
        here = line(fixed, each, b, self.peak_bytes)
        if other_batch is None or other_batch == b:
            return "the peak is " + here
        there = self._run(other_batch).peak
        if abs(fixed + other_batch * each - there) <= 0.01 * there:
            return "the peak is " + here + f", and {fmt_bytes(there)} at {other_batch}"
        fixed2, each2 = self.per_example_bytes(other_batch)
        return ("the peak is not affine in the batch: " + here + "; " +
                line(fixed2, each2, other_batch, there))

    def per_example_bytes(self, batch_size=None):
        """(batch-independent bytes, bytes per example) of the peak near
        batch_size: peak(b) = fixed + b * per_example, from peak(b) and peak(b + 1)."""
        b = batch_size or self.batch_size
        p0, p1 = self._run(b).peak, self._run(b + 1).peak
        return p0 - b * (p1 - p0), p1 - p0

    def workspace_limit_failures(self, batch_size=None):
        """[LimitFailure(layer, op, pass_, algorithm, limit, message, auto_fits)]:
        the tfbigconv ops whose planned passes do not fit the op's
        workspace_limit at batch_size (default: the report's), where the op
        raises ResourceExhaustedError whatever memory is free. auto_fits:
        whether algorithm="auto" fits the same limit (None for an op already
        auto, or BigConv3D)."""
        b = batch_size or self.batch_size
        out = []
        for op in self._trace.ops:
            failed = self._plans.limit_failures(op, b)
            if not failed:
                continue
            a = op.tf_op
            algorithm = decode(a.get_attr("algorithm"))
            auto_fits = None
            if op.type == "BigConv2D" and algorithm != "auto":
                auto_fits = not self._plans.limit_failures(op, b, "auto")
            label = op.layer.label if op.layer is not None else op.name
            for p, (ran, message) in failed.items():
                out.append(LimitFailure(label, op.name, p, ran,
                                        int(a.get_attr("workspace_limit_bytes")), message,
                                        auto_fits))
        return out

    def largest_batch_within_workspace_limits(self):
        """The largest batch below the report's at which every tfbigconv op fits
        its workspace_limit (0: not even batch 1; None: the report's batch does)."""
        if not self.workspace_limit_failures():
            return None
        if self.workspace_limit_failures(1):
            return 0
        lo, hi = 1, self.batch_size  # lo fits, hi does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.workspace_limit_failures(mid):
                hi = mid
            else:
                lo = mid
        return lo


    def _rows(self, batch):
        if getattr(self._trace, "is_graph", False):
            from tfbigconv.memory.graph import graph_rows
            return graph_rows(self, batch, Row)
        t, rows, seen_layers = self._trace, [], set()
        slot = self.slots_per_weight if self.training else 0
        for call in t.calls:
            if hasattr(call.layer, "layers") and not call.ops:
                continue
            first = id(call.layer) not in seen_layers
            seen_layers.add(id(call.layer))
            own = [] if hasattr(call.layer, "layers") else call.layer.weights
            params = sum(var_bytes(v) for v in own) if first else 0
            trainable = sum(var_bytes(v) for v in own if id(v) in t.trainable) if first else 0
            grads = trainable if self.training else 0
            op_rows, kept_all = [], {}
            made = [op for op in call.ops if op.outputs and op.type not in NO_GRADIENT
                    and op.type != "ReadVariableOp"]
            final = t.tensors[made[-1].outputs[0]] if made else None
            for op in call.ops:
                if op.type in ("Const", "Placeholder", "ReadVariableOp", "NoOp") or op.type in ALIASES:
                    continue
                outs = [t.tensors[o] for o in op.outputs]
                batched = any(o.dims is not None and any(not isinstance(d, int) for d in o.dims)
                              for o in outs)  # None or (k, c): scales with the batch
                kept_names = t.saved(op)[0] if self.training else []
                kept = [(n, t.tensors[t.tensors[n].base]) for n in kept_names]
                kept = [(n, k) for n, k in kept if k.kind in ("activation", "workspace")]
                for n, k in kept:
                    kept_all[k.name] = k.bytes(batch)
                tf_ws = big_ws = None
                if op.type in CONVS:
                    tf_w = self._plans.tf_workspace(op, batch)
                    big = self._plans.runs(op, batch, True) if op.type != "Conv2DBackpropInput" \
                        else None
                    # The gradient passes that run: the input's only if it needs a gradient.
                    gi = set(t.grad_inputs(op)) if self.training else set()
                    grad_passes = [p for p, i in (("backprop_input", 0), ("backprop_filter", 1))
                                   if i in gi]
                    tf_ws = (tf_w["forward"], sum(tf_w[p] for p in grad_passes))
                    if big:
                        big_ws = (big["forward"][1], gradient_workspace(big, grad_passes)[0])
                    for p, (algorithm, _, note) in (big or {}).items():
                        if note and op.type == "BigConv2D":
                            self.notes.append(f"{call.label}, {p} ({algorithm}): {note}")
                if not batched and tf_ws is None:
                    continue
                what = ", ".join(("input " if n in op.inputs else "output " if n in op.outputs
                                  else f"oneDNN {op.type} workspace ") + fmt_bytes(k.bytes(batch))
                                 for n, k in kept)
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
        b = lambda n: fmt_bytes(n) if n else "-"
        pair = lambda p: f"{fmt_bytes(p[0])} / {fmt_bytes(p[1])}" if p else ""
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
        out.append(f"Peak: {fmt_bytes(self.peak_bytes)} = weights {fmt_bytes(self.param_bytes)}"
                   f" + optimizer slots {fmt_bytes(self.slot_bytes)} + batch "
                   f"{fmt_bytes(self._persistent(self.batch_size) - self.param_bytes - self.slot_bytes)}"
                   f" + step {fmt_bytes(self.step_peak_bytes)}; at the {s.phase} step of "
                   f"{s.layer} ({s.op})")
        out.append("Alive at the peak, largest first:")
        for a in self.alive_at_peak[:max_alive]:
            shape = f" {'x'.join(map(str, a.shape))}" if a.shape else ""
            out.append(f"  {fmt_bytes(a.bytes):>10}  {a.layer}: {a.what}{shape}")
        if len(self.alive_at_peak) > max_alive:
            rest = sum(a.bytes for a in self.alive_at_peak[max_alive:])
            out.append(f"  {fmt_bytes(rest):>10}  {len(self.alive_at_peak) - max_alive} more")
        if self.advice:
            out.append("Advice:")
            out += [f"  - {line}" for line in self.advice]
        out += [f"Note: {n}" for n in self.notes]
        return "\n".join(out)

    __str__ = table

    def plot(self, path):
        """Draws the timeline into path, a PNG or SVG by its suffix (.png, .svg):
        live bytes at each simulated step, stacked by kind, the peak marked
        with its step, layer, op and bytes. Returns the matplotlib Figure.

        Needs matplotlib (an optional dependency; ImportError without it).
        Raises ValueError for another suffix."""
        from tfbigconv.memory import plot
        return plot.plot(self, path)

    def to_tensorboard(self, logdir, step=0):
        """Writes the table (Markdown, TensorBoard's text plugin, tag
        "memory_report/table") and the plot (PNG, its images plugin, tag
        "memory_report/timeline") at `step` into an event file in logdir,
        with TensorFlow's own summary writer (the tensorboard package is not
        needed to write them). Needs matplotlib for the plot."""
        from tfbigconv.memory import plot
        plot.to_tensorboard(self, logdir, step)

    def __repr__(self):
        return f"<MemoryReport batch={self.batch_size} peak={fmt_bytes(self.peak_bytes)}>"


def var_bytes(v):
    return int(math.prod(v.shape)) * tf.as_dtype(v.dtype).size


def inference_view(trace):
    """The trace with no gradients: nothing kept for backward."""
    view = object.__new__(Trace)
    view.__dict__.update(trace.__dict__)
    view.has_grad, view.needs_grad = set(), set()
    view._grad_inputs = {op.name: [] for op in trace.ops}
    view._saved = {op.name: ([], True) for op in trace.ops}
    return view


def free_memory(device):
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


