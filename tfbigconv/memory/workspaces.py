"""The transient workspace of each convolution in a traced model: TensorFlow's
kernel (CPU col_buffer; none where TF runs oneDNN) or tfbigconv's planned
algorithm, and oneDNN MaxPool's workspace."""
import tensorflow as tf

from tfbigconv.planning import planner, tf_rules
from tfbigconv.memory.rules import CUDNN_WORKSPACE_LIMIT

# ---------------------------------------------------------------------------
# Convolution workspaces


def decode(v):
    return v.decode() if isinstance(v, bytes) else v


class ConvPlans:
    """Each convolution's transient workspace per pass under TensorFlow's kernel
    and under tfbigconv's plan, cached per (op, batch, device)."""

    def __init__(self, trace, device):
        self.trace, self.device = trace, device
        self.cache = {}
        # cache key of bigconv/bigconv3d -> {pass: the planner's message} for the
        # passes that do not fit their workspace limit (the op raises
        # ResourceExhaustedError there)
        self.failures = {}

    def geometry(self, op, batch):
        """(input shape, filter shape in tfbigconv's form, attrs, dtype) or None."""
        t = self.trace
        a = op.tf_op
        attrs = {k: decode(a.get_attr(k)) for k in ("strides", "padding", "data_format",
                                                         "dilations")}
        try:
            attrs["explicit_paddings"] = list(a.get_attr("explicit_paddings"))
        except ValueError:
            attrs["explicit_paddings"] = []
        attrs["strides"], attrs["dilations"] = list(attrs["strides"]), list(attrs["dilations"])
        # A gradient (or transposed) conv: the forward conv's geometry.
        x, w = (t.tensors[(op.inputs if r[:-1] == "in" else op.outputs)[int(r[-1])]]
                for r in CONV_OPERANDS[op.type][:2])
        xs, ws = x.shape(batch), w.shape(batch)
        if xs is None or ws is None or None in xs or None in ws:
            return None
        if op.type.startswith("DepthwiseConv2dNative"):
            ws = [ws[0], ws[1], 1, ws[2] * ws[3]]
        return xs, ws, attrs, x.dtype.name

    def tf_workspace(self, op, batch):
        """{pass: bytes} of TensorFlow's kernels for the op's geometry."""
        key = ("tf", op.name, batch)
        if key not in self.cache:
            g = self.geometry(op, batch)
            out = {p: 0 for p in planner.PASSES}
            # TF's Conv3D workspace is not modelled: 0 for the 3-D ops.
            if g is not None and op.type != "BigConv3D":
                # The CPU planner's estimate of TF's kernel, per pass and host
                # kind (tf_estimate.cc: the Eigen gradient kernels' col_buffer,
                # nothing where TF runs oneDNN, as its allocator log of U-Net-style
                # steps showed). On the GPU, cuDNN's workspace is estimated,
                # unmeasured, as one image's patch matrix, capped as TF caps it.
                # The op's registered gradients run its own kind of kernel.
                kernel = ("DepthwiseConv2dNative" if op.type.startswith("DepthwiseConv2dNative")
                          else "Conv2D")
                plans = {p: planner.plan(p, g[0], g[1], g[2], g[3], "tf", 0, "CPU", kernel)
                         for p in planner.PASSES}
                one_image = (patch_matrix_bytes(plans["forward"].geometry, g[3])
                             if kernel == "Conv2D" else plans["forward"].tf.workspace_bytes)
                for p in planner.PASSES:
                    if self.device == "GPU":
                        out[p] = min(one_image, CUDNN_WORKSPACE_LIMIT)
                    else:
                        out[p] = plans[p].tf.workspace_bytes
            self.cache[key] = out
        return self.cache[key]

    def bigconv(self, op, batch, algorithm="auto", limit=0):
        """{pass: (algorithm that runs, bytes, note)} under tfbigconv's planner."""
        key = ("big", op.name, batch, algorithm, limit)
        if key not in self.cache:
            g = self.geometry(op, batch)
            out = {}
            for p in planner.PASSES:
                if g is None:
                    out[p] = ("auto", 0, "shape unknown: planned at run time")
                    continue
                xs, ws, attrs, dtype = g
                # The choice bigconv2d made when the model was traced with an
                # unknown batch (planner.planning_shape), from the estimates; a
                # plan that does not fit `limit` is noted and planned without it.
                note = ""
                if algorithm == "auto":
                    with planner.planning_only() as failures:
                        chosen = planner.decide(p, planner.planning_shape([None] + xs[1:]), ws,
                                                attrs, dtype, algorithm, limit,
                                                self.device).chosen
                    note = failures[0] if failures else ""
                else:
                    chosen = algorithm
                if note:
                    self.failures.setdefault(key, {})[p] = note
                if chosen in ("tf", "im2col"):
                    out[p] = (self._tf_name(op), self.tf_workspace(op, batch)[p], note)
                    continue
                try:
                    plan = planner.plan(p, xs, ws, attrs, dtype, chosen, limit, self.device)
                except tf.errors.ResourceExhaustedError as e:
                    note = note or e.message
                    self.failures.setdefault(key, {})[p] = note
                    plan = planner.plan(p, xs, ws, attrs, dtype, chosen, 0, self.device)
                out[p] = (chosen, plan.estimate(chosen).workspace_bytes, note)
            if g is not None and out["backprop_input"][0] == out["backprop_filter"][0] == "fft":
                fused = planner.fused_backward(xs, ws, attrs, dtype, self.device, limit)
                if fused:
                    out[FUSED] = ("fft (fused backward)", fused.workspace_bytes, "")
            self.cache[key] = out
        return self.cache[key]

    @staticmethod
    def _tf_name(op):
        return ("tf.DepthwiseConv2dNative" if op.type.startswith("DepthwiseConv2dNative")
                else "tf.Conv2D")

    def bigconv3d(self, op, batch):
        """{pass: (algorithm, bytes, note)} of a BigConv3D op: the plan its kernels
        run, on the CPU (no TF candidate in 3-D; no GPU kernels)."""
        key = ("big3d", op.name, batch)
        if key not in self.cache:
            g, a = self.geometry(op, batch), op.tf_op
            algorithm = decode(a.get_attr("algorithm"))
            limit = int(a.get_attr("workspace_limit_bytes"))
            out = {}
            for p in planner.PASSES:
                if g is None:
                    out[p] = ("auto", 0, "shape unknown: planned at run time")
                    continue
                try:
                    plan = planner.plan(p, *g[:3], g[3], algorithm, limit, "CPU")
                except tf.errors.ResourceExhaustedError as e:
                    out[p] = (algorithm, 0, e.message)
                    self.failures.setdefault(key, {})[p] = e.message
                    continue
                note = "runs on the CPU: host memory" if self.device == "GPU" else ""
                out[p] = (plan.chosen, plan.estimate(plan.chosen).workspace_bytes, note)
            self.cache[key] = out
        return self.cache[key]

    def limit_failures(self, op, batch, algorithm=None):
        """{pass: (algorithm, the planner's message)} of a tfbigconv op's passes
        that do not fit the op's workspace_limit at `batch`: where its kernel
        raises ResourceExhaustedError. algorithm: plan with this one instead
        of the op's own (BigConv2D). {} for other ops."""
        if op.type not in ("BigConv2D", "BigConv3D"):
            return {}
        a = op.tf_op
        limit = int(a.get_attr("workspace_limit_bytes"))
        if op.type == "BigConv3D":
            runs, key = self.bigconv3d(op, batch), ("big3d", op.name, batch)
        else:
            algorithm = algorithm or decode(a.get_attr("algorithm"))
            runs = self.bigconv(op, batch, algorithm, limit)
            key = ("big", op.name, batch, algorithm, limit)
        return {p: (runs[p][0], message) for p, message in self.failures.get(key, {}).items()}

    def workspace(self, op, batch, convert=False):
        """(bytes, what runs) of op's passes (op.passes) under its convolution's
        (op.conv's) plan: a graph's conv op or a Keras trace's forward conv
        runs its own plan (runs(planned=True)), a synthesized gradient its
        conv's algorithm."""
        runs = self.runs(op.conv, batch, convert, planned=op.conv is op)
        if len(op.passes) == 1:
            return runs[op.passes[0]][1], runs[op.passes[0]][0]
        return gradient_workspace(runs, op.passes)

    def runs(self, op, batch, convert=False, planned=False):
        """{pass: (algorithm, bytes, note)} of what runs for a convolution op
        (CONV_OPERANDS: a forward op, or a graph's gradient op, whose geometry
        is its forward conv's), FUSED added where one op computes both
        gradients. convert: a TF convolution run as tfbigconv's BigConv2D
        (auto, no limit) instead of TF's kernel; planned: a BigConv2D op runs
        the algorithm its trace planned (planned_algorithm), as its own
        pass does (a Keras trace's synthesized gradients plan their passes
        from its algorithm, as its registered gradient does)."""
        if op.type.startswith("BigConv3D"):
            return self.bigconv3d(op, batch)
        if op.type.startswith("BigConv2D"):
            a = op.tf_op
            algorithm = decode(a.get_attr("algorithm"))
            chosen = decode(a.get_attr("planned_algorithm")) if planned else None
            return self.bigconv(op, batch, chosen if chosen in ("direct", "fft") else algorithm,
                                int(a.get_attr("workspace_limit_bytes")))
        if convert and op.type in ("Conv2D", "DepthwiseConv2dNative"):
            return self.bigconv(op, batch)
        ws = self.tf_workspace(op, batch)
        name = "cuDNN (est.)" if self.device == "GPU" else self._tf_name(op)
        runs = {p: (name, ws[p], "") for p in planner.PASSES}
        if gradients_routed(op):
            ours = self.bigconv(op, batch)
            runs.update({p: ours[p] for p in planner.PASSES[1:]})
        return runs


# Convolution op type -> (its input's tensor, its filter's tensor, the pass it
# runs): "in<i>" is the op's input i, "out<k>" its output k. A gradient op's
# geometry is its forward conv's; BigConv2DBackprop runs both gradients (None).
CONV_OPERANDS = {}
for _prefix in ("Conv2D", "DepthwiseConv2dNative", "BigConv2D", "BigConv3D"):
    CONV_OPERANDS.update({
        _prefix: ("in0", "in1", "forward"),
        _prefix + "BackpropInput": ("out0", "in1", "backprop_input"),
        _prefix + "BackpropFilter": ("in0", "out0", "backprop_filter")})
CONV_OPERANDS["BigConv2DBackprop"] = ("in0", "in1", None)
BOTH_GRADIENTS = ("backprop_input", "backprop_filter")


def conv_passes(op_type):
    """The passes a convolution op (CONV_OPERANDS) runs."""
    p = CONV_OPERANDS[op_type][2]
    return BOTH_GRADIENTS if p is None else (p,)


# A forward convolution's type -> {input index: the pass that computes its
# gradient}: a Keras trace synthesizes one gradient op per pass.
GRADIENT_PASSES = {t: {0: "backprop_input", 1: "backprop_filter"}
                   for t in ("Conv2D", "DepthwiseConv2dNative", "BigConv2D", "BigConv3D")}
GRADIENT_PASSES["Conv2DBackpropInput"] = {2: "forward", 1: "backprop_filter"}  # Conv2DTranspose


# The entry of ConvPlans.bigconv's runs for BigConv2DBackprop, which computes
# both gradients in one op where the fused FFT backward serves the case.
FUSED = "fused backward"


def gradient_workspace(runs, passes):
    """(bytes, what runs) of the gradient passes `passes` (names) of one
    convolution, which may run at once: one fused op where both gradients are
    wanted and it serves them."""
    if FUSED in runs and set(passes) == set(BOTH_GRADIENTS):
        return runs[FUSED][1], runs[FUSED][0]
    return (sum(runs[p][1] for p in passes),
            " + ".join(f"{p} ({runs[p][0]})" for p in passes))


def gradients_routed(op):
    """Whether a TF convolution's gradients are tfbigconv's: bigconv2d runs TF's
    forward kernel with its own gradient plan through tf.custom_gradient
    (ops.conv2d's routed forward), whose IdentityN takes the forward's output."""
    return op.type in ("Conv2D", "DepthwiseConv2dNative") and any(
        c.type == "IdentityN" for c in op.tf_op.outputs[0].consumers())


def patch_matrix_bytes(geometry, dtype):
    """One image's im2col patch matrix: out_h x out_w x KH x KW x in_c elements
    (tf_estimate.cc's col_buffer of one image)."""
    g = geometry
    return (g.out_h * g.out_w * g.filter_h * g.filter_w * g.in_c
            * tf.as_dtype(dtype).size if g.batch else 0)


def tf_conv2d_onednn(dtype, explicit_padding):
    """Whether TF's CPU Conv2D kernels run `dtype` through oneDNN on this host
    (the planner's probe, tf_rules.tf_cpu_onednn: oneDNN on, TF's default on
    many CPUs, and then not for every dtype, nor for EXPLICIT padding)."""
    return bool(tf_rules.tf_cpu_onednn("Conv2D", dtype, explicit_padding))


def onednn_maxpool_workspace(op):
    """Bytes per output element of the workspace oneDNN's MaxPool keeps for its
    gradient, or 0. With oneDNN on, TF rewrites a MaxPool whose gradient is in
    the graph to _MklNativeMaxPool(workspace_enabled=true): a second output,
    the argmax of each window, that _MklNativeMaxPoolGrad reads. oneDNN stores
    it as uint8 for windows of at most 255 elements, else int32. Measured: a
    16x64x64x16 MaxPool (2x2) at batch 16 allocated 1.0 MiB of DT_UINT8
    (TF_CPP_VMODULE=log_memory=2), alive until MaxPoolGrad ran."""
    if op.type != "MaxPool" or op.tf_op.get_attr("T") not in (tf.float32, tf.bfloat16):
        return 0
    k = list(op.tf_op.get_attr("ksize"))
    window = k[1] * k[2] if decode(op.tf_op.get_attr("data_format")) == "NHWC" else k[2] * k[3]
    return 1 if window <= 255 else 4
