"""The dispatcher (tfbigconv/dispatch.py, conv.py): algorithm="auto" picks
TensorFlow's own kernel ("tf": Conv2D, or DepthwiseConv2dNative for depthwise
filters), direct or fft per pass; the precision rules of float16/bfloat16;
planning with an unknown batch; the overrides; explain() and the CLI; the
calibration round trip into both compiled modules."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from tfbigconv import _core, autotune, conv, cost_model, dispatch
from conftest import TOLERANCE, random_case, rel_l2
from reference import (conv2d_reference, conv2d_reference_backprop_filter,
                       conv2d_reference_backprop_input)

SMALL = ((8, 64, 64, 16), (3, 3, 16, 16), "SAME")
SEED16 = ((4, 321, 481, 1), (135, 135, 1, 3), "VALID")


def rand(shape, seed):
    return tf.constant(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def graph_ops(fn, *args):
    return [op for op in tf.function(fn).get_concrete_function(*args).graph.get_operations()]


def op_types(fn, *args):
    return {op.type for op in graph_ops(fn, *args)}


def run(cmd, **env):
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **env)
    return subprocess.run([sys.executable] + cmd, env=full_env, capture_output=True, text=True,
                          cwd=os.path.dirname(__file__))


def test_small_filter_runs_tf_conv2d_and_large_filter_runs_fft():
    x_shape, w_shape, pad = SMALL
    e = tfbigconv.explain(x_shape, w_shape, padding=pad)
    assert e.chosen["forward"] == "tf.Conv2D"
    x, w = rand(x_shape, 0), rand(w_shape, 1)
    types = op_types(lambda x: tfbigconv.bigconv2d(x, w, 1, pad), x)
    assert "Conv2D" in types and "BigConv2D" not in types
    np.testing.assert_array_equal(tfbigconv.bigconv2d(x, w, 1, pad), tf.nn.conv2d(x, w, 1, pad))

    x_shape, w_shape, pad = SEED16
    e = tfbigconv.explain(x_shape, w_shape, padding=pad)
    assert e.chosen == {"forward": "fft", "backprop_input": "fft", "backprop_filter": "fft"}
    x, w = rand(x_shape, 2), rand(w_shape, 3)
    types = op_types(lambda x: tfbigconv.bigconv2d(x, w, 1, pad), x)
    assert "BigConv2D" in types and "Conv2D" not in types


def test_gradient_passes_are_planned_each_on_their_own(model):
    """Forward on TF's Conv2D, backprop_filter moved off it by the model: the
    gradient mixes TF's Conv2DBackpropInput with our BigConv2DBackpropFilter,
    and first and second order match tf.nn.conv2d's."""
    model("im2col_flops_per_second.forward", 1e6)
    model("im2col_flops_per_second.backprop_input", 1e6)
    model("im2col_flops_per_second.backprop_filter", 1e-6)
    x_shape, w_shape, pad = (2, 20, 23, 3), (5, 5, 3, 4), "SAME"
    e = tfbigconv.explain(x_shape, w_shape, padding=pad)
    assert e.chosen["forward"] == "tf.Conv2D" and e.chosen["backprop_input"] == "tf.Conv2D"
    assert e.chosen["backprop_filter"] in ("direct", "fft")
    x, w = rand(x_shape, 4), rand(w_shape, 5)

    def grads(conv, x, w):
        with tf.GradientTape() as outer:
            outer.watch(w)
            with tf.GradientTape() as inner:
                inner.watch([x, w])
                y = conv(x, w)
                loss = tf.reduce_sum(y * tf.sin(y))
            dx, dw = inner.gradient(loss, [x, w])
            penalty = tf.reduce_sum(dx * dx) + tf.reduce_sum(dw * dw)
        return dx, dw, outer.gradient(penalty, w)

    ours = lambda x, w: tfbigconv.bigconv2d(x, w, 1, pad)
    types = op_types(lambda x, w: grads(ours, x, w), x, w)
    assert {"Conv2D", "Conv2DBackpropInput", "BigConv2DBackpropFilter"} <= types
    want = grads(lambda x, w: tf.nn.conv2d(x, w, 1, pad), x, w)
    for fn in (lambda: grads(ours, x, w), tf.function(lambda: grads(ours, x, w))):
        for got, ref in zip(fn(), want):
            assert rel_l2(got.numpy(), ref.numpy()) < 1e-5


def test_registered_gradient_uses_tf_where_it_wins(model):
    """Forward on our op (direct), backprop_input moved to TF's kernel by the model."""
    model("im2col_flops_per_second.forward", 1e-6)
    model("im2col_flops_per_second.backprop_input", 1e6)
    x_shape, w_shape, pad = (2, 20, 23, 3), (5, 5, 3, 4), "VALID"
    e = tfbigconv.explain(x_shape, w_shape, padding=pad)
    assert e.chosen["forward"] != "tf.Conv2D" and e.chosen["backprop_input"] == "tf.Conv2D"
    x, w = rand(x_shape, 6), rand(w_shape, 7)

    def grads(conv, x, w):
        with tf.GradientTape() as t:
            t.watch([x, w])
            loss = tf.reduce_sum(conv(x, w) ** 2)
        return t.gradient(loss, [x, w])

    ours = lambda x, w: tfbigconv.bigconv2d(x, w, 1, pad)
    types = op_types(lambda x, w: grads(ours, x, w), x, w)
    assert {"BigConv2D", "Conv2DBackpropInput"} <= types
    for got, ref in zip(grads(ours, x, w), grads(lambda x, w: tf.nn.conv2d(x, w, 1, pad), x, w)):
        assert rel_l2(got.numpy(), ref.numpy()) < 1e-5


def test_tf_is_never_chosen_where_tf_cannot_run_it(eigen_tf):
    # NCHW: TF's CPU Conv2D runs only NHWC (without oneDNN).
    e = tfbigconv.explain((2, 16, 32, 32), (3, 3, 16, 16), padding="SAME", data_format="NCHW")
    assert not any(a.startswith("tf") for a in e.chosen.values())
    tf_rows = [r for r in e.rows if r.algorithm.startswith("tf")]
    assert len(tf_rows) == 3 and all("NHWC" in r.note and not r.available for r in tf_rows)
    # Grouped and dilated: TF's CPU gradients reject them.
    for kwargs in ({}, {"dilations": 2}):
        w = (3, 3, 4, 16) if not kwargs else (3, 3, 16, 16)
        e = tfbigconv.explain((2, 32, 32, 16), w, padding="SAME", **kwargs)
        for p in ("backprop_input", "backprop_filter"):
            assert not e.chosen[p].startswith("tf")
            row = next(r for r in e.rows if r.pass_ == p and r.algorithm.startswith("tf"))
            assert not row.available and "reject" in row.note
    x, w = rand((2, 32, 32, 16), 8), rand((3, 3, 4, 16), 9)
    with tf.GradientTape() as t:
        t.watch([x, w])
        loss = tf.reduce_sum(tfbigconv.bigconv2d(x, w, 1, "SAME") ** 2)
    assert all(np.isfinite(g.numpy()).all() for g in t.gradient(loss, [x, w]))


def test_unknown_shapes_leave_the_choice_to_the_op():
    x, w = rand((2, 40, 40, 2), 10), rand((9, 9, 2, 3), 11)
    f = tf.function(lambda x: tfbigconv.bigconv2d(x, w, 1, "SAME"),
                    input_signature=[tf.TensorSpec([None, None, None, 2])])
    ops = [op for op in f.get_concrete_function().graph.get_operations() if op.type == "BigConv2D"]
    assert len(ops) == 1 and ops[0].get_attr("algorithm") == b"auto"
    assert ops[0].get_attr("planned_algorithm") == b"none"
    assert rel_l2(f(x).numpy(), tf.nn.conv2d(x, w, 1, "SAME").numpy()) < 1e-5


def test_environment_override(monkeypatch):
    x, w = rand((1, 16, 16, 2), 12), rand((3, 3, 2, 2), 13)
    conv = lambda x: tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm="fft")
    monkeypatch.setenv("TFBIGCONV_ALGORITHM", "direct")
    ops = [op for op in graph_ops(conv, x) if op.type == "BigConv2D"]
    assert ops[0].get_attr("algorithm") == b"direct"
    for name in ("tf", "im2col"):
        monkeypatch.setenv("TFBIGCONV_ALGORITHM", name)
        types = op_types(conv, x)
        assert "Conv2D" in types and "BigConv2D" not in types
    monkeypatch.setenv("TFBIGCONV_ALGORITHM", "fastest")
    with pytest.raises(tf.errors.InvalidArgumentError, match="TFBIGCONV_ALGORITHM"):
        conv(x)


@pytest.mark.parametrize("algorithm", ["tf", "im2col"])
def test_forced_tf_is_tf_conv2d(algorithm):
    """"tf" (and its old name "im2col") is TF's Conv2D, its gradients included."""
    x, w = rand((2, 12, 13, 3), 14), rand((4, 4, 3, 5), 15)

    def run(conv):
        with tf.GradientTape() as t:
            t.watch([x, w])
            y = conv(x, w)
            loss = tf.reduce_sum(y * tf.sin(y))
        return [y] + t.gradient(loss, [x, w])

    got = run(lambda x, w: tfbigconv.bigconv2d(x, w, 2, "SAME", algorithm=algorithm))
    for g, r in zip(got, run(lambda x, w: tf.nn.conv2d(x, w, 2, "SAME"))):
        np.testing.assert_array_equal(g, r)
    assert tfbigconv.explain((2, 12, 13, 3), (4, 4, 3, 5), 2, "SAME",
                             algorithm=algorithm).chosen["forward"] == "tf.Conv2D"


def test_nothing_fits_raises_resource_exhausted_with_the_minimum():
    x, w = rand((2, 64, 64, 1), 16), rand((31, 31, 1, 3), 17)
    with pytest.raises(tf.errors.ResourceExhaustedError, match=r"at least \d+ bytes"):
        tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm="fft", workspace_limit=4096)
    with pytest.raises(tf.errors.ResourceExhaustedError, match="no algorithm fits"):
        tfbigconv.bigconv2d(x, w, 1, "SAME", workspace_limit=4096)
    # Unknown shapes: the op itself says so at run time.
    f = tf.function(lambda x: tfbigconv.bigconv2d(x, w, 1, "SAME", workspace_limit=4096),
                    input_signature=[tf.TensorSpec([None, 64, 64, 1])])
    with pytest.raises(tf.errors.ResourceExhaustedError, match="no algorithm fits"):
        f(x)


def test_explain_table():
    e = tfbigconv.explain(*SEED16[:2], padding="VALID", budget=256 << 20)
    assert len(e.rows) == 9 and e.budget == 256 << 20
    for p in ("forward", "backprop_input", "backprop_filter"):
        rows = [r for r in e.rows if r.pass_ == p]
        assert [r.algorithm for r in rows] == ["tf.Conv2D", "direct", "fft"]
        assert sum(r.chosen for r in rows) == 1
        chosen = next(r for r in rows if r.chosen)
        assert chosen.fits and chosen.workspace_bytes <= e.budget
        assert e.reasons[p].startswith("auto: " + chosen.algorithm)
    # One image's patch matrix of a 135x135 filter is 4.4 GiB: over the budget.
    conv2d = next(r for r in e.rows if r.algorithm == "tf.Conv2D")
    assert conv2d.workspace_bytes == 187 * 347 * 135 * 135 * 4 and not conv2d.fits
    assert e.device == "CPU" and e.how == dict.fromkeys(e.chosen, "estimated")
    assert all(r.measured_seconds is None for r in e.rows)
    text = str(e)
    assert text.count("<==") == 3 and "forward: estimated; auto: fft" in text
    assert e.geometry["output_shape"] == [4, 187, 347, 3]


def test_explain_errors():
    with pytest.raises(tf.errors.InvalidArgumentError, match="device"):
        tfbigconv.explain((1, 8, 8, 1), (3, 3, 1, 1), device="TPU")
    with pytest.raises(tf.errors.InvalidArgumentError, match="budget"):
        tfbigconv.explain((1, 8, 8, 1), (3, 3, 1, 1), budget=-1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="filter"):
        tfbigconv.explain((1, 8, 8, 1), (3, 3, 2, 1))
    with pytest.raises(tf.errors.ResourceExhaustedError, match="at least"):
        tfbigconv.explain(*SEED16[:2], algorithm="fft", budget=1024)


def test_cli():
    r = run(["-m", "tfbigconv", "explain", "--input", "200,321,481,1", "--filter", "135,135,1,3",
             "--padding", "VALID", "--budget", "256M"])
    assert r.returncode == 0, r.stderr
    assert "forward: estimated; auto: fft" in r.stdout and "workspace budget 256.0 MiB" in r.stdout
    r = run(["-m", "tfbigconv", "explain", "--input", "1,8,8,1", "--filter", "3,3,2,1"])
    assert r.returncode == 2 and "error:" in r.stderr
    r = run(["-m", "tfbigconv", "explain", "--input", "1,8,x,1", "--filter", "3,3,1,1"])
    assert r.returncode == 2 and "comma-separated ints" in r.stderr


CHECK_MODEL = """
import json, sys
import numpy as np, tensorflow as tf
import tfbigconv
from tfbigconv import _core, cost_model
# The op's run-time choice (unknown shapes) must follow the loaded model:
# its output is bitwise that of the algorithm the model makes fastest.
x = tf.constant(np.random.default_rng(0).standard_normal((2, 40, 40, 2)).astype(np.float32))
w = tf.constant(np.random.default_rng(1).standard_normal((9, 9, 2, 3)).astype(np.float32))
spec = [tf.TensorSpec([None, None, None, 2])]
run = lambda a: tf.function(lambda x: tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm=a),
                            input_signature=spec)(x).numpy()
auto = run("auto")
same = [a for a in ("direct", "fft") if np.array_equal(auto, run(a))]
print(json.dumps({"source": cost_model.active_source, "values": _core.get_cost_model(),
                  "op_choice": same}))
"""


def test_channel_block_is_the_count_before_the_first_that_costs_more():
    """calibrate.channel_block, on timings like those measured on the oneDNN and
    Eigen builds (RESULTS.md): the probe stops at the first count over
    BLOCK_TOLERANCE x one channel's time, and a faster count after it (oneDNN's
    filter gradient switching path) does not count."""
    from tfbigconv import calibrate
    probe = calibrate.BLOCK_PROBE
    onednn = dict(zip(probe, (4.33, 4.09, 4.17, 4.33, 4.33, 8.12)))
    eigen_input = dict(zip(probe, (2.51, 3.19, 4.53, 6.77, 12.72, 27.76)))
    slow_path = {1: 17.94, 2: 17.92, 4: 35.16}  # stopped at 4
    slow_then_fast = dict(zip(probe, (14.5, 29.0, 56.0, 112.0, 4.07, 2.51)))
    assert calibrate.channel_block(onednn) == 16
    assert calibrate.channel_block(eigen_input) == 2
    assert calibrate.channel_block(slow_path) == 2
    assert calibrate.channel_block(slow_then_fast) == 1
    assert calibrate.channel_block({c: 1.0 * c for c in probe}) == 1
    assert calibrate.channel_block({c: 1.0 for c in probe}) == probe[-1]


def test_im2col_table_cases_fill_the_channel_block():
    """With a block of 1 the table's cases are the square-ish ones it always
    had; with 16 the written channels are a whole block wherever the product
    allows; every case has the product it stands for."""
    from tfbigconv import calibrate
    assert calibrate.IM2COL_PRODUCTS == (1, 16, 256, 2048)
    assert [calibrate.table_case(p, 1) for p in calibrate.IM2COL_PRODUCTS] == \
        [(1, 1), (4, 4), (16, 16), (32, 64)]
    assert [calibrate.table_case(p, 16) for p in calibrate.IM2COL_PRODUCTS] == \
        [(1, 1), (1, 16), (16, 16), (32, 64)]
    assert [calibrate.table_case(p, 2) for p in calibrate.IM2COL_PRODUCTS] == \
        [(1, 1), (4, 4), (16, 16), (32, 64)]
    for block in (1, 2, 4, 8, 16, 32):
        for p in calibrate.IM2COL_PRODUCTS:
            other, written = calibrate.table_case(p, block)
            assert other * written == p
            assert written % block == 0 or written == p


def test_calibration_round_trip(tmp_path):
    cache = tmp_path / "cache"
    r = run(["-m", "tfbigconv", "calibrate", "--quick"], XDG_CACHE_HOME=str(cache))
    assert r.returncode == 0, r.stderr
    profile = cache / "tfbigconv" / "cost_model.json"
    doc = json.loads(profile.read_text())
    assert doc["meta"]["quick"] and doc["meta"]["format"] == cost_model.FORMAT
    assert doc["meta"]["cpu"] == cost_model.this_cpu()  # what machine_mismatch compares
    assert doc["meta"]["tf_onednn"] == cost_model.tf_onednn() is not None
    _, shipped_meta = cost_model.read_profile_and_meta(cost_model.SHIPPED_PATH)
    assert doc["meta"]["gpu_grids"] == shipped_meta["gpu_grids"]
    fields = _core.cost_model_fields()
    assert set(doc["values"]) == set(fields)
    # A fresh process loads the user's profile into _core and the op library.
    for fast, other in (("direct", "fft"), ("fft", "direct")):
        values = dict(doc["values"])
        for name in fields:
            if name.startswith(other) and "per_unit" not in name and "flops" not in name:
                values[name] = 1.0  # a second per call: never chosen
        profile.write_text(json.dumps({"meta": doc["meta"], "values": values}))
        r = run(["-c", CHECK_MODEL], XDG_CACHE_HOME=str(cache))
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert got["source"] == "user"
        assert got["values"] == [values[n] for n in fields]
        assert got["op_choice"] == [fast]
    # A broken profile is ignored with a warning, falling back to the shipped one.
    profile.write_text("{not json")
    r = run(["-c", CHECK_MODEL], XDG_CACHE_HOME=str(cache))
    assert r.returncode == 0 and "ignoring cost model" in r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["source"] == "shipped"


def test_machine_mismatch_names_what_differs():
    here = cost_model.this_cpu()
    assert here["cpus"] == os.cpu_count() and set(here["isa"]) <= set(cost_model.ISA_FLAGS)
    meta = {"cpu": dict(here), "tensorflow": tf.__version__, "machine": "m"}
    assert cost_model.machine_mismatch(meta) == ""
    other = dict(here, isa=sorted(set(here["isa"]) ^ {"avx512f"}))
    why = cost_model.machine_mismatch(dict(meta, cpu=other))
    assert "avx512f" in why and here["name"] in why
    assert "CPUs" in cost_model.machine_mismatch(dict(meta, cpu=dict(here, cpus=here["cpus"] + 1)))
    assert "TensorFlow 1.0" in cost_model.machine_mismatch(dict(meta, tensorflow="1.0"))
    assert "does not record its CPU" in cost_model.machine_mismatch({"machine": "m"})
    assert "built-in" in cost_model.machine_mismatch({})
    assert "machine is" in cost_model.machine_mismatch(dict(meta, cpu={"isa": 5}))  # no crash
    # TF's oneDNN kernels, on or off (TF_ENABLE_ONEDNN_OPTS), are other code.
    here_dnn = cost_model.tf_onednn()
    assert isinstance(here_dnn, bool)
    assert cost_model.machine_mismatch(dict(meta, tf_onednn=here_dnn)) == ""
    why = cost_model.machine_mismatch(dict(meta, tf_onednn=not here_dnn))
    assert "oneDNN " + ("off" if here_dnn else "on") in why and "TF_ENABLE_ONEDNN_OPTS" in why
    assert cost_model.machine_mismatch(dict(meta, tf_onednn="yes")) == ""  # malformed: ignored


def test_the_shipped_profile_for_a_machine(tmp_path):
    """shipped_for: the same oneDNN setting first, then the same ISA; the main
    profile on a tie; an unreadable profile is passed over."""
    def profile(name, isa, onednn):
        path = tmp_path / name
        path.write_text(json.dumps({"meta": {"format": 1, "tf_onednn": onednn,
                                             "cpu": {"name": name, "isa": isa, "cpus": 2}},
                                    "values": {}}))
        return str(path)
    main = profile("main", ["avx2", "fma"], False)
    avx512 = profile("avx512", ["avx2", "avx512f", "fma"], True)
    broken = tmp_path / "broken"
    broken.write_text("{")
    paths = (main, avx512, str(broken))
    zen3, zen4 = {"isa": ["fma", "avx2"]}, {"isa": ["avx2", "fma", "avx512f"]}
    assert cost_model.shipped_for(zen3, False, paths) == main
    assert cost_model.shipped_for(zen4, True, paths) == avx512
    assert cost_model.shipped_for(zen3, True, paths) == avx512  # TF's kernels decide more
    assert cost_model.shipped_for(zen4, False, paths) == main
    assert cost_model.shipped_for({"isa": ["avx512f"]}, None, paths) == main  # a tie
    assert cost_model.shipped_for(zen4, True, (main, str(broken))) == main


def test_shipped_cpu_profiles_hold_cpu_values_of_another_kind_of_host():
    """Each CPU-only profile is valid with the main one's GPU values, holds no
    GPU values of its own (one GPU fit), and is picked on the host it was
    measured on, not on the main profile's."""
    main_meta = cost_model.read_profile_and_meta(cost_model.SHIPPED_PATH)[1]
    assert cost_model.SHIPPED_CPU_PATHS, "no CPU-only profile shipped"
    for path in cost_model.SHIPPED_CPU_PATHS:
        with open(path) as f:
            doc = json.load(f)
        assert not any(k.startswith("gpu.") for k in doc["values"]), path
        values, meta = cost_model.read_profile_and_meta(path, cost_model.shipped_values())
        gpu = [i for i, n in enumerate(_core.cost_model_fields()) if n.startswith("gpu.")]
        assert [values[i] for i in gpu] == [cost_model.shipped_values()[n] for n in
                                            np.array(_core.cost_model_fields())[gpu]]
        assert (meta["tf_onednn"], sorted(meta["cpu"]["isa"])) != (
            main_meta["tf_onednn"], sorted(main_meta["cpu"]["isa"]))
        assert cost_model.shipped_for(meta["cpu"], meta["tf_onednn"]) == path
    assert cost_model.shipped_for(main_meta["cpu"], main_meta["tf_onednn"]) == \
        cost_model.SHIPPED_PATH
    # explain() names the file the constants came from.
    e = tfbigconv.explain((2, 20, 20, 3), (5, 5, 3, 4), padding="SAME")
    assert f"cost model: {cost_model.active_source} ({os.path.basename(cost_model.active_path)})" \
        in e.table()


def test_explain_warns_when_the_profile_is_from_another_machine(monkeypatch):
    here = {"cpu": cost_model.this_cpu(), "tensorflow": tf.__version__}
    warn = "may be off several-fold"
    monkeypatch.setattr(cost_model, "active_meta", here)
    e = tfbigconv.explain((2, 20, 20, 3), (5, 5, 3, 4), padding="SAME")
    assert e.cost_model_warning == "" and warn not in e.table()
    monkeypatch.setattr(cost_model, "active_meta", dict(here, cpu=dict(here["cpu"], cpus=999)))
    e = tfbigconv.explain((2, 20, 20, 3), (5, 5, 3, 4), padding="SAME")
    assert "999 CPUs" in e.cost_model_warning and warn in e.table()
    # The GPU's constants are the H100 grids' fit wherever explain runs.
    e = tfbigconv.explain((2, 20, 20, 3), (5, 5, 3, 4), padding="SAME", device="GPU")
    assert e.cost_model_warning == "" and warn not in e.table()


# ---- depthwise: TF's DepthwiseConv2dNative, never grouped Conv2D -----------

DEPTHWISE = ((2, 16, 16, 8), (3, 3, 1, 16))  # multiplier 2; the model picks TF's kernel
CPU = "/CPU:0"  # the CPU's rules and model, also where a GPU is visible


def cpu_bigconv2d(*args, **kwargs):
    with tf.device(CPU):
        return tfbigconv.bigconv2d(*args, **kwargs)


def grads_vs_reference(fn, x, w, strides=1, padding="SAME", fmt="NHWC", dil=1):
    """fn's output and gradients (dy random) against the float64 reference:
    the three relative L2 errors."""
    s = (strides, strides) if isinstance(strides, int) else tuple(strides)
    d = (dil, dil) if isinstance(dil, int) else tuple(dil)
    x64 = tf.cast(x, tf.float64).numpy()
    w64 = tf.cast(w, tf.float64).numpy()
    y_ref = conv2d_reference(x64, w64, s, padding, d, fmt)
    dy = tf.cast(random_case(y_ref.shape, 99, np.float64), x.dtype)
    dy64 = tf.cast(dy, tf.float64).numpy()
    with tf.device(CPU):
        with tf.GradientTape() as t:
            t.watch([x, w])
            y = fn(x, w)
        dx, dw = t.gradient(y, [x, w], output_gradients=dy)
    refs = (y_ref, conv2d_reference_backprop_input(dy64, w64, x64.shape, s, padding, d, fmt),
            conv2d_reference_backprop_filter(x64, dy64, w64.shape, s, padding, d, fmt))
    return [rel_l2(tf.cast(g, tf.float64).numpy(), r) for g, r in zip((y, dx, dw), refs)]


def tape_types(fn, x_shape, w_shape, dtype=tf.float32):
    def step(x, w):
        with tf.device(CPU), tf.GradientTape() as t:
            t.watch([x, w])
            loss = tf.reduce_sum(fn(x, w) ** 2)
        return t.gradient(loss, [x, w])
    return op_types(step, tf.TensorSpec(x_shape, dtype), tf.TensorSpec(w_shape, dtype))


def test_auto_depthwise_runs_tf_depthwise_kernels():
    e = tfbigconv.explain(*DEPTHWISE, padding="SAME")
    assert e.chosen == dict.fromkeys(dispatch.PASSES, "tf.DepthwiseConv2dNative")
    ours = lambda x, w: cpu_bigconv2d(x, w, 1, "SAME")  # noqa: E731
    types = tape_types(ours, *DEPTHWISE)
    assert {"DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
            "DepthwiseConv2dNativeBackpropFilter"} <= types
    assert not types & {"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "BigConv2D"}
    x, w = rand(DEPTHWISE[0], 20), rand(DEPTHWISE[1], 21)
    for fn in (ours, tf.function(ours)):
        errors = grads_vs_reference(fn, x, w)
        assert max(errors) < TOLERANCE["float32"], errors


def test_depthwise_gradient_passes_mix_tf_and_ours(model):
    """The model moves depthwise backprop_filter (then forward) off TF: the
    other passes stay on DepthwiseConv2dNative*, reshaping the filter."""
    x, w = rand(DEPTHWISE[0], 22), rand(DEPTHWISE[1], 23)
    ours = lambda x, w: cpu_bigconv2d(x, w, 1, "SAME")  # noqa: E731
    model("tf_depthwise_multiplier_flops_per_second.backprop_filter", 1e-6)  # DEPTHWISE: multiplier 2
    types = tape_types(ours, *DEPTHWISE)
    assert {"DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
            "BigConv2DBackpropFilter"} <= types
    assert max(grads_vs_reference(ours, x, w)) < TOLERANCE["float32"]
    model("tf_depthwise_multiplier_flops_per_second.forward", 1e-6)  # the registered gradient's turn
    types = tape_types(ours, *DEPTHWISE)
    assert {"BigConv2D", "DepthwiseConv2dNativeBackpropInput", "BigConv2DBackpropFilter"} <= types
    assert "DepthwiseConv2dNative" not in types
    assert max(grads_vs_reference(ours, x, w)) < TOLERANCE["float32"]


def test_auto_never_runs_grouped_conv2d_for_depthwise():
    """The issue's trap: TF's grouped Conv2D ran depthwise filters 10-300x
    slower than DepthwiseConv2dNative. Whatever auto picks, not that."""
    for x_shape, w_shape in (((2, 24, 24, 16), (15, 15, 1, 16)), ((2, 20, 20, 8), (7, 7, 1, 8))):
        types = tape_types(lambda x, w: cpu_bigconv2d(x, w, 1, "SAME"), x_shape, w_shape)
        assert not types & {"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"}, types
        e = tfbigconv.explain(x_shape, w_shape, padding="SAME")
        assert {r.algorithm for r in e.rows} == {"tf.DepthwiseConv2dNative", "direct", "fft"}


@pytest.mark.parametrize("strides", [1, 2])
def test_forced_tf_depthwise_is_tf_nn_depthwise_conv2d(strides):
    x, w = rand((2, 13, 15, 6), 24), rand((5, 5, 1, 12), 25)
    tf_w = tf.reshape(w, (5, 5, 6, 2))

    def run(fn, w):
        with tf.GradientTape() as t:
            t.watch([x, w])
            y = fn(x, w)
            loss = tf.reduce_sum(y * tf.sin(y))
        return [y] + t.gradient(loss, [x, w])

    got = run(lambda x, w: tfbigconv.bigconv2d(x, w, strides, "SAME", algorithm="tf"), w)
    want = run(lambda x, w: tf.nn.depthwise_conv2d(x, w, [1, strides, strides, 1], "SAME"), tf_w)
    want[2] = tf.reshape(want[2], w.shape)
    for g, r in zip(got, want):
        np.testing.assert_array_equal(g, r)


@pytest.mark.parametrize("kwargs", [dict(data_format="NCHW"), dict(dilations=2),
                                    dict(strides=(1, 2))])
def test_depthwise_that_tf_depthwise_cannot_run(kwargs, eigen_tf):
    """TF's depthwise kernels need NHWC, equal strides and no dilations; such
    cases are grouped Conv2D for TF, which on the CPU (without oneDNN) runs
    only NHWC forward (dilated gradients: the test below)."""
    kwargs = dict(kwargs)
    strides = kwargs.pop("strides", 1)
    fmt = kwargs.get("data_format", "NHWC")
    shape = (2, 8, 12, 12) if fmt == "NCHW" else (2, 12, 12, 8)
    x, w = rand(shape, 26), rand((3, 3, 1, 8), 27)
    if fmt == "NCHW":
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="'tf' is not available: .*only NHWC"):
            cpu_bigconv2d(x, w, strides, "SAME", algorithm="tf", **kwargs)
    else:  # forced tf: TF's grouped Conv2D, exactly tf.nn.conv2d
        with tf.device("/CPU:0"):
            np.testing.assert_array_equal(
                cpu_bigconv2d(x, w, strides, "SAME", algorithm="tf", **kwargs),
                tf.nn.conv2d(x, w, strides, "SAME", dilations=kwargs.get("dilations")))
        e = tfbigconv.explain(shape, w.shape, strides, "SAME", dilations=kwargs.get("dilations", 1))
        assert {r.algorithm for r in e.rows if r.pass_ == "forward"} >= {"tf.Conv2D"}
    # auto runs it (on our kernels), correctly.
    errors = grads_vs_reference(
        lambda x, w: cpu_bigconv2d(x, w, strides, "SAME", **kwargs), x, w,
        strides=strides, fmt=fmt, dil=kwargs.get("dilations", 1))
    assert max(errors) < 1e-4, errors



@pytest.mark.parametrize("x_shape, w_shape, padding, dil", [
    ((2, 13, 17, 6), (3, 3, 1, 6), "SAME", (2, 2)),
    ((2, 13, 17, 6), (3, 5, 1, 12), "SAME", (3, 2)),    # multiplier 2, odd sizes
    ((1, 20, 19, 4), (3, 3, 1, 4), "VALID", (4, 3)),
    ((2, 11, 12, 3), (2, 4, 1, 3), "SAME", (5, 1)),     # even sides
    ((3, 7, 9, 5), (4, 4, 1, 5), "SAME", (3, 3)),       # filter wider than the input
    ((2, 15, 15, 4), (3, 3, 1, 8), [[0, 0], [1, 3], [2, 0], [0, 0]], (2, 3)),
    ((2, 20, 21, 4), (3, 3, 1, 4), "SAME", (8, 8)),     # dilated side 17: the forward too
    ((1, 19, 23, 3), (3, 4, 1, 6), [[0, 0], [2, 1], [0, 3], [0, 0]], (7, 1)),
])
@pytest.mark.parametrize("shapes, dtype", [("static", tf.float32), ("dynamic", tf.float32),
                                           ("static", tf.float64)])
def test_dilated_depthwise_tf_kernels_run_as_tf_nn_depthwise_conv2d(x_shape, w_shape, padding,
                                                                  dil, shapes, dtype, eigen_tf):
    """TF's kernels for dilated depthwise filters: SpaceToBatchND, the
    undilated DepthwiseConv2dNative* (VALID), BatchToSpaceND, as
    tf.nn.depthwise_conv2d runs them, in the gradients, and in the forward pass
    from a dilated side of SPACE_TO_BATCH_FORWARD_SIDE (below, grouped Conv2D);
    also where TF has no dilated Conv2D gradient (planned as without oneDNN;
    float64 runs TF's Eigen kernels here). Every pass against float64."""
    fmt_pad = padding if isinstance(padding, str) else "EXPLICIT"
    explicit = sum(padding, []) if fmt_pad == "EXPLICIT" else []
    a = dict(strides=[1, 1, 1, 1], padding=fmt_pad, explicit_paddings=explicit,
             data_format="NHWC", dilations=[1, dil[0], dil[1], 1])
    pairs = ((0, 0), (0, 0)) if fmt_pad != "EXPLICIT" else (tuple(padding[1]), tuple(padding[2]))
    x, w = random_case(x_shape, 30, np.float64), random_case(w_shape, 31, np.float64)
    y_ref = conv2d_reference(x, w, (1, 1), fmt_pad, dil, explicit=pairs)
    dy = random_case(y_ref.shape, 32, np.float64)
    refs = (y_ref, conv2d_reference_backprop_input(dy, w, x_shape, (1, 1), fmt_pad, dil,
                                                   explicit=pairs),
            conv2d_reference_backprop_filter(x, dy, w_shape, (1, 1), fmt_pad, dil, explicit=pairs))

    def passes(x, w, dy):
        return [conv.run_pass(p, "tf", x, w, dy, a, "CPU") for p in dispatch.PASSES]

    specs = [tf.TensorSpec(s if shapes == "static" else [None] * 3 + [s[3]], dtype)
             for s in (x_shape, w_shape, y_ref.shape)]
    specs[1] = tf.TensorSpec(w_shape, dtype)
    def checked(fn):  # run on the CPU against float64; the graph's op types
        fn = tf.function(fn, input_signature=specs)
        with tf.device(CPU):
            got = fn(*(tf.constant(v, dtype) for v in (x, w, dy)))
        for g, r in zip(got, refs):
            assert rel_l2(g.numpy(), r) < TOLERANCE[dtype.name]
        return {op.type for op in fn.get_concrete_function().graph.get_operations()}

    wide = max((k - 1) * d + 1 for k, d in zip(w_shape, dil)) >= dispatch.SPACE_TO_BATCH_FORWARD_SIDE
    forward = "DepthwiseConv2dNative" if wide else "Conv2D"
    types = checked(passes)
    assert {"SpaceToBatchND", "BatchToSpaceND", "DepthwiseConv2dNativeBackpropInput",
            "DepthwiseConv2dNativeBackpropFilter", forward} <= types, types
    assert not types & {"Conv2DBackpropInput", "Conv2DBackpropFilter"}, types
    assert ("Conv2D" in types) != wide, types
    # The copies count as workspace in every pass on the path.
    e = tfbigconv.explain(x_shape, w_shape, 1, padding, dilations=dil)
    tf_rows = {r.pass_: r for r in e.rows if r.algorithm.startswith("tf.")}
    assert tf_rows["forward"].algorithm == "tf." + forward
    for p in (dispatch.PASSES if wide else dispatch.PASSES[1:]):
        assert tf_rows[p].algorithm == "tf.DepthwiseConv2dNative"
        assert "SpaceToBatchND" in tf_rows[p].note and tf_rows[p].workspace_bytes > 0
        planned = dispatch.plan(p, x_shape, w_shape, a, dtype.name, "auto", 0, "CPU")
        assert planned["tf_for_auto"] == "measured"  # the copies are not in the estimate
    # Forced "tf" runs them too, not TF's grouped Conv2D gradients (which Eigen
    # rejects with dilations, and oneDNN with EXPLICIT padding).
    def forced(x, w, dy):
        with tf.GradientTape() as t:
            t.watch([x, w])
            y = tfbigconv.bigconv2d(x, w, 1, padding, dilations=dil, algorithm="tf")
        return [y] + t.gradient(y, [x, w], output_gradients=dy)

    types = checked(forced)
    # The forward keeps its static spatial shape (Keras and memory_report read it).
    y_spec = tf.function(lambda x, w: tfbigconv.bigconv2d(x, w, 1, padding, dilations=dil,
                                                          algorithm="tf"))
    y = y_spec.get_concrete_function(tf.TensorSpec([None] + list(x_shape[1:]), dtype),
                                     specs[1]).structured_outputs
    assert y.shape.as_list() == [None] + list(y_ref.shape[1:]), y.shape
    assert "SpaceToBatchND" in types and not types & {"Conv2DBackpropInput",
                                                       "Conv2DBackpropFilter"}, types


@pytest.mark.parametrize("strides, data_format", [(2, "NHWC"), (1, "NCHW")])
def test_dilated_depthwise_that_tf_nn_depthwise_conv2d_cannot_run_stays_grouped(strides,
                                                                             data_format):
    """tf.nn.depthwise_conv2d takes dilations only at stride 1, and
    DepthwiseConv2dNative in NHWC: TF's kernel there is grouped Conv2D."""
    shape = (2, 8, 12, 12) if data_format == "NCHW" else (2, 12, 12, 8)
    e = tfbigconv.explain(shape, (3, 3, 1, 8), strides, "SAME", dilations=2,
                          data_format=data_format)
    assert {r.algorithm for r in e.rows if r.algorithm.startswith("tf.")} == {"tf.Conv2D"}


def test_tfs_bfloat16_grouped_dilated_filter_gradient_is_never_run(monkeypatch):
    """TF 2.21's oneDNN bfloat16 grouped Conv2DBackpropFilter with dilations
    killed the process: auto neither picks nor times it, and nothing here
    builds it. Under a forced "tf", building that gradient raises, naming why
    (also with unknown spatial sizes, and through the emitter every route
    shares); the forward pass runs."""
    monkeypatch.setattr(dispatch, "tf_cpu_onednn", lambda *args: True)  # as where oneDNN runs it
    x_shape, w_shape = (2, 16, 16, 16), (3, 3, 4, 16)
    a = dict(strides=[1, 1, 1, 1], padding="SAME", explicit_paddings=[], data_format="NHWC",
             dilations=[1, 3, 3, 1])
    for p in dispatch.PASSES:
        plan = dispatch.plan(p, x_shape, w_shape, a, "bfloat16", "auto", 0, "CPU")
        refused = p == "backprop_filter"
        assert plan["tf"]["available"] != refused, p
        if refused:
            assert "segmentation fault" in plan["tf"]["note"]
            assert "tf" not in autotune.candidates_to_time(plan)
    for dtype, dil in (("float32", [1, 3, 3, 1]), ("bfloat16", [1, 1, 1, 1])):
        plan = dispatch.plan("backprop_filter", x_shape, w_shape, dict(a, dilations=dil), dtype,
                             "auto", 0, "CPU")
        assert plan["tf"]["available"], (dtype, dil)

    def step(x, w):
        with tf.device(CPU), tf.GradientTape() as t:
            t.watch([x, w])
            y = tfbigconv.bigconv2d(x, w, 1, "SAME", dilations=3, algorithm="tf")
        return t.gradient(y, [x, w])

    static = [tf.TensorSpec(x_shape, tf.bfloat16), tf.TensorSpec(w_shape, tf.bfloat16)]
    unknown = [tf.TensorSpec([None, None, None, 16], tf.bfloat16), static[1]]
    for specs in (static, unknown):  # traced, not run
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="'tf' is not available: .*segmentation"):
            tf.function(step).get_concrete_function(*specs)
    forward = op_types(lambda x, w: tfbigconv.bigconv2d(x, w, 1, "SAME", dilations=3,
                                                        algorithm="tf"), *static)
    assert "Conv2D" in forward  # inference is not refused
    a = dict(strides=[1, 1, 1, 1], padding="SAME", explicit_paddings=[], data_format="NHWC",
             dilations=[1, 3, 3, 1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="segmentation"):
        tf.function(lambda x, w, dy: conv.run_pass("backprop_filter", "tf", x, w, dy, a, "CPU")
                    ).get_concrete_function(*static, static[0])

# ---- precision: float16 and bfloat16 gradients from auto -------------------

HALF_CASES = {
    "dense_1ch": ((3, 58, 63, 1), (9, 1, 1, 2), 1, "VALID"),   # the issue's bfloat16 case
    "dense": ((2, 17, 19, 16), (7, 7, 16, 16), 1, "SAME"),
    "dense_stride2": ((2, 20, 20, 8), (3, 3, 8, 8), 2, "SAME"),
    "grouped": ((2, 20, 20, 8), (3, 3, 2, 8), 1, "SAME"),
    "depthwise": ((2, 24, 24, 4), (7, 7, 1, 8), 1, "SAME"),
    "big_k": ((1, 48, 44, 1), (31, 31, 1, 2), 1, "SAME"),
}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", sorted(HALF_CASES))
@pytest.mark.parametrize("tuned", [False, True], ids=["estimated", "autotuned"])
def test_half_precision_gradients_from_auto_meet_tolerances(dtype, case, tuned, request,
                                                          eigen_tf):
    """TF's CPU gradients (and depthwise kernels) without oneDNN accumulate in
    half precision, 5-20x our error, over the tolerances: auto never picks
    them, whether it decides by estimates or by timing, and explain() says why."""
    if tuned:
        request.getfixturevalue("autotuning")
    x_shape, w_shape, strides, padding = HALF_CASES[case]
    tf_dtype = tf.as_dtype(dtype)
    x = tf.cast(random_case(x_shape, 30, np.float64), tf_dtype)
    w = tf.cast(random_case(w_shape, 31, np.float64), tf_dtype)
    fn = lambda x, w: cpu_bigconv2d(x, w, strides, padding)  # noqa: E731
    errors = grads_vs_reference(fn, x, w, strides, padding)
    assert max(errors) <= TOLERANCE[dtype], errors

    e = tfbigconv.explain(x_shape, w_shape, strides, padding, dtype=dtype)
    depthwise = w_shape[2] == 1 and x_shape[3] > 1
    for p in dispatch.PASSES:
        tf_row = next(r for r in e.rows if r.pass_ == p and r.algorithm.startswith("tf"))
        if p == "forward" and not depthwise:
            continue  # TF's forward rounds only its output: allowed
        # Runnable when forced (algorithm="tf"), never auto's choice.
        assert not e.chosen[p].startswith("tf"), (p, tf_row)
        if case != "grouped":  # grouped gradients are out for another reason
            assert "half precision" in tf_row.note, tf_row.note
    if tuned:
        assert set(e.how.values()) <= {"measured", "estimated"}


def test_half_precision_rule_is_the_cpus():
    """cuDNN accumulates half types in float32: on the GPU TF's kernels stay in."""
    for dtype in ("float16", "bfloat16"):
        e = tfbigconv.explain((2, 17, 19, 16), (7, 7, 16, 16), padding="SAME", dtype=dtype,
                              device="GPU")
        assert all(r.available for r in e.rows if r.algorithm.startswith("tf"))
        e = tfbigconv.explain((2, 17, 19, 16), (7, 7, 16, 16), padding="SAME", dtype="float32")
        assert all(r.available for r in e.rows if r.algorithm.startswith("tf"))


# ---- TF's CPU kernels through oneDNN ----------------------------------------

ONEDNN_CASES = {  # what TF's CPU kernels run only through oneDNN
    "nchw": ((2, 8, 15, 17), (3, 3, 8, 6), {"data_format": "NCHW"}),
    "grouped": ((2, 15, 17, 8), (3, 3, 2, 8), {}),
    "dilated": ((2, 15, 17, 8), (3, 3, 8, 6), {"dilations": 2}),
    "grouped_dilated_nchw": ((2, 8, 15, 17), (5, 3, 4, 6),
                             {"data_format": "NCHW", "dilations": (2, 1)}),
}


def test_where_tf_runs_onednn_auto_may_pick_its_kernels(monkeypatch):
    """With oneDNN, TF's CPU Conv2D runs NCHW, grouped and dilated gradients
    and accumulates bfloat16 in float32: auto may pick it there (grouped
    Conv2D still only when measured), and explain() says why. The check is
    asked about explicit padding apart (oneDNN did not run it)."""
    asked = []
    monkeypatch.setattr(dispatch, "tf_cpu_onednn", lambda *a: asked.append(a) or True)
    for name, (x_shape, w_shape, kwargs) in ONEDNN_CASES.items():
        e = tfbigconv.explain(x_shape, w_shape, padding="SAME", **kwargs)
        for p in dispatch.PASSES:
            row = next(r for r in e.rows if r.pass_ == p and r.algorithm == "tf.Conv2D")
            assert row.available, (name, row)
            if p != "forward" or name == "nchw":
                assert "oneDNN" in row.note, (name, row.note)
            if name.startswith("grouped"):
                assert "measured fastest" in row.note, row.note
    assert {a[0] for a in asked} == {"Conv2D"} and not any(a[2] for a in asked)
    e = tfbigconv.explain((2, 17, 19, 16), (7, 7, 16, 16), padding="SAME", dtype="bfloat16")
    assert all(r.available and "half precision" not in r.note
               for r in e.rows if r.algorithm.startswith("tf"))
    asked.clear()
    tfbigconv.explain((2, 15, 17, 8), (3, 3, 8, 6), padding=[[0, 0], [1, 2], [0, 3], [0, 0]],
                      dilations=2)
    assert asked and all(a == ("Conv2D", "float32", True) for a in asked)


NCHW_DEPTHWISE = ((2, 8, 15, 17), (5, 5, 1, 8))


def test_half_types_in_nchw_run_tf_only_where_measured_fastest(monkeypatch, model):
    """oneDNN's bfloat16 kernels ran 3-30x slower in NCHW than in NHWC, where
    the model's rates are from: in half types and NCHW, TF's CPU kernels
    (dense and depthwise) are picked only when measured fastest, so never on
    estimates alone, even where the model makes them 1000x faster than ours;
    in float32 and in NHWC they are trusted as before."""
    monkeypatch.setattr(dispatch, "tf_cpu_onednn", lambda *a: True)
    model("im2col_flops_per_second", 1000)
    model("tf_depthwise_flops_per_second", 1000)
    dense = ((2, 8, 15, 17), (3, 3, 8, 6))
    for (x_shape, w_shape), kernel in ((dense, "tf.Conv2D"),
                                       (NCHW_DEPTHWISE, "tf.DepthwiseConv2dNative")):
        for dtype, fmt, trusted in (("bfloat16", "NCHW", False), ("float16", "NCHW", False),
                                    ("float32", "NCHW", True)):
            e = tfbigconv.explain(x_shape, w_shape, padding="SAME", dtype=dtype, data_format=fmt)
            rows = [r for r in e.rows if r.algorithm == kernel]
            assert len(rows) == 3 and all(r.available for r in rows), (kernel, dtype, rows)
            assert all(("measured fastest" in r.note) is not trusted for r in rows), rows
            picked = {p for p, name in e.chosen.items() if name == kernel}
            assert picked == (set(dispatch.PASSES) if trusted else set()), (kernel, dtype, e.chosen)
    e = tfbigconv.explain((2, 15, 17, 8), (3, 3, 8, 6), padding="SAME", dtype="bfloat16")
    assert not any("measured fastest" in r.note for r in e.rows)
    assert set(e.chosen.values()) == {"tf.Conv2D"}


def test_onednn_bfloat16_depthwise_forward_that_compiles_for_minutes_is_not_for_auto(
        monkeypatch, model):
    """oneDNN's bfloat16 depthwise forward with at most 16 channels and a 15x15
    or larger filter took over 10 minutes to compile on its first call: auto
    never picks it (nor times it), even where the model makes it 1000x faster;
    its gradients, and the cases next to the region, stay TF's."""
    monkeypatch.setattr(dispatch, "tf_cpu_onednn", lambda *a: True)
    model("tf_depthwise_flops_per_second", 1000)  # both rate tables: multiplier 1
    model("tf_depthwise_multiplier_flops_per_second", 1000)  # and over 1
    tf_dw = "tf.DepthwiseConv2dNative"
    e = tfbigconv.explain((2, 32, 32, 16), (15, 15, 1, 16), padding="SAME", dtype="bfloat16")
    forward = [r for r in e.rows if r.pass_ == "forward" and r.algorithm == tf_dw]
    assert len(forward) == 1 and "compile" in forward[0].note, forward
    assert e.chosen["forward"] != tf_dw
    assert e.chosen["backprop_input"] == e.chosen["backprop_filter"] == tf_dw
    plan = dispatch.plan("forward", (2, 32, 32, 16), (15, 15, 1, 16), dict(
        strides=[1, 1, 1, 1], padding="SAME", explicit_paddings=[], data_format="NHWC",
        dilations=[1, 1, 1, 1]), "bfloat16", "auto", 0, "CPU")
    assert "tf" not in autotune.candidates_to_time(plan)
    for x_shape, w_shape, stride, dtype in (((2, 32, 32, 24), (15, 15, 1, 24), 1, "bfloat16"),
                                            ((2, 32, 32, 16), (13, 13, 1, 16), 1, "bfloat16"),
                                            ((2, 32, 32, 16), (15, 15, 1, 16), 2, "bfloat16"),
                                            ((2, 32, 32, 16), (15, 15, 1, 32), 1, "bfloat16"),
                                            ((2, 32, 32, 16), (15, 15, 1, 16), 1, "float32")):
        e = tfbigconv.explain(x_shape, w_shape, stride, padding="SAME", dtype=dtype)
        assert e.chosen["forward"] == tf_dw, (x_shape, w_shape, stride, dtype, e.reasons)


def test_nchw_depthwise_runs_tf_depthwise_where_onednn_runs_it(monkeypatch):
    """TF's CPU depthwise kernels run NCHW only through oneDNN: there the
    planner's row and the graph (forced "tf") are DepthwiseConv2dNative, with
    the check asked about NCHW; elsewhere on the CPU neither kernel runs it
    (TF's own kernels are NHWC only), and on the GPU it is grouped Conv2D."""
    forced = lambda x, w: cpu_bigconv2d(x, w, 1, "SAME", data_format="NCHW",  # noqa: E731
                                        algorithm="tf")
    for onednn, kernel in ((False, ""), (True, "DepthwiseConv2dNative")):
        asked = []
        monkeypatch.setattr(dispatch, "tf_cpu_onednn",
                            lambda *a, answer=onednn: asked.append(a) or answer)
        e = tfbigconv.explain(*NCHW_DEPTHWISE, padding="SAME", data_format="NCHW")
        tf_rows = [r for r in e.rows if r.algorithm.startswith("tf")]
        if onednn:
            assert {r.algorithm for r in tf_rows} == {"tf." + kernel} and all(
                r.available and "oneDNN" in r.note for r in tf_rows), tf_rows
        else:  # neither TF kernel runs NCHW
            assert not any(r.available for r in tf_rows) and "NHWC" in tf_rows[0].note
        assert ("DepthwiseConv2dNative", "float32", False, "NCHW") in asked
        e = tfbigconv.explain(*NCHW_DEPTHWISE, padding="SAME", data_format="NCHW", device="GPU")
        assert {r.algorithm for r in e.rows if r.algorithm.startswith("tf")} == {"tf.Conv2D"}
    types = tape_types(forced, *NCHW_DEPTHWISE)  # with oneDNN (the last answer)
    assert {kernel, kernel + "BackpropInput", kernel + "BackpropFilter"} <= types, types
    assert not types & {"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"}, types


def test_tf_kernels_that_onednn_runs_here_are_correct(autotuning):
    """On this host, as it is: where the oneDNN check says yes, TF's kernel
    (forced) and auto meet the tolerances on the cases only oneDNN runs;
    where it says no, auto never picks TF's kernel for them."""
    for dtype in ("float32", "bfloat16", "float16"):
        onednn = dispatch.tf_cpu_onednn("Conv2D", dtype, False)
        for name, (x_shape, w_shape, kwargs) in ONEDNN_CASES.items():
            if dtype != "float32" and name != "grouped_dilated_nchw":
                continue
            fmt = kwargs.get("data_format", "NHWC")
            x = tf.cast(random_case(x_shape, 50, np.float64), dtype)
            w = tf.cast(random_case(w_shape, 51, np.float64), dtype)
            algorithms = ("auto", "tf") if onednn else ("auto",)
            for algorithm in algorithms:
                run = lambda: grads_vs_reference(  # noqa: E731
                    lambda x, w: cpu_bigconv2d(x, w, 1, "SAME", algorithm=algorithm, **kwargs),
                    x, w, fmt=fmt, dil=kwargs.get("dilations", 1))
                if algorithm == "tf" and dtype == "bfloat16" and name == "grouped_dilated_nchw":
                    # dispatch.ONEDNN_BF16_GROUPED_DILATED_NOTE: refused, not run
                    with pytest.raises(tf.errors.InvalidArgumentError, match="segmentation"):
                        run()
                    continue
                errors = run()
                assert max(errors) <= TOLERANCE[dtype], (dtype, name, algorithm, errors)
            if not onednn:
                e = tfbigconv.explain(x_shape, w_shape, padding="SAME", dtype=dtype, **kwargs)
                assert not any(e.chosen[p].startswith("tf") for p in dispatch.PASSES[1:]), e.chosen
        # NCHW depthwise: TF's depthwise kernels where the check says oneDNN runs them
        onednn = dispatch.tf_cpu_onednn("DepthwiseConv2dNative", dtype, False, "NCHW")
        x = tf.cast(random_case(NCHW_DEPTHWISE[0], 52, np.float64), dtype)
        w = tf.cast(random_case(NCHW_DEPTHWISE[1], 53, np.float64), dtype)
        for algorithm in ("auto", "tf") if onednn else ("auto",):
            errors = grads_vs_reference(
                lambda x, w: cpu_bigconv2d(x, w, 1, "SAME", algorithm=algorithm,
                                           data_format="NCHW"), x, w, fmt="NCHW")
            assert max(errors) <= TOLERANCE[dtype], (dtype, "nchw depthwise", algorithm, errors)
        e = tfbigconv.explain(*NCHW_DEPTHWISE, padding="SAME", dtype=dtype, data_format="NCHW")
        kernels = {r.algorithm for r in e.rows if r.algorithm.startswith("tf") and r.available}
        assert kernels == ({"tf.DepthwiseConv2dNative"} if onednn else set()), (dtype, kernels)


def exact_tf_kernels(monkeypatch, dtype, error=0.0, fail=False):
    """Replaces TF's three kernels as conv.py emits them by float64 results
    (our direct kernel) rounded to dtype, after a relative error of `error`
    (NaN: NaN results); fail: they raise as TF's Eigen kernels do on NCHW."""
    def pass_fn(pass_, a, b, sizes):
        def run(a, b):
            if fail:
                raise tf.errors.InvalidArgumentError(None, None, "no NCHW here")
            out = _core.run_pass("direct", pass_, a.numpy().astype(np.float64),
                                 b.numpy().astype(np.float64), list(sizes), *attrs)
            noise = np.random.default_rng(0).standard_normal(out.shape)
            return out + error * np.linalg.norm(out) / np.sqrt(out.size) * noise
        result = tf.py_function(run, [a, b], tf.float64)
        return tf.cast(result, dtype)

    attrs = None

    def with_attrs(a):
        nonlocal attrs
        attrs = (a["strides"], a["padding"], a["explicit_paddings"], a["data_format"],
                 a["dilations"])

    def forward(x, w, a, depthwise=None):
        with_attrs(a)
        return pass_fn("forward", x, w, [])

    def backprop_input(sizes, w, dy, a, in_depth, depthwise=None):
        with_attrs(a)
        return pass_fn("backprop_input", dy, w, tf.get_static_value(sizes).tolist())

    def backprop_filter(x, f_shape, dy, a, depthwise=None):
        with_attrs(a)
        return pass_fn("backprop_filter", x, dy, list(f_shape))

    monkeypatch.setattr(conv, "_tf_forward", forward)
    monkeypatch.setattr(conv, "_tf_backprop_input", backprop_input)
    monkeypatch.setattr(conv, "_tf_backprop_filter", backprop_filter)


@pytest.mark.parametrize("kernel,fmt", [("Conv2D", "NHWC"), ("DepthwiseConv2dNative", "NHWC"),
                                        ("DepthwiseConv2dNative", "NCHW")])
def test_onednn_check_accepts_only_kernels_that_run_and_are_precise(monkeypatch, kernel, fmt):
    """The check itself, on stand-ins for TF's kernels: exact results pass;
    an error of 5x bfloat16's rounding (as TF's Eigen kernels accumulate),
    NaN, or a kernel that raises does not; and without oneDNN nothing is run."""
    monkeypatch.setattr(cost_model, "tf_onednn", lambda: True)
    cases = [(0.0, False, True), (5 * 2.0 ** -9, False, False), (np.nan, False, False),
             (0.0, True, False)]
    try:
        for error, fail, want in cases:
            dispatch._onednn_probe.cache_clear()
            exact_tf_kernels(monkeypatch, tf.bfloat16, error, fail)
            assert dispatch.tf_cpu_onednn(kernel, "bfloat16", False, fmt) is want, (error, fail)
        dispatch._onednn_probe.cache_clear()
        monkeypatch.setattr(cost_model, "tf_onednn", lambda: False)
        exact_tf_kernels(monkeypatch, tf.bfloat16, fail=True)
        assert dispatch.tf_cpu_onednn(kernel, "bfloat16", False, fmt) is False
    finally:
        dispatch._onednn_probe.cache_clear()


# ---- an unknown batch is planned at trace time -----------------------------

def test_unknown_batch_is_planned_at_trace_time(monkeypatch, model):
    planned = []
    real = dispatch.plan

    def spy(pass_, input_shape, *args, **kwargs):
        planned.append((pass_, list(input_shape)))
        return real(pass_, input_shape, *args, **kwargs)

    monkeypatch.setattr(dispatch, "plan", spy)
    # A 3x3 dense layer where the model puts TF's Conv2D far ahead (whatever the
    # active profile says of it): TF's Conv2D, as with a known batch.
    model("im2col_flops_per_second", 100)
    w = rand((3, 3, 8, 8), 40)
    f = tf.function(lambda x: tfbigconv.bigconv2d(x, w, 1, "SAME"),
                    input_signature=[tf.TensorSpec([None, 28, 28, 8])])
    types = {op.type for op in f.get_concrete_function().graph.get_operations()}
    model("im2col_flops_per_second", 0.01)
    assert "Conv2D" in types and "BigConv2D" not in types
    assert planned and all(s == [dispatch.ASSUMED_BATCH, 28, 28, 8] for _, s in planned)
    x = rand((3, 28, 28, 8), 41)
    assert rel_l2(f(x).numpy(), conv2d_reference(x, w, (1, 1), "SAME")) < 1e-5

    # A large filter: our ops, each pass with its trace-time plan.
    w = rand((21, 21, 2, 3), 42)

    @tf.function(input_signature=[tf.TensorSpec([None, 40, 40, 2])])
    def grads(x):
        with tf.GradientTape() as t:
            t.watch(x)
            y = tfbigconv.bigconv2d(x, w, 1, "SAME")
            loss = tf.reduce_sum(y * y)
        return y, t.gradient(loss, x)

    ops = grads.get_concrete_function().graph.get_operations()
    for op_type in ("BigConv2D", "BigConv2DBackpropInput"):
        found = [op for op in ops if op.type == op_type]
        assert len(found) == 1 and found[0].get_attr("planned_algorithm") in (b"direct", b"fft")
    x = rand((3, 40, 40, 2), 43)
    y, dx = grads(x)
    y_ref = conv2d_reference(x, w, (1, 1), "SAME")
    assert rel_l2(y.numpy(), y_ref) < 1e-4
    dx_ref = conv2d_reference_backprop_input(2 * y_ref, w, x.shape, (1, 1), "SAME")
    assert rel_l2(dx.numpy(), dx_ref) < 1e-4
