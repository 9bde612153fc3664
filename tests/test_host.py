"""The host's facts (tfbigconv/host.py): the Host object the planner reads,
its defaults (this process) and use(); where an op will run
(resolve_device); the GPU's trace-time workspace budget."""
import threading

import pytest
import tensorflow as tf

from tfbigconv import _core, host
from tfbigconv.planning import autotune, planner, tf_rules
from conftest import FakeGpu

HAVE_GPU = host.gpu_available()
ATTRS = dict(strides=[1, 1, 1, 1], padding="SAME", explicit_paddings=[], data_format="NHWC",
             dilations=[1, 1, 1, 1])


# ---- Host and use() -------------------------------------------------------

def test_host_defaults_are_this_process():
    h = host.Host()
    assert (h.onednn, h.gpu, h.workers, h.onednn_runs) == (None, None, None, None)
    assert h.runs_onednn() == bool(host.tf_onednn())
    assert h.has_gpu() == host.gpu_available() == HAVE_GPU
    assert h.threads() == host.workers() >= 1
    assert host.current() == h  # nothing installed: this process's facts


def test_given_facts_override_the_process():
    h = host.Host(onednn=not host.tf_onednn(), gpu=not HAVE_GPU, workers=7)
    assert h.runs_onednn() is (not host.tf_onednn())
    assert h.has_gpu() is (not HAVE_GPU)
    assert h.threads() == 7
    with pytest.raises(AttributeError):  # frozen: a Host is a value
        h.workers = 3


def test_use_installs_a_host_and_restores_the_last():
    process = host.current()
    a, b = host.Host(workers=3), host.Host(workers=5, gpu=True)
    with host.use(a) as got:
        assert got is a and host.current() is a
        with host.use(b):
            assert host.current() is b
        assert host.current() is a
        with pytest.raises(RuntimeError), host.use(b):
            raise RuntimeError("restored all the same")
        assert host.current() is a
    assert host.current() is process


def test_use_holds_only_for_the_thread_that_entered_it():
    seen = []
    with host.use(host.Host(workers=3)):
        t = threading.Thread(target=lambda: seen.append(host.current()))
        t.start()
        t.join()
    assert seen == [host.Host()]


def test_the_planner_reads_the_installed_host():
    """The thread count, the oneDNN answer and the GPU, as planning, the oneDNN
    check and autotuning's key read them."""
    key = lambda: autotune._key("forward", [1, 8, 8, 1], [3, 3, 1, 1], ATTRS, "float32",  # noqa: E731
                                "CPU", 0)
    asked = []
    h = host.Host(onednn=True, gpu=False, workers=5,
                  onednn_runs=lambda *q: asked.append(q) or True)
    with host.use(h):
        assert tf_rules.tf_cpu_onednn("Conv2D", "bfloat16", False)
        assert asked == [("Conv2D", "bfloat16", False, "NCHW")]
        assert '"CPU", 5, 0, true]' in key()
        assert not autotune.can_measure("GPU") and autotune.can_measure("CPU")
    with host.use(host.Host(onednn=False, onednn_runs=lambda *q: asked.append(q) or True)):
        assert not tf_rules.tf_cpu_onednn("Conv2D", "bfloat16", False)  # not asked: no oneDNN
        assert len(asked) == 1 and '"CPU", ' in key() and key().endswith(", 0, false]")
    with host.use(host.Host(gpu=True)):
        assert autotune.can_measure("GPU")
    # Planning on the CPU with another thread count: _core.plan_pass's workers.
    plans = {}
    for workers in (1, 64):
        with host.use(host.Host(workers=workers)):
            plans[workers] = planner.plan("forward", [8, 64, 64, 16], [7, 7, 16, 16], ATTRS,
                                          "float32", "direct", 0, "CPU")
    assert plans[1].direct.seconds != plans[64].direct.seconds


# ---- where an op will run ---------------------------------------------------

def test_resolve_device_follows_explicit_scopes():
    default = "GPU" if HAVE_GPU else "CPU"
    assert host.resolve_device() == default
    seen = {}

    @tf.function
    def f():
        seen["none"] = host.resolve_device()
        with tf.device("/GPU:0"):
            seen["gpu"] = host.resolve_device()
        with tf.device("/job:localhost/replica:0/task:0/device:GPU:0"):
            seen["gpu_full"] = host.resolve_device()
        with tf.device("/CPU:0"):
            seen["cpu"] = host.resolve_device()
        return tf.constant(0)

    f.get_concrete_function()
    assert seen == {"none": default, "gpu": "GPU", "gpu_full": "GPU", "cpu": "CPU"}
    with tf.device("/CPU:0"):
        assert host.resolve_device() == "CPU"
        assert host.resolve_device(tf.constant(1.0)) == "CPU"
    assert host.device_kind("/device:GPU:1") == "GPU"
    assert host.device_kind("") == ""


def test_default_placement_and_kernel_device_follow_the_hosts_gpu():
    """Without a scope, a visible GPU runs the op (a Host saying so, too); a GPU
    scope without a GPU runs TF's kernels on the CPU (soft placement)."""
    with host.use(host.Host(gpu=True)):
        assert host.resolve_device() == "GPU" and host.kernel_device("GPU") == "GPU"
        assert host.kernel_device(None) == "GPU"
    with host.use(host.Host(gpu=False)):
        assert host.resolve_device() == "CPU" and host.kernel_device("GPU") == "CPU"
        assert host.kernel_device(None) == "CPU" and host.kernel_device("CPU") == "CPU"
        with tf.device("/GPU:0"):
            assert host.resolve_device() == "GPU"  # the scope wins: planned for the GPU


# ---- the GPU's workspace budget ---------------------------------------------

def test_gpu_budget_is_a_fraction_of_what_the_allocator_can_still_give(monkeypatch):
    half = _core.DEFAULT_BUDGET_FRACTION
    FakeGpu(monkeypatch, memory_limit_mib=1024, in_use=256 << 20, total=80 << 30)
    assert host.gpu_workspace_budget() == int((768 << 20) * half)  # the configured limit
    FakeGpu(monkeypatch, in_use=1 << 30, total=80 << 30)
    assert host.gpu_workspace_budget() == int((79 << 30) * half)  # the driver's total
    FakeGpu(monkeypatch, in_use=None, total=8 << 30)
    assert host.gpu_workspace_budget() == int((8 << 30) * half)   # no statistics yet
    FakeGpu(monkeypatch, in_use=90 << 30, total=80 << 30)
    assert host.gpu_workspace_budget() == 1                       # full: nothing fits
    FakeGpu(monkeypatch, in_use=0, total=0)
    assert host.gpu_workspace_budget() == 0                       # unknown: no limit


def _meta_optimizer_disabled():
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.eager import context
    config = config_pb2.ConfigProto()
    config.ParseFromString(context.context().function_call_options.config_proto_serialized)
    return config.graph_options.rewrite_options.disable_meta_optimizer


def test_without_graph_optimizer_holds_for_the_calling_thread_only():
    assert not _meta_optimizer_disabled()
    seen = {}
    with host.without_graph_optimizer():
        assert _meta_optimizer_disabled()
        other = threading.Thread(target=lambda: seen.setdefault("other", _meta_optimizer_disabled()))
        other.start()
        other.join()
        # a function first called inside still computes
        f = tf.function(lambda v: v * 2.0)
        assert float(f(tf.constant(3.0))) == 6.0
    assert seen == {"other": False}
    assert not _meta_optimizer_disabled()
