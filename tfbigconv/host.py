"""Facts about the process the ops run in: TensorFlow's CPU kernels (oneDNN or
not), a GPU, the ops' thread count, where an op built now will run, and a
way to run code eagerly while a graph is being built.

The planner reads them through `current()`, one `Host` object. Tests build
their own and install it with `use()` instead of patching functions.
"""
import contextlib
import contextvars
import ctypes
import dataclasses
import os
from typing import Callable, Optional

import tensorflow as tf

from tfbigconv import _core

DEVICES = ("CPU", "GPU")


def tf_onednn():
    """Whether TensorFlow's CPU kernels run oneDNN in this process, or None if unknown.

    TF turns oneDNN on by default only on some CPUs (it was on on the AVX-512
    development host, off on the AVX2 one), and TF_ENABLE_ONEDNN_OPTS overrides
    that; TF's Conv2D and depthwise kernels are different code either way."""
    try:
        from tensorflow.python.util import _pywrap_util_port
        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):
        return None


def gpu_available():
    return bool(tf.config.list_logical_devices("GPU"))


def workers():
    """The worker count of the ops' ParallelFor: TF's intra-op threads (kernels_cpu.cc)."""
    return tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class Host:
    """The facts the planner reads. None: read from this process when asked.

    onednn: TF runs its CPU kernels through oneDNN (tf_onednn()).
    gpu: a GPU is visible to TF.
    workers: the ops' CPU threads.
    onednn_runs: (kernel, dtype, explicit_padding, data_format) -> whether
      oneDNN runs that case correctly; None: measured once per process
      (planning.tf_rules.tf_cpu_onednn).
    """
    onednn: Optional[bool] = None
    gpu: Optional[bool] = None
    workers: Optional[int] = None
    onednn_runs: Optional[Callable] = None

    def runs_onednn(self):
        return bool(tf_onednn()) if self.onednn is None else self.onednn

    def has_gpu(self):
        return gpu_available() if self.gpu is None else self.gpu

    def threads(self):
        return workers() if self.workers is None else self.workers


_PROCESS = Host()
_current = contextvars.ContextVar("tfbigconv_host", default=_PROCESS)


def current():
    """The Host the planner reads: this process's, unless use() installed another."""
    return _current.get()


@contextlib.contextmanager
def use(host):
    """Within it, in this thread (or task), current() is `host`."""
    token = _current.set(host)
    try:
        yield host
    finally:
        _current.reset(token)


def device_kind(name):
    """"GPU" or "CPU" for a device name or spec, "" if it names neither."""
    name = (name or "").upper()
    if "GPU" in name:
        return "GPU"
    if "CPU" in name:
        return "CPU"
    return ""


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
    has_gpu = current().has_gpu()
    if tensor is not None and tf.executing_eagerly():
        kind = device_kind(getattr(tensor, "device", "") or "")
        if kind == "CPU" and has_gpu:
            kind = "GPU"  # eager ops on CPU tensors still run on a visible GPU
        if kind:
            return kind
    return "GPU" if has_gpu else "CPU"


def kernel_device(device):
    """Where TF's kernel emitted for `device` (None: where ops built here run)
    will run: a GPU scope without a GPU runs it on the CPU (soft placement),
    where TF's kernels have the CPU's limits."""
    if device is None:
        device = resolve_device()
    return "CPU" if device == "GPU" and not current().has_gpu() else device


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


def without_graph_optimizer():
    """Functions called inside run without Grappler, on this thread only.

    For autotuning's one-pass candidate graphs, which Grappler leaves as they
    are: their first call (the function's instantiation) cost ~6 ms with it and
    ~2 ms without, and a layer's tuning calls 6 to 9 new graphs. The setting is
    the thread's function-call options (a function is instantiated with the
    options of its calls), not the process-wide optimizer options."""
    return graph_optimizer(False)


@contextlib.contextmanager
def graph_optimizer(enabled):
    """Functions called inside run with Grappler on or off (`enabled`), on this
    thread only (see without_graph_optimizer)."""
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.eager import context  # no public per-thread call options
    ctx = context.context()
    old = ctx.function_call_options
    config = config_pb2.ConfigProto()
    config.ParseFromString(old.config_proto_serialized)
    config.graph_options.rewrite_options.disable_meta_optimizer = not enabled
    ctx.function_call_options = context.FunctionCallOptions(
        executor_type=old.executor_type, config_proto=config)
    try:
        yield
    finally:
        ctx.function_call_options = old


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
