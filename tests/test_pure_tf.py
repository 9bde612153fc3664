"""bigconv2d as pure TensorFlow (tfbigconv/pure_tf.py): under XLA
(tf.function(jit_compile=True), Keras' jit_compile=True), forced with
TFBIGCONV_PURE_TF=1, and where the compiled library does not load."""
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from conftest import TESTS_DIR, TOLERANCE, random_case, rel_l2, run_python
from reference import (conv2d_reference, conv2d_reference_backprop_filter,
                       conv2d_reference_backprop_input)
from tfbigconv import _core
from tfbigconv import pure_tf

# The geometry cases: every padding mode, strides, dilations, groups (dense,
# grouped, depthwise with a multiplier), both layouts.
CASES = [
    ((2, 19, 23, 3), (7, 5, 3, 4), 1, 1, "SAME", "NHWC"),
    ((2, 20, 17, 4), (9, 9, 2, 6), 2, 1, "VALID", "NHWC"),
    ((1, 31, 29, 6), (5, 7, 1, 12), 1, 2, "SAME", "NHWC"),
    ((2, 4, 19, 17), (7, 7, 2, 4), (2, 3), (1, 2), [[0, 0], [0, 0], [1, 3], [4, 0]], "NCHW"),
    ((1, 40, 37, 2), (15, 15, 2, 3), (1, 2), 1, [[0, 0], [6, 0], [0, 7], [0, 0]], "NHWC"),
    ((1, 3, 26, 30), (11, 13, 3, 2), 1, (2, 1), "SAME", "NCHW"),
]
DTYPES = ["float32", "float64", "float16", "bfloat16"]
# The FFT's rounding error beside the kernels' (float32: up to ~3e-7 x max|y|).
FFT_TOLERANCE = {"float64": 1e-10, "float32": 2e-5}


def _tolerance(dtype):
    return max(TOLERANCE[dtype], FFT_TOLERANCE.get(dtype, 0))


def _nhwc(shape, fmt):
    return shape if fmt == "NHWC" else (shape[0], shape[2], shape[3], shape[1])


def _pairs(padding, fmt):
    if not isinstance(padding, list):
        return padding, ((0, 0), (0, 0))
    p = padding if fmt == "NHWC" else [padding[0], padding[2], padding[3], padding[1]]
    return "EXPLICIT", (tuple(p[1]), tuple(p[2]))


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def test_good_fft_size_is_the_planners():
    sizes = list(range(1, 3000)) + [2**32 - 5, 2**32]  # the planner's table ends at 2^32
    assert [pure_tf.good_fft_size(n) for n in sizes] == [_core.good_fft_size(n) for n in sizes]


@pytest.mark.parametrize("algorithm", ["auto", "fft", "direct"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=[str(c[:2]) for c in CASES])
def test_xla_forward_and_gradients_match_the_reference(case, dtype, algorithm):
    """Under jit_compile: forward and both gradients against the float64
    reference, as the kernels are held to outside XLA."""
    xs, ws, s, d, padding, fmt = case
    x = tf.cast(random_case(xs, 1, np.float64), dtype)
    w = tf.cast(random_case(ws, 2, np.float64), dtype)
    kw = dict(strides=s, padding=padding, data_format=fmt, dilations=d)

    @tf.function(jit_compile=True)
    def step(x, w, dy):
        with tf.GradientTape() as t:
            t.watch([x, w])
            y = tfbigconv.bigconv2d(x, w, algorithm=algorithm, **kw)
        return (y,) + tuple(t.gradient(y, [x, w], output_gradients=dy))

    pad, pairs = _pairs(padding, fmt)
    rk = dict(strides=_pair(s), padding=pad, dilations=_pair(d), data_format=fmt, explicit=pairs)
    x64, w64 = tf.cast(x, tf.float64).numpy(), tf.cast(w, tf.float64).numpy()
    y_ref = conv2d_reference(x64, w64, **rk)
    dy = tf.cast(random_case(y_ref.shape, 3, np.float64), dtype)
    dy64 = tf.cast(dy, tf.float64).numpy()
    refs = (y_ref, conv2d_reference_backprop_input(dy64, w64, x64.shape, **rk),
            conv2d_reference_backprop_filter(x64, dy64, w64.shape, **rk))
    for got, ref, what in zip(step(x, w, dy), refs, ("y", "dL/dx", "dL/dw")):
        assert got.dtype == dtype and got.shape == ref.shape, what
        err = rel_l2(tf.cast(got, tf.float64).numpy(), ref)
        assert err <= _tolerance(dtype), f"{what}: rel L2 {err}"


@pytest.mark.parametrize("algorithm", ["fft", "direct"])
def test_xla_second_order_matches_the_kernels(algorithm):
    """d/dw of |dL/dx|^2 under XLA equals the same outside it (our ops' registered
    gradients of gradients)."""
    x = tf.constant(random_case((2, 16, 18, 2), 4, np.float64))
    w = tf.constant(random_case((9, 7, 2, 3), 5, np.float64))

    def second(x, w):
        with tf.GradientTape() as outer:
            outer.watch(w)
            with tf.GradientTape() as inner:
                inner.watch(x)
                y = tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm=algorithm)
                loss = tf.reduce_sum(y * y)
            dx = inner.gradient(loss, x)
            g = tf.reduce_sum(dx * dx)
        return outer.gradient(g, w)

    got = tf.function(second, jit_compile=True)(x, w).numpy()
    want = second(x, w).numpy()
    assert rel_l2(got, want) <= 1e-10


@pytest.mark.native
def test_xla_builds_no_custom_op_and_outside_xla_the_kernels_run():
    x, w = tf.TensorSpec((1, 40, 40, 1), tf.float32), tf.TensorSpec((31, 31, 1, 2), tf.float32)

    def fn(x, w):
        return tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm="fft")

    inside = {op.type for op in tf.function(fn, jit_compile=True).get_concrete_function(x, w)
              .graph.get_operations()}
    outside = {op.type for op in tf.function(fn).get_concrete_function(x, w).graph.get_operations()}
    assert "BigConv2D" not in inside and "RFFT2D" in inside
    assert "BigConv2D" in outside


def test_xla_with_unknown_spatial_shapes_runs_tf_conv():
    """Unknown height and width under XLA: TF's convolution (XLA compiles it per
    shape), never a custom op."""
    spec = tf.TensorSpec((None, None, None, 2), tf.float32)
    fn = tf.function(lambda x: tfbigconv.bigconv2d(x, tf.ones((21, 21, 2, 3)), 1, "SAME"),
                     jit_compile=True, input_signature=[spec])
    x = random_case((1, 30, 25, 2), 6)
    got = fn(tf.constant(x)).numpy()
    assert rel_l2(got, conv2d_reference(x, np.ones((21, 21, 2, 3)), padding="SAME")) <= 1e-5
    types = {op.type for op in fn.get_concrete_function().graph.get_operations()}
    assert "BigConv2D" not in types and "Conv2D" in types


def test_estimates_pick_tf_conv_for_small_filters_and_fft_for_large():
    def fft_wins(geometry, xla=True):
        conv, fft = pure_tf.estimates(*geometry.values(), xla=xla)
        return fft < conv

    big = dict(n=16, h=321, w=481, cin=1, cout=3, kh=135, kw=135, groups=1, fft_h=324,
               fft_w=486, out_h=187, out_w=347)
    assert fft_wins(big)
    small = dict(big, cin=16, cout=16, kh=3, kw=3, out_h=319, out_w=479)
    assert not fft_wins(small)
    # XLA's depthwise convolution is slow on the CPU: the FFT wins there even at 3x3.
    dw = dict(n=8, h=56, w=56, cin=128, cout=128, kh=3, kw=3, groups=128, fft_h=60, fft_w=60,
              out_h=56, out_w=56)
    assert fft_wins(dw, xla=True)
    assert not fft_wins(dw, xla=False)


@pytest.mark.parametrize("algorithm", ["auto", "fft", "direct"])
def test_forced_pure_tf_builds_no_custom_op(monkeypatch, algorithm):
    monkeypatch.setenv(pure_tf.PURE_TF_ENV, "1")
    x, w = random_case((2, 24, 20, 4), 7), random_case((9, 9, 2, 4), 8)
    fn = tf.function(lambda x, w: tfbigconv.bigconv2d(x, w, 2, "SAME", algorithm=algorithm))
    types = {op.type for op in fn.get_concrete_function(tf.constant(x), tf.constant(w))
             .graph.get_operations()}
    assert not any(t.startswith("BigConv2D") for t in types)
    got = fn(tf.constant(x), tf.constant(w)).numpy()
    assert rel_l2(got, conv2d_reference(x, w, (2, 2), "SAME")) <= _tolerance("float32")


def test_fft_chunks_over_the_batch_within_the_workspace_limit(monkeypatch):
    """A workspace_limit smaller than the batch's spectra: the batch runs in
    chunks (several transforms), with the same result."""
    monkeypatch.setenv(pure_tf.PURE_TF_ENV, "1")
    x, w = random_case((5, 30, 30, 2), 9), random_case((15, 15, 2, 2), 10)
    per_image = (2 + 2) * 30 * 16 * 8  # (cin + cout) spectra of 30 x 30, complex64
    fn = tf.function(lambda x, w: tfbigconv.bigconv2d(x, w, 1, "VALID", algorithm="fft",
                                                      workspace_limit=2 * per_image))
    g = fn.get_concrete_function(tf.constant(x), tf.constant(w)).graph
    assert sum(op.type == "RFFT2D" for op in g.get_operations()) == 1 + 3  # filter + 3 chunks
    got = fn(tf.constant(x), tf.constant(w)).numpy()
    assert rel_l2(got, conv2d_reference(x, w)) <= _tolerance("float32")


def test_pure_tf_rejects_a_filter_larger_than_the_input(monkeypatch):
    with pytest.raises(ValueError, match="larger than the padded input"):
        pure_tf.check_geometry((1, 10, 10, 1), (12, 3, 1, 1), [1] * 4, "VALID", [], "NHWC",
                               [1] * 4)
    # One row more than the input is an empty output, as in tf.nn.conv2d.
    pure_tf.check_geometry((1, 10, 10, 1), (11, 3, 1, 1), [1] * 4, "VALID", [], "NHWC", [1] * 4)
    with pytest.raises(ValueError, match="multiple"):
        pure_tf.check_geometry((1, 10, 10, 3), (3, 3, 2, 1), [1] * 4, "VALID", [], "NHWC",
                               [1] * 4)


def test_without_the_compiled_library_import_warns_and_layers_run(tmp_path):
    """The package without its compiled modules (as after a TensorFlow upgrade
    or without a compiler): import tfbigconv warns once with the cause and the
    rebuild command; a .keras model saved with the library loads and gives the
    same output; what needs the library says so."""
    import keras
    pkg = os.path.dirname(tfbigconv.__file__)
    copy = tmp_path / "site" / "tfbigconv"
    shutil.copytree(pkg, copy, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    model = keras.Sequential([keras.Input((24, 24, 2)),
                              tfbigconv.keras.BigConv2D(3, 15, padding="same"),
                              tfbigconv.keras.BigDepthwiseConv2D(5, padding="same")])
    path = str(tmp_path / "m.keras")
    model.save(path)
    x = random_case((2, 24, 24, 2), 11)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", model(x).numpy())
    out = run_python(f"""
        import warnings
        import numpy as np
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import tfbigconv
            import tfbigconv.keras
        said = [str(w.message) for w in caught if "compiled library" in str(w.message)]
        assert len(said) == 1, said
        assert "pip install" in said[0] and "_core" in said[0], said[0]
        assert tfbigconv.__file__.startswith({str(tmp_path)!r})
        import keras
        m = keras.models.load_model({path!r})
        y = m(np.load({str(tmp_path / "x.npy")!r})).numpy()
        want = np.load({str(tmp_path / "y.npy")!r})
        print("rel", np.linalg.norm(y - want) / np.linalg.norm(want))
        try:
            tfbigconv.explain((1, 8, 8, 1), (3, 3, 1, 1))
        except ImportError as e:
            assert "compiled library" in str(e), e
            print("explain: ImportError")
        """, cwd=str(tmp_path), env={"PYTHONPATH": str(tmp_path / "site") + os.pathsep +
                                     os.path.join(TESTS_DIR)})
    assert "explain: ImportError" in out, out
    rel = float(out.split("rel ")[1].split()[0])
    assert rel <= 2e-5, out


def test_padding_rule_is_the_cores():
    """pure_tf's Python copies of the shape rules (they must run without _core)
    agree with _core.conv_geometry: output sizes, and which geometries fail."""
    rng = np.random.default_rng(12)
    for _ in range(400):
        fmt = ["NHWC", "NCHW"][rng.integers(2)]
        k, s, d = rng.integers(1, 8, 2), rng.integers(1, 4, 2), rng.integers(1, 4, 2)
        size = rng.integers(1, 20, 2)
        mode = ["SAME", "VALID", "EXPLICIT"][rng.integers(3)]
        pads = rng.integers(0, 5, 4)
        hd, wd = (1, 2) if fmt == "NHWC" else (2, 3)
        in_shape = [2, 0, 0, 3] if fmt == "NHWC" else [2, 3, 0, 0]
        in_shape[hd], in_shape[wd] = int(size[0]), int(size[1])
        strides, dil, explicit = [1] * 4, [1] * 4, []
        strides[hd], strides[wd], dil[hd], dil[wd] = int(s[0]), int(s[1]), int(d[0]), int(d[1])
        if mode == "EXPLICIT":
            explicit = [0] * 8
            explicit[2 * hd:2 * hd + 2] = [int(pads[0]), int(pads[1])]
            explicit[2 * wd:2 * wd + 2] = [int(pads[2]), int(pads[3])]
        f_shape = [int(k[0]), int(k[1]), 3, 4]
        args = (in_shape, f_shape, strides, mode, explicit, fmt, dil)
        try:
            want = _core.conv_geometry(*args)["output_shape"]
        except ValueError:
            with pytest.raises(ValueError):
                pure_tf.check_geometry(*args)
            continue
        pure_tf.check_geometry(*args)
        got = [pure_tf.pads_1d(in_shape[dd], f_shape[i], strides[dd], dil[dd], mode,
                               explicit[2 * dd:2 * dd + 2])[2] for i, dd in enumerate((hd, wd))]
        assert got == [want[hd], want[wd]], args


def test_explain_xla_shows_the_pure_tf_plan():
    big = tfbigconv.explain((16, 321, 481, 1), (135, 135, 1, 3), padding="VALID", xla=True)
    assert big.chosen == {"forward": "fft", "backprop_input": "fft", "backprop_filter": "fft"}
    assert "rfft2d/irfft2d 324x486" in str(big)  # good sizes of the 321 x 481 input
    small = tfbigconv.explain((8, 64, 64, 16), (3, 3, 16, 16), padding="SAME", xla=True)
    assert set(small.chosen.values()) == {"tf"} and "TensorFlow's convolution" in str(small)
    with pytest.raises(tf.errors.InvalidArgumentError, match="larger than the padded input"):
        tfbigconv.explain((1, 8, 8, 1), (10, 3, 1, 1), xla=True)
