"""MemoryReport: which tensors a step keeps, its peak, and what to change
(memory_report in api.py makes it; the advice is advice.py's, explain_oom
oom.py's). It reads its step from a source, a Keras model's Trace (trace.py)
or a GraphTrace (graph.py), through the same methods (step, weight_memory,
rows, saved), and never asks which.

How it works:
- The step is an OpGraph (opgraph.py): a Keras model traced symbolically, with
  the batch dimension left unknown (as Keras' fit traces it), its gradient
  and update ops synthesized from the rules; or a graph's own ops. No data is
  needed: each tensor's size at any batch size follows from its static
  shape (and TensorFlow's shape inference at three batches).
- Every op's gradient reads some of the op's inputs and outputs; those are
  kept from the forward pass until the gradient runs. SAVED_FOR_BACKWARD holds
  these rules, one entry per op type, as TensorFlow's gradient functions
  (nn_grad.py, math_grad.py, array_grad.py) and tfbigconv's own define them.
- One liveness simulation (simulate.py) runs the ops as TensorFlow's
  executor does, first ready first run (with more than one CPU thread, a
  convolution's filter gradient runs on beside the ops after it). A tensor
  lives until its last reader has run; an element-wise kernel writes its
  output into an input nothing else reads (BufferRules). Each convolution
  adds its transient workspace while it runs: TensorFlow's kernel (CPU: the
  gradient kernels' col_buffer, as tfbigconv's planner estimates it; none
  where TF runs oneDNN, its default on many CPUs, whose MaxPool instead keeps
  a workspace for its gradient) or tfbigconv's planned algorithm. The largest
  total is the peak.
- Advice re-runs the simulation with one change at a time: a layer converted
  by `convert_model`, a batch size, a mixed-precision clone of the model, a
  layer wrapped in `tf.recompute_grad`.
"""
import collections
import warnings

import tensorflow as tf

from tfbigconv import _core, host
from tfbigconv.memory import plot
from tfbigconv.memory.advice import Advice
from tfbigconv.memory.rules import SAFETY_MARGIN
from tfbigconv.memory.simulate import simulate
from tfbigconv.memory.timeline import BATCH, SLOTS, WEIGHTS, MemoryTimeline
from tfbigconv.memory.workspaces import (ConvPlans, decode, onednn_maxpool_workspace,
                                         tf_conv2d_onednn)
from tfbigconv.text import fmt_bytes, render_table

# ---------------------------------------------------------------------------
# The report

LimitFailure = collections.namedtuple(
    "LimitFailure", "layer op pass_ algorithm limit message auto_fits")


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

    def __init__(self, source, batch_size, device, training, optimizer, budget, advise=True,
                 model=None, input_shape=None):
        self._source, self.batch_size, self.device = source, batch_size, device
        self.training, self.budget = training, budget
        self._model, self._input_shape, self._optimizer = model, input_shape, optimizer
        self._plans = ConvPlans(source, device)
        self.notes = list(source.notes)
        # TF's CPU executor runs ready ops on as many threads as the host has
        # workers (inter-op threads default to the cores, as intra-op ones);
        # a GPU's kernels queue on one stream.
        self._overlap = device == "CPU" and host.current().threads() > 1
        weights = source.weight_memory(optimizer)
        self.param_bytes, self.slot_bytes = weights.param_bytes, weights.slot_bytes
        self.slots_per_weight, self.optimizer = weights.slots_per_weight, weights.optimizer
        self._onednn = device == "CPU" and host.current().runs_onednn()
        step = self._step()
        if self._onednn:
            onednn_convs = any(
                tf_conv2d_onednn(op.tf_op.get_attr("T").name,
                                 decode(op.tf_op.get_attr("padding")) == "EXPLICIT")
                for op in source.ops
                if op.type in ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"))
            what = (["its Conv2D kernels hold no patch matrices"] if onednn_convs else []) + \
                (["MaxPool keeps a workspace for its gradient"] if step.extra_outputs else [])
            if what:
                self.notes.append("TensorFlow runs oneDNN here (TF_ENABLE_ONEDNN_OPTS=0 turns it "
                                  "off): " + "; ".join(what))
        unknown = sorted({op.type for op in source.ops if not source.saved(op)[1]})
        if unknown:
            self.notes.append("no saved-for-backward rule for " + ", ".join(unknown) +
                              ": assumed to keep all their inputs and outputs")
        if device == "GPU":
            self.notes.append("GPU: cuDNN's and tfbigconv's workspaces are estimates, and the "
                              "simulation has not been checked against measured GPU peaks")
        for message in dict.fromkeys(source.plan_failures):
            self.notes.append(f"a tfbigconv layer does not fit its workspace_limit: {message}")
        result = self._run(batch_size, record=True)
        self.timeline = MemoryTimeline.from_simulation(result.timeline, {
            WEIGHTS: self.param_bytes, SLOTS: self.slot_bytes,
            BATCH: self._persistent(batch_size) - self.param_bytes - self.slot_bytes})
        self.peak_bytes = result.peak
        self.step_peak_bytes = result.peak - self._persistent(batch_size)
        self.peak_step, self.alive_at_peak = result.step, result.alive
        self.rows, notes = source.rows(batch_size, self._plans, self.slots_per_weight, step)
        self.notes = list(dict.fromkeys(self.notes + notes))
        self.advice = self.advise() if advise else []

    def persistent_bytes(self, batch_size=None):
        """What lives across steps: weights, optimizer slots and the input batch."""
        batch = batch_size or self.batch_size
        data = sum(self._source.tensors[n].bytes(batch) for n in self._source.input_names)
        return self.param_bytes + self.slot_bytes + data

    _persistent = persistent_bytes

    def _step(self, convert=(), recompute=()):
        """The source's step (an OpGraph) with the changes, oneDNN's workspaces added."""
        step = self._source.step(recompute, convert)
        if self._onednn:
            step.add_onednn_workspaces(onednn_maxpool_workspace)
        return step

    def _run(self, batch, convert=(), recompute=(), record=False):
        return simulate(self._step(convert, recompute), self._plans, batch,
                        self._persistent(batch), slots=self.slots_per_weight,
                        overlap=self._overlap, record=record)

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
        return self._source.has_batch

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
        for op in self._source.ops:
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
        out = [f"Memory report: batch {self.batch_size}, "
               f"{'training' if self.training else 'inference'}, device {self.device}"
               + (f", optimizer {self.optimizer} ({self.slots_per_weight} slots per weight)"
                  if self.training else "")] + render_table(head, lines)
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
        return plot.plot(self, path)

    def to_tensorboard(self, logdir, step=0):
        """Writes the table (Markdown, TensorBoard's text plugin, tag
        "memory_report/table") and the plot (PNG, its images plugin, tag
        "memory_report/timeline") at `step` into an event file in logdir,
        with TensorFlow's own summary writer (the tensorboard package is not
        needed to write them). Needs matplotlib for the plot."""
        plot.to_tensorboard(self, logdir, step)

    def __repr__(self):
        return f"<MemoryReport batch={self.batch_size} peak={fmt_bytes(self.peak_bytes)}>"


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


