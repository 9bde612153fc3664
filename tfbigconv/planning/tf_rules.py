"""TensorFlow's kernel rules: which of TF's kernels runs a pass, whether it can,
and whether `auto` may pick it (TF_KERNEL_RULES, one table), with the facts
they read: which kernel runs a depthwise filter, oneDNN's reach on this host
(measured once per process on a small case), and TF's known crashes.

The planner (so the N-d front end, ops/conv.py, in every rank and for a forced
algorithm "tf" too), the emitters (planning.candidates), memory_report and
calibrate all ask here.
"""
import dataclasses
import functools
from typing import Callable

import numpy as np
import tensorflow as tf
from absl import logging

from tfbigconv import _core, arguments, capabilities, host, kernels
from tfbigconv.arguments import Pass
from tfbigconv.planning.plan import Verdict

HALF_TYPES = ("float16", "bfloat16")


def uses_depthwise_kernel(pass_, spec, dtype, device):
    """Whether TF's kernel for the pass of `spec` (an arguments.ConvSpec with its
    operands) is DepthwiseConv2dNative: a depthwise
    filter (one input channel, several groups) on the CPU that its kernels accept:
    equal strides, no dilations, and NHWC, or NCHW where TF runs it through
    oneDNN (tf_cpu_onednn). With dilations, in NHWC at stride 1, the gradients
    run it as tf.nn.depthwise_conv2d does (SPACE_TO_BATCH_NOTE), and so does the
    forward pass from a dilated side of SPACE_TO_BATCH_FORWARD_SIDE; below it the
    forward is grouped Conv2D, which oneDNN runs faster there. Other grouped
    cases, and every one on the GPU (GPU_DEPTHWISE_NOTE), are grouped Conv2D.
    The rules and the emitters (planning.candidates) both ask this."""
    if not spec.depthwise or device == "GPU":  # TF has no 3-D depthwise kernel
        return False
    nhwc = spec.data_format == "NHWC"
    strides = spec.strides[1:3] if nhwc else spec.strides[2:4]
    if strides[0] != strides[1]:
        return False
    if spec.dilated:
        filter_hw = spec.filter_dims[:2]
        if not nhwc or strides[0] != 1 or None in filter_hw:
            return False
        sides = [(k - 1) * d + 1 for k, d in zip(filter_hw, spec.dilations[1:3])]
        return pass_ != Pass.FORWARD or max(sides) >= SPACE_TO_BATCH_FORWARD_SIDE
    if nhwc:
        return True
    # TF's own CPU depthwise kernels reject NCHW; oneDNN's ran it at 0.93-1.12x
    # the time of grouped Conv2D, with the same results.
    return device == "CPU" and tf_cpu_onednn("DepthwiseConv2dNative", dtype, spec.explicit,
                                             "NCHW")


# Measured fwd+bwd (RESULTS.md, "Dilated depthwise gradients"): TF's grouped
# Conv2D gradients ran dilated depthwise filters 1.2-8x slower than
# tf.nn.depthwise_conv2d's path, which pads, moves the dilation's phases into
# the batch (SpaceToBatchND), runs the undilated kernel and moves them back.
# The copies cost about as much as a 3x3 kernel and are not in the estimate.
# Forward only, float32, 3x3 to 7x7 filters (RESULTS.md, "The dilated depthwise
# forward pass on the same path"): at dilated sides (K - 1) * d + 1 of 5-13,
# grouped Conv2D was 2.2-2.7x faster than the path in three layers and 1.1x
# slower in one; at 19-37 the path was 1.7-3.7x faster in all three.
SPACE_TO_BATCH_FORWARD_SIDE = 15
SPACE_TO_BATCH_NOTE = ("as tf.nn.depthwise_conv2d runs dilations: SpaceToBatchND, the undilated "
                       "kernel, BatchToSpaceND; the copies are not in the estimate: picked only "
                       "when measured fastest")
ONEDNN_NOTE = "TensorFlow runs this case through oneDNN here (checked on a small case)"
# On the GPU, TF's DepthwiseConv2dNative* run cuDNN only in float16 with a
# square 1, 3, 5 or 7 filter, multiplier 1 and, in NHWC, stride 1 or 2; elsewhere they
# run TF's own CUDA kernels, which the GPU cost model (fitted to cuDNN) does
# not describe, and they have no bfloat16 GPU kernel at all (TF's
# depthwise_conv_op.cc, depthwise_conv_grad_op.cc). Grouped Conv2D and its
# gradients run cuDNN in every dtype: that is the GPU's depthwise kernel.
GPU_DEPTHWISE_NOTE = ("TensorFlow's GPU kernel (cuDNN) as grouped Conv2D: its depthwise kernels "
                      "run cuDNN only in part; workspace not modelled")
# TF 2.21's oneDNN bfloat16 grouped Conv2DBackpropFilter with dilations killed
# the process (SIGSEGV) in 22 of 110 layers of a sweep here, each with a height
# dilation of 3 or more. None with dilation 2 or in width alone did, nor float32,
# the forward pass or the input gradient, but the bug's edges are unknown
# (RESULTS.md, "A crash in TF's bfloat16 grouped filter gradient").
ONEDNN_BF16_GROUPED_DILATED_NOTE = (
    "TensorFlow's oneDNN bfloat16 grouped filter gradient with dilations crashed the process "
    "(segmentation fault) in TF 2.21: not run; algorithm 'auto', 'direct' or 'fft' runs it")


def tf_filter_gradient_crashes(spec, dtype, device):
    """Whether TF's kernel for the filter gradient of `spec` (a ConvSpec with its
    operands) is the one that crashed (ONEDNN_BF16_GROUPED_DILATED_NOTE): grouped
    Conv2DBackpropFilter in bfloat16 with dilations, where oneDNN runs it. Needs
    no spatial sizes, so the emitter (planning.candidates) asks it too, also
    where shapes are unknown."""
    if (spec.conv3d or device != "CPU" or dtype != "bfloat16" or not spec.grouped
            or not spec.dilated):
        return False
    if uses_depthwise_kernel(Pass.BACKPROP_FILTER, spec, dtype, device):
        return False  # the undilated depthwise kernel on SpaceToBatchND copies
    return tf_cpu_onednn("Conv2D", dtype, spec.explicit)


# oneDNN's bfloat16 kernels in NCHW measured 3-5x (Conv2D) and 10-30x (depthwise)
# slower than in NHWC, where the cost model's rates come from (RESULTS.md, "A
# shipped profile for oneDNN hosts").
HALF_NCHW_NOTE = ("TensorFlow's CPU kernels in half precision and NCHW (oneDNN) ran 3-30x "
                  "slower than NHWC, which its estimate is from: picked only when measured "
                  "fastest")


# oneDNN compiles its bfloat16 depthwise forward kernel (brdgmm, JIT) on the
# first call, and for few channels and a large filter that took over 10 minutes
# here (16x64x64x16 by 15x15, in a Keras model; smaller inputs were stopped
# after 12-25 s). Measured where it did:
# stride 1, multiplier 1, 1-16 channels, filter side 15-31, input 32x32 and
# up. Where it did not (under 1 s): 24 channels or more, side 14 or less,
# stride 2, multiplier 2, 24x24 inputs, float32, the two gradients.
ONEDNN_SLOW_COMPILE_NOTE = ("oneDNN's bfloat16 depthwise forward with at most 16 channels and "
                            "a filter side of 15 or more took over 10 minutes to compile its "
                            "kernel on the first call: not for auto")


def onednn_compiles_slowly(pass_, geometry, dtype):
    """Whether TF's oneDNN depthwise kernel for the pass is in the region
    where its first call compiled for minutes (ONEDNN_SLOW_COMPILE_NOTE):
    auto must not run it, not even to time it."""
    return (pass_ == Pass.FORWARD and dtype == "bfloat16" and geometry.in_c <= 16
            and geometry.out_c == geometry.in_c and geometry.stride_h == 1
            and geometry.stride_w == 1
            and max(geometry.filter_h, geometry.filter_w) >= 15)


# oneDNN's grouped Conv2D against its estimate (the dense rates per group),
# NHWC, 8 layers of 8-64 input channels per group, three passes (RESULTS.md,
# "Grouped Conv2D under oneDNN"): float32 0.52-1.12x the estimate, bfloat16
# 0.26-1.15x; with 1-4 channels per group up to 8x (forward, 2 per group) and
# 6x (filter gradient, 4 per group); float16's filter gradient 24-36x at every
# width. So auto trusts its estimate from this many channels per group, in
# float32 and bfloat16; elsewhere it is timed first.
ONEDNN_GROUPED_TRUSTED_CHANNELS = 8


def check_batch_depth(kernel, strides, dilations, data_format, input):
    """Raises what TF's `kernel` ("Conv2D" or "Conv3D") raises where `input` would
    run it (tf_batch_depth_error) for positive strides or dilations other than 1
    in the batch or depth dimension; the parsers name non-positive ones."""
    depth = data_format.index("C")
    for name, values in (("strides", strides), ("dilations", dilations)):
        if all(v > 0 for v in values) and (values[0] != 1 or values[depth] != 1):
            error = tf_batch_depth_error(kernel, name, input.dtype.name,
                                         host.kernel_device(host.resolve_device(input)))
            # TF's words, which code and tests match
            raise error(None, None, f"Current implementation does not yet support {name} in "
                        f"the batch and depth dimensions: {name} must be 1 there, got {values} "
                        f"for data_format {data_format}")


@functools.lru_cache(maxsize=None)
@tf.autograph.experimental.do_not_convert
def tf_batch_depth_error(kernel, attr, dtype, device):
    """The exception class TF's `kernel` ("Conv2D" or "Conv3D") raises on `device`
    ("CPU" or "GPU") in this process for `attr` ("strides" or "dilations") other
    than 1 in the batch dimension (the depth's is the same check).

    TF's shape functions let these through, and each kernel raises its own class,
    eagerly, in a tf.function and in a Session alike. In TF 2.21 it depends on
    which kernel runs the dtype: Conv2D's strides UnimplementedError everywhere,
    its dilations InvalidArgumentError where oneDNN runs it (float32 and bfloat16
    with oneDNN on), else UnimplementedError (Eigen: float16, float64, int32, and
    every dtype with oneDNN off); Conv3D's dilations InvalidArgumentError, its
    strides UnimplementedError under oneDNN, else InvalidArgumentError. So TF is
    asked: its kernel runs once on one element, per process and arguments.
    UnimplementedError where TF runs the case (ours do not)."""
    rank = 5 if kernel == "Conv3D" else 4
    attrs = dict(strides=[1] * rank, dilations=[1] * rank)
    attrs[attr] = [2] + [1] * (rank - 1)
    try:
        with host.eager_scope(), tf.device(f"/{device}:0"):
            one = tf.ones([1] * rank, dtype)
            getattr(tf.raw_ops, kernel)(input=one, filter=one, padding="VALID", **attrs)
    except tf.errors.OpError as e:
        return type(e)
    return tf.errors.UnimplementedError


EMPTY_NOTE = "TensorFlow's kernels mishandle empty tensors"
ONEDNN_216_DEPTHWISE_NOTE = ("TF 2.16's oneDNN depthwise kernel can abort the process on large "
                             "filters: not for auto")


def tf_version():
    """TensorFlow's (major, minor), for rules that hold on some releases only."""
    return tuple(int(v) for v in tf.__version__.split(".")[:2])


@dataclasses.dataclass
class Case:
    """What the rules read of one pass: its geometry (_core.conv_geometry), its
    arguments.ConvSpec (given the geometry's operands here), dtype and device.
    The oneDNN checks run only when a rule asks."""
    pass_: Pass
    geometry: dict
    spec: arguments.ConvSpec
    dtype: str
    device: str

    def __post_init__(self):
        g = self.geometry
        self.conv3d = self.spec.conv3d
        filter_shape = [getattr(g, k) for k in ("filter_d", "filter_h", "filter_w", "filter_in_c",
                                       "out_c")[0 if self.conv3d else 1:]]
        self.spec = self.spec.with_filter(g.in_c, filter_shape)
        self.nchw = not self.spec.channels_last
        self.explicit = self.spec.explicit
        self.half = self.dtype in HALF_TYPES and self.device == "CPU"
        self.dilated = g.dilation_d > 1 or g.dilation_h > 1 or g.dilation_w > 1
        self.grouped = g.groups > 1
        self.gradient = self.pass_ != Pass.FORWARD
        sizes = ("batch", "in_d", "in_h", "in_w", "in_c", "filter_d", "filter_h", "filter_w",
                 "out_c", "out_d", "out_h", "out_w")
        self.empty = any(getattr(g, k) == 0 for k in sizes)

    @functools.cached_property
    def depthwise(self):
        """TF's kernel is DepthwiseConv2dNative (uses_depthwise_kernel; may probe oneDNN)."""
        return uses_depthwise_kernel(self.pass_, self.spec, self.dtype, self.device)

    @functools.cached_property
    def onednn_depthwise(self):
        """oneDNN runs TF's depthwise kernel for this dtype (dilated: undilated, VALID)."""
        return tf_cpu_onednn("DepthwiseConv2dNative", self.dtype,
                             self.explicit and not self.dilated)

    @functools.cached_property
    def onednn_conv2d(self):
        return tf_cpu_onednn("Conv2D", self.dtype, self.explicit)

    @functools.cached_property
    def onednn_conv3d(self):
        """oneDNN runs Conv3D for this dtype (explicit padding is a tf.pad around it)."""
        return self.device == "CPU" and tf_cpu_onednn("Conv3D", self.dtype, False)

    @property
    def needs_onednn_conv2d(self):
        """Only oneDNN's CPU Conv2D runs it right: TF's Eigen kernels run NHWC
        only, no grouped or dilated gradients, and accumulate half types in half."""
        return self.nchw or (self.gradient and (self.grouped or self.dilated or self.half))

    @property
    def relies_on_onednn(self):
        """TF's kernel for the case is oneDNN's (ONEDNN_NOTE is added to its note)."""
        if self.conv3d:
            return self.onednn_conv3d
        if self.depthwise:
            return self.nchw or (self.half and self.onednn_depthwise)
        return self.device == "CPU" and self.needs_onednn_conv2d


@dataclasses.dataclass(frozen=True)
class Rule:
    """A row of TF_KERNEL_RULES: where `applies`, TF's `kernel` ("" if it cannot
    run the case), whether auto may pick it (`verdict`: TRUSTED, its estimate
    decides; MEASURED, only when timed fastest; NEVER) and why (`note`;
    ONEDNN_NOTE is added where TF's kernel is oneDNN's, unless the verdict is
    NEVER). `source` says where the measurement behind it is."""
    applies: Callable
    kernel: str
    verdict: Verdict
    note: str
    source: str


# TensorFlow's kernel rules, the first row that applies decides (tf_kernel).
TF_KERNEL_RULES = (
    Rule(lambda c: c.empty, "", Verdict.NEVER, EMPTY_NOTE,
         "TF 2.21's oneDNN Conv2D returns an input-shaped result for empty inputs, its "
         "gradients leave empty sums uninitialised, and its graph shape function rejects the "
         "empty outputs its kernel gives (filter one larger than the input)"),
    # Where our op of the rank is not registered (capabilities: 3-D on the GPU).
    Rule(lambda c: not capabilities.of(c.spec.spatial, c.device).registered, "", Verdict.NEVER,
         "; ".join(f"{u.rank}-D convolutions run on the {u.runs_on} ({u.gap})"
                   for u in capabilities.unregistered()),
         "; ".join(u.source for u in capabilities.unregistered())),
    # Conv3D, TF's only 3-D kernel (bigconv3d).
    Rule(lambda c: c.conv3d and c.grouped, "", Verdict.NEVER,
         "TensorFlow's CPU Conv3D rejects groups",
         "TF 2.21, oneDNN and Eigen: 'input and filter must have the same depth'"),
    Rule(lambda c: c.conv3d and (c.nchw or c.dilated) and not c.onednn_conv3d, "", Verdict.NEVER,
         "TensorFlow's own CPU Conv3D runs only NDHWC, without dilations",
         "TF 2.21's Eigen Conv3D: 'only supports the NHWC tensor format', 'dilated rates of 1'"),
    Rule(lambda c: c.conv3d and c.half and not c.onednn_conv3d, "Conv3D", Verdict.NEVER,
         "TensorFlow's CPU Conv3D accumulates in half precision (4-6x the error of ours): "
         "not for auto",
         "measured rel. L2 vs float64 (3x3x3x8x8): bfloat16 1.2e-2 to 1.8e-2, oneDNN 2.5e-3 to "
         "2.9e-3"),
    Rule(lambda c: c.conv3d and not c.onednn_conv3d, "Conv3D", Verdict.MEASURED,
         "TensorFlow's Eigen Conv3D, estimated at oneDNN's rates: picked only when measured "
         "fastest", "the Conv3D estimate was measured on oneDNN only"),
    Rule(lambda c: c.conv3d, "Conv3D", Verdict.TRUSTED, "",
         "oneDNN's Conv3D against Conv2D's rates at the side of as many taps (plan.cc)"),
    # DepthwiseConv2dNative (uses_depthwise_kernel).
    Rule(lambda c: c.depthwise and tf_version() < (2, 17) and c.onednn_depthwise,
         "DepthwiseConv2dNative", Verdict.NEVER, ONEDNN_216_DEPTHWISE_NOTE,
         "scripts/tf_matrix.sh, TF 2.16.2 on a Zen 4 host: Keras' DepthwiseConv2D (15x15 SAME) "
         "and a bfloat16 fit whose backprop_input auto gave TF's kernel abort the process "
         "(divide by zero in oneDNN's brdgmm blocking, gdb); not from TF 2.17 on"),
    Rule(lambda c: (c.depthwise and c.half and onednn_compiles_slowly(c.pass_, c.geometry, c.dtype)
                    and c.onednn_depthwise), "DepthwiseConv2dNative", Verdict.NEVER,
         ONEDNN_SLOW_COMPILE_NOTE, "ONEDNN_SLOW_COMPILE_NOTE"),
    Rule(lambda c: c.depthwise and c.nchw and c.half, "DepthwiseConv2dNative", Verdict.MEASURED,
         HALF_NCHW_NOTE, "HALF_NCHW_NOTE"),
    Rule(lambda c: c.depthwise and c.half and not c.nchw and not c.onednn_depthwise,
         "DepthwiseConv2dNative", Verdict.NEVER,
         "TensorFlow's CPU depthwise kernels accumulate in half precision (3-10x the error of "
         "ours): not for auto",
         "measured rel. L2 vs float64 (bfloat16, 7x7): 8.5e-3 forward, 3.0e-2 filter gradient, "
         "against 3e-3 for ours"),
    Rule(lambda c: c.depthwise and c.dilated, "DepthwiseConv2dNative", Verdict.MEASURED,
         SPACE_TO_BATCH_NOTE, "SPACE_TO_BATCH_NOTE"),
    Rule(lambda c: c.depthwise, "DepthwiseConv2dNative", Verdict.TRUSTED, "",
         "NCHW: TF's own CPU depthwise kernels reject it, oneDNN's ran it (uses_depthwise_kernel)"),
    # Conv2D.
    Rule(lambda c: (c.device == "GPU" and c.geometry.filter_in_c == 1
                    and c.geometry.in_c > 1), "Conv2D", Verdict.TRUSTED, GPU_DEPTHWISE_NOTE,
         "GPU_DEPTHWISE_NOTE"),
    Rule(lambda c: c.device == "GPU", "Conv2D", Verdict.TRUSTED, "",
         "cuDNN, as tf.nn.conv2d runs it"),
    Rule(lambda c: c.needs_onednn_conv2d and c.nchw and not c.onednn_conv2d, "", Verdict.NEVER,
         "TensorFlow's CPU Conv2D runs only NHWC", "TF's Eigen Conv2D kernels"),
    Rule(lambda c: c.needs_onednn_conv2d and c.grouped and not c.onednn_conv2d, "", Verdict.NEVER,
         "TensorFlow's CPU gradients reject grouped convolution", "TF's Eigen Conv2D kernels"),
    Rule(lambda c: c.needs_onednn_conv2d and c.dilated and not c.onednn_conv2d, "", Verdict.NEVER,
         "TensorFlow's CPU gradients reject dilations", "TF's Eigen Conv2D kernels"),
    Rule(lambda c: c.needs_onednn_conv2d and not c.onednn_conv2d, "Conv2D", Verdict.NEVER,
         "TensorFlow's CPU gradients accumulate in half precision (5-20x the error of ours): "
         "not for auto",
         "measured rel. L2 vs float64 (bfloat16, 15x15x8): 1.4e-2 input and 1.9e-2 filter "
         "gradient, against 2.4e-3 for ours"),
    Rule(lambda c: c.pass_ == Pass.BACKPROP_FILTER and tf_filter_gradient_crashes(
        c.spec, c.dtype, c.device), "", Verdict.NEVER,
         ONEDNN_BF16_GROUPED_DILATED_NOTE, "ONEDNN_BF16_GROUPED_DILATED_NOTE"),
    Rule(lambda c: (c.grouped and c.geometry.filter_in_c >= ONEDNN_GROUPED_TRUSTED_CHANNELS
                    and c.dtype in ("float32", "bfloat16") and not c.nchw and c.onednn_conv2d),
         "Conv2D", Verdict.TRUSTED, "", "ONEDNN_GROUPED_TRUSTED_CHANNELS"),
    Rule(lambda c: c.grouped, "Conv2D", Verdict.MEASURED,
         "grouped Conv2D on the CPU: picked only when measured fastest",
         "measured 10-300x slower than its estimate (depthwise-like shapes)"),
    Rule(lambda c: c.half and c.nchw, "Conv2D", Verdict.MEASURED, HALF_NCHW_NOTE, "HALF_NCHW_NOTE"),
    Rule(lambda c: True, "Conv2D", Verdict.TRUSTED, "", "the cost model's calibration"),
)


def tf_kernel(pass_, geometry, spec, dtype, device):
    """TensorFlow's kernel for one pass on `device`: (name, auto may pick it, note),
    from the first row of TF_KERNEL_RULES that applies.

    name is "Conv2D" or "DepthwiseConv2dNative", or "" where TensorFlow cannot
    run the case (then note says why); a forced algorithm="tf" runs any named
    kernel. "auto may pick it" is a Verdict: TRUSTED (its estimate decides),
    MEASURED (chosen only when autotuning timed it fastest) or NEVER (runs, but
    less precisely than ours, or compiles for minutes). spec: the ConvSpec. On
    the CPU, TF's own (Eigen) kernels run NHWC only, no grouped or dilated
    gradients, and accumulate half types in half precision; where TF runs the case through oneDNN
    (tf_cpu_onednn: measured, per kernel and dtype), none of that holds.
    """
    case = Case(pass_, geometry, spec, dtype, device)
    rule = next(r for r in TF_KERNEL_RULES if r.applies(case))
    note = rule.note
    if rule.verdict != Verdict.NEVER and case.relies_on_onednn:
        note = "; ".join(n for n in (note, ONEDNN_NOTE) if n)
    return rule.kernel, rule.verdict, note


def tf_cpu_onednn(kernel, dtype, explicit_padding, data_format="NHWC"):
    """Whether TF's CPU `kernel` ("Conv2D", "DepthwiseConv2dNative" or "Conv3D")
    runs `dtype` through oneDNN in this process, with explicit padding or not
    (and, for depthwise, in `data_format`).

    TF turns oneDNN on by default on some CPUs only (TF_ENABLE_ONEDNN_OPTS
    overrides it), and even then not for every case: it fell back to its Eigen
    kernels for float16 on an AVX-512 CPU without AVX512-FP16, and for
    EXPLICIT padding. So this is measured, once per process and arguments, on
    a small case of what only oneDNN runs correctly: for Conv2D a grouped,
    dilated NCHW convolution; for Conv3D a dilated NCDHW one; for depthwise,
    NCHW or half-type accuracy. Every
    pass must run and be within 2x the error of rounding the exact result to
    `dtype` (oneDNN: 1.1x in bfloat16; Eigen's half-type gradients: 3-18x).
    """
    h = host.current()
    if not h.runs_onednn():
        return False
    fmt = {"Conv2D": "NCHW", "Conv3D": "NCDHW"}.get(kernel, data_format)
    if h.onednn_runs is not None:
        return bool(h.onednn_runs(kernel, dtype, bool(explicit_padding), fmt))
    return _onednn_probe(kernel, dtype, bool(explicit_padding), fmt)


def tf_runs_onednn(kernel, spec, dtype, device):
    """Whether TF runs its `kernel` for the case (`spec`, a ConvSpec) through oneDNN:
    CPU Conv2D where tf_cpu_onednn says so. Its workspace is then oneDNN's
    (tf_estimate.cc), and TF's Eigen kernels' otherwise; the planner passes this to
    TF's estimate."""
    return (device == "CPU" and kernel == "Conv2D"
            and tf_cpu_onednn("Conv2D", dtype, spec.explicit))


@functools.lru_cache(maxsize=None)
@tf.autograph.experimental.do_not_convert
def _onednn_probe(kernel, dtype, explicit_padding, fmt):
    depthwise = kernel == "DepthwiseConv2dNative"
    if kernel == "Conv3D":  # dilated, in NCDHW: TF's Eigen Conv3D runs neither
        x_shape, f_shape, dil = (2, 4, 7, 9, 8), (3, 3, 3, 4, 6), [1, 1, 2, 1, 2]
    elif not depthwise:  # grouped and dilated, in fmt (NCHW)
        # Dilated in width only: TF 2.21's oneDNN bfloat16 grouped filter
        # gradient crashed with height dilations (ONEDNN_BF16_GROUPED_DILATED_NOTE).
        x_shape, f_shape, dil = (2, 8, 21, 23), (3, 3, 4, 6), [1, 1, 1, 2]
    else:  # as conv.py emits DepthwiseConv2dNative: no dilations
        x_shape, f_shape, dil = (2, 17, 19, 8), (7, 7, 1, 8), [1, 1, 1, 1]
        if fmt == "NCHW":
            x_shape = (2, 8, 17, 19)
    pads = ([0, 0, 1, 2, 2, 1, 0, 0] if fmt == "NHWC" else [0, 0, 0, 0, 1, 2, 2, 1]) \
        if explicit_padding else []
    spec = arguments.ConvSpec(
        (1,) * len(dil), "EXPLICIT" if explicit_padding else "SAME", tuple(pads), fmt,
        tuple(dil)).with_filter(x_shape[3 if fmt == "NHWC" else 1], f_shape)
    core_args = spec.geometry_args()
    rng = np.random.default_rng(0)
    tf_dtype = tf.as_dtype(dtype)

    def rounded(v):  # to dtype and back to float64
        return np.asarray(v).astype(tf_dtype.as_numpy_dtype).astype(np.float64)

    def exact(shape):  # float64 values that dtype holds exactly
        return rounded(rng.standard_normal(shape))

    x, w = exact(x_shape), exact(f_shape)
    y_ref = _core.run_pass("direct", Pass.FORWARD, x, w, [], *core_args)
    dy = exact(y_ref.shape)
    refs = [y_ref,
            _core.run_pass("direct", Pass.BACKPROP_INPUT, dy, w, list(x_shape), *core_args),
            _core.run_pass("direct", Pass.BACKPROP_FILTER, x, dy, list(f_shape), *core_args)]
    try:
        with host.eager_scope(), tf.device("/CPU:0"):
            xt, wt, dyt = (tf.constant(v, tf_dtype) for v in (x, w, dy))
            got = tf.function(lambda: (
                kernels.tf_forward(xt, wt, spec, depthwise),
                kernels.tf_backprop_input(tf.constant(x_shape), wt, dyt, spec, depthwise),
                kernels.tf_backprop_filter(xt, f_shape, dyt, spec, depthwise)),
                autograph=False)()
            got = [tf.cast(g, tf.float64).numpy() for g in got]
    except (tf.errors.OpError, ValueError) as e:
        logging.vlog(1, "TF's CPU %s does not run %s through oneDNN: %s", kernel, dtype,
                     str(e).splitlines()[0] if str(e) else type(e).__name__)
        return False
    for g, ref in zip(got, refs):
        norm = np.linalg.norm(ref)
        rounding = np.linalg.norm(rounded(ref) - ref) / norm
        err = np.linalg.norm(g - ref) / norm
        if not err <= max(2 * rounding, 1e-5):  # NaN fails
            return False
    return True


def grouped_fusion_fails(spec, dtype, device):
    """Whether TF's Conv2D forward of a grouped 2-D case (`spec`, a ConvSpec with
    its operands) on `device` would fail where a BiasAdd follows it in a graph
    (grouped_conv2d_fusion_fails); then planning.candidates emits it per group.
    Needs only the channel counts."""
    if spec.conv3d or device != "CPU" or not spec.grouped:
        return False
    return grouped_conv2d_fusion_fails(dtype, spec.data_format, spec.explicit)


@functools.lru_cache(maxsize=None)
@tf.autograph.experimental.do_not_convert
def grouped_conv2d_fusion_fails(dtype, data_format, explicit_padding):
    """Whether, in a graph on the CPU, a grouped Conv2D that runs on its own
    fails once a BiasAdd follows it: Grappler's remapper fuses the two into
    _FusedConv2D, whose Eigen kernel rejects groups ("Fused conv implementation
    does not support grouped convolutions"); oneDNN's fused kernel runs them.
    Which kernel a fusion gets depends on TF's build and the host (TF 2.21:
    float32 and float64 in NHWC with oneDNN off), so this is measured, once per
    process and arguments. kernels.tf_forward then runs the case per group."""
    nhwc = data_format == "NHWC"
    pads = ([0, 0, 1, 0, 0, 1, 0, 0] if nhwc else [0, 0, 0, 0, 1, 0, 0, 1]) \
        if explicit_padding else []
    attrs = dict(strides=[1, 1, 1, 1], padding="EXPLICIT" if explicit_padding else "SAME",
                 explicit_paddings=pads, data_format=data_format, dilations=[1, 1, 1, 1])
    with host.eager_scope(), tf.device("/CPU:0"), host.graph_optimizer(True):
        x = tf.ones((1, 3, 4, 4) if nhwc else (1, 4, 3, 4), dtype)
        w, b = tf.ones([2, 2, 2, 4], dtype), tf.ones([4], dtype)
        try:  # eagerly, without Grappler: whether TF's kernel runs the case at all
            tf.raw_ops.Conv2D(input=x, filter=w, **attrs).numpy()
        except (tf.errors.OpError, TypeError, ValueError):
            return False
        try:
            tf.function(lambda: tf.nn.bias_add(tf.raw_ops.Conv2D(input=x, filter=w, **attrs), b,
                                               data_format=data_format), autograph=False)().numpy()
        except tf.errors.OpError as e:
            logging.vlog(1, "TF's fused CPU Conv2D rejects groups in %s, %s: %s", dtype,
                         data_format, str(e).splitlines()[0] if str(e) else type(e).__name__)
            return True
    return False
