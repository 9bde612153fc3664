"""The trace-time dispatcher: per pass, TensorFlow's own kernel, direct or fft.

The estimates and the choice come from the planner in C++ (plan.cc, through
_core.plan_pass), so that they are the ones the ops use at run time. This
module adds what only Python knows: where the op will run, which TensorFlow
kernel runs each case on that device and whether it can, the
TFBIGCONV_ALGORITHM override, TF's thread count, and measured choices
(autotune.py) where estimates are not to be trusted.
"""
import contextlib
import contextvars
import ctypes
import functools
import os

import tensorflow as tf
from absl import logging

from tfbigconv import _core, cost_model

# "im2col" is the earlier name of "tf" (TensorFlow's own kernel), still accepted.
ALGORITHMS = ("auto", "tf", "direct", "fft", "im2col")
PASSES = ("forward", "backprop_input", "backprop_filter")
DEVICES = ("CPU", "GPU")
ENV_ALGORITHM = "TFBIGCONV_ALGORITHM"
HALF_TYPES = ("float16", "bfloat16")
# With an unknown batch (Keras' usual None), passes are planned for this many
# images: the choice between algorithms depends little on the batch, and a
# training batch of 32 is Keras' default.
ASSUMED_BATCH = 32


# Set by planning_only() to the list of its plans' ResourceExhaustedError
# messages; None outside it. A context variable, so that it holds only for the
# thread (or task) that set it.
_planning_only = contextvars.ContextVar("tfbigconv_planning_only", default=None)


def invalid_argument(message):
    return tf.errors.InvalidArgumentError(None, None, message)


@contextlib.contextmanager
def eager_scope():
    """Runs its body eagerly, outside any graph being built: what trace-time
    probes and autotuning time and read (.numpy()). tf.init_scope() alone
    lifts out of a tf.function but stays in a TF1 graph (tf.Graph().as_default(),
    tf.compat.v1 sessions, disable_v2_behavior()), where reading a tensor fails."""
    from tensorflow.python.eager import context  # no public eager_mode()
    with tf.init_scope():
        if tf.executing_eagerly():
            yield
        else:
            with context.eager_mode():
                yield


def requested_algorithm(algorithm):
    """`algorithm` ("im2col" read as "tf"), unless TFBIGCONV_ALGORITHM forces another."""
    forced = os.environ.get(ENV_ALGORITHM)
    if forced:
        if forced not in ALGORITHMS:
            raise invalid_argument(f"{ENV_ALGORITHM} must be one of {ALGORITHMS}, got {forced!r}")
        algorithm = forced
    elif algorithm not in ALGORITHMS:
        raise invalid_argument(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    return "tf" if algorithm == "im2col" else algorithm


def uses_depthwise_kernel(pass_, in_depth, filter_shape, attrs, dtype, device):
    """Whether TF's kernel for the pass is DepthwiseConv2dNative: a depthwise
    filter (one input channel, several groups) on the CPU that its kernels accept:
    equal strides, no dilations, and NHWC, or NCHW where TF runs it through
    oneDNN (tf_cpu_onednn). With dilations, in NHWC at stride 1, the gradients
    run it as tf.nn.depthwise_conv2d does (SPACE_TO_BATCH_NOTE), and so does the
    forward pass from a dilated side of SPACE_TO_BATCH_FORWARD_SIDE; below it the
    forward is grouped Conv2D, which oneDNN runs faster there. Other grouped
    cases, and every one on the GPU (GPU_DEPTHWISE_NOTE), are grouped Conv2D.
    The planner and conv.py's emitters both ask this."""
    if in_depth is None or in_depth <= 1 or filter_shape[2] != 1 or device == "GPU":
        return False
    nhwc = attrs["data_format"] == "NHWC"
    strides = attrs["strides"][1:3] if nhwc else attrs["strides"][2:4]
    if strides[0] != strides[1]:
        return False
    if any(d != 1 for d in attrs["dilations"]):
        if not nhwc or strides[0] != 1 or None in filter_shape[:2]:
            return False
        sides = [(k - 1) * d + 1 for k, d in zip(filter_shape[:2], attrs["dilations"][1:3])]
        return pass_ != "forward" or max(sides) >= SPACE_TO_BATCH_FORWARD_SIDE
    if nhwc:
        return True
    # TF's own CPU depthwise kernels reject NCHW; oneDNN's ran it at 0.93-1.12x
    # the time of grouped Conv2D, with the same results.
    return device == "CPU" and tf_cpu_onednn("DepthwiseConv2dNative", dtype,
                                             attrs["padding"] == "EXPLICIT", "NCHW")


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


def tf_filter_gradient_crashes(in_depth, filter_shape, attrs, dtype, device):
    """Whether TF's kernel for the filter gradient is the one that crashed
    (ONEDNN_BF16_GROUPED_DILATED_NOTE): grouped Conv2DBackpropFilter in bfloat16
    with dilations, where oneDNN runs it. Needs no spatial sizes, so conv.py's
    emitter asks it too, also where shapes are unknown."""
    if (device != "CPU" or dtype != "bfloat16" or in_depth is None or filter_shape[2] is None
            or in_depth == filter_shape[2] or all(d == 1 for d in attrs["dilations"])):
        return False
    if uses_depthwise_kernel("backprop_filter", in_depth, filter_shape, attrs, dtype, device):
        return False  # the undilated depthwise kernel on SpaceToBatchND copies
    return tf_cpu_onednn("Conv2D", dtype, attrs["padding"] == "EXPLICIT")


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
    return (pass_ == "forward" and dtype == "bfloat16" and geometry["in_c"] <= 16
            and geometry["out_c"] == geometry["in_c"] and geometry["stride_h"] == 1
            and geometry["stride_w"] == 1
            and max(geometry["filter_h"], geometry["filter_w"]) >= 15)


def tf_kernel(pass_, geometry, attrs, dtype, device):
    """TensorFlow's kernel for one pass on `device`: (name, auto may pick it, note).

    name is "Conv2D" or "DepthwiseConv2dNative", or "" where TensorFlow cannot
    run the case (then note says why); a forced algorithm="tf" runs any named
    kernel. "auto may pick it" is "trusted" (its estimate decides), "measured"
    (chosen only when autotuning timed it fastest: its estimate has been wrong
    by 10-300x: grouped Conv2D, half types in NCHW; or leaves out copies:
    dilated depthwise gradients, SPACE_TO_BATCH_NOTE) or "never" (runs, but less
    precisely than ours, or compiles for minutes: onednn_compiles_slowly). On the CPU, TF's
    own (Eigen) kernels run NHWC only, no grouped or dilated gradients, and
    accumulate half types in half precision; where TF runs the case through
    oneDNN (tf_cpu_onednn: measured, per kernel and dtype), none of that holds.
    """
    sizes = ("batch", "in_h", "in_w", "in_c", "filter_h", "filter_w", "out_c", "out_h", "out_w")
    if any(geometry[k] == 0 for k in sizes):
        # TF 2.21's oneDNN Conv2D returns an input-shaped result for empty inputs,
        # its gradients leave empty sums uninitialised, and its graph shape function
        # rejects the empty outputs its kernel gives (filter one larger than the input).
        return "", "never", "TensorFlow's kernels mishandle empty tensors"
    data_format = attrs["data_format"]
    explicit = attrs["padding"] == "EXPLICIT"
    half = dtype in HALF_TYPES and device == "CPU"
    filter_shape = [geometry[k] for k in ("filter_h", "filter_w", "filter_in_c", "out_c")]
    dilated = geometry["dilation_h"] > 1 or geometry["dilation_w"] > 1
    if uses_depthwise_kernel(pass_, geometry["in_c"], filter_shape, attrs, dtype, device):
        # With dilations the kernel runs undilated and VALID, on padded copies.
        for_auto, note = _depthwise_kernel_for_auto(pass_, geometry, dtype, data_format,
                                                    explicit and not dilated, half)
        if dilated and for_auto == "trusted":
            for_auto, note = "measured", SPACE_TO_BATCH_NOTE + ("; " + note if note else "")
        return "DepthwiseConv2dNative", for_auto, note
    if device == "GPU":
        depthwise = geometry["filter_in_c"] == 1 and geometry["in_c"] > 1
        return "Conv2D", "trusted", GPU_DEPTHWISE_NOTE if depthwise else ""
    grouped = geometry["groups"] > 1
    gradient = pass_ != "forward"
    note = ""
    if data_format != "NHWC" or (gradient and (grouped or dilated or half)):
        if not tf_cpu_onednn("Conv2D", dtype, explicit):
            if data_format != "NHWC":
                return "", "never", "TensorFlow's CPU Conv2D runs only NHWC"
            if grouped:
                return "", "never", "TensorFlow's CPU gradients reject grouped convolution"
            if dilated:
                return "", "never", "TensorFlow's CPU gradients reject dilations"
            # Measured rel. L2 vs float64 (bfloat16, 15x15x8): 1.4e-2 input and
            # 1.9e-2 filter gradient, against 2.4e-3 for ours.
            return ("Conv2D", "never", "TensorFlow's CPU gradients accumulate in half precision "
                    "(5-20x the error of ours): not for auto")
        note = ONEDNN_NOTE
    if pass_ == "backprop_filter" and tf_filter_gradient_crashes(geometry["in_c"], filter_shape,
                                                                  attrs, dtype, device):
        return "", "never", ONEDNN_BF16_GROUPED_DILATED_NOTE
    if grouped:
        # Measured 10-300x slower than its estimate (depthwise-like shapes).
        return "Conv2D", "measured", ("grouped Conv2D on the CPU: picked only when measured "
                                      "fastest" + ("; " + note if note else ""))
    if half and data_format == "NCHW":
        return "Conv2D", "measured", HALF_NCHW_NOTE + "; " + note
    return "Conv2D", "trusted", note


def _depthwise_kernel_for_auto(pass_, geometry, dtype, data_format, explicit, half):
    """tf_kernel's (auto may pick it, note) for DepthwiseConv2dNative."""
    if (half and onednn_compiles_slowly(pass_, geometry, dtype)
            and tf_cpu_onednn("DepthwiseConv2dNative", dtype, explicit)):
        return "never", ONEDNN_SLOW_COMPILE_NOTE
    if data_format == "NCHW":  # the check ran it NCHW in this dtype
        if half:
            return "measured", HALF_NCHW_NOTE + "; " + ONEDNN_NOTE
        return "trusted", ONEDNN_NOTE
    if half:
        if tf_cpu_onednn("DepthwiseConv2dNative", dtype, explicit):
            return "trusted", ONEDNN_NOTE
        # Measured rel. L2 vs float64 (bfloat16, 7x7): 8.5e-3 forward,
        # 3.0e-2 filter gradient, against 3e-3 for ours.
        return "never", ("TensorFlow's CPU depthwise kernels accumulate in half precision "
                         "(3-10x the error of ours): not for auto")
    return "trusted", ""


def tf_cpu_onednn(kernel, dtype, explicit_padding, data_format="NHWC"):
    """Whether TF's CPU `kernel` ("Conv2D" or "DepthwiseConv2dNative") runs
    `dtype` through oneDNN in this process, with explicit padding or not (and,
    for depthwise, in `data_format`).

    TF turns oneDNN on by default on some CPUs only (TF_ENABLE_ONEDNN_OPTS
    overrides it), and even then not for every case: it fell back to its Eigen
    kernels for float16 on an AVX-512 CPU without AVX512-FP16, and for
    EXPLICIT padding. So this is measured, once per process and arguments, on
    a small case of what only oneDNN runs correctly: for Conv2D a grouped,
    dilated NCHW convolution; for depthwise, NCHW or half-type accuracy. Every
    pass must run and be within 2x the error of rounding the exact result to
    `dtype` (oneDNN: 1.1x in bfloat16; Eigen's half-type gradients: 3-18x).
    """
    if not cost_model.tf_onednn():
        return False
    fmt = "NCHW" if kernel == "Conv2D" else data_format
    return _onednn_probe(kernel, dtype, bool(explicit_padding), fmt)


@functools.lru_cache(maxsize=None)
@tf.autograph.experimental.do_not_convert
def _onednn_probe(kernel, dtype, explicit_padding, fmt):
    import numpy as np
    from tfbigconv import conv
    depthwise = kernel != "Conv2D"
    if not depthwise:  # grouped and dilated, in fmt (NCHW)
        # Dilated in width only: TF 2.21's oneDNN bfloat16 grouped filter
        # gradient crashed with height dilations (ONEDNN_BF16_GROUPED_DILATED_NOTE).
        x_shape, f_shape, dil = (2, 8, 21, 23), (3, 3, 4, 6), [1, 1, 1, 2]
    else:  # as conv.py emits DepthwiseConv2dNative: no dilations
        x_shape, f_shape, dil = (2, 17, 19, 8), (7, 7, 1, 8), [1, 1, 1, 1]
        if fmt == "NCHW":
            x_shape = (2, 8, 17, 19)
    pads = ([0, 0, 1, 2, 2, 1, 0, 0] if fmt == "NHWC" else [0, 0, 0, 0, 1, 2, 2, 1]) \
        if explicit_padding else []
    a = dict(strides=[1, 1, 1, 1], padding="EXPLICIT" if explicit_padding else "SAME",
             explicit_paddings=pads, data_format=fmt, dilations=dil)
    core_args = (a["strides"], a["padding"], pads, fmt, dil)
    rng = np.random.default_rng(0)
    tf_dtype = tf.as_dtype(dtype)

    def rounded(v):  # to dtype and back to float64
        return np.asarray(v).astype(tf_dtype.as_numpy_dtype).astype(np.float64)

    def exact(shape):  # float64 values that dtype holds exactly
        return rounded(rng.standard_normal(shape))

    x, w = exact(x_shape), exact(f_shape)
    y_ref = _core.run_pass("direct", "forward", x, w, [], *core_args)
    dy = exact(y_ref.shape)
    refs = [y_ref, _core.run_pass("direct", "backprop_input", dy, w, list(x_shape), *core_args),
            _core.run_pass("direct", "backprop_filter", x, dy, list(f_shape), *core_args)]
    try:
        with eager_scope(), tf.device("/CPU:0"):
            xt, wt, dyt = (tf.constant(v, tf_dtype) for v in (x, w, dy))
            in_depth = x_shape[3 if fmt == "NHWC" else 1]
            got = tf.function(lambda: (
                conv._tf_forward(xt, wt, a, depthwise),
                conv._tf_backprop_input(tf.constant(x_shape), wt, dyt, a, in_depth, depthwise),
                conv._tf_backprop_filter(xt, f_shape, dyt, a, depthwise)), autograph=False)()
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


def gpu_available():
    return bool(tf.config.list_logical_devices("GPU"))


def resolve_device(tensor=None):
    """"CPU" or "GPU": where an op built now will run.

    An explicit tf.device scope wins (in a tf.function: a scope inside it,
    else an eager scope around the call that traces it), then the tensor's
    own placement (eager), then TensorFlow's default placement: a visible GPU
    runs ops that have a GPU kernel. TF does not retrace a tf.function for
    another device scope, so the scope of the first call is the one planned for.
    """
    from tensorflow.python.eager import context  # the eager tf.device scope
    if tf.executing_eagerly():
        scope = context.context().device_name or ""
    else:
        scope = tf.constant(0, name="device_probe").device  # a graph op gets the scope's device
        if not scope:
            scope = context.context().device_name or ""  # the scope around the traced call
    kind = device_kind(scope)
    if kind:
        return kind
    if tensor is not None and tf.executing_eagerly():
        kind = device_kind(getattr(tensor, "device", "") or "")
        if kind == "CPU" and gpu_available():
            kind = "GPU"  # eager ops on CPU tensors still run on a visible GPU
        if kind:
            return kind
    return "GPU" if gpu_available() else "CPU"


def device_kind(name):
    """"GPU" or "CPU" for a device name or spec, "" if it names neither."""
    name = (name or "").upper()
    if "GPU" in name:
        return "GPU"
    if "CPU" in name:
        return "CPU"
    return ""


def workers():
    """The worker count of the ops' ParallelFor: TF's intra-op threads (kernels_cpu.cc)."""
    return tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count() or 1


def gpu_workspace_budget():
    """The trace-time workspace budget on the first visible GPU, in bytes; 0 if unknown.

    The same rule as the GPU kernels' run-time default (kernels_gpu.cc): a
    fraction (_core.DEFAULT_BUDGET_FRACTION) of what TF's allocator can still
    hand out, its limit less its bytes in use
    (tf.config.experimental.get_memory_info). The limit is the logical
    device's configured memory_limit, else the device's total memory from the
    CUDA driver (TF's allocator reserves a little of it: the kernel, planning
    again at run time, has the last word). No GPU, or neither known: 0, and the
    planner sets no trace-time limit.
    """
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return 0
    limit = 0
    try:
        config = tf.config.get_logical_device_configuration(gpus[0])
    except (RuntimeError, ValueError):
        config = None
    if config and getattr(config[0], "memory_limit", None):
        limit = int(config[0].memory_limit) << 20  # MiB
    if not limit:
        limit = cuda_total_memory(0)
    if not limit:
        return 0
    try:
        in_use = int(tf.config.experimental.get_memory_info("GPU:0")["current"])
    except (RuntimeError, ValueError, KeyError):
        in_use = 0  # the allocator keeps no statistics (or is not made yet)
    return max(1, int(max(0, limit - in_use) * _core.DEFAULT_BUDGET_FRACTION))


def cuda_total_memory(ordinal):
    """Total memory of CUDA device `ordinal` (after CUDA_VISIBLE_DEVICES) from the
    driver API, which needs no context; 0 without a driver."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        dev, total = ctypes.c_int(), ctypes.c_size_t()
        if (cuda.cuInit(0) or cuda.cuDeviceGet(ctypes.byref(dev), ordinal)
                or cuda.cuDeviceTotalMem_v2(ctypes.byref(total), dev)):
            return 0
        return int(total.value)
    except (OSError, AttributeError):
        return 0


def plan(pass_, input_shape, filter_shape, attrs, dtype, algorithm, workspace_limit,
         device="CPU", kernel=None):
    """The planner's table and choice for one pass (a dict; see _core.plan_pass).

    attrs: strides, padding, explicit_paddings, data_format, dilations as the
    op takes them. Raises InvalidArgumentError for bad arguments and
    ResourceExhaustedError when nothing requested fits the workspace limit.
    workspace_limit 0: the default budget (on the GPU, gpu_workspace_budget()).
    kernel: TF's kernel to estimate ("Conv2D", "DepthwiseConv2dNative") instead
    of tf_kernel's (memory_report: the kernel of an op already in a graph).
    """
    if device == "GPU" and not workspace_limit:
        workspace_limit = gpu_workspace_budget()
    args = (list(input_shape), list(filter_shape), attrs["strides"], attrs["padding"],
            attrs["explicit_paddings"], attrs["data_format"], attrs["dilations"])
    try:
        geometry = _core.conv_geometry(*args)
    except ValueError as e:
        raise invalid_argument(str(e)) from None
    picked, for_auto, note = tf_kernel(pass_, geometry, attrs, dtype, device)
    kernel = kernel or picked
    try:
        p = _core.plan_pass(*args, pass_, dtype, device, algorithm, workspace_limit, workers(),
                            kernel, for_auto == "trusted", note)
    except ValueError as e:
        raise invalid_argument(str(e)) from None
    except RuntimeError as e:
        raise tf.errors.ResourceExhaustedError(None, None, str(e)) from None
    p["geometry"] = geometry
    p["tf_trusted"] = for_auto == "trusted"
    p["tf_for_auto"] = for_auto
    p["measured"] = None
    return p


@contextlib.contextmanager
def planning_only():
    """Within it, and only in the thread (or task) that entered it, decide()
    plans from the estimates alone: nothing is timed or read from autotune's
    cache, and a pass that does not fit its workspace limit is planned without
    one instead of raising. Yields the list of those ResourceExhaustedError
    messages. memory_report traces a model under it."""
    failures = []
    token = _planning_only.set(failures)
    try:
        yield failures
    finally:
        _planning_only.reset(token)


def decide(pass_, input_shape, filter_shape, attrs, dtype, algorithm, workspace_limit,
           device="CPU", autotune=None):
    """plan(), then for "auto" a measured choice where the estimates cannot be trusted.

    autotune: None follows TFBIGCONV_AUTOTUNE (on unless "0"). The result's
    "measured" is {candidate: seconds} when timings decided, else None.
    Inside planning_only(): plan() alone, see there.
    """
    failures = _planning_only.get()
    if failures is not None:
        try:
            return plan(pass_, input_shape, filter_shape, attrs, dtype, algorithm,
                        workspace_limit, device)
        except tf.errors.ResourceExhaustedError as e:
            failures.append(e.message)
            return plan(pass_, input_shape, filter_shape, attrs, dtype, algorithm, 0, device)
    p = plan(pass_, input_shape, filter_shape, attrs, dtype, algorithm, workspace_limit, device)
    if algorithm == "auto":
        from tfbigconv import autotune as tuner  # imports conv.py, which imports this module
        tuner.refine(p, input_shape, filter_shape, attrs, dtype, device, workspace_limit,
                     enabled=autotune)
    return p


def decide_gradients(input_shape, filter_shape, attrs, dtype, algorithm, workspace_limit,
                     device="CPU", autotune=None):
    """decide() for both gradient passes (dL/dinput, dL/dfilter), which run in
    one step; then, for "auto", autotune.refine_gradients: a pair other than
    TF's two kernels that won pass by pass must win again timed together."""
    plans = [decide(p, input_shape, filter_shape, attrs, dtype, algorithm, workspace_limit,
                    device, autotune) for p in PASSES[1:]]
    if algorithm == "auto" and _planning_only.get() is None:
        from tfbigconv import autotune as tuner
        tuner.refine_gradients(*plans, input_shape, filter_shape, attrs, dtype, device,
                               workspace_limit, enabled=autotune)
    return plans


def log_choice(op_name, p):
    how = "measured" if p.get("measured") else "estimated"
    logging.vlog(1, "%s %s on %s: %s, %s (%s)", op_name, p["pass"], p["device"], p["chosen"],
                 how, p["reason"])
