"""Odd and extreme input (issue 15's fuzz findings): no crash, and no silent
difference from tf.nn.conv2d. Probes that could kill the process run in a
subprocess (probe_worker.py), so that a crash fails the test, not pytest.
(Finding 4, corrupt cost-model profiles: cost_model/test_profiles.py; the
command line's bad arguments: test_cli.py.)"""
import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfbigconv
from tfbigconv import _core

from conftest import TOLERANCE, random_case
from reference import conv2d_reference, rel_l2

HERE = os.path.dirname(os.path.abspath(__file__))
ALGORITHMS = ("auto", "direct", "fft")


class Worker:
    """probe_worker.py in a subprocess; restarted after a probe kills it."""

    def __init__(self, env=None):
        self.proc = None
        self.env = None if env is None else dict(os.environ, **env)

    def probe(self, **p):
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "probe_worker.py")],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True, cwd=HERE,
                                         env=self.env)
        defaults = dict(kind="run", strides=1, padding="VALID", data_format="NHWC", dilations=1,
                        algorithm="auto", workspace_limit=0, budget=None)
        self.proc.stdin.write(json.dumps(dict(defaults, **p)) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            pytest.fail(f"the process died (exit status {code}) on probe {p}")
        return json.loads(line)

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()


@pytest.fixture(scope="module")
def tf_shapes():
    """The shape oracle: eager tf.nn.conv2d on TF's own kernels. TF 2.21's oneDNN
    Conv2D returns wrong shapes for empty outputs (probe_worker._compare)."""
    w = Worker(env={"TF_ENABLE_ONEDNN_OPTS": "0"})
    yield w
    w.close()


def tf_shape(tf_shapes, input, filter, **kwargs):
    """tf.nn.conv2d's output shape on TF's own kernels, or None if TF refuses."""
    r = tf_shapes.probe(kind="tf_shape", input=input, filter=filter, **kwargs)
    assert r["outcome"] in ("ok", "InvalidArgumentError"), r
    return r.get("shape")


def expect_clean(result, probe, tf_shapes):
    """ok, agreeing with tf.nn.conv2d wherever it ran, or a named TF error."""
    # tf.nn.conv2d's classes (tests/test_arguments.py); ValueError and TypeError
    # only from bigconv2d's own checks.
    assert result["outcome"] in ("ok", "InvalidArgumentError", "ResourceExhaustedError",
                                 "UnimplementedError", "not_reached") or (
        result["outcome"] in ("ValueError", "TypeError") and result["from_bigconv2d"]), \
        (probe, result)
    assert not result.get("differs"), (probe, result)
    if result["outcome"] == "ok" and probe["kind"] in ("run", "grad"):
        # Where TF refuses the arguments, only the values check above applies.
        keys = ("input", "filter", "strides", "padding", "data_format", "dilations")
        want = tf_shapes.probe(kind="tf_shape", **{k: probe[k] for k in keys})
        assert want["outcome"] != "ok" or result["shape"] == want["shape"], (probe, result, want)


# ---- finding 1: output depth 0 (was SIGFPE) ------------------------------------------

@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_output_depth_zero_is_empty_like_tf(worker, algorithm):
    for kind in ("run", "grad", "trace"):
        r = worker.probe(kind=kind, input=[1, 5, 5, 2], filter=[3, 3, 2, 0], padding="SAME",
                         algorithm=algorithm)
        assert r["outcome"] == "ok" and r["shape"] == [1, 5, 5, 0] and not r.get("differs"), r


def test_output_depth_zero_explain_and_core(worker):
    assert worker.probe(kind="explain", input=[1, 5, 5, 2], filter=[3, 3, 2, 0],
                        padding="SAME")["outcome"] == "ok"
    code = ("from tfbigconv import _core\n"
            "a = ([1, 5, 5, 2], [3, 3, 2, 0], [1, 1, 1, 1], 'SAME', [], 'NHWC', [1, 1, 1, 1])\n"
            "for p in ('forward', 'backprop_input', 'backprop_filter'):\n"
            "    _core.plan_pass(*a, p, 'float32', 'CPU', 'auto', 1 << 30, 2, 'Conv2D')\n"
            "    _core.plan_pass(*a, p, 'float32', 'GPU', 'auto', 1 << 30, 2, 'Conv2D')\n"
            "_core.direct_blocking(*a)\n"
            "for p in ('backprop_input', 'backprop_filter'):\n"
            "    print(p)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=HERE)
    assert r.returncode == 0, r.stderr[-2000:]
    out = subprocess.run([sys.executable, "-m", "tfbigconv", "explain", "--input", "1,5,5,2",
                          "--filter", "3,3,2,0", "--padding", "SAME"],
                         capture_output=True, text=True, cwd=HERE)
    assert out.returncode == 0, out.stderr[-2000:]


def test_output_depth_zero_gradients_are_zeros():
    x, w = random_case((1, 5, 5, 2), 0), np.zeros((3, 3, 2, 0), np.float32)
    for algorithm in ALGORITHMS:
        xt, wt = tf.constant(x), tf.constant(w)
        with tf.GradientTape() as tape:
            tape.watch([xt, wt])
            y = tfbigconv.bigconv2d(xt, wt, 1, "SAME", algorithm=algorithm)
        dx, dw = tape.gradient(y, [xt, wt], output_gradients=tf.zeros_like(y))
        assert y.shape == (1, 5, 5, 0) and dw.shape == (3, 3, 2, 0)
        np.testing.assert_array_equal(dx.numpy(), np.zeros_like(x))


# ---- finding 5: empty spatial input, and outputs TF's rounding leaves empty -----------

@pytest.mark.parametrize("case", [
    ([1, 0, 5, 2], [3, 3, 2, 3], 1, "SAME"),
    ([1, 0, 5, 2], [1, 1, 2, 3], 1, "VALID"),
    ([1, 0, 5, 2], [3, 3, 2, 3], 2, "SAME"),
    ([1, 4, 5, 2], [7, 1, 2, 3], 2, "VALID"),  # (4 - 7 + 2) / 2 rounds to 0 in TF
    ([1, 8, 8, 2], [9, 3, 2, 3], 1, "VALID"),
    ([0, 5, 5, 2], [3, 3, 2, 3], 1, "SAME"),
])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_empty_outputs_like_tf(worker, tf_shapes, case, algorithm):
    x, w, s, pad = case
    want = tf_shape(tf_shapes, x, w, strides=s, padding=pad)
    for kind in ("grad", "trace"):
        r = worker.probe(kind=kind, input=x, filter=w, strides=s, padding=pad, algorithm=algorithm)
        assert r["outcome"] == "ok" and r["shape"] == want and not r.get("differs"), r


@pytest.mark.parametrize("x_shape,padding", [([1, 0, 5, 2], "SAME"), ([1, 4, 5, 2], "VALID")])
def test_empty_output_gradients_are_zeros(x_shape, padding):
    """Where TF 2.21 leaves them uninitialised: every gradient entry is an empty sum."""
    x, w = tf.constant(random_case(x_shape, 0)), tf.constant(random_case((7, 3, 2, 3), 1))
    for algorithm in ALGORITHMS:
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            y = tfbigconv.bigconv2d(x, w, 2, padding, algorithm=algorithm)
        dx, dw = tape.gradient(y, [x, w], output_gradients=tf.zeros_like(y))
        assert y.shape[1] == 0
        np.testing.assert_array_equal(dx.numpy(), np.zeros(x_shape, np.float32))
        np.testing.assert_array_equal(dw.numpy(), np.zeros((7, 3, 2, 3), np.float32))


def test_empty_input_filter_gradient_is_zeros():
    x, w = tf.zeros([1, 0, 5, 2]), tf.constant(random_case((3, 3, 2, 3), 1))
    for algorithm in ALGORITHMS:
        with tf.GradientTape() as tape:
            tape.watch(w)
            y = tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm=algorithm)
        dw = tape.gradient(y, w, output_gradients=tf.zeros_like(y))
        np.testing.assert_array_equal(dw.numpy(), np.zeros((3, 3, 2, 3), np.float32))


@pytest.mark.parametrize("n", [0, 1, 2, 4, 5])
@pytest.mark.parametrize("k", [1, 2, 3, 6, 9])
@pytest.mark.parametrize("s", [1, 2, 3])
def test_output_sizes_and_errors_match_tf(tf_shapes, n, k, s):
    """Eager tf.nn.conv2d (TF's own kernels) is the reference: the same shape, or both refuse."""
    for pad in ("SAME", "VALID", [[0, 0], [1, 2], [0, 1], [0, 0]]):
        want = tf_shape(tf_shapes, [1, n, 4, 1], [k, 2, 1, 1], strides=s, padding=pad)
        explicit = [] if isinstance(pad, str) else [v for p in pad for v in p]
        try:
            got = _core.conv_geometry([1, n, 4, 1], [k, 2, 1, 1], [1, s, s, 1],
                                      pad if isinstance(pad, str) else "EXPLICIT", explicit,
                                      "NHWC", [1, 1, 1, 1]).output_shape
        except ValueError as e:
            assert "larger than the padded input" in str(e)
            got = None
        assert got == want, (n, k, s, pad)


# ---- findings 2 and 3: NaN, Inf and overflow through the FFT ------------------------

def assert_like(got, ref, tol):
    """NaN and Inf where ref has them (same sign), within tol elsewhere."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(ref))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref))
    finite = np.isfinite(ref)
    assert np.isfinite(got[finite]).all()
    assert rel_l2(got[finite], ref[finite]) <= tol


@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_non_finite_input_like_tf(algorithm, poison):
    x = random_case((1, 16, 16, 1), 0)
    x[0, 3, 4, 0] = poison
    w = random_case((5, 5, 1, 2), 1)
    got = tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm=algorithm)
    assert_like(got, tf.nn.conv2d(x, w, 1, "SAME"), 1e-4)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_non_finite_filter_like_tf(algorithm):
    x = random_case((1, 16, 16, 2), 0)
    w = random_case((5, 5, 2, 3), 1)
    w[1, 2, 0, 1] = np.nan
    got = tfbigconv.bigconv2d(x, w, 1, "VALID", algorithm=algorithm)
    assert_like(got, tf.nn.conv2d(x, w, 1, "VALID"), 1e-4)


def test_masked_pixel_gradients_under_auto_like_tf():
    """The issue's training case: one NaN pixel, a 31x31 filter, auto."""
    x = random_case((1, 64, 64, 1), 0)
    x[0, 20, 33, 0] = np.nan
    x, w = tf.constant(x), tf.constant(random_case((31, 31, 1, 2), 1))
    dy = tf.constant(random_case((1, 34, 34, 2), 2))

    def grads(conv):
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            loss = tf.reduce_sum(conv(x, w) * dy)
        return tape.gradient(loss, [x, w])

    ours = grads(lambda x, w: tfbigconv.bigconv2d(x, w, 1, "VALID"))
    ref = grads(lambda x, w: tf.nn.conv2d(x, w, 1, "VALID"))
    for got, want in zip(ours, ref):
        assert_like(got, want, 1e-4)


@pytest.mark.parametrize("pass_", ["forward", "backprop_input", "backprop_filter"])
@pytest.mark.parametrize("strides,dil", [(1, 1), (2, 1), (1, 2), (3, 2)])
def test_core_fft_non_finite_tiles_match_direct(pass_, strides, dil):
    """Small tiles and chunks (a tight workspace limit): only the poisoned tiles fall
    back, and every pass gives the direct kernel's NaN/Inf placement and values."""
    from conftest import run_core, run_core_pass
    rng = np.random.default_rng(3)
    x, w = random_case((2, 40, 37, 3), 0), random_case((4, 5, 3, 4), 1)
    for _ in range(3):
        x[rng.integers(2), rng.integers(40), rng.integers(37), rng.integers(3)] = np.nan
    x[1, 5, 6, 2] = np.inf
    geo = _core.conv_geometry(list(x.shape), list(w.shape), [1, strides, strides, 1], "SAME", [],
                              "NHWC", [1, dil, dil, 1])
    dy = random_case(geo.output_shape, 2)
    dy[0, 1, 2, 3] = -np.inf
    a, b, sizes = {"forward": (x, w, []), "backprop_input": (dy, w, list(x.shape)),
                   "backprop_filter": (x, dy, list(w.shape))}[pass_]
    if pass_ == "backprop_input":
        a = np.where(np.isfinite(a), a, 0).astype(np.float32)
        a[0, 0, 1, 1] = np.nan
    common = dict(strides=strides, padding="SAME", dil=dil)

    def run(kind, **kw):
        if pass_ == "forward":
            return run_core(kind, a, b, **common, **kw)
        return run_core_pass(kind, pass_, a, b, sizes, **common, **kw)

    plan = _core.fft_plan(list(x.shape), list(w.shape), [1, strides, strides, 1], "SAME", [],
                          "NHWC", [1, dil, dil, 1], workers=2)
    for divisor in (16, 4, 1):  # the smallest workspace the pass allows: many tiles and chunks
        try:
            fft = run("fft", workspace_limit=plan.workspace_bytes // divisor, num_threads=2)
            break
        except ValueError:
            continue
    assert_like(fft, run("direct"), 1e-4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fft_does_not_overflow_where_the_result_is_finite(dtype):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((1, 16, 16, 2)) * 1e30).astype(np.float32)
    w = (rng.standard_normal((7, 7, 2, 2)) * 1e5).astype(np.float32)
    xt, wt = tf.cast(x, dtype), tf.cast(w, dtype)
    ref = conv2d_reference(tf.cast(xt, tf.float64).numpy(), tf.cast(wt, tf.float64).numpy(),
                           (1, 1), "SAME", (1, 1), "NHWC", ((0, 0), (0, 0)))
    assert np.isfinite(ref).all() and np.abs(ref).max() > 1e35
    for algorithm in ALGORITHMS:
        got = tf.cast(tfbigconv.bigconv2d(xt, wt, 1, "SAME", algorithm=algorithm), tf.float64)
        assert np.isfinite(got.numpy()).all(), algorithm
        assert rel_l2(got.numpy(), ref) <= TOLERANCE[dtype], algorithm


# ---- findings 6 and 7: arguments --------------------------------------------------

X, W = random_case((1, 8, 8, 2), 0), random_case((3, 3, 2, 4), 1)


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(workspace_limit=2**63), "workspace_limit"),
    (dict(workspace_limit=2**64), "workspace_limit"),
    (dict(workspace_limit=-1), "workspace_limit"),
    (dict(workspace_limit=1.5), "workspace_limit"),
    (dict(strides=2**63), "strides"),
    (dict(dilations=2**64), "dilations"),
    (dict(strides="2"), "strides"),
    (dict(strides=2.0), "strides"),
    (dict(strides=[True, True]), "strides"),
    (dict(dilations=[1.7, 1.2]), "dilations"),
    (dict(dilations="1"), "dilations"),
    (dict(padding=[[0, 0], [1.5, 1], [1, 1], [0, 0]]), "explicit padding"),
    (dict(padding=[[0, 0], [2**63, 1], [1, 1], [0, 0]]), "explicit padding"),
    (dict(padding=[[0, 0], [2**31, 1], [1, 1], [0, 0]]), "explicit padding"),
    (dict(padding=[[0, 0], "ab", [1, 1], [0, 0]]), "padding"),
    (dict(padding=None), "padding"),
])
def test_bad_arguments_are_named(kwargs, fragment):
    """Our own workspace_limit: InvalidArgumentError; the form of tf.nn.conv2d's
    arguments: ValueError, the class tf.nn.conv2d's Python raises for it (TypeError
    for a padding of None, as its op definition; strides None means 1 there)."""
    args = dict(input=X, filters=W, strides=1, padding="VALID")
    args.update(kwargs)
    error = (tf.errors.InvalidArgumentError if "workspace_limit" in kwargs
             else TypeError if kwargs == dict(padding=None) else ValueError)
    with pytest.raises(error, match=fragment):
        tfbigconv.bigconv2d(**args)


@pytest.mark.parametrize("args,kwargs,fragment", [
    (([1, 2**31, 2**31, 1], [2**31, 2**31, 1, 1]), {}, "overflow"),
    (([1, "5", 5, 1], [3, 3, 1, 1]), {}, "input_shape"),
    (([1, 5.0, 5, 1], [3, 3, 1, 1]), {}, "input_shape"),
    (([1, 2**63, 5, 1], [3, 3, 1, 1]), {}, "input_shape"),
    ((tf.TensorShape([None, 5, 5, 1]), [3, 3, 1, 1]), {}, "input_shape"),
    ((None, [3, 3, 1, 1]), {}, "input_shape"),
    (([1, 5, 5, 1], None), {}, "filter_shape"),
    (([1, 5, 5, 1], [3, 3, 1, 1]), dict(budget=2**70), "budget"),
    (([1, 5, 5, 1], [3, 3, 1, 1]), dict(budget=0), "budget"),
    (([1, 5, 5, 1], [3, 3, 1, 1]), dict(padding=[[0, 0], [2**62, 0], [0, 0], [0, 0]]),
     "explicit padding"),
])
def test_explain_bad_arguments_are_named(args, kwargs, fragment):
    with pytest.raises(tf.errors.InvalidArgumentError, match=fragment):
        tfbigconv.explain(*args, **kwargs)


@pytest.mark.parametrize("in_shape,f_shape,pads,fragment", [
    ([1, 5, 5, 1], [3, 3, 1, 1], [2**62, 2**62], "padded input size overflows"),
    ([1, 5, 5, 1], [3, 3, 1, 1], [2**62, 0], "output's size in bytes"),
    ([1, 2**31, 2**31, 1], [2**31, 2**31, 1, 1], [0, 0], "input's size in bytes"),
    ([1, 2**28, 2**28, 1], [2**28, 2**28, 1, 1], [0, 0], "input gradient's multiply-adds"),
])
def test_geometry_size_arithmetic_is_checked(in_shape, f_shape, pads, fragment):
    """Sizes that overflow int64 anywhere are named errors, never wrapped numbers."""
    with pytest.raises(ValueError, match=fragment):
        _core.conv_geometry(in_shape, f_shape, [1, 1, 1, 1], "EXPLICIT",
                            [0, 0] + pads + [0, 0, 0, 0], "NHWC", [1, 1, 1, 1])


def test_planner_saturates_instead_of_wrapping():
    """Huge but representable problems: every workspace and time is non-negative, and
    nothing wrapped fits."""
    for pass_, device, stride in itertools.product(
            ("forward", "backprop_input", "backprop_filter"), ("CPU", "GPU"), (1, 2**30)):
        p = _core.plan_pass([1, 2**16, 2**16, 1], [2**14, 2**14, 1, 1], [1, stride, stride, 1],
                            "VALID", [], "NHWC", [1, 1, 1, 1], pass_, "float32", device,
                            "auto", 1 << 30, 2, "Conv2D")
        for name in ("tf", "direct", "fft"):
            e = getattr(p, name)
            assert e.workspace_bytes >= 0 and e.peak_bytes >= 0 and e.seconds >= 0
            assert not e.fits or e.workspace_bytes <= 1 << 30


def test_explain_accepts_tensor_shapes_and_numpy_ints():
    e = tfbigconv.explain(tf.TensorShape([1, 9, 9, 1]), np.array([3, 3, 1, 2]))
    assert e.geometry.output_shape == [1, 7, 7, 2]


# ---- fuzz: invalid and extreme arguments, each probe in the worker process ---------

DIMS = st.sampled_from([0, 1, 2, 3, 5, 8, 2**31, 2**62, 2**63 - 1, 2**63, -1])
SMALL = st.integers(0, 6)
SIZES = st.sampled_from([1, 2, 3, 2**31, 2**62, 2**63 - 1, 2**63, 0, -1, 1.5, "2", None])
PADDINGS = st.one_of(
    st.sampled_from(["SAME", "VALID", "same", "FULL", None]),
    st.lists(st.lists(st.sampled_from([0, 1, 3, 2**62, 2**63, -1, 1.5]), min_size=2, max_size=2),
             min_size=3, max_size=5))
PROBE = st.fixed_dictionaries(dict(
    kind=st.sampled_from(["run", "grad", "trace", "explain"]),
    small=st.booleans(),
    input=st.lists(DIMS, min_size=3, max_size=5),
    filter=st.lists(DIMS, min_size=3, max_size=5),
    small_input=st.tuples(SMALL, SMALL, SMALL, st.integers(1, 4)),
    small_filter=st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(1, 2), SMALL),
    strides=st.one_of(SIZES, st.lists(SIZES, min_size=1, max_size=4)),
    dilations=st.one_of(SIZES, st.lists(SIZES, min_size=2, max_size=2)),
    padding=PADDINGS,
    data_format=st.sampled_from(["NHWC", "NCHW", "nhwc", "HWNC"]),
    algorithm=st.sampled_from(list(ALGORITHMS) + ["tf", "magic"]),
    workspace_limit=st.sampled_from([0, 1, 4096, 2**63 - 1, 2**63, -1, 1.5]),
    budget=st.sampled_from([None, 1, 2**40, 2**63 - 1, 2**70, 0]),
))


def fuzz(worker, tf_shapes, p):
    if p.pop("small"):
        n, h, w_, c = p.pop("small_input")
        kh, kw, ci, co = p.pop("small_filter")
        p["input"], p["filter"] = [n, h, w_, c * ci], [kh, kw, ci, co]
    else:
        del p["small_input"], p["small_filter"]
        if p["kind"] in ("run", "grad"):  # no data for huge shapes: plan them only
            p["kind"] = "trace"
    expect_clean(worker.probe(**p), p, tf_shapes)


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(p=PROBE)
def test_fuzz_arguments(worker, tf_shapes, p):
    fuzz(worker, tf_shapes, p)


@pytest.mark.slow
@settings(max_examples=1500, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(p=PROBE)
def test_fuzz_arguments_long(worker, tf_shapes, p):
    fuzz(worker, tf_shapes, p)
