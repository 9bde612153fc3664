"""The memory report's advice: each line from a re-run of the simulation with
one change (a layer converted by convert_model, a batch size, a
mixed-precision clone of the model, a layer under tf.recompute_grad). A
mixin of MemoryReport; a graph's report (no Keras model) gives the batch
and workspace_limit lines only."""
from tfbigconv.keras_model import clone_model, keras_of
from tfbigconv.memory.rules import SAFETY_MARGIN
from tfbigconv.memory.trace import Trace
from tfbigconv.text import fmt_bytes


class Advice:
    """MemoryReport's advice (see advise) and the re-runs behind it."""

    def convertible_layers(self):
        """Layers convert_model would swap for tfbigconv's (exact Conv2D and
        DepthwiseConv2D of the model's Keras), in model order."""
        keras = keras_of(self._model)
        seen, out = set(), []
        for call in self._source.calls:
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
        for call in self._source.calls:
            if hasattr(call.layer, "layers"):  # models: their layers are listed themselves
                continue
            own = [op for op in call.ops if self._source.saved(op)[0]]
            if not own:
                continue
            out.append((call, self._run(b, recompute=[call]).peak))
        return sorted(out, key=lambda x: x[1])

    def mixed_precision_peak(self, policy=None):
        """(policy, peak) of a clone of the model under a mixed-precision policy
        (default: mixed_float16 on the GPU, mixed_bfloat16 on the CPU)."""
        policy = policy or ("mixed_float16" if self.device == "GPU" else "mixed_bfloat16")
        if self._model is None:
            raise ValueError("the report was made without the model")

        def clone(layer):
            config = layer.get_config()
            config["dtype"] = policy
            return layer.__class__.from_config(config)

        copy = clone_model(self._model, clone)
        trace = Trace(copy, self._input_shape, self.training)
        report = type(self)(trace, self.batch_size, self.device, self.training,
                              self._optimizer, self.budget, advise=False)
        return policy, report.peak_bytes

    def advise(self):
        lines = []
        base = self.peak_bytes
        pct = lambda new: f"{fmt_bytes(base)} -> {fmt_bytes(new)} ({100 * (new - base) / base:+.0f}%)"
        keras_model = self._model is not None
        if self.training and keras_model:
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
        limits = self.workspace_limit_failures()
        if limits:  # these raise at this batch whatever the memory
            lines.append("workspace_limit: " + workspace_limit_advice(self, limits))
        budget, fits = self.batch_fit() if self.varies_with_batch() else (None, None)
        if fits == 0:
            lines.append(f"largest batch within {fmt_bytes(budget)}: none, "
                         + self.no_batch_fits_reason(budget))
        elif fits:
            line = (f"largest batch within {fmt_bytes(budget)}: {fits} (peak at {fits}: "
                    f"{fmt_bytes(self._run(fits).peak)}, {SAFETY_MARGIN:.0%} margin "
                    f"kept); " + self.growth_text(fits))
            over = -(-5 * fits // 4)
            if self._run(over).peak <= budget:
                line += (f"; batch {over} is predicted at {fmt_bytes(self._run(over).peak)}, "
                         f"also within the budget: only the margin keeps it out")
            lines.append(line)
        if self._model is not None and not is_mixed(self._model):
            try:
                policy, peak = self.mixed_precision_peak()
                lines.append(f"mixed precision ({policy}): " + (
                    f"leaves the peak at {fmt_bytes(base)} (within 0.5%)"
                    if abs(peak - base) < 0.005 * base else pct(peak)))
            except Exception as e:  # noqa: BLE001 - e.g. a subclassed model cannot be cloned
                lines.append(f"mixed precision: not computed ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:100]})")
        if self.training and keras_model:
            best = [(c, p) for c, p in self.recompute_effect() if p < 0.97 * base][:3]
            for call, peak in best:
                lines.append(f"tf.recompute_grad around {call.label}: {pct(peak)}")
            if not best:
                lines.append("tf.recompute_grad: no single layer lowers the peak by 3% or more")
        if not keras_model:
            lines.append("a graph's report gives no convert_model, mixed precision or "
                         "tf.recompute_grad advice: they change a Keras model, and the graph "
                         "is built")
        return lines



def is_mixed(model):
    policy = getattr(model, "dtype_policy", None)
    return policy is not None and getattr(policy, "compute_dtype", "float32") != \
        getattr(policy, "variable_dtype", "float32")


def workspace_limit_advice(report, failures):
    """What a workspace_limit failure needs (text): which layer and pass, the
    planner's message, and what fits: a larger workspace_limit, the algorithm
    auto picks, or a smaller batch where one does."""
    lines = []
    for layer in dict.fromkeys(f.layer for f in failures):
        mine = [f for f in failures if f.layer == layer]
        passes = "; ".join(f"{f.pass_} ({f.algorithm}): {f.message}" for f in mine)
        fixes = ["raise its workspace_limit (0: no limit)"]
        if mine[0].auto_fits:
            fixes.append('use algorithm="auto", which fits the limit')
        lines.append(f"{layer} does not fit its workspace_limit of {mine[0].limit} bytes: "
                     f"{passes}. Fix: " + ", or ".join(fixes))
    smaller = report.largest_batch_within_workspace_limits()
    batch = ("a smaller batch does not help (batch 1 does not fit either)" if smaller == 0
             else f"the largest batch within the limits is {smaller}" if smaller else "")
    return " ".join(lines) + (f"; {batch}." if batch else ".")
