"""Planning for the GPU without one: where an op will run (dispatch.resolve_device),
explain(device="GPU") with the GPU cost model, trace-time plans that follow
the device, and fitting the GPU model to grid files (gpu_fit.py, fit-gpu).
The GPU kernels themselves are tested in test_gpu.py."""
import csv
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from tfbigconv import _core, autotune, cost_model, dispatch, gpu_fit

PASSES = dispatch.PASSES
DENSE_3X3 = ((16, 56, 56, 64), (3, 3, 64, 64))
SEED16 = ((16, 321, 481, 1), (135, 135, 1, 3))
NAMES = {"tf.Conv2D", "tf.DepthwiseConv2dNative", "direct", "fft"}
HAVE_GPU = dispatch.gpu_available()


def run(cmd, **env):
    full = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **env)
    return subprocess.run([sys.executable] + cmd, env=full, capture_output=True, text=True,
                          cwd=os.path.dirname(__file__))


def rand(shape, seed):
    return tf.constant(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


# ---- where an op will run --------------------------------------------------

def test_resolve_device_follows_explicit_scopes():
    default = "GPU" if HAVE_GPU else "CPU"
    assert dispatch.resolve_device() == default
    seen = {}

    @tf.function
    def f():
        seen["none"] = dispatch.resolve_device()
        with tf.device("/GPU:0"):
            seen["gpu"] = dispatch.resolve_device()
        with tf.device("/job:localhost/replica:0/task:0/device:GPU:0"):
            seen["gpu_full"] = dispatch.resolve_device()
        with tf.device("/CPU:0"):
            seen["cpu"] = dispatch.resolve_device()
        return tf.constant(0)

    f.get_concrete_function()
    assert seen == {"none": default, "gpu": "GPU", "gpu_full": "GPU", "cpu": "CPU"}
    with tf.device("/CPU:0"):
        assert dispatch.resolve_device() == "CPU"
        assert dispatch.resolve_device(tf.constant(1.0)) == "CPU"
    assert dispatch.device_kind("/device:GPU:1") == "GPU"
    assert dispatch.device_kind("") == ""


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
            seen["device"] = dispatch.resolve_device(x)
            return tfbigconv.bigconv2d(x, w, 1, "SAME", data_format="NCHW")

        with tf.device(f"/{device}:0"):
            graph = f.get_concrete_function(tf.TensorSpec(x_shape, tf.float32)).graph
        types = {op.type for op in graph.get_operations()}
        assert seen["device"] == device
        assert want in types and ({"Conv2D", "BigConv2D"} - {want}).isdisjoint(types), types


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_depthwise_runs_as_grouped_conv2d_on_the_gpu(dtype, monkeypatch):
    """TF's GPU DepthwiseConv2dNative* run cuDNN only in part and have no
    bfloat16 kernel: on the GPU every pass of a depthwise layer that goes to
    TF's kernel is grouped Conv2D (cuDNN); on the CPU it stays depthwise."""
    monkeypatch.setattr(dispatch, "gpu_available", lambda: True)  # as on a GPU machine
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


def test_tf_gradient_kernels_follow_the_device_the_forward_was_planned_for(monkeypatch):
    """A depthwise forward planned for the GPU (grouped Conv2D) whose gradient is
    built under another scope (here /CPU:0): the planned TF gradient pass is
    emitted for the GPU too (grouped Conv2DBackpropInput), not for where the
    gradient code is built."""
    from tfbigconv import conv
    monkeypatch.setattr(dispatch, "gpu_available", lambda: True)  # as on a GPU machine
    monkeypatch.setattr(conv, "_plan", lambda *args, **kwargs: {"chosen": "tf"})
    monkeypatch.setattr(conv, "_choose_gradients", lambda *args, **kwargs: ("tf", "direct"))
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


@pytest.mark.skipif(HAVE_GPU, reason="about a machine without a GPU")
class FakeGpu:
    """tf.config as it looks with one GPU: its configured memory_limit (MiB or
    None), the allocator's bytes in use (None: no statistics) and the driver's
    total memory (0: no driver)."""

    def __init__(self, monkeypatch, memory_limit_mib=None, in_use=None, total=0):
        gpu = tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")
        monkeypatch.setattr(tf.config, "list_physical_devices",
                            lambda kind=None: [gpu] if kind == "GPU" else [])
        config = ([tf.config.LogicalDeviceConfiguration(memory_limit=memory_limit_mib)]
                  if memory_limit_mib else None)
        monkeypatch.setattr(tf.config, "get_logical_device_configuration", lambda d: config)

        def memory_info(name):
            if in_use is None:
                raise ValueError("no statistics")
            assert name == "GPU:0"
            return {"current": in_use, "peak": in_use}
        monkeypatch.setattr(tf.config.experimental, "get_memory_info", memory_info)
        monkeypatch.setattr(dispatch, "cuda_total_memory", lambda ordinal: total)


def test_gpu_budget_is_a_fraction_of_what_the_allocator_can_still_give(monkeypatch):
    half = _core.DEFAULT_BUDGET_FRACTION
    FakeGpu(monkeypatch, memory_limit_mib=1024, in_use=256 << 20, total=80 << 30)
    assert dispatch.gpu_workspace_budget() == int((768 << 20) * half)  # the configured limit
    FakeGpu(monkeypatch, in_use=1 << 30, total=80 << 30)
    assert dispatch.gpu_workspace_budget() == int((79 << 30) * half)  # the driver's total
    FakeGpu(monkeypatch, in_use=None, total=8 << 30)
    assert dispatch.gpu_workspace_budget() == int((8 << 30) * half)   # no statistics yet
    FakeGpu(monkeypatch, in_use=90 << 30, total=80 << 30)
    assert dispatch.gpu_workspace_budget() == 1                       # full: nothing fits
    FakeGpu(monkeypatch, in_use=0, total=0)
    assert dispatch.gpu_workspace_budget() == 0                       # unknown: no limit


def test_gpu_trace_time_plans_use_the_gpu_budget(monkeypatch):
    attrs = dict(strides=[1, 1, 1, 1], padding="SAME", explicit_paddings=[],
                 data_format="NHWC", dilations=[1, 1, 1, 1])
    x, w = SEED16
    unlimited = dispatch.plan("forward", x, w, attrs, "float32", "auto", 1 << 40, "GPU")
    assert unlimited["chosen"] == "fft"
    # a 1 MiB device: half of it is less than the fft's smallest workspace
    FakeGpu(monkeypatch, memory_limit_mib=1, in_use=0)
    p = dispatch.plan("forward", x, w, attrs, "float32", "auto", 0, "GPU")
    assert p["limit"] == int((1 << 20) * _core.DEFAULT_BUDGET_FRACTION)
    assert p["limit"] < unlimited["fft"]["workspace_bytes"]
    assert not p["fft"]["fits"] and p["chosen"] != "fft"
    # an explicit limit still wins
    assert dispatch.plan("forward", x, w, attrs, "float32", "auto", 1 << 40, "GPU")["chosen"] == "fft"
    # a GPU with nothing known: no trace-time limit, as before
    FakeGpu(monkeypatch, in_use=0, total=0)
    assert dispatch.plan("forward", x, w, attrs, "float32", "auto", 0, "GPU")["limit"] >= 1 << 62


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


def test_cli_explain_gpu():
    r = run(["-m", "tfbigconv", "explain", "--input", "16,56,56,64", "--filter", "3,3,64,64",
             "--padding", "SAME", "--device", "GPU"])
    assert r.returncode == 0, r.stderr
    assert "device GPU" in r.stdout and "forward: estimated; auto: tf" in r.stdout
    assert r.stdout.count("tf.Conv2D") >= 3


# ---- the GPU model: gpu_fit.py and fit-gpu ---------------------------------

# Geometries like the H100 grids' (N, H, W, Cin, Cout, K, groups, stride).
GRID = [
    (16, 56, 56, 64, 64, 3, 1, 1), (8, 64, 64, 32, 32, 3, 4, 1), (2, 128, 128, 3, 16, 11, 1, 1),
    (8, 128, 128, 64, 64, 7, 1, 2), (32, 32, 32, 64, 64, 5, 64, 1), (4, 128, 128, 32, 32, 31, 1, 1),
    (2, 64, 64, 16, 16, 51, 1, 1), (1, 128, 128, 1, 3, 63, 1, 1), (2, 224, 224, 32, 32, 31, 4, 1),
    (8, 32, 32, 128, 128, 31, 128, 2), (16, 321, 481, 1, 3, 135, 1, 1),
    (32, 56, 56, 256, 256, 13, 256, 1), (2, 321, 481, 128, 128, 15, 128, 2),
    (1, 56, 56, 32, 32, 7, 4, 1),
]


def shipped():
    return dict(zip(_core.cost_model_fields(), cost_model.read_profile(cost_model.SHIPPED_PATH)))


def gpu_explain_seconds(geometry, pass_, candidate, dtype):
    x, f, strides = gpu_fit.shapes(geometry)
    e = tfbigconv.explain(x, f, strides=strides, padding="SAME", dtype=dtype, device="GPU")
    rows = [r for r in e.rows if r.pass_ == pass_
            and (r.algorithm == candidate or (candidate == "tf" and r.algorithm.startswith("tf")))]
    assert len(rows) == 1
    return rows[0].seconds


def test_predict_equals_the_planners_estimate():
    """gpu_fit.predict (Python) and the C++ planner evaluate the same model."""
    values = dict(zip(_core.cost_model_fields(), _core.get_cost_model()))
    for geometry in (GRID[0], GRID[1], GRID[4], GRID[9]):
        for dtype in ("float32", "bfloat16"):
            for p in PASSES:
                for c in ("tf", "direct", "fft"):
                    want = gpu_explain_seconds(geometry, p, c, dtype)
                    got = gpu_fit.predict(values, geometry, p, c, dtype)
                    assert got == pytest.approx(want, rel=1e-9), (geometry, dtype, p, c)


def write_grid(path, times):
    """A grid CSV with `times` {(geometry, dtype, pass, algo): seconds} and rows fit() must skip."""
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["N", "H", "W", "Cin", "Cout", "K", "groups", "stride", "dtype", "pass",
                      "algo", "kernel_ms", "note"])
        for (g, dtype, p, algo), s in times.items():
            out.writerow(list(g) + [dtype, p, algo, f"{s * 1e3:.6g}", ""])
            if algo == "direct":  # the run-time choice, a skipped and a broken measurement
                out.writerow(list(g) + [dtype, p, "auto", "1e6", "ignored"])
                out.writerow(list(g) + [dtype, p, "fft", "nan", "skipped: flops"])
                out.writerow(list(g) + [dtype, p, "cudnn", "0", "broken"])


def test_fit_gpu_cli_updates_only_the_gpu_section(tmp_path):
    """Grid times 2x the shipped model's (float32) and 4x (half): the fitted
    model predicts them closely, its CPU values are the profile's own, and
    the planner uses the fitted values."""
    truth = shipped()
    times = {}
    for i, g in enumerate(GRID):
        for dtype, factor in (("float32", 2.0), ("bfloat16", 4.0)):
            for p in PASSES:
                for algo, c in gpu_fit.CANDIDATES.items():
                    noise = math.exp(0.02 * math.sin(7 * i + len(p)))
                    times[(g, dtype, p, algo)] = (factor * noise *
                                                  gpu_fit.predict(truth, g, p, c, dtype))
    grid = tmp_path / "grid.csv"
    write_grid(grid, times)
    assert len(gpu_fit.read_grid([str(grid)])) == len(times)

    # A profile with a CPU section of its own (a calibration of this machine).
    profile = tmp_path / "profile.json"
    cpu = {k: v for k, v in truth.items() if not k.startswith("gpu.")}
    cpu["direct_flops_per_second"] = 1.25e11
    cpu["fft_seconds_per_call"] = 7e-4
    profile.write_text(json.dumps({"meta": {"format": 1, "machine": "test box"}, "values": cpu}))

    r = run(["-m", "tfbigconv", "fit-gpu", str(grid), "--output", str(profile)])
    assert r.returncode == 0, r.stderr
    assert f"wrote {profile}" in r.stdout
    doc = json.loads(profile.read_text())
    assert doc["meta"]["machine"] == "test box" and doc["meta"]["gpu_grids"] == ["grid.csv"]
    fitted = doc["values"]
    assert set(fitted) == set(_core.cost_model_fields())
    for k, v in cpu.items():
        assert fitted[k] == v, k
    changed = [k for k in fitted if k.startswith("gpu.") and fitted[k] != truth[k]]
    # The coefficients and the floor of each (candidate, pass, dtype class), but
    # those the fit holds at 0: a half-only feature's in float32, and a feature
    # that is 0 on every row of its group in both fits (the cuDNN depthwise
    # class of our filter gradients' problems).
    zero = [k for k in fitted if k.startswith("gpu.") and fitted[k] == truth[k] == 0.0]
    assert all(k.endswith(gpu_fit.HALF_ONLY_FEATURES) for k in zero), zero
    assert len(changed) + len(zero) == 3 * 3 * 2 * (len(gpu_fit.FEATURES) + 1)
    # The half-only feature: fitted (non-zero) in the half class, 0 in float32's,
    # though the grid has layers in its class in both.
    half_only = [k for k in fitted if k.startswith("gpu.") and k.endswith(gpu_fit.HALF_ONLY_FEATURES)]
    assert all(fitted[k] == 0.0 for k in half_only if ".float32." in k)
    assert any(fitted[k] != 0.0 for k in half_only if ".half." in k)

    ratios = {"float32": [], "bfloat16": []}
    for (g, dtype, p, algo), s in times.items():
        ratios[dtype].append(gpu_fit.predict(fitted, g, p, gpu_fit.CANDIDATES[algo], dtype) / s)
    for dtype, rs in ratios.items():
        assert 0.9 < float(np.median(rs)) < 1.1, dtype
        assert 0.5 < min(rs) and max(rs) < 2.0, dtype

    # The planner, given the fitted profile, estimates what predict() says.
    saved = _core.get_cost_model()
    try:
        _core.set_cost_model(cost_model.read_profile(str(profile)))
        for p in PASSES:
            for c in ("tf", "direct", "fft"):
                assert gpu_explain_seconds(GRID[3], p, c, "float16") == pytest.approx(
                    gpu_fit.predict(fitted, GRID[3], p, c, "float16"), rel=1e-9)
    finally:
        _core.set_cost_model(saved)


def test_fit_gpu_cli_without_usable_rows(tmp_path):
    grid = tmp_path / "empty.csv"
    write_grid(grid, {})
    r = run(["-m", "tfbigconv", "fit-gpu", str(grid), "--output", str(tmp_path / "p.json")])
    assert r.returncode == 2 and "no cudnn/direct/fft rows" in r.stderr
    assert not (tmp_path / "p.json").exists()


def test_read_profile_fills_missing_fields_from_defaults(tmp_path):
    truth = shipped()
    gpu_only = {k: v for k, v in truth.items() if k.startswith("gpu.")}
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"meta": {"format": 1}, "values": gpu_only}))
    with pytest.raises(ValueError, match="lacks"):
        cost_model.read_profile(str(path))
    defaults = dict(truth, direct_flops_per_second=9e10)
    values = dict(zip(_core.cost_model_fields(), cost_model.read_profile(str(path), defaults)))
    assert values["direct_flops_per_second"] == 9e10
    assert all(values[k] == v for k, v in gpu_only.items())


def test_a_profile_from_before_the_load_bound_rate_keeps_its_model(tmp_path):
    """Such a profile ran one-channel column tiles at 0.3 of its direct rate;
    reading it restores that, whatever the defaults say."""
    old = {k: v for k, v in shipped().items() if k != "direct_load_bound_flops_per_second"}
    old["direct_flops_per_second"] = 4e11
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"meta": {"format": 1}, "values": old}))
    for defaults in (None, shipped()):
        values = dict(zip(_core.cost_model_fields(), cost_model.read_profile(str(path), defaults)))
        assert values["direct_load_bound_flops_per_second"] == pytest.approx(1.2e11, rel=1e-12)
    # A profile that names the rate keeps it.
    old["direct_load_bound_flops_per_second"] = 7e10
    path.write_text(json.dumps({"meta": {"format": 1}, "values": old}))
    values = dict(zip(_core.cost_model_fields(), cost_model.read_profile(str(path))))
    assert values["direct_load_bound_flops_per_second"] == 7e10


def test_a_profile_from_before_the_depthwise_multiplier_table_keeps_its_model(tmp_path):
    """Such a profile estimated multipliers over 1 with its multiplier-1 rates:
    reading it copies them, whatever the defaults say."""
    old = {k: v for k, v in shipped().items()
           if not k.startswith(cost_model.MULTIPLIER_TABLE)}
    old["tf_depthwise_flops_per_second.forward.side7"] = 3.5e10
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"meta": {"format": 1}, "values": old}))
    defaults = dict(shipped(), **{cost_model.MULTIPLIER_TABLE + "forward.side7": 1e9})
    for d in (None, defaults):
        values = dict(zip(_core.cost_model_fields(), cost_model.read_profile(str(path), d)))
        for name in _core.cost_model_fields():
            if name.startswith(cost_model.MULTIPLIER_TABLE):
                one = cost_model.DEPTHWISE_TABLE + name[len(cost_model.MULTIPLIER_TABLE):]
                assert values[name] == old[one], name
    # A profile that has the table keeps it.
    old[cost_model.MULTIPLIER_TABLE + "forward.side7"] = 2e9
    path.write_text(json.dumps({"meta": {"format": 1}, "values": old}))
    values = dict(zip(_core.cost_model_fields(), cost_model.read_profile(str(path), shipped())))
    assert values[cost_model.MULTIPLIER_TABLE + "forward.side7"] == 2e9


def test_a_profile_from_before_side_14_keeps_its_model(tmp_path):
    """Such a profile interpolated TF's rates from side 7 to side 15; reading it
    puts its side-14 values on that line (log rate over log side), whatever the
    defaults say, so its estimates at sides 7-15 are the ones it gave."""
    old = {k: v for k, v in shipped().items() if ".side14" not in k}
    bpf = "im2col_flops_per_second.backprop_filter.side{}.channels16"
    old[bpf.format(15)] = old[bpf.format(7)] / 100  # a cliff, as oneDNN has
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"meta": {"format": 1}, "values": old}))
    t = math.log(14 / 7) / math.log(15 / 7)
    for d in (None, dict(shipped(), **{bpf.format(14): 1.0})):
        values = dict(zip(_core.cost_model_fields(), cost_model.read_profile(str(path), d)))
        for name in _core.cost_model_fields():
            if ".side14" in name:
                lo, hi = (old[name.replace(".side14", f".side{s}")] for s in (7, 15))
                assert values[name] == pytest.approx(
                    math.exp(math.log(lo) * (1 - t) + math.log(hi) * t), rel=1e-12), name
    # A profile that has side 14 keeps it.
    old[bpf.format(14)] = 3e10
    path.write_text(json.dumps({"meta": {"format": 1}, "values": old}))
    values = dict(zip(_core.cost_model_fields(), cost_model.read_profile(str(path), shipped())))
    assert values[bpf.format(14)] == 3e10


def test_a_profile_from_before_the_channel_block_keeps_its_model(tmp_path):
    """Such a profile modelled no channel blocking: reading it gives a block of
    1 in every pass, whatever the defaults say; a profile with the values keeps
    them, and a GPU-only profile takes them from the defaults."""
    old = {k: v for k, v in shipped().items() if not k.startswith(cost_model.CHANNEL_BLOCK)}
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"meta": {"format": 1}, "values": old}))
    blocked = {k: (16.0 if k.startswith(cost_model.CHANNEL_BLOCK) else v)
               for k, v in shipped().items()}
    blocks = lambda v: {k: x for k, x in v.items() if k.startswith(cost_model.CHANNEL_BLOCK)}  # noqa: E731
    for d in (None, blocked):
        values = dict(zip(_core.cost_model_fields(), cost_model.read_profile(str(path), d)))
        assert set(blocks(values).values()) == {1.0}
        assert len(blocks(values)) == 15  # 3 passes x 5 sides
    path.write_text(json.dumps({"meta": {"format": 1}, "values": blocked}))
    values = dict(zip(_core.cost_model_fields(), cost_model.read_profile(str(path), shipped())))
    assert set(blocks(values).values()) == {16.0}
    gpu_only = {k: v for k, v in shipped().items() if k.startswith("gpu.")}
    path.write_text(json.dumps({"meta": {"format": 1}, "values": gpu_only}))
    values = dict(zip(_core.cost_model_fields(), cost_model.read_profile(str(path), blocked)))
    assert set(blocks(values).values()) == {16.0}


def test_a_profile_from_before_the_per_pass_dtype_slowdowns_keeps_its_model(tmp_path):
    """Such a profile had one slowdown per dtype (TF's Conv2D forward), used for
    both TF kernels and every pass: reading it copies that value to all 18."""
    old = {k: v for k, v in shipped().items() if not k.startswith(cost_model.DTYPE_SLOWDOWNS)}
    legacy = {"float16": 1.9, "bfloat16": 0.56, "float64": 3.8}
    old.update({cost_model.LEGACY_DTYPE_SLOWDOWN + d: x for d, x in legacy.items()})
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"meta": {"format": 1}, "values": old}))
    values = dict(zip(_core.cost_model_fields(), cost_model.read_profile(str(path), shipped())))
    slowdowns = {k: x for k, x in values.items() if k.startswith(cost_model.DTYPE_SLOWDOWNS)}
    assert len(slowdowns) == 18  # 2 kernels x 3 passes x 3 dtypes
    assert all(x == legacy[k.rsplit(".", 1)[1]] for k, x in slowdowns.items()), slowdowns


def test_gpu_features_bend_with_the_filter_side():
    """Two later features are log side squared and log side x log pixels
    (cost_model.h GpuModelTerms), for every candidate."""
    assert gpu_fit.FEATURES[-3:] == cost_model.LATER_GPU_FEATURES
    assert gpu_fit.FEATURES[6:8] == ("log_side_squared", "log_side_x_log_pixels")
    x, f, strides = gpu_fit.shapes((2, 30, 40, 6, 10, 13, 2, 2))
    for c in ("tf", "direct", "fft"):
        _, t = _core.gpu_terms(x, f, strides, "SAME", [], "NHWC", [1, 1, 1, 1], "forward", c)
        assert len(t) == len(gpu_fit.FEATURES)
        assert t[1] == pytest.approx(math.log(13))
        assert t[6] == pytest.approx(t[1] ** 2) and t[7] == pytest.approx(t[1] * t[5])
    _, t = _core.gpu_terms(x, f, strides, "SAME", [], "NHWC", [1, 1, 1, 1], "forward", "tf")
    assert t[5] == pytest.approx(math.log(2 * 15 * 20))


@pytest.mark.parametrize("geometry,in_class", [
    ((8, 224, 224, 128, 128, 7, 128, 1), True),   # depthwise 7x7
    ((2, 64, 64, 384, 384, 5, 384, 2), True),     # 5x5, stride 2
    ((8, 32, 32, 32, 32, 3, 32, 1), True),
    ((8, 64, 64, 128, 128, 9, 128, 1), False),    # side 9
    ((2, 40, 40, 8, 16, 5, 8, 1), False),         # multiplier 2
    ((2, 64, 64, 64, 64, 7, 64, 3), False),       # stride 3
    ((4, 64, 64, 32, 32, 3, 4, 1), False),        # grouped, not depthwise
    ((16, 56, 56, 64, 64, 3, 1, 1), False),       # dense
])
def test_cudnn_depthwise_class_is_a_half_precision_feature(geometry, in_class):
    """The last GPU feature is 1 for the depthwise layers TF sends to cuDNN's
    dedicated kernels in float16 (multiplier 1, square side 1/3/5/7, stride
    1 or 2), for TF's kernel; the fit gives it a coefficient in the half class
    only."""
    x, f, strides = gpu_fit.shapes(geometry)
    _, t = _core.gpu_terms(x, f, strides, "SAME", [], "NHWC", [1, 1, 1, 1], "forward", "tf")
    assert t[gpu_fit.FEATURES.index("cudnn_depthwise_class")] == (1.0 if in_class else 0.0)
    values = shipped()
    for name, v in values.items():
        if name.endswith(".float32.cudnn_depthwise_class"):
            assert v == 0.0, name
    assert any(v != 0.0 for k, v in values.items() if k.endswith(".half.cudnn_depthwise_class"))


def test_a_gpu_profile_from_before_the_side_features_keeps_its_model(tmp_path):
    """A GPU section fitted without the later features reads them as 0 (its
    own model), not as the defaults' coefficients; the planner then gives the
    six-feature model's estimate."""
    truth = shipped()
    old = {k: v for k, v in truth.items()
           if k.split(".")[-1] not in cost_model.LATER_GPU_FEATURES}
    path = tmp_path / "old_gpu.json"
    path.write_text(json.dumps({"meta": {"format": 1}, "values": old}))
    for defaults in (None, truth):
        values = dict(zip(_core.cost_model_fields(), cost_model.read_profile(str(path), defaults)))
        later = [k for k in values if k.split(".")[-1] in cost_model.LATER_GPU_FEATURES]
        assert len(later) == 3 * 3 * 2 * len(cost_model.LATER_GPU_FEATURES)
        assert all(values[k] == 0.0 for k in later)
        assert all(values[k] == v for k, v in old.items())
    g = (4, 64, 64, 16, 16, 31, 1, 1)
    x, f, strides = gpu_fit.shapes(g)
    saved = _core.get_cost_model()
    try:
        _core.set_cost_model(cost_model.read_profile(str(path)))
        for c in ("tf", "direct", "fft"):
            work, t = _core.gpu_terms(x, f, strides, "SAME", [], "NHWC", [1, 1, 1, 1], "forward", c)
            prefix = f"gpu.{c}.forward.float32."
            six = work * math.exp(sum(old[prefix + n] * v for n, v in zip(gpu_fit.FEATURES[:6], t)))
            assert gpu_explain_seconds(g, "forward", c, "float32") == pytest.approx(
                max(six, old[prefix + "floor_seconds"]), rel=1e-9)
    finally:
        _core.set_cost_model(saved)
    # A profile that names them keeps them.
    path.write_text(json.dumps({"meta": {"format": 1}, "values": truth}))
    assert cost_model.read_profile(str(path)) == [truth[n] for n in _core.cost_model_fields()]


def test_gpu_floor_bounds_estimates_and_a_tie_goes_to_tf():
    """A GPU estimate never goes below its group's floor (the shortest call
    measured); where all three sit at equal floors, TF's kernel is chosen."""
    values = shipped()
    floors = [k for k in values if k.endswith(".floor_seconds")]
    assert len(floors) == 3 * 3 * 2 and all(values[k] > 0 for k in floors)
    saved = _core.get_cost_model()
    try:
        tiny = (1, 8, 8, 4, 4, 3, 1, 1)
        for k in floors:
            values[k] = 1.0
        _core.set_cost_model([values[n] for n in _core.cost_model_fields()])
        x, f, strides = gpu_fit.shapes(tiny)
        e = tfbigconv.explain(x, f, strides=strides, padding="SAME", device="GPU")
        assert all(r.seconds == 1.0 for r in e.rows), e
        assert set(e.chosen.values()) == {"tf.Conv2D"}, e.chosen
        values[floors[0]] = -1.0
        with pytest.raises(ValueError, match="floor_seconds"):
            _core.set_cost_model([values[n] for n in _core.cost_model_fields()])
    finally:
        _core.set_cost_model(saved)


def test_gpu_replace_rows_swaps_only_the_remeasured_rows(tmp_path):
    """benchmarks/gpu_replace_rows.py: a re-measured row takes its old row's
    place, every other byte of the grid stays, and a row the grid lacks is
    refused without writing anything."""
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "gpu_replace_rows.py")
    g1, g2 = GRID[0], GRID[1]
    # write_grid adds auto, fft and cudnn rows beside each direct one: 24 rows.
    times = {(g, "float32", p, "direct"): 1e-3 * (i + 1)
             for i, (g, p) in enumerate((g, p) for g in (g1, g2) for p in PASSES)}
    into = tmp_path / "into"
    into.mkdir()
    write_grid(into / "grid.csv", times)
    before = (into / "grid.csv").read_bytes()
    new = tmp_path / "grid.csv"
    write_grid(new, {(g1, "float32", "forward", "direct"): 0.5})
    r = run([script, str(new), "--into", str(into)])
    assert r.returncode == 0, r.stderr
    assert "4 of 24 rows replaced" in r.stdout
    rows = {(r_["geometry"], r_["pass_"], r_["algo"]): r_["seconds"]
            for r_ in gpu_fit.read_grid([str(into / "grid.csv")])}
    assert len(rows) == 6 and rows[(g1, "forward", "direct")] == pytest.approx(0.5)
    assert rows[(g2, "forward", "direct")] == pytest.approx(times[(g2, "float32", "forward",
                                                                   "direct")])
    # Putting the old row back restores the file byte for byte.
    write_grid(new, {(g1, "float32", "forward", "direct"):
                     times[(g1, "float32", "forward", "direct")]})
    assert run([script, str(new), "--into", str(into)]).returncode == 0
    assert (into / "grid.csv").read_bytes() == before
    # A geometry the grid does not hold: refused, nothing written.
    write_grid(new, {(GRID[2], "float32", "forward", "direct"): 0.5})
    r = run([script, str(new), "--into", str(into)])
    assert r.returncode == 2 and "no row in" in r.stderr
    assert (into / "grid.csv").read_bytes() == before
