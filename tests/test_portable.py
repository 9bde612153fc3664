"""tfbigconv.portable(): exports that load and run where tfbigconv is not installed.

A Keras 3 model with BigConv2D, BigDepthwiseConv2D and BigConv1D is exported
inside portable() (and a tf.Module through tf.saved_model.save), then loaded in
a fresh interpreter that cannot import tfbigconv, whose output must match the
Keras model's. The same export outside portable() holds our ops and must fail
there: that proves the clean process has no tfbigconv."""
import contextvars
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
from reference import rel_l2
from tfbigconv import pure_tf
from tfbigconv.keras import BigConv1D, BigConv2D, BigDepthwiseConv2D

REASON = "tfbigconv.portable()"
# Where the native ops run, the reason the pure path would run anyway (--pure-tf).
PURE_ANYWAY = pure_tf_mode() or pure_tf.missing_library is not None
native = pytest.mark.skipif(PURE_ANYWAY, reason="needs our ops outside portable()")

# Loads each SavedModel in a process that cannot import tfbigconv: the name is
# blocked before anything else is imported (an installed copy would sit in
# site-packages, beside TensorFlow), and the source tree is off sys.path. Prints
# one JSON line: per model, its outputs' file or the error, and what of
# tfbigconv the process holds at the end (no module, no mapped op library).
CLEAN_LOADER = textwrap.dedent("""
    import json, os, sys
    sys.modules["tfbigconv"] = None  # `import tfbigconv` raises ImportError from here on
    root = os.path.realpath(sys.argv[2])
    sys.path = [p for p in sys.path if os.path.realpath(p or ".") != root]
    import numpy as np
    import tensorflow as tf
    job = json.loads(sys.argv[1])
    data = np.load(job["inputs"])
    result = {}
    for name, (path, args_as_list) in job["models"].items():
        try:
            loaded = tf.saved_model.load(path)  # kept: it owns the variables
            args = [tf.constant(data[k]) for k in sorted(data.files)]
            ys = tf.nest.flatten(loaded.serve(args) if args_as_list else loaded.serve(*args))
        except Exception as e:
            result[name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        out = os.path.join(job["outdir"], name + ".npz")
        np.savez(out, *[y.numpy() for y in ys])
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
    with what it had loaded of tfbigconv."""
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


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The model, its inputs and Keras' outputs (our ops), and what the clean
    process made of its exports inside and outside portable() and of a tf.Module."""
    tmp = tmp_path_factory.mktemp("portable")
    model = three_layer_model()
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((2, 48, 48, 2)).astype(np.float32),
              rng.standard_normal((2, 60, 3)).astype(np.float32)]
    expected = [np.asarray(y) for y in model(inputs)]
    kernel = tf.constant(next(np.asarray(layer.kernel) for layer in model.layers
                              if isinstance(layer, BigConv2D)))
    with tfbigconv.portable():
        model.export(str(tmp / "portable"), format="tf_saved_model", verbose=False)
        module = tf.Module()
        module.serve = tf.function(
            lambda x: tfbigconv.bigconv2d(x, kernel, 1, "SAME"),
            input_signature=[tf.TensorSpec((None, 48, 48, 2), tf.float32)])
        module.serve.get_concrete_function()  # traced inside: stock ops
        tf.saved_model.save(module, str(tmp / "module"))
    model.export(str(tmp / "native"), format="tf_saved_model", verbose=False)
    models = {"portable": [str(tmp / "portable"), True], "native": [str(tmp / "native"), True]}
    clean = load_clean(models, inputs, tmp)
    module_clean = load_clean({"module": [str(tmp / "module"), False]}, inputs[:1], tmp)
    module_expected = tfbigconv.bigconv2d(inputs[0], kernel, 1, "SAME").numpy()
    return dict(tmp=tmp, expected=expected, clean=clean, module_clean=module_clean,
                module_expected=module_expected)


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
    assert "RFFT2D" in types  # the 31x31 filters took the pure path's FFT


@native
def test_export_outside_portable_keeps_our_ops(exported):
    """The check above can fail: the same export outside portable() holds
    BigConv2D, and the clean process cannot load it."""
    assert "BigConv2D" in big_ops(saved_op_types(exported["tmp"] / "native"))
    error = exported["clean"]["native"]
    assert isinstance(error, dict) and "Op type not registered" in error["error"], error


def test_saved_model_save_of_a_module_traced_inside(exported):
    assert big_ops(saved_op_types(exported["tmp"] / "module")) == []
    clean = exported["module_clean"]
    assert clean["loaded"] == [] and not clean["library_mapped"]
    (got,) = clean["module"]
    want = exported["module_expected"]
    assert rel_l2(got.astype(np.float64), want.astype(np.float64)) <= 1e-4


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
            1 / 0
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
    assert big_ops(inside) == [] and "RFFT2D" in inside
    assert big_ops(types()) == ["BigConv2D"]


# ---- LiteRT and ONNX: where the pure path runs TensorFlow's own convolution ----
# The pure path's FFT (large filters for their input) converts to neither yet:
# LiteRT's builtin RFFT2D takes power-of-two sizes only and Conj, IRFFT, IFFT and
# complex transposes need SELECT_TF_OPS; tf2onnx converts no IRFFT nor IFFT.
# Filters small for their input convert to builtin convolutions of both.

def small_filter_model():
    """The three layers with filters the pure path runs as TF's own convolution."""
    keras.utils.set_random_seed(3)
    image, seq = keras.Input((24, 24, 2)), keras.Input((40, 3))
    outputs = [BigConv2D(3, 15, padding="same", bias_initializer="random_normal")(image),
               BigDepthwiseConv2D(9, depth_multiplier=2)(image),
               BigConv1D(4, 21, padding="causal")(seq)]
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((1, 24, 24, 2)).astype(np.float32),
              rng.standard_normal((1, 40, 3)).astype(np.float32)]
    return keras.Model([image, seq], outputs), inputs


def match_outputs(got, want):
    """Each output of `got` (in the runtime's order) against Keras' by shape."""
    assert sorted(g.shape for g in got) == sorted(w.shape for w in want)
    for g in got:
        w = next(w for w in want if w.shape == g.shape)
        err = rel_l2(g.astype(np.float64), w.astype(np.float64))
        assert err <= 1e-4, (g.shape, err)


def test_litert_export_runs_on_builtin_ops(tmp_path):
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        Interpreter = getattr(getattr(tf, "lite", None), "Interpreter", None)
    if Interpreter is None:
        pytest.skip("no LiteRT interpreter (ai-edge-litert, or tf.lite before its removal)")
    model, inputs = small_filter_model()
    want = [np.asarray(y) for y in model(inputs)]
    path = str(tmp_path / "model.tflite")
    builtins = {"target_spec": {"supported_ops": [tf.lite.OpsSet.TFLITE_BUILTINS]}}
    with tfbigconv.portable():
        model.export(path, format="litert", verbose=False, **builtins)
    interpreter = Interpreter(model_path=path)
    interpreter.allocate_tensors()
    for d in interpreter.get_input_details():
        interpreter.set_tensor(d["index"], next(x for x in inputs
                                                if list(x.shape) == d["shape"].tolist()))
    interpreter.invoke()
    match_outputs([interpreter.get_tensor(d["index"])
                   for d in interpreter.get_output_details()], want)
    if not PURE_ANYWAY:  # outside portable(), BigConv2D is no TFLite op
        with pytest.raises(Exception, match="BigConv2D"):  # TF's ConverterError, not public
            model.export(str(tmp_path / "ours.tflite"), format="litert", verbose=False,
                         **builtins)


def test_onnx_export_runs_in_onnxruntime(tmp_path):
    pytest.importorskip("tf2onnx")
    ort = pytest.importorskip("onnxruntime")
    model, inputs = small_filter_model()
    want = [np.asarray(y) for y in model(inputs)]
    path = str(tmp_path / "model.onnx")
    with tfbigconv.portable():
        model.export(path, format="onnx", verbose=False)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {d.name: next(x for x in inputs if len(x.shape) == len(d.shape))
             for d in session.get_inputs()}
    match_outputs(session.run(None, feeds), want)
