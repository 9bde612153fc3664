"""tfbigconv.portable(): exports that load and run where tfbigconv is not installed.

A Keras 3 model with BigConv2D, BigDepthwiseConv2D and BigConv1D is exported
inside portable() in every format Keras exports (and a tf.Module through
tf.saved_model.save), then run in a fresh interpreter that cannot import
tfbigconv (TensorFlow for the SavedModel, the LiteRT interpreter, onnxruntime),
whose outputs must match the Keras model's. The same SavedModel export outside
portable() holds our ops and must fail there: that proves the clean process has
no tfbigconv. LiteRT and ONNX are optional: their tests skip without them."""
import contextvars
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import tensorflow as tf

import keras
import tfbigconv
from conftest import ROOT, pure_tf_mode
from reference import conv2d_reference, conv3d_reference, rel_l2
from tfbigconv import pure_tf
from tfbigconv.keras import BigConv1D, BigConv2D, BigConv3D, BigDepthwiseConv2D

REASON = "tfbigconv.portable()"
# Where the native ops run, the reason the pure path would run anyway (--pure-tf).
PURE_ANYWAY = pure_tf_mode() or pure_tf.missing_library is not None
native = pytest.mark.skipif(PURE_ANYWAY, reason="needs our ops outside portable()")
HAVE_LITERT = importlib.util.find_spec("ai_edge_litert") is not None
HAVE_ONNX = all(importlib.util.find_spec(m) for m in ("tf2onnx", "onnxruntime"))
needs_litert = pytest.mark.skipif(not HAVE_LITERT, reason="needs ai-edge-litert (make deps)")
needs_onnx = pytest.mark.skipif(not HAVE_ONNX, reason="needs tf2onnx and onnxruntime (make deps)")
# Ops of the pure path's FFT that LiteRT's builtins or tf2onnx lack.
FFT_OPS = {"RFFT2D", "IRFFT2D", "RFFT", "IRFFT", "FFT", "IFFT", "Conj", "Complex", "Real", "Imag"}

# Runs each exported file in a process that cannot import tfbigconv: the name is
# blocked before anything else is imported (an installed copy would sit in
# site-packages, beside TensorFlow), and the source tree is off sys.path. Each
# runtime is imported only for its format: the LiteRT and ONNX files run without
# TensorFlow. Inputs are matched to a model's inputs by shape. Prints one JSON
# line: per model, its outputs' file or the error, and what of tfbigconv the
# process holds at the end (no module, no mapped op library).
CLEAN_LOADER = textwrap.dedent("""
    import json, os, sys
    sys.modules["tfbigconv"] = None  # `import tfbigconv` raises ImportError from here on
    root = os.path.realpath(sys.argv[2])
    sys.path = [p for p in sys.path if os.path.realpath(p or ".") != root]
    import numpy as np
    job = json.loads(sys.argv[1])
    data = np.load(job["inputs"])
    xs = [data[k] for k in sorted(data.files)]

    def by_shape(shape):
        return next(x for x in xs if list(x.shape) == list(shape))

    def saved_model(path, args_as_list):
        import tensorflow as tf
        loaded = tf.saved_model.load(path)
        args = [tf.constant(x) for x in xs]
        ys = loaded.serve(args) if args_as_list else loaded.serve(*args)
        return [y.numpy() for y in tf.nest.flatten(ys)]

    def litert(path, _):
        from ai_edge_litert.interpreter import Interpreter
        it = Interpreter(model_path=path)
        for d in it.get_input_details():  # the batch is dynamic in the file
            x = next(x for x in xs if x.shape[1:] == tuple(d["shape"][1:]))
            it.resize_tensor_input(d["index"], x.shape)
        it.allocate_tensors()
        for d in it.get_input_details():
            it.set_tensor(d["index"], by_shape(d["shape"]))
        it.invoke()
        return [it.get_tensor(d["index"]) for d in it.get_output_details()]

    def onnx(path, _):
        import onnxruntime as ort
        s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        feeds = {d.name: next(x for x in xs if list(x.shape[1:]) == d.shape[1:])
                 for d in s.get_inputs()}
        return s.run(None, feeds)

    result = {}
    for name, (fmt, path, args_as_list) in job["models"].items():
        try:
            ys = {"tf_saved_model": saved_model, "litert": litert, "onnx": onnx}[fmt](
                path, args_as_list)
        except Exception as e:
            result[name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        out = os.path.join(job["outdir"], name + ".npz")
        np.savez(out, *ys)
        result[name] = {"outputs": out}
    maps = "/proc/self/maps"
    result["loaded"] = sorted(m for m in sys.modules if m.startswith("tfbigconv")
                              and sys.modules[m] is not None)
    result["library_mapped"] = (os.path.exists(maps)
                                and "_bigconv_ops" in open(maps).read())
    print(json.dumps(result))
""")


def saved_op_types(path):
    """Every op type in a SavedModel's graph and its function library."""
    from tensorflow.core.protobuf import saved_model_pb2
    sm = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        sm.ParseFromString(f.read())
    types = set()
    for meta in sm.meta_graphs:
        types |= {n.op for n in meta.graph_def.node}
        for fn in meta.graph_def.library.function:
            types |= {n.op for n in fn.node_def}
    return types


def big_ops(types):
    return sorted(t for t in types if t.startswith("BigConv"))


def load_clean(models, inputs, tmp_path):
    """{name: outputs (list of arrays) or {"error": ...}} from the clean process,
    with what it had loaded of tfbigconv. models: {name: (format, path, args_as_list)}."""
    np.savez(tmp_path / "inputs.npz", **{f"x{i}": x for i, x in enumerate(inputs)})
    job = {"inputs": str(tmp_path / "inputs.npz"), "outdir": str(tmp_path), "models": models}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # -I: no PYTHONPATH, user site-packages nor current folder on sys.path
    proc = subprocess.run([sys.executable, "-I", "-c", CLEAN_LOADER, json.dumps(job), ROOT],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, r in result.items():
        if isinstance(r, dict) and "outputs" in r:
            with np.load(r["outputs"]) as f:
                result[name] = [f[k] for k in sorted(f.files, key=lambda s: int(s[4:]))]
    return result


def three_layer_model():
    """Two images through a BigConv2D and a BigDepthwiseConv2D (31x31: the pure
    path's FFT) and a sequence through a BigConv1D (TF's own convolution)."""
    keras.utils.set_random_seed(7)
    image, seq = keras.Input((48, 48, 2)), keras.Input((60, 3))
    outputs = [BigConv2D(3, 31, padding="same", bias_initializer="random_normal")(image),
               BigDepthwiseConv2D(31, padding="valid", depth_multiplier=2)(image),
               BigConv1D(4, 21, padding="causal", dilation_rate=2)(seq)]
    return keras.Model([image, seq], outputs)


def match_outputs(got, want):
    """Each output of `got` (in the runtime's order) against Keras' by shape."""
    assert isinstance(got, list), got  # not {"error": ...}
    assert sorted(g.shape for g in got) == sorted(w.shape for w in want)
    for g in got:
        w = next(w for w in want if w.shape == g.shape)
        err = rel_l2(g.astype(np.float64), w.astype(np.float64))
        assert err <= 1e-4, (g.shape, err)  # NaN fails


def litert_op_names(path):
    """The operator codes of a .tflite file: builtin names, or the custom code
    (SELECT_TF_OPS appear as "Flex" + TensorFlow's op type)."""
    from ai_edge_litert import schema_py_generated as schema
    with open(path, "rb") as f:
        model = schema.Model.GetRootAs(f.read(), 0)
    builtin = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    codes = [model.OperatorCodes(i) for i in range(model.OperatorCodesLength())]
    # deprecated_builtin_code holds codes below 127, builtin_code all (the schema's rule)
    return {c.CustomCode().decode() if c.CustomCode() else
            builtin[max(c.BuiltinCode(), c.DeprecatedBuiltinCode())] for c in codes}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The model, its inputs and Keras' outputs (our ops), and what the clean
    process made of its exports inside portable() (every format the converters
    here allow), of a SavedModel outside it, and of a tf.Module."""
    tmp = tmp_path_factory.mktemp("portable")
    model = three_layer_model()
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((2, 48, 48, 2)).astype(np.float32),
              rng.standard_normal((2, 60, 3)).astype(np.float32)]
    expected = [np.asarray(y) for y in model(inputs)]
    kernel = tf.constant(next(np.asarray(layer.kernel) for layer in model.layers
                              if isinstance(layer, BigConv2D)))
    models = {"portable": ("tf_saved_model", str(tmp / "portable"), True),
              "native": ("tf_saved_model", str(tmp / "native"), True)}
    with tfbigconv.portable():
        model.export(str(tmp / "portable"), format="tf_saved_model", verbose=False)
        if HAVE_LITERT:
            # Builtin ops only: the conversion fails where an op would need SELECT_TF_OPS.
            model.export(str(tmp / "model.tflite"), format="litert", verbose=False,
                         target_spec={"supported_ops": [tf.lite.OpsSet.TFLITE_BUILTINS]})
            models["litert"] = ("litert", str(tmp / "model.tflite"), True)
        if HAVE_ONNX:
            model.export(str(tmp / "model.onnx"), format="onnx", verbose=False)
            models["onnx"] = ("onnx", str(tmp / "model.onnx"), True)
        module = tf.Module()
        module.serve = tf.function(
            lambda x: tfbigconv.bigconv2d(x, kernel, 1, "SAME"),
            input_signature=[tf.TensorSpec((None, 48, 48, 2), tf.float32)])
        module.serve.get_concrete_function()  # traced inside: stock ops
        tf.saved_model.save(module, str(tmp / "module"))
    model.export(str(tmp / "native"), format="tf_saved_model", verbose=False)
    clean = load_clean(models, inputs, tmp)
    module_clean = load_clean({"module": ("tf_saved_model", str(tmp / "module"), False)},
                              inputs[:1], tmp)
    module_expected = tfbigconv.bigconv2d(inputs[0], kernel, 1, "SAME").numpy()
    return dict(tmp=tmp, model=model, expected=expected, clean=clean,
                module_clean=module_clean, module_expected=module_expected)


def test_portable_export_runs_without_tfbigconv(exported):
    clean = exported["clean"]
    assert clean["loaded"] == [] and not clean["library_mapped"]
    outputs = clean["portable"]
    assert isinstance(outputs, list), outputs
    assert len(outputs) == 3
    for got, want in zip(outputs, exported["expected"]):
        assert got.shape == want.shape
        err = rel_l2(got.astype(np.float64), want.astype(np.float64))
        assert err <= 1e-4, err  # NaN fails


def test_portable_export_holds_stock_ops_only(exported):
    types = saved_op_types(exported["tmp"] / "portable")
    assert big_ops(types) == []
    assert not types & FFT_OPS, types & FFT_OPS
    assert "BatchMatMulV2" in types  # the 31x31 filters took the DFT as matrix products


def test_portable_layers_take_the_dft_or_tf_convolution(exported):
    """The two 31x31 layers, which the pure path runs by FFT, run as the DFT in
    matrix products inside portable(); the BigConv1D stays on TF's convolution."""
    model = exported["model"]
    conv = {"Conv2D", "DepthwiseConv2dNative"}

    def types(layer):
        specs = [tf.TensorSpec((None, *t.shape[1:]), tf.float32)  # as model.export traces
                 for t in tf.nest.flatten(layer.input)]
        fn = tf.function(lambda *a: layer(*a))
        return {op.type for op in fn.get_concrete_function(*specs).graph.get_operations()}
    with tfbigconv.portable():
        seen = {type(layer).__name__: types(layer) for layer in model.layers
                if isinstance(layer, (BigConv2D, BigDepthwiseConv2D, BigConv1D))}
    for name in ("BigConv2D", "BigDepthwiseConv2D"):
        assert "BatchMatMulV2" in seen[name] and not seen[name] & (conv | FFT_OPS), seen[name]
    assert "Conv2D" in seen["BigConv1D"] and "BatchMatMulV2" not in seen["BigConv1D"]


@native
def test_export_outside_portable_keeps_our_ops(exported):
    """The check above can fail: the same export outside portable() holds
    BigConv2D, and the clean process cannot load it."""
    assert "BigConv2D" in big_ops(saved_op_types(exported["tmp"] / "native"))
    error = exported["clean"]["native"]
    assert isinstance(error, dict) and "Op type not registered" in error["error"], error


@needs_litert
def test_litert_export_runs_in_the_litert_interpreter(exported):
    match_outputs(exported["clean"]["litert"], exported["expected"])


@needs_litert
def test_litert_export_needs_builtin_ops_only(exported):
    """The op set docs/export.md lists: builtins, no SELECT_TF_OPS (Flex) and no
    FFT: the 31x31 layers as BATCH_MATMUL, the BigConv1D as CONV_2D."""
    ops = litert_op_names(str(exported["tmp"] / "model.tflite"))
    assert not [op for op in ops if op.startswith("Flex") or op == "CUSTOM"], ops
    assert not ops & {"RFFT2D", "REAL", "IMAG", "COMPLEX_ABS"}, ops
    assert {"BATCH_MATMUL", "CONV_2D"} <= ops, ops


@needs_onnx
def test_onnx_export_runs_in_onnxruntime(exported):
    match_outputs(exported["clean"]["onnx"], exported["expected"])
    import onnx
    ops = {n.op_type for n in onnx.load(str(exported["tmp"] / "model.onnx")).graph.node}
    assert "MatMul" in ops and "Conv" in ops and not ops & {"DFT", "STFT"}, ops


@native
def test_litert_export_outside_portable_fails_on_our_op(tmp_path):
    model = three_layer_model()
    with pytest.raises(Exception, match="BigConv2D"):  # TF's ConverterError, not public
        model.export(str(tmp_path / "ours.tflite"), format="litert", verbose=False,
                     target_spec={"supported_ops": [tf.lite.OpsSet.TFLITE_BUILTINS]})


def test_saved_model_save_of_a_module_traced_inside(exported):
    assert big_ops(saved_op_types(exported["tmp"] / "module")) == []
    clean = exported["module_clean"]
    assert clean["loaded"] == [] and not clean["library_mapped"]
    (got,) = clean["module"]
    want = exported["module_expected"]
    assert rel_l2(got.astype(np.float64), want.astype(np.float64)) <= 1e-4


@pytest.mark.parametrize("x_shape, f_shape, strides, padding, dilations, data_format", [
    ((2, 20, 23, 2), (7, 5, 2, 3), (1, 1), "SAME", (1, 1), "NHWC"),
    ((1, 20, 23, 4), (7, 5, 2, 6), (2, 3), "VALID", (1, 1), "NHWC"),  # groups 2, strides
    ((1, 20, 23, 3), (5, 6, 1, 6), (1, 1), "SAME", (2, 3), "NHWC"),  # depthwise, dilated
    ((1, 3, 19, 18), (9, 9, 1, 6), (2, 2), [[0, 0], [0, 0], [1, 4], [0, 3]], (1, 1), "NCHW"),
    ((1, 1, 60, 3), (1, 21, 3, 4), (1, 1), "VALID", (1, 2), "NHWC"),  # conv1d's shape
])
def test_portable_dft_matches_the_reference(x_shape, f_shape, strides, padding, dilations,
                                            data_format):
    """The DFT in matrix products, forced (algorithm "fft") inside portable(),
    against the float64 reference, with no FFT op in the graph."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(x_shape).astype(np.float32)
    f = rng.standard_normal(f_shape).astype(np.float32)
    spec = [tf.TensorSpec(x_shape, tf.float32), tf.TensorSpec(f_shape, tf.float32)]
    fn = tf.function(lambda x, f: tfbigconv.bigconv2d(
        x, f, strides, padding, data_format, dilations, algorithm="fft"), input_signature=spec)
    with tfbigconv.portable():
        graph_fn = fn.get_concrete_function()
    types = {op.type for op in graph_fn.graph.get_operations()}
    assert "BatchMatMulV2" in types and not types & FFT_OPS, types
    explicit = isinstance(padding, list)
    want = conv2d_reference(x, f, strides, "EXPLICIT" if explicit else padding, dilations,
                            data_format, explicit=padding[2:] if explicit else ((0, 0), (0, 0)))
    got = graph_fn(tf.constant(x), tf.constant(f)).numpy()
    assert got.shape == want.shape
    assert rel_l2(got, want) <= 1e-5


@pytest.mark.parametrize("x_shape, f_shape, strides, padding, dilations, data_format", [
    ((1, 6, 12, 11, 2), (3, 7, 6, 2, 3), (1, 1, 1), "SAME", (1, 1, 1), "NDHWC"),
    ((2, 4, 7, 9, 10), (3, 3, 4, 2, 6), (2, 1, 3), "VALID", (1, 2, 1), "NCDHW"),  # groups 2
    ((1, 9, 8, 7, 3), (4, 3, 3, 1, 3), (1, 2, 1),
     [[0, 0], [2, 1], [0, 3], [1, 1], [0, 0]], (2, 1, 1), "NDHWC"),  # depthwise
])
def test_portable_dft_3d_matches_the_reference(x_shape, f_shape, strides, padding, dilations,
                                               data_format):
    """Inside portable() a 3-D convolution that asks for the FFT runs the DFT in
    matrix products too (the 3-D FFT's complex transforms convert to neither
    LiteRT nor ONNX): no FFT op, against the float64 reference."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal(x_shape).astype(np.float32)
    f = rng.standard_normal(f_shape).astype(np.float32)
    fn = tf.function(lambda x, f: tfbigconv.bigconv3d(x, f, strides, padding, data_format,
                                                      dilations, algorithm="fft"))
    with tfbigconv.portable():
        graph_fn = fn.get_concrete_function(tf.constant(x), tf.constant(f))
    types = {op.type for op in graph_fn.graph.get_operations()}
    assert "BatchMatMulV2" in types and not types & (FFT_OPS | {"Conv3D"}), types
    assert big_ops(types) == []
    explicit = isinstance(padding, list)
    want = conv3d_reference(x, f, strides, "EXPLICIT" if explicit else padding, dilations,
                            data_format, explicit=tuple(map(tuple, padding[1:4]))
                            if explicit else ((0, 0),) * 3)
    got = graph_fn(tf.constant(x), tf.constant(f)).numpy()
    assert got.shape == want.shape
    assert rel_l2(got, want) <= 1e-5


def test_portable_conv3d_small_filter_runs_tf_convolution():
    """Where the pure path runs TensorFlow's convolution (a small 3-D filter
    under auto), portable() keeps Conv3D."""
    x = tf.TensorSpec((1, 8, 16, 16, 8), tf.float32)
    f = tf.TensorSpec((3, 3, 3, 8, 8), tf.float32)
    fn = tf.function(lambda x, f: tfbigconv.bigconv3d(x, f, 1, "SAME"))
    with tfbigconv.portable():
        types = {op.type for op in fn.get_concrete_function(x, f).graph.get_operations()}
    assert "Conv3D" in types and "BatchMatMulV2" not in types and not types & FFT_OPS, types


@pytest.mark.skipif(not (HAVE_LITERT and HAVE_ONNX), reason="needs ai-edge-litert, tf2onnx "
                    "and onnxruntime (make deps)")
def test_portable_3d_exports_run_in_litert_and_onnxruntime(tmp_path):
    """A BigConv3D whose pure path runs the FFT (algorithm "fft"), exported inside
    portable() with LiteRT's builtins only and to ONNX, runs in a process without
    tfbigconv and matches the Keras model."""
    keras.utils.set_random_seed(3)
    volume = keras.Input((6, 10, 9, 2))
    model = keras.Model(volume, BigConv3D(3, (3, 7, 5), padding="same", algorithm="fft")(volume))
    x = np.random.default_rng(4).standard_normal((2, 6, 10, 9, 2)).astype(np.float32)
    with tfbigconv.portable():
        model.export(str(tmp_path / "m.tflite"), format="litert", verbose=False,
                     target_spec={"supported_ops": [tf.lite.OpsSet.TFLITE_BUILTINS]})
        model.export(str(tmp_path / "m.onnx"), format="onnx", verbose=False)
    ops = litert_op_names(str(tmp_path / "m.tflite"))
    assert "BATCH_MATMUL" in ops and "CONV_3D" not in ops, ops
    clean = load_clean({"litert": ("litert", str(tmp_path / "m.tflite"), True),
                        "onnx": ("onnx", str(tmp_path / "m.onnx"), True)}, [x], tmp_path)
    assert clean["loaded"] == [] and not clean["library_mapped"]
    want = [np.asarray(model(x))]
    match_outputs(clean["litert"], want)
    match_outputs(clean["onnx"], want)


@native
def test_active_inside_and_restored():
    assert pure_tf.active() == ""
    with tfbigconv.portable():
        assert pure_tf.active() == REASON
        with tfbigconv.portable():  # re-entrant
            assert pure_tf.active() == REASON
        assert pure_tf.active() == REASON
    assert pure_tf.active() == ""
    with pytest.raises(ZeroDivisionError):
        with tfbigconv.portable():
            _ = 1 / 0
    assert pure_tf.active() == ""


@native
def test_other_threads_and_contexts_keep_our_ops():
    seen = {}
    with tfbigconv.portable():
        thread = threading.Thread(target=lambda: seen.update(thread=pure_tf.active()))
        thread.start()
        thread.join()
        # a context copied inside sees it; one created fresh does not
        seen["copied"] = contextvars.copy_context().run(pure_tf.active)
        seen["fresh"] = contextvars.Context().run(pure_tf.active)
    assert seen == {"thread": "", "copied": REASON, "fresh": ""}


@native
def test_traced_inside_stock_outside_ours():
    x = tf.TensorSpec((1, 48, 48, 1), tf.float32)
    w = tf.TensorSpec((31, 31, 1, 1), tf.float32)

    def types():
        fn = tf.function(lambda x, w: tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm="fft"))
        return {op.type for op in fn.get_concrete_function(x, w).graph.get_operations()}
    with tfbigconv.portable():
        inside = types()
    assert big_ops(inside) == [] and "BatchMatMulV2" in inside and not inside & FFT_OPS
    assert big_ops(types()) == ["BigConv2D"]
