"""The dispatcher (tfbigconv/dispatch.py, conv.py): algorithm="auto" picks
im2col, direct or fft per pass; the overrides; explain() and the CLI; the
calibration round trip into both compiled modules."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from tfbigconv import _core, cost_model
from conftest import rel_l2

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


@pytest.fixture
def model():
    """Lets a test change _core's cost model (the trace-time planner's); restores it."""
    saved = _core.get_cost_model()
    fields = _core.cost_model_fields()

    def scale(prefix, factor):
        values = _core.get_cost_model()
        for i, name in enumerate(fields):
            if name.startswith(prefix):
                values[i] *= factor
        _core.set_cost_model(values)

    yield scale
    _core.set_cost_model(saved)


def test_small_filter_runs_tf_conv2d_and_large_filter_runs_fft():
    x_shape, w_shape, pad = SMALL
    e = tfbigconv.explain(x_shape, w_shape, padding=pad)
    assert e.chosen["forward"] == "im2col"
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
    """Forward on im2col, backprop_filter moved off it by the model: the
    gradient mixes TF's Conv2DBackpropInput with our BigConv2DBackpropFilter,
    and first and second order match tf.nn.conv2d's."""
    model("im2col_flops_per_second.forward", 1e6)
    model("im2col_flops_per_second.backprop_input", 1e6)
    model("im2col_flops_per_second.backprop_filter", 1e-6)
    x_shape, w_shape, pad = (2, 20, 23, 3), (5, 5, 3, 4), "SAME"
    e = tfbigconv.explain(x_shape, w_shape, padding=pad)
    assert e.chosen["forward"] == "im2col" and e.chosen["backprop_input"] == "im2col"
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


def test_registered_gradient_uses_im2col_where_it_wins(model):
    """Forward on our op (direct), backprop_input moved to im2col by the model."""
    model("im2col_flops_per_second.forward", 1e-6)
    model("im2col_flops_per_second.backprop_input", 1e6)
    x_shape, w_shape, pad = (2, 20, 23, 3), (5, 5, 3, 4), "VALID"
    e = tfbigconv.explain(x_shape, w_shape, padding=pad)
    assert e.chosen["forward"] != "im2col" and e.chosen["backprop_input"] == "im2col"
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


def test_im2col_is_never_chosen_where_tf_cannot_run_it():
    # NCHW: TF's CPU Conv2D runs only NHWC (without oneDNN).
    e = tfbigconv.explain((2, 16, 32, 32), (3, 3, 16, 16), padding="SAME", data_format="NCHW")
    assert "im2col" not in e.chosen.values()
    assert all("NHWC" in r.note for r in e.rows if r.algorithm == "im2col")
    # Grouped and dilated: TF's CPU gradients reject them.
    for kwargs in ({}, {"dilations": 2}):
        w = (3, 3, 4, 16) if not kwargs else (3, 3, 16, 16)
        e = tfbigconv.explain((2, 32, 32, 16), w, padding="SAME", **kwargs)
        assert e.chosen["backprop_input"] != "im2col" and e.chosen["backprop_filter"] != "im2col"
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
    assert rel_l2(f(x).numpy(), tf.nn.conv2d(x, w, 1, "SAME").numpy()) < 1e-5


def test_environment_override(monkeypatch):
    x, w = rand((1, 16, 16, 2), 12), rand((3, 3, 2, 2), 13)
    conv = lambda x: tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm="fft")
    monkeypatch.setenv("TFBIGCONV_ALGORITHM", "direct")
    ops = [op for op in graph_ops(conv, x) if op.type == "BigConv2D"]
    assert ops[0].get_attr("algorithm") == b"direct"
    monkeypatch.setenv("TFBIGCONV_ALGORITHM", "im2col")
    assert "Conv2D" in op_types(conv, x)
    monkeypatch.setenv("TFBIGCONV_ALGORITHM", "fastest")
    with pytest.raises(tf.errors.InvalidArgumentError, match="TFBIGCONV_ALGORITHM"):
        conv(x)


def test_forced_im2col_is_tf_conv2d():
    x, w = rand((2, 12, 13, 3), 14), rand((4, 4, 3, 5), 15)
    np.testing.assert_array_equal(tfbigconv.bigconv2d(x, w, 2, "SAME", algorithm="im2col"),
                                  tf.nn.conv2d(x, w, 2, "SAME"))


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
        assert [r.algorithm for r in rows] == ["im2col", "direct", "fft"]
        assert sum(r.chosen for r in rows) == 1
        chosen = next(r for r in rows if r.chosen)
        assert chosen.fits and chosen.workspace_bytes <= e.budget
        assert e.reasons[p].startswith("auto: " + chosen.algorithm)
    # One image's patch matrix of a 135x135 filter is 4.4 GiB: over the budget.
    im2col = next(r for r in e.rows if r.algorithm == "im2col")
    assert im2col.workspace_bytes == 187 * 347 * 135 * 135 * 4 and not im2col.fits
    text = str(e)
    assert text.count("<==") == 3 and "forward: auto: fft" in text
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
    assert "forward: auto: fft" in r.stdout and "workspace budget 256.0 MiB" in r.stdout
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


def test_calibration_round_trip(tmp_path):
    cache = tmp_path / "cache"
    r = run(["-m", "tfbigconv", "calibrate", "--quick"], XDG_CACHE_HOME=str(cache))
    assert r.returncode == 0, r.stderr
    profile = cache / "tfbigconv" / "cost_model.json"
    doc = json.loads(profile.read_text())
    assert doc["meta"]["quick"] and doc["meta"]["format"] == cost_model.FORMAT
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
