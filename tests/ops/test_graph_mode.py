"""bigconv2d from the doors a TF1 user takes, under auto with autotuning on,
each in a fresh process with an empty autotune cache: a warm cache or an
earlier eager call in the same process once hid a crash here (trace-time
timing and the oneDNN probe read tensors of the graph being built)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

# Prelude of every script: a float64 reference by rel. L2, and the result line.
PRELUDE = """
import json, os, sys, warnings
warnings.simplefilter("ignore")
import numpy as np
import tensorflow as tf
def rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300)
    return float(err) if np.isfinite(err) else 1e300
def report(**values):
    print("RESULT " + json.dumps(values))
"""


def run_fresh(tmp_path, body, autotune="1"):
    """Runs PRELUDE + body in a new Python with an empty autotune cache; returns
    the dict it reported."""
    env = dict(os.environ, TFBIGCONV_AUTOTUNE=autotune,
               TFBIGCONV_AUTOTUNE_CACHE=str(tmp_path / "autotune.json"),
               TF_CPP_MIN_LOG_LEVEL="3")
    script = PRELUDE + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=600)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_tf_graph_pointwise_depthwise(tmp_path):
    r = run_fresh(tmp_path, """
        import tfbigconv
        x, w = np.random.rand(4, 5, 5, 48), np.random.rand(1, 1, 1, 96)
        with tf.Graph().as_default():
            y = tfbigconv.bigconv2d(x, w, 1, "SAME")
            want = tf.nn.conv2d(x, w, 1, "SAME")
            with tf.compat.v1.Session() as s:
                got, want = s.run([y, want])
        report(err=rel(got, want), shape=list(got.shape))
    """)
    assert r["shape"] == [4, 5, 5, 96] and r["err"] < 1e-12


def test_tf_graph_onednn_probe_without_autotuning(tmp_path):
    # The oneDNN probe runs whatever TFBIGCONV_AUTOTUNE says.
    r = run_fresh(tmp_path, """
        import tfbigconv
        x, w = np.ones([1, 3, 4, 1]), np.ones([1, 2, 1, 1])
        with tf.Graph().as_default():
            y = tfbigconv.bigconv2d(x, w, 1, "VALID", dilations=[2, 1])
            want = tf.nn.conv2d(x, w, 1, "VALID", dilations=[2, 1])
            with tf.compat.v1.Session() as s:
                got, want = s.run([y, want])
        report(err=rel(got, want), shape=list(got.shape))
    """, autotune="0")
    assert r["shape"] == [1, 3, 3, 1] and r["err"] < 1e-12


SESSION_SCRIPT = """
    import tfbigconv
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 40, 37, 2)).astype(np.float32)
    w = rng.standard_normal((15, 15, 2, 3)).astype(np.float32)
    errors = {}
    with tf.Graph().as_default():
        for name, shape in (("batch_none", [None, 40, 37, 2]),
                            ("all_none", [None, None, None, 2])):
            xp = tf.compat.v1.placeholder(tf.float32, shape)
            wv = tf.constant(w)
            got = tfbigconv.bigconv2d(xp, wv, [1, 2], "SAME", dilations=1)
            want = tf.nn.conv2d(xp, wv, [1, 2], "SAME")
            gy = tf.constant(rng.standard_normal((3, 40, 19, 3)).astype(np.float32))
            grads = tf.compat.v1.gradients(got, [xp, wv], grad_ys=gy)
            wants = tf.compat.v1.gradients(want, [xp, wv], grad_ys=gy)
            with tf.compat.v1.Session() as s:
                out = s.run([got, want] + grads + wants, {xp: x})
            errors[name] = [rel(out[0], out[1]), rel(out[2], out[4]), rel(out[3], out[5])]
    report(**errors)
"""


def test_compat_v1_session_with_placeholders_and_gradients(tmp_path):
    r = run_fresh(tmp_path, SESSION_SCRIPT)
    for name, errs in r.items():
        assert max(errs) < 1e-5, (name, errs)


def test_disable_v2_behavior(tmp_path):
    r = run_fresh(tmp_path, "tf.compat.v1.disable_v2_behavior()\n"
                  + textwrap.dedent(SESSION_SCRIPT))
    for name, errs in r.items():
        assert max(errs) < 1e-5, (name, errs)


def test_rank5_input_in_a_tf1_graph(tmp_path):
    r = run_fresh(tmp_path, """
        import tfbigconv
        rng = np.random.default_rng(1)
        x = rng.standard_normal((2, 5, 9, 8, 3)).astype(np.float32)
        w = rng.standard_normal((3, 3, 3, 4)).astype(np.float32)
        with tf.Graph().as_default():
            xp = tf.compat.v1.placeholder(tf.float32, [None, None, 9, 8, 3])
            got = tfbigconv.bigconv2d(xp, w, 1, "SAME")
            want = tf.nn.conv2d(xp, w, 1, "SAME")
            g, gw = tf.compat.v1.gradients(got, xp)[0], tf.compat.v1.gradients(want, xp)[0]
            with tf.compat.v1.Session() as s:
                a, b, c, d = s.run([got, want, g, gw], {xp: x})
        report(err=rel(a, b), grad=rel(c, d), shape=list(a.shape), static=str(got.shape))
    """)
    assert r["shape"] == [2, 5, 9, 8, 4] and r["err"] < 1e-5 and r["grad"] < 1e-5, r
    assert r["static"] == "(None, None, 9, 8, 4)"


def test_fuse_linear_on_depthwise_chain(tmp_path):
    # fuse.compose_kernels calls bigconv2d while Keras builds a graph.
    r = run_fresh(tmp_path, """
        import keras, tfbigconv
        inp = keras.Input((33, 35, 8))
        y = inp
        for _ in range(3):
            y = keras.layers.DepthwiseConv2D(7, padding="same")(y)
        model = keras.Model(inp, y)
        fused, reports = tfbigconv.fuse_linear(model)
        x = np.random.default_rng(2).standard_normal((2, 33, 35, 8)).astype(np.float32)
        report(err=rel(fused(x), model(x)), fused=len(reports))
    """)
    assert r["err"] < 1e-5 and r["fused"] == 1, r


def test_tf1_session_bigconv1d_and_bigconv3d_with_placeholders(tmp_path):
    """The other ranks from a TF1 graph: unknown shapes fed in a Session, a
    tf.gradients gradient, in a fresh process."""
    r = run_fresh(tmp_path, """
        import tfbigconv
        x3, w3 = np.random.rand(2, 7, 8, 9, 4), np.random.rand(3, 3, 3, 2, 6)
        x1, w1 = np.random.rand(2, 50, 4), np.random.rand(9, 1, 4)
        with tf.Graph().as_default():
            p3 = tf.compat.v1.placeholder(tf.float64, [None, None, None, None, 4])
            p1 = tf.compat.v1.placeholder(tf.float64, [None, None, 4])
            y3 = tfbigconv.bigconv3d(p3, w3, 2, "SAME")
            y1 = tfbigconv.bigconv1d(p1, w1, 1, "CAUSAL")
            g3 = tf.gradients(tf.reduce_sum(y3 * y3), p3)[0]
            want3 = tf.nn.conv3d(p3[..., :2], w3[..., :3], [1, 2, 2, 2, 1], "SAME")
            want1 = tf.nn.depthwise_conv2d(tf.pad(p1, [[0, 0], [8, 0], [0, 0]])[:, None],
                                           np.reshape(w1, (1, 9, 4, 1)), [1] * 4, "VALID")[:, 0]
            with tf.compat.v1.Session() as s:
                a3, b3, a1, c3, c1 = s.run([y3, g3, y1, want3, want1], {p3: x3, p1: x1})
        report(err3=rel(a3[..., :3], c3), err1=rel(a1, c1), grad_shape=list(b3.shape))
    """)
    assert r["err3"] < 1e-12 and r["err1"] < 1e-12 and r["grad_shape"] == [2, 7, 8, 9, 4]


@pytest.mark.native  # the routes are our planner's; the pure-TF path is tf.nn.conv3d
@pytest.mark.parametrize("autotune", ["0", "1"])
def test_tf1_session_bigconv3d_auto_with_static_shapes(tmp_path, autotune):
    """bigconv3d's trace-time plan from a TF1 graph, in a fresh process: each pass
    TF's Conv3D or our op, with tf.gradients, against tf.nn.conv3d. By the
    estimates alone (autotuning off), where TF runs oneDNN, a small filter goes
    to TF's Conv3D and a large one to our ops."""
    r = run_fresh(tmp_path, """
        import tfbigconv
        from tfbigconv.planning import tf_rules
        errs, types = [], []
        for xs, ws in (((2, 6, 12, 12, 16), (3, 3, 3, 16, 16)), ((1, 12, 16, 16, 2), (9, 9, 9, 2, 2))):
            x, w = np.random.rand(*xs).astype(np.float32), np.random.rand(*ws).astype(np.float32)
            with tf.Graph().as_default() as g:
                xt, wt = tf.constant(x), tf.constant(w)
                y = tfbigconv.bigconv3d(xt, wt, 1, "SAME")
                grads = tf.gradients(tf.reduce_sum(y * y), [xt, wt])
                types.append(sorted({op.type for op in g.get_operations()
                                     if "Conv3D" in op.type}))  # ours, before the reference
                x64, w64 = tf.constant(x, tf.float64), tf.constant(w, tf.float64)
                want = tf.nn.conv3d(x64, w64, [1] * 5, "SAME")
                wants = tf.gradients(tf.reduce_sum(want * want), [x64, w64])
                with tf.compat.v1.Session() as s:
                    got, ref = s.run([[y] + grads, [want] + wants])
            errs.append(max(rel(a, b) for a, b in zip(got, ref)))
        report(errs=errs, types=types, onednn=tf_rules.tf_cpu_onednn("Conv3D", "float32", False))
    """, autotune=autotune)
    assert all(e < 1e-4 for e in r["errs"]), r
    small, large = r["types"]
    if autotune == "0":  # timings may choose otherwise
        assert ("Conv3D" in small) == r["onednn"] and ("BigConv3D" in small) != r["onednn"], r
        assert "BigConv3D" in large and "Conv3D" not in large, r
