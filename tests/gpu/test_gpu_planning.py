"""Planning for the GPU without one: trace-time plans that follow the device
(its scope, the one around a traced call, the GPU's workspace budget), the
kernels emitted for it (grouped Conv2D for depthwise filters, also in the
gradients), nothing timed for a GPU that is not here, and explain(device="GPU")
with the GPU cost model. Where an op will run: test_host.py; the GPU model and
fit-gpu: cost_model/test_gpu_fit.py; the GPU kernels themselves: test_gpu.py."""
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from tfbigconv import _core, host
from tfbigconv.arguments import Algorithm
from tfbigconv.ops import planned
from tfbigconv.planning import autotune, planner
from conftest import FakeGpu, rand, run_cli as run

PASSES = planner.PASSES
DENSE_3X3 = ((16, 56, 56, 64), (3, 3, 64, 64))
SEED16 = ((16, 321, 481, 1), (135, 135, 1, 3))
NAMES = {"tf.Conv2D", "tf.DepthwiseConv2dNative", "direct", "fft"}
HAVE_GPU = host.gpu_available()


def test_trace_time_plan_follows_the_device_scope(eigen_tf):
    """NCHW 3x3, 32 channels: TF's CPU Conv2D without oneDNN cannot run it, so
    the CPU plan is ours; on the GPU, cuDNN is the plan for every pass (TF's own
    gradients; on the H100 grids cuDNN is 10-30x faster than ours there).
    Tiny layers would not do: all candidates are then near their launch
    floors, where ours measured faster."""
    x_shape, w_shape = (8, 32, 64, 64), (3, 3, 32, 32)
    for device, want in (("CPU", False), ("GPU", True)):
        e = tfbigconv.explain(x_shape, w_shape, padding="SAME", data_format="NCHW", device=device)
        assert (set(e.chosen.values()) == {"tf.Conv2D"}) == want, (device, e.chosen)
    w = rand(w_shape, 0)

    def step(x, device):
        with tf.device(f"/{device}:0"):
            with tf.GradientTape() as t:
                t.watch(x)
                y = tfbigconv.bigconv2d(x, w, 1, "SAME", data_format="NCHW")
                loss = tf.reduce_sum(y * y)
            dx = t.gradient(loss, x)
            assert dx is not None
            return dx

    x = tf.TensorSpec(x_shape, tf.float32)
    gpu = tf.function(lambda x: step(x, "GPU")).get_concrete_function(x).graph
    types = {op.type for op in gpu.get_operations()}
    assert {"Conv2D", "Conv2DBackpropInput"} <= types and "BigConv2D" not in types
    assert all("GPU" in op.device for op in gpu.get_operations() if op.type == "Conv2D")
    cpu = tf.function(lambda x: step(x, "CPU")).get_concrete_function(x).graph
    types = {op.type for op in cpu.get_operations()}
    assert {"BigConv2D", "BigConv2DBackpropInput"} <= types and "Conv2D" not in types


def test_a_gpu_scope_without_a_gpu_emits_the_cpus_depthwise_kernels(eigen_tf):
    """With no GPU, an op under tf.device("/GPU:0") runs on the CPU (soft
    placement). It is planned for the GPU, but TF's depthwise kernels are
    emitted for the CPU: grouped Conv2D gradients, the GPU's choice, fail on
    TF's Eigen CPU kernels. Runs, and matches float64."""
    if HAVE_GPU:
        pytest.skip("about a machine without a GPU")
    x = tf.constant(np.random.default_rng(0).standard_normal((2, 12, 12, 8)), tf.float32)
    w = rand((3, 3, 1, 8), 1)

    def step(x, w):
        with tf.GradientTape() as t:
            t.watch([x, w])
            with tf.device("/GPU:0"):
                y = tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm="tf")
            loss = tf.reduce_sum(y * y)
        return t.gradient(loss, [x, w])

    f = tf.function(step)
    types = {op.type for op in f.get_concrete_function(x, w).graph.get_operations()}
    assert {"DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter"} <= types
    assert not {"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"} & types, types
    got = f(x, w)
    want = step(tf.cast(x, tf.float64), tf.cast(w, tf.float64))
    for g, r in zip(got, want):
        err = float(tf.norm(tf.cast(g, tf.float64) - r) / tf.norm(r))
        assert err < 1e-5, err


def test_an_eager_scope_around_a_traced_call_is_planned_for(eigen_tf):
    """with tf.device(...) around the call that traces a tf.function: the
    trace plans for that device (NCHW 3x3: cuDNN on the GPU, ours on a CPU
    where TF runs no oneDNN)."""
    x_shape, w_shape = (8, 32, 64, 64), (3, 3, 32, 32)
    w = rand(w_shape, 0)
    for device, want in (("GPU", "Conv2D"), ("CPU", "BigConv2D")):
        seen = {}

        @tf.function
        def f(x):
            seen["device"] = host.resolve_device(x)
            return tfbigconv.bigconv2d(x, w, 1, "SAME", data_format="NCHW")

        with tf.device(f"/{device}:0"):
            graph = f.get_concrete_function(tf.TensorSpec(x_shape, tf.float32)).graph
        types = {op.type for op in graph.get_operations()}
        assert seen["device"] == device
        assert want in types and ({"Conv2D", "BigConv2D"} - {want}).isdisjoint(types), types


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_depthwise_runs_as_grouped_conv2d_on_the_gpu(dtype, gpu_host):
    """TF's GPU DepthwiseConv2dNative* run cuDNN only in part and have no
    bfloat16 kernel: on the GPU every pass of a depthwise layer that goes to
    TF's kernel is grouped Conv2D (cuDNN); on the CPU it stays depthwise."""
    # gpu_host: as on a GPU machine
    x_shape, w_shape = (2, 16, 16, 8), (3, 3, 1, 16)  # multiplier 2
    w = tf.cast(rand(w_shape, 0), dtype)

    def step(x, device):
        with tf.device(f"/{device}:0"):
            with tf.GradientTape() as t:
                t.watch([x, w])
                y = tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm="tf")
                loss = tf.reduce_sum(tf.cast(y, tf.float32))
            return t.gradient(loss, [x, w])

    spec = tf.TensorSpec(x_shape, dtype)
    for device in ("GPU", "CPU"):
        graph = tf.function(lambda x: step(x, device)).get_concrete_function(spec).graph
        types = {op.type for op in graph.get_operations()}
        depthwise = {"DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
                     "DepthwiseConv2dNativeBackpropFilter"}
        grouped = {"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"}
        if device == "GPU":
            assert grouped <= types and depthwise.isdisjoint(types), types
            convs = [op for op in graph.get_operations() if op.type in grouped]
            assert all("GPU" in op.device for op in convs)
        elif dtype == "float32":  # half types follow the CPU's precision rules
            assert depthwise <= types and grouped.isdisjoint(types), types


def test_tf_gradient_kernels_follow_the_device_the_forward_was_planned_for(monkeypatch,
                                                                           gpu_host):
    """A depthwise forward planned for the GPU (grouped Conv2D) whose gradient is
    built under another scope (here /CPU:0): the planned TF gradient pass is
    emitted for the GPU too (grouped Conv2DBackpropInput), not for where the
    gradient code is built."""
    # gpu_host: as on a GPU machine
    monkeypatch.setattr(planned, "plan_forward",
                        lambda *args, **kwargs: SimpleNamespace(chosen=Algorithm.TF))
    monkeypatch.setattr(planner, "choose_gradients", lambda *args, **kwargs: ("tf", "direct"))
    x_shape, w_shape = (2, 16, 16, 8), (3, 3, 1, 8)
    w = rand(w_shape, 0)

    @tf.function
    def step(x):
        with tf.GradientTape() as t:
            t.watch(x)
            with tf.device("/GPU:0"):
                y = tfbigconv.bigconv2d(x, w, 1, "SAME")
            loss = tf.reduce_sum(y)
        with tf.device("/CPU:0"):
            return t.gradient(loss, x)

    graph = step.get_concrete_function(tf.TensorSpec(x_shape, tf.float32)).graph
    types = {op.type for op in graph.get_operations()}
    assert {"Conv2D", "Conv2DBackpropInput"} <= types, types
    assert not any(t.startswith("DepthwiseConv2dNative") for t in types), types


def test_gpu_trace_time_plans_use_the_gpu_budget(monkeypatch):
    attrs = dict(strides=[1, 1, 1, 1], padding="SAME", explicit_paddings=[],
                 data_format="NHWC", dilations=[1, 1, 1, 1])
    x, w = SEED16
    unlimited = planner.plan("forward", x, w, attrs, "float32", "auto", 1 << 40, "GPU")
    assert unlimited.chosen == "fft"
    # a 1 MiB device: half of it is less than the fft's smallest workspace
    FakeGpu(monkeypatch, memory_limit_mib=1, in_use=0)
    p = planner.plan("forward", x, w, attrs, "float32", "auto", 0, "GPU")
    assert p.limit == int((1 << 20) * _core.DEFAULT_BUDGET_FRACTION)
    assert p.limit < unlimited.fft.workspace_bytes
    assert not p.fft.fits and p.chosen != "fft"
    # an explicit limit still wins
    assert planner.plan("forward", x, w, attrs, "float32", "auto", 1 << 40, "GPU").chosen == "fft"
    # a GPU with nothing known: no trace-time limit, as before
    FakeGpu(monkeypatch, in_use=0, total=0)
    assert planner.plan("forward", x, w, attrs, "float32", "auto", 0, "GPU").limit >= 1 << 62


def test_no_timing_for_a_gpu_that_is_not_here(autotuning, monkeypatch):
    """A tf.device("/GPU:0") scope on a machine without a GPU: the op is
    planned for the GPU, on estimates; nothing is timed (it would run on the
    CPU, and TF's CPU kernels cannot even run every GPU candidate, e.g.
    grouped gradients)."""
    def fail(*args, **kwargs):
        raise AssertionError("autotune.measure called")
    monkeypatch.setattr(autotune, "measure", fail)
    x_shape, w_shape = (2, 16, 16, 16), (3, 3, 4, 16)
    with pytest.raises(tf.errors.InvalidArgumentError, match="GPU"):
        tfbigconv.explain(x_shape, w_shape, padding="SAME", device="GPU", autotune=True)
    e = tfbigconv.explain(x_shape, w_shape, padding="SAME", device="GPU", autotune=None)
    assert e.how == dict.fromkeys(PASSES, "estimated")
    w = rand(w_shape, 1)

    def step(x):
        with tf.device("/GPU:0"):
            with tf.GradientTape() as t:
                t.watch(x)
                loss = tf.reduce_sum(tfbigconv.bigconv2d(x, w, 1, "SAME") ** 2)
            return t.gradient(loss, x)

    tf.function(step).get_concrete_function(tf.TensorSpec(x_shape, tf.float32))
    assert not autotuning.exists()
    r = run(["-m", "tfbigconv", "explain", "--input", "2,16,16,16", "--filter", "3,3,4,16",
             "--device", "GPU", "--autotune"])
    assert r.returncode == 2 and "error:" in r.stderr and "GPU" in r.stderr


# ---- explain(device="GPU") -------------------------------------------------

@pytest.mark.parametrize("x_shape,w_shape,kernel", [
    (DENSE_3X3[0], DENSE_3X3[1], "tf.Conv2D"),
    ((2, 32, 32, 16), (9, 9, 2, 16), "tf.Conv2D"),                  # grouped
    ((8, 56, 56, 128), (31, 31, 1, 128), "tf.Conv2D"),              # depthwise: grouped
    ((2, 40, 40, 8), (5, 5, 1, 16), "tf.Conv2D"),                   # multiplier 2
])
def test_explain_gpu_rows(x_shape, w_shape, kernel):
    e = tfbigconv.explain(x_shape, w_shape, padding="SAME", device="GPU")
    assert e.device == "GPU" and len(e.rows) == 9
    assert {r.algorithm for r in e.rows} == {kernel, "direct", "fft"} and kernel in NAMES
    for p in PASSES:
        r = {row.algorithm: row for row in e.rows if row.pass_ == p}
        # On the GPU TF runs grouped gradients too.
        assert all(row.available and row.fits and row.seconds > 0 for row in r.values())
        assert r[kernel].workspace_bytes == 0
        assert e.chosen[p] in r and r[e.chosen[p]].chosen
        assert r[e.chosen[p]].seconds == min(row.seconds for row in r.values())
        assert e.how[p] == "estimated"
    assert e.budget >= 1 << 62 and "GPU allocator" in str(e) and "device GPU" in str(e)


def test_explain_gpu_picks_cudnn_for_small_filters_and_fft_for_the_seed():
    e = tfbigconv.explain(*DENSE_3X3, padding="SAME", device="GPU")
    assert e.chosen == dict.fromkeys(PASSES, "tf.Conv2D")
    e = tfbigconv.explain(*SEED16, padding="VALID", device="GPU")
    assert e.chosen == dict.fromkeys(PASSES, "fft")
    # The CPU's answer for the 3x3 layer is not taken from the GPU's model.
    cpu = tfbigconv.explain(*DENSE_3X3, padding="SAME")
    gpu = tfbigconv.explain(*DENSE_3X3, padding="SAME", device="GPU")
    assert [r.seconds for r in cpu.rows] != [r.seconds for r in gpu.rows]


def test_explain_gpu_availability_rules():
    # NCHW, grouped gradients and half precision run on the GPU (not on the CPU).
    for kwargs in (dict(data_format="NCHW"), dict(dtype="bfloat16"), dict(dtype="float16")):
        shape = (2, 16, 32, 32) if kwargs.get("data_format") == "NCHW" else (2, 32, 32, 16)
        e = tfbigconv.explain(shape, (3, 3, 4, 16), padding="SAME", device="GPU", **kwargs)
        assert all(r.available for r in e.rows if r.algorithm.startswith("tf")), kwargs
    # Depthwise: grouped Conv2D (cuDNN) in every dtype, layout and pass; TF's
    # GPU depthwise kernels run cuDNN only in part and lack bfloat16.
    for kwargs in (dict(), dict(dilations=2), dict(strides=(1, 2)), dict(data_format="NCHW"),
                   dict(dtype="bfloat16"), dict(dtype="float16")):
        shape = (2, 16, 32, 32) if kwargs.get("data_format") == "NCHW" else (2, 32, 32, 16)
        e = tfbigconv.explain(shape, (3, 3, 1, 16), padding="SAME", device="GPU", **kwargs)
        tf_rows = [r for r in e.rows if r.algorithm.startswith("tf")]
        assert len(tf_rows) == 3, kwargs
        assert all(r.available and r.algorithm == "tf.Conv2D" and "cuDNN" in r.note
                   for r in tf_rows), kwargs
    # A budget applies to the GPU's fft (its smallest plan).
    e = tfbigconv.explain(*SEED16, padding="VALID", device="GPU", budget=1024)
    assert e.budget == 1024 and "fft" not in e.chosen.values()
    with pytest.raises(tf.errors.ResourceExhaustedError, match="at least"):
        tfbigconv.explain(*SEED16, padding="VALID", device="GPU", budget=1024, algorithm="fft")
