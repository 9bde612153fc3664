"""bigconv1d, bigconv2d and bigconv3d as pure TensorFlow (tfbigconv/pure_tf/):
under XLA (tf.function(jit_compile=True), Keras' jit_compile=True), forced with
TFBIGCONV_PURE_TF=1, and where the compiled library does not load. The plan's
pure functions: pure_tf/test_plans.py; the DFT of portable(): pure_tf/test_dft.py."""
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from conftest import TESTS_DIR, TOLERANCE, random_case, rel_l2, run_python, second_order_grads
from reference import (conv2d_reference, conv2d_reference_backprop_filter,
                       conv2d_reference_backprop_input, conv3d_reference, conv3d_reference_grads)
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


# ---- Gradients on the pure-TF path in 1-D, 2-D and 3-D (issue 52, item 6) ----------------
# TF's own CPU kernels have no grouped gradient, no dilated gradient and no dilated
# Conv3D (oneDNN's grouped gradient fails with explicit padding): the pure path must
# compose the convolution from ops that have them on every host.
# (rank, input shape, filter shape, strides, dilations, padding, data_format)
GRAD_CASES = [
    (1, (2, 23, 4), (5, 1, 8), 1, 1, "CAUSAL", "NWC"),                       # depthwise x2
    (1, (2, 4, 21), (6, 1, 4), 2, 1, [[0, 0], [0, 0], [3, 1]], "NCW"),       # depthwise
    (1, (1, 19, 6), (4, 2, 6), 2, 3, "CAUSAL", "NWC"),                       # 3 groups
    (2, (2, 11, 13, 4), (3, 5, 2, 6), (2, 1), 1, "SAME", "NHWC"),            # 2 groups
    (2, (1, 12, 13, 3), (3, 3, 1, 6), (2, 3), 1, [[0, 0], [1, 2], [0, 3], [0, 0]], "NHWC"),
    (2, (2, 3, 14, 12), (3, 3, 1, 3), 2, (2, 3), "SAME", "NCHW"),           # depthwise
    (2, (1, 4, 13, 15), (3, 4, 2, 4), (1, 2), 2, [[0, 0], [0, 0], [2, 0], [1, 3]], "NCHW"),
    (3, (1, 9, 8, 10, 2), (3, 2, 3, 2, 3), 1, (2, 1, 3), "SAME", "NDHWC"),   # dilated
    (3, (2, 8, 9, 7, 3), (3, 3, 2, 1, 6), (2, 1, 3), (2, 2, 1),
     [[0, 0], [1, 1], [2, 0], [0, 2], [0, 0]], "NDHWC"),                     # depthwise
    (3, (1, 4, 7, 8, 9), (2, 3, 3, 2, 4), (3, 1, 2), (2, 2, 1), "VALID", "NCDHW"),  # 2 groups
]
GRAD_IDS = [f"{c[0]}d-{c[6]}-{'explicit' if isinstance(c[5], list) else c[5]}-"
            f"{'depthwise' if c[2][-2] == 1 else 'groups'}-s{c[3]}-d{c[4]}" for c in GRAD_CASES]
CONV = {1: tfbigconv.bigconv1d, 2: tfbigconv.bigconv2d, 3: tfbigconv.bigconv3d}


def _per_dim(v, rank):
    return (v,) * rank if isinstance(v, int) else tuple(v)


def _as_3d(case):
    """The case as conv3d_reference's arguments (1-D and 2-D with depth, height 1):
    (to_3d(x), to_3d(w), from_3d(y), strides, padding, dilations, data_format, pads)."""
    rank, xs, ws, s, d, padding, fmt = case
    s, d, extra = _per_dim(s, rank), _per_dim(d, rank), 3 - rank
    last = fmt.endswith("C")
    at = 1 if last else 2  # where the missing spatial dimensions go

    def to_3d(x):
        return x.reshape(x.shape[:at] + (1,) * extra + x.shape[at:])

    def from_3d(y):
        return y.reshape(y.shape[:at] + y.shape[at + extra:])

    if padding == "CAUSAL":
        pad, pads = "EXPLICIT", ((0, 0),) * extra + (((ws[0] - 1) * d[0], 0),)
    elif isinstance(padding, list):
        spatial = padding[1:-1] if last else padding[2:]
        pad, pads = "EXPLICIT", ((0, 0),) * extra + tuple(map(tuple, spatial))
    else:
        pad, pads = padding, ((0, 0),) * 3
    return (to_3d, (lambda w: w.reshape((1,) * extra + w.shape)), from_3d, (1,) * extra + s,
            pad, (1,) * extra + d, "NDHWC" if last else "NCDHW", pads)


def _reference(case, x, w, dy):
    """(y, dL/dx, dL/dw) of the case in float64, for the output gradient dy."""
    to_3d, w3, from_3d, s, pad, d, fmt, pads = _as_3d(case)
    y = conv3d_reference(to_3d(x), w3(w), s, pad, d, fmt, pads)
    dx, dw = conv3d_reference_grads(to_3d(x), w3(w), to_3d(dy), s, pad, d, fmt, pads)
    return from_3d(y), from_3d(dx), dw.reshape(w.shape)


def _second_order_reference(case, x, w):
    """second_order_grads (conftest) of the case in float64. The convolution C is
    bilinear, with adjoints Bx (backprop input) and Bw (backprop filter): for
    y = C(x, w), gx = 2 Bx(y, w), gw = 2 Bw(x, y), s = |gx|^2 + sum(gw sin gw),
    a = 2 gx, b = sin gw + gw cos gw and z = 2 C(a, w) + 2 C(x, b):
    ds/dx = Bx(z, w) + 2 Bx(y, b), ds/dw = Bw(x, z) + 2 Bw(a, y)."""
    def c(x, w):
        return _conv(case, x, w)

    def bx(dy, w):
        return _reference(case, x, w, dy)[1]

    def bw(x, dy):
        return _reference(case, x, w, dy)[2]

    y = c(x, w)
    gx, gw = 2 * bx(y, w), 2 * bw(x, y)
    a, b = 2 * gx, np.sin(gw) + gw * np.cos(gw)
    z = 2 * c(a, w) + 2 * c(x, b)
    return bx(z, w) + 2 * bx(y, b), bw(x, z) + 2 * bw(a, y)


def _conv(case, x, w):
    to_3d, w3, from_3d, s, pad, d, fmt, pads = _as_3d(case)
    return from_3d(conv3d_reference(to_3d(x), w3(w), s, pad, d, fmt, pads))


def _step(case, algorithm, xla):
    """(y, dL/dx, dL/dw) of the case for x, w and the output gradient dy."""
    rank, _, _, s, d, padding, fmt = case

    def step(x, w, dy):
        with tf.GradientTape() as t:
            t.watch([x, w])
            y = CONV[rank](x, w, s, padding, fmt, d, algorithm=algorithm)
        return (y,) + tuple(t.gradient(y, [x, w], output_gradients=dy))
    return tf.function(step, jit_compile=True) if xla else step


@pytest.mark.parametrize("xla", [False, True], ids=["outside-xla", "xla"])
@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("case", GRAD_CASES, ids=GRAD_IDS)
def test_grouped_depthwise_dilated_gradients_match_the_reference(monkeypatch, case, algorithm,
                                                                  xla):
    """Forward and both gradients of grouped and depthwise filters (1-D, 2-D, 3-D),
    dilations (3-D too), CAUSAL and explicit padding, strides beside dilations, on
    TF's convolution ("direct") and the FFT, against the float64 reference."""
    monkeypatch.setenv(pure_tf.PURE_TF_ENV, "1")
    _, xs, ws = case[:3]
    x, w = random_case(xs, 21, np.float64), random_case(ws, 22, np.float64)
    dy = random_case(_conv(case, x, w).shape, 23, np.float64)
    got = _step(case, algorithm, xla)(tf.constant(x), tf.constant(w), tf.constant(dy))
    for g, ref, what in zip(got, _reference(case, x, w, dy), ("y", "dL/dx", "dL/dw")):
        assert g.shape == ref.shape, what
        assert rel_l2(g.numpy(), ref) <= FFT_TOLERANCE["float64"], what


@pytest.mark.parametrize("xla", [False, True], ids=["outside-xla", "xla"])
@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("case", [GRAD_CASES[i] for i in (0, 1, 4, 6, 8, 9)],
                         ids=[GRAD_IDS[i] for i in (0, 1, 4, 6, 8, 9)])
def test_second_order_gradients_match_the_reference(monkeypatch, case, algorithm, xla):
    """Gradients of a penalty on the first gradients (conftest.second_order_grads)
    of depthwise, grouped and dilated cases, against the float64 reference."""
    monkeypatch.setenv(pure_tf.PURE_TF_ENV, "1")
    rank, xs, ws, s, d, padding, fmt = case
    x, w = random_case(xs, 24, np.float64), random_case(ws, 25, np.float64)
    fn = lambda x, w: second_order_grads(  # noqa: E731
        lambda x, w: CONV[rank](x, w, s, padding, fmt, d, algorithm=algorithm), x, w)
    got = (tf.function(fn, jit_compile=True) if xla else fn)(tf.constant(x), tf.constant(w))
    for g, ref, what in zip(got, _second_order_reference(case, x, w), ("d/dx", "d/dw")):
        assert rel_l2(g.numpy(), ref) <= FFT_TOLERANCE["float64"], what


@pytest.mark.parametrize("dtype", DTYPES)
def test_3d_fft_under_xla_in_every_dtype(dtype):
    """The 3-D FFT (rfft2d over height x width, a complex FFT over depth) under
    jit_compile: forward and both gradients, half precision computed in float32."""
    case = GRAD_CASES[8]
    _, xs, ws = case[:3]
    x = tf.cast(random_case(xs, 26, np.float64), dtype)
    w = tf.cast(random_case(ws, 27, np.float64), dtype)
    x64, w64 = tf.cast(x, tf.float64).numpy(), tf.cast(w, tf.float64).numpy()
    dy = tf.cast(random_case(_conv(case, x64, w64).shape, 28, np.float64), dtype)
    step = _step(case, "fft", xla=True)
    types = {op.type for op in step.get_concrete_function(x, w, dy).graph.get_operations()}
    assert {"RFFT2D", "FFT", "IFFT", "IRFFT2D"} <= types and "Conv3D" not in types
    got = step(x, w, dy)
    refs = _reference(case, x64, w64, tf.cast(dy, tf.float64).numpy())
    for g, ref, what in zip(got, refs, ("y", "dL/dx", "dL/dw")):
        assert g.dtype == dtype, what
        assert rel_l2(tf.cast(g, tf.float64).numpy(), ref) <= _tolerance(dtype), what


def test_large_3d_filter_under_xla_runs_the_fft():
    """Under XLA, auto runs a large 3-D filter as FFTs (rfft2d over height x width,
    complex FFTs over depth), a small one as XLA's convolution."""
    def types(x_shape, w_shape):
        fn = tf.function(lambda x, w: tfbigconv.bigconv3d(x, w, 1, "SAME"), jit_compile=True)
        return {op.type for op in fn.get_concrete_function(
            tf.TensorSpec(x_shape, tf.float32), tf.TensorSpec(w_shape, tf.float32))
            .graph.get_operations()}

    big = types((2, 24, 24, 24, 2), (15, 15, 15, 2, 2))
    assert {"RFFT2D", "FFT", "IFFT", "IRFFT2D"} <= big and "Conv3D" not in big
    small = types((2, 24, 24, 24, 16), (3, 3, 3, 16, 16))
    assert "Conv3D" in small and "RFFT2D" not in small


def test_3d_fft_chunks_over_the_batch_within_the_workspace_limit(monkeypatch):
    monkeypatch.setenv(pure_tf.PURE_TF_ENV, "1")
    x, w = random_case((5, 9, 10, 11, 2), 29), random_case((5, 5, 5, 2, 3), 30)
    p = pure_tf.plan(list(x.shape), list(w.shape), [1] * 5, "VALID", [], "NDHWC", [1] * 5,
                     "float32", "fft", 0, xla=False)
    fn = tf.function(lambda x, w: tfbigconv.bigconv3d(
        x, w, 1, "VALID", algorithm="fft", workspace_limit=2 * p.per_image_bytes))
    g = fn.get_concrete_function(tf.constant(x), tf.constant(w)).graph
    assert sum(op.type == "RFFT2D" for op in g.get_operations()) == 1 + 3  # filter + 3 chunks
    got = fn(tf.constant(x), tf.constant(w)).numpy()
    assert rel_l2(got, conv3d_reference(x, w)) <= _tolerance("float32")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shapes", [((2, 40, 40, 3), (25, 25, 1, 3)),
                                    ((1, 12, 12, 12, 4), (9, 9, 9, 2, 4))],
                         ids=["2d-depthwise", "3d-groups"])
def test_half_precision_on_tf_convolution_accumulates_in_float32(monkeypatch, dtype, shapes):
    """TensorFlow's convolution on the pure path ("direct"; outside XLA) in float16
    and bfloat16 keeps the precision of our kernels and the FFT (TF's CPU kernels
    may accumulate in half precision: a depthwise float16 filter of 625 taps)."""
    monkeypatch.setenv(pure_tf.PURE_TF_ENV, "1")
    xs, ws = shapes
    conv = tfbigconv.bigconv2d if len(xs) == 4 else tfbigconv.bigconv3d
    x = tf.cast(random_case(xs, 31, np.float64), dtype)
    w = tf.cast(random_case(ws, 32, np.float64) / np.sqrt(np.prod(ws[:-2])), dtype)
    y = conv(x, w, 1, "SAME", algorithm="direct")
    x64, w64 = tf.cast(x, tf.float64).numpy(), tf.cast(w, tf.float64).numpy()
    ref = (conv2d_reference(x64, w64, padding="SAME") if len(xs) == 4 else
           conv3d_reference(x64, w64, padding="SAME"))
    assert y.dtype == dtype
    assert rel_l2(tf.cast(y, tf.float64).numpy(), ref) <= TOLERANCE[dtype]


@pytest.mark.parametrize("case", [GRAD_CASES[i] for i in (3, 5, 7)],
                         ids=[GRAD_IDS[i] for i in (3, 5, 7)])
def test_unknown_spatial_shapes_gradients_match_the_reference(monkeypatch, case):
    """Only the batch and channels known when the graph is built: TensorFlow's
    convolution with SAME's padding computed in the graph, groups and dilations,
    forward and gradients."""
    monkeypatch.setenv(pure_tf.PURE_TF_ENV, "1")
    rank, xs, ws, s, d, padding, fmt = case
    x, w = random_case(xs, 33, np.float64), random_case(ws, 34, np.float64)
    dy = random_case(_conv(case, x, w).shape, 35, np.float64)
    c = 1 if fmt.startswith("NC") else rank + 1
    spec = [None] * (rank + 2)
    spec[c] = xs[c]
    step = tf.function(_step(case, "direct", xla=False), input_signature=[
        tf.TensorSpec(spec, tf.float64), tf.TensorSpec(ws, tf.float64),
        tf.TensorSpec([None] * (rank + 2), tf.float64)])
    for g, ref, what in zip(step(x, w, dy), _reference(case, x, w, dy), ("y", "dL/dx", "dL/dw")):
        assert rel_l2(g.numpy(), ref) <= TOLERANCE["float64"], what
