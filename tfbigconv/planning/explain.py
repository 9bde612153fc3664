"""explain(): the planner's table for a convolution, and why each pass gets its algorithm."""
import collections
import os

import tensorflow as tf

from tfbigconv import arguments, errors, host, pure_tf
from tfbigconv.arguments import Algorithm, Pass
from tfbigconv.cost_model import profiles
from tfbigconv.planning import autotune as tuner, planner
from tfbigconv.planning.plan import CANDIDATES
from tfbigconv.text import fmt_bytes, render_table

Row = collections.namedtuple(
    "Row", "pass_ algorithm seconds workspace_bytes peak_bytes available fits chosen note "
           "measured_seconds")
# The planner's candidates (plan.CANDIDATES); the "tf" row is named for the
# TensorFlow kernel that runs the case, e.g. "tf.Conv2D" or "tf.DepthwiseConv2dNative".


def _seconds(s):
    return f"{s:.3g} s" if s >= 1 else f"{s * 1e3:.3g} ms"


class Explanation:
    """What the planner saw: one Row per pass and algorithm, the choice per pass and why.

    Attributes:
      rows: list of Row(pass_, algorithm, seconds, workspace_bytes, peak_bytes,
        available, fits, chosen, note, measured_seconds). algorithm is what
        runs: "tf.Conv2D" / "tf.DepthwiseConv2dNative" (TensorFlow's kernel),
        "direct" or "fft". seconds is the cost model's estimate;
        measured_seconds the autotuner's timing (None if not timed);
        peak_bytes is input + filter + output + workspace.
      chosen: {pass: algorithm}; how: {pass: "measured" or "estimated"};
      reasons: {pass: one line}; device: "CPU" or "GPU";
      budget: the workspace limit in bytes; geometry: the validated geometry;
      cost_model: where the model's constants came from ("env", "user",
        "scaled", "shipped" or "built-in"), cost_model_file: its file name;
        cost_model_fit: how its CPU values were fitted (profiles.how_fitted);
        cost_model_warning: why they may not fit this machine
        (profiles.machine_mismatch), or "".
      fused_backward: where both gradients are fft and one op computes them
        from a single transform of dL/doutput (planner.fused_backward: 1-D
        depthwise on the CPU), its plan (fft_w, workspace_bytes, ...); else None.
    """

    def __init__(self, plans, budget, cost_model_source, device):
        self.rows = []
        self.chosen, self.how, self.reasons = {}, {}, {}
        for p in plans:
            names = {"tf": p.tf_kernel, "direct": "direct", "fft": "fft"}
            measured = p.measured or {}
            self.chosen[p.pass_] = names[p.chosen]
            self.how[p.pass_] = "measured" if measured else "estimated"
            self.reasons[p.pass_] = p.reason
            for name in CANDIDATES:
                e = p.estimate(name)
                self.rows.append(Row(p.pass_, names[name], e.seconds, e.workspace_bytes,
                                     e.peak_bytes, e.available, e.fits, name == p.chosen, e.note,
                                     measured.get(name)))
        self.budget = budget
        self.device = device
        self.geometry = plans[0].geometry
        self.cost_model = cost_model_source
        self.cost_model_file = os.path.basename(profiles.active_path or "")
        # Why the CPU constants may not fit this machine ("" if they were measured
        # on one like it); the GPU's come from the H100 grids' fit either way.
        self.cost_model_warning = profiles.machine_mismatch() if device == "CPU" else ""
        self.cost_model_fit = profiles.how_fitted() if device == "CPU" else ""
        self.fused_backward = None

    def table(self):
        head = ["pass", "algorithm", "est. time", "measured", "workspace", "peak", "fits",
                "chosen", "note"]
        lines = []
        for r in self.rows:
            sized = r.available or r.algorithm.startswith("tf")  # TF's sizes are known regardless
            lines.append([r.pass_, r.algorithm,
                          _seconds(r.seconds) if r.available else "-",
                          _seconds(r.measured_seconds) if r.measured_seconds is not None else "-",
                          fmt_bytes(r.workspace_bytes) if sized else "-",
                          fmt_bytes(r.peak_bytes) if sized else "-",
                          "yes" if r.available and r.fits else "no", "<==" if r.chosen else "",
                          r.note])
        out = render_table(head, lines)
        g = self.geometry
        out.append(f"output shape {g.output_shape}, {2 * g.macs / 1e9:.3g} GFLOP per pass; "
                   f"device {self.device}; workspace budget {self._budget()}; "
                   f"cost model: {self.cost_model}"
                   + (f" ({self.cost_model_file})" if self.cost_model_file else ""))
        if self.cost_model_fit:
            out.append(f"cost model: {self.cost_model_fit}")
        if self.cost_model_warning:
            out.append(f"cost model: {self.cost_model_warning}; its estimates may be off "
                       "several-fold here (`python -m tfbigconv calibrate` measures this machine)")
        out += [f"{p}: {self.how[p]}; {why}" for p, why in self.reasons.items()]
        if self.fused_backward:
            f = self.fused_backward
            out.append(f"backward: both gradients in one op (BigConv2DBackprop), dL/doutput "
                       f"transformed once for both: {f.fft_w}-point transforms, workspace "
                       f"{fmt_bytes(f.workspace_bytes)} in place of the two passes' (when both "
                       "gradients are wanted)")
        return "\n".join(out)

    def _budget(self):
        if self.budget >= 1 << 62:  # no trace-time limit: the GPU kernels plan at run time
            return "TensorFlow's GPU allocator, at run time"
        return fmt_bytes(self.budget)

    __str__ = table

    def __repr__(self):
        return f"<Explanation {self.chosen}>"


class XlaExplanation:
    """What bigconv2d builds where XLA compiles it (tf.function(jit_compile=True),
    Keras' jit_compile=True): pure TensorFlow (tfbigconv/pure_tf/), every pass.

    Attributes: chosen {pass: "fft" or "tf"} (the gradients are TensorFlow's
    autodiff of the forward's composition, so they follow it); fft (the transform
    size); tf_seconds and fft_seconds (pure_tf.estimates); per_image_bytes (the
    spectra of one image, the chunk's unit); reason."""

    def __init__(self, p, budget):
        self.chosen = {name: p.branch.value for name in planner.PASSES}
        self.fft, self.reason = p.fft, p.reason
        self.tf_seconds, self.fft_seconds = p.tf_seconds, p.fft_seconds
        self.per_image_bytes, self.budget = p.per_image_bytes, budget

    def table(self):
        size = "x".join(str(n) for n in self.fft)
        transforms = ("rfft2d/irfft2d" if len(self.fft) == 2 else "rfft2d/irfft2d over height "
                      "and width, fft/ifft over depth")
        runs = {"fft": f"FFT convolution ({transforms} {size}, one tile "
                       f"per image, batch chunks of {fmt_bytes(self.per_image_bytes)} per image)",
                "tf": "TensorFlow's convolution (tf.nn.conv2d / tf.nn.depthwise_conv2d / "
                      "tf.nn.conv3d)"}
        return "\n".join([
            f"under XLA: {runs[self.chosen['forward']]}; {self.reason}",
            f"estimates: TF's convolution {_seconds(self.tf_seconds)}, FFT "
            f"{_seconds(self.fft_seconds)} (pure_tf.estimates, per forward pass)",
            "gradients: TensorFlow's own, of that composition (XLA compiles them too)"])

    __str__ = table

    def __repr__(self):
        return f"<XlaExplanation {self.chosen}>"


def explain(input_shape, filter_shape, strides=1, padding="VALID", data_format="NHWC",
            dilations=1, dtype="float32", device="CPU", budget=None, algorithm="auto",
            autotune=False, xla=False):
    """The planner's estimates for every algorithm and pass of a convolution.

    Arguments follow tf.nn.conv2d (input_shape in data_format order, filter
    HWIO), or bigconv1d for a 1-D input_shape of 3 dimensions (data_format "NWC",
    the default, or "NCW"; filter [width, in, out]; padding "CAUSAL" too), which
    is shown as bigconv1d runs it: a 2-D convolution of height 1; or bigconv3d
    for an input_shape of 5 dimensions (data_format "NDHWC", the default, or
    "NCDHW"; filter DHWIO; on the CPU only, with TF's Conv3D as its TF
    candidate). device: "CPU" or "GPU" (each has its own candidates and cost
    model; "GPU" needs no GPU here). budget: workspace limit in bytes (None:
    as the ops decide: half of the free host memory on the CPU; on the GPU,
    half of what TensorFlow's allocator can still give, see
    host.gpu_workspace_budget, or no limit where that is unknown, e.g. on
    a machine without a GPU: the kernels plan again at run time). algorithm:
    what bigconv2d would be asked for. autotune: False shows the estimates
    and any cached measurement; True also times what bigconv2d would time
    (on this machine's `device`, which must exist); None follows
    TFBIGCONV_AUTOTUNE as bigconv2d does. xla: True shows what bigconv2d builds
    where XLA compiles it (an XlaExplanation: pure TensorFlow, no custom op).

    Returns an Explanation (an XlaExplanation with xla=True); print it for the table. Raises
    InvalidArgumentError for bad arguments (autotune=True for a GPU that is
    not here included) and ResourceExhaustedError when a forced algorithm
    does not fit the budget.
    """
    device = str(device).upper()
    if device not in host.DEVICES:
        raise errors.invalid_argument(f"device must be 'CPU' or 'GPU', got {device!r}")
    if budget is not None:
        budget = arguments.parse_byte_count(budget, "budget (bytes, or None)", 1)
    try:
        dtype = tf.as_dtype(dtype).name
    except TypeError:
        raise errors.invalid_argument(f"dtype must be float16, bfloat16, float32 or float64, got {dtype!r}") from None
    try:  # bigconv2d raises tf.nn.conv2d's classes for these; explain InvalidArgumentError
        input_shape = arguments.parse_shape(input_shape, "input_shape")
        filter_shape = arguments.parse_shape(filter_shape, "filter_shape")
        spatial = len(input_shape) - 2
        if spatial not in arguments.FILTER_LAYOUTS:
            raise ValueError(f"input_shape must have 3 dimensions (1-D, as bigconv1d), 4 (2-D) "
                             f"or 5 (3-D, as bigconv3d), got {len(input_shape)}: {input_shape}")
        if len(filter_shape) != len(input_shape):
            raise ValueError(f"filter_shape must be {arguments.FILTER_LAYOUTS[spatial]} for a "
                             f"{spatial}-D input_shape, got {filter_shape}")
        # explain's default "NHWC" (and "NCHW" in 3-D) stands for each rank's layout
        if isinstance(data_format, str):
            data_format = {1: {"NHWC": None}, 3: {"NHWC": None, "NCHW": "NCDHW"}}.get(
                spatial, {}).get(data_format, data_format)
        data_format = arguments.parse_format(spatial, data_format)
        spec = arguments.parse_attrs(spatial, strides, padding, data_format, dilations,
                                     filter_shape[0])
        input_shape, filter_shape = arguments.as_op_shapes(spatial, input_shape, filter_shape,
                                                           data_format)
    except ValueError as e:
        raise errors.invalid_argument(str(e)) from None
    algorithm = arguments.requested_algorithm(algorithm)
    if xla:
        try:
            pure_tf.check_geometry(input_shape, filter_shape, *spec.geometry_args())
        except ValueError as e:
            raise errors.invalid_argument(str(e)) from None
        p = pure_tf.plan(input_shape, filter_shape, *spec.geometry_args(), dtype, algorithm,
                         budget or 0, xla=True)
        return XlaExplanation(p, budget or 0)
    if autotune is True and algorithm == Algorithm.AUTO:
        if not tuner.can_measure(device):
            raise errors.invalid_argument("autotune=True times the candidates on the GPU, and TensorFlow sees "
                           "none here; autotune=False shows the GPU's estimates")
    limit = budget or 0
    plans = [planner.plan(p, input_shape, filter_shape, spec, dtype, algorithm, limit, device)
             for p in planner.PASSES]
    if algorithm == Algorithm.AUTO:
        args = (input_shape, filter_shape, spec.tf_attrs(), dtype, device, limit)
        if autotune is False:
            plans = [tuner.cached(p, *args) for p in plans]
            # The gradient passes as bigconv2d's gradient decides them (planner.decide_gradients).
            plans[1:] = tuner.cached_gradients(*plans[1:], *args)
        else:
            plans = [tuner.refine(p, *args, enabled=autotune) for p in plans]
            plans[1:] = tuner.refine_gradients(*plans[1:], *args, enabled=autotune)
    e = Explanation(plans, plans[0].limit, profiles.active_source, device)
    if e.chosen[Pass.BACKPROP_INPUT] == e.chosen[Pass.BACKPROP_FILTER] == Algorithm.FFT:
        e.fused_backward = planner.fused_backward(input_shape, filter_shape, spec, dtype, device,
                                                  limit)
    return e
