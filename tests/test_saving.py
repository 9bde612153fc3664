"""Models with tfbigconv layers save and load in a fresh process (.keras and SavedModel),
and importing tfbigconv refuses a TensorFlow other than the one the ops were built against."""
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from tfbigconv import _ops
from tfbigconv.keras import BigConv2D, BigDepthwiseConv2D
from conftest import random_case

TOL = 1e-5


def run_python(code, cwd, env=None):
    """Runs `code` in a fresh interpreter (inheriting PYTHONPATH), outside the source tree."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd,
                            env={**os.environ, **(env or {})}, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr[-5000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A model with both layers, saved as .keras and exported as a SavedModel, with its
    outputs and input gradient on fixed data."""
    path = tmp_path_factory.mktemp("saved")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((40, 36, 2)),
        BigConv2D(3, 15, padding="same", activation="relu", algorithm="direct", name="big"),
        BigDepthwiseConv2D((17, 13), depth_multiplier=2, strides=2, algorithm="fft",
                           workspace_limit=1 << 28, name="big_dw"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(1),
    ])
    for i, w in enumerate(model.weights):
        w.assign(random_case(w.shape, 10 + i) * 0.1)
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    x = random_case((4, 40, 36, 2), 1)
    y = random_case((4, 1), 2)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        out = model(xt)
    grad = tape.gradient(out, xt)
    model.save(path / "model.keras")
    model.export(str(path / "saved_model"), verbose=False)
    np.savez(path / "data.npz", x=x, y=y, out=out.numpy(), grad=grad.numpy())
    return path


def test_keras_file_loads_in_fresh_process(saved):
    out = run_python(f"""
        import numpy as np, keras, tfbigconv
        tfbigconv.register_all()
        d = np.load("data.npz")
        model = keras.models.load_model("model.keras")
        big, dw = model.get_layer("big"), model.get_layer("big_dw")
        assert type(big) is tfbigconv.keras.BigConv2D, type(big)
        assert type(dw) is tfbigconv.keras.BigDepthwiseConv2D, type(dw)
        assert (big.algorithm, dw.algorithm, dw.workspace_limit) == ("direct", "fft", 1 << 28)
        out = model.predict(d["x"], verbose=0)
        err = np.linalg.norm(out - d["out"]) / np.linalg.norm(d["out"])
        assert err < {TOL}, err
        # The compiled state comes back too: training continues.
        loss = model.fit(d["x"], d["y"], epochs=3, verbose=0).history["loss"]
        assert loss[-1] < loss[0], loss
        print("ok", err)
    """, cwd=saved)
    assert out.startswith("ok")


def test_saved_model_loads_in_fresh_process(saved):
    out = run_python(f"""
        import numpy as np, tensorflow as tf
        # Without tfbigconv the ops are unknown: the import is what makes loading work.
        try:
            tf.saved_model.load("saved_model")
        except Exception as e:
            assert "BigConv2D" in str(e), e
        else:
            raise AssertionError("loaded without the ops registered")
        import tfbigconv
        tfbigconv.register_all()
        d = np.load("data.npz")
        loaded = tf.saved_model.load("saved_model")
        x = tf.constant(d["x"])
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = loaded.serve(x)
        grad = tape.gradient(out, x)  # through the ops' registered gradients
        err = np.linalg.norm(out.numpy() - d["out"]) / np.linalg.norm(d["out"])
        gerr = np.linalg.norm(grad.numpy() - d["grad"]) / np.linalg.norm(d["grad"])
        assert err < {TOL} and gerr < {TOL}, (err, gerr)
        print("ok", err, gerr)
    """, cwd=saved)
    assert out.startswith("ok")


def test_version_check_messages():
    _ops.check_tf_version("2.21.0", "2.21.0")
    _ops.check_tf_version(None, "2.21.0")  # not built by setup.py: nothing recorded
    with pytest.raises(ImportError) as e:
        _ops.check_tf_version("2.20.0", "2.21.0")
    message = str(e.value)
    assert "built against TensorFlow 2.20.0" in message
    assert "TensorFlow 2.21.0 is installed" in message
    assert "pip install --no-build-isolation --force-reinstall --no-deps ." in message


def test_installed_build_matches_running_tensorflow():
    if _ops.BUILT_TF_VERSION is None:
        pytest.skip("this tfbigconv was not built by setup.py, so it records no TF version")
    assert _ops.BUILT_TF_VERSION == tf.__version__


def test_import_refuses_other_tensorflow(tmp_path):
    """The recorded build version is replaced by another one before tfbigconv is imported."""
    out = run_python("""
        import os, sys, types
        import tensorflow as tf
        fake = types.ModuleType("tfbigconv._build_info")
        fake.TF_VERSION = "2.3.0"
        sys.modules["tfbigconv._build_info"] = fake
        try:
            import tfbigconv
        except ImportError as e:
            message = str(e)
        else:
            raise AssertionError("imported despite the version mismatch")
        assert "built against TensorFlow 2.3.0" in message, message
        assert f"TensorFlow {tf.__version__} is installed" in message, message
        assert "pip install --no-build-isolation --force-reinstall --no-deps ." in message, message
        # The documented escape hatch.
        os.environ["TFBIGCONV_SKIP_VERSION_CHECK"] = "1"
        import tfbigconv
        assert tfbigconv.bigconv2d(tf.ones((1, 5, 5, 1)), tf.ones((3, 3, 1, 1)), 1,
                                   "VALID").shape == (1, 3, 3, 1)
        print("ok")
    """, cwd=tmp_path)
    assert out.startswith("ok")


def test_files_saved_by_an_earlier_version_load(tmp_path):
    """A .keras file and a SavedModel made by tfbigconv at a6d1a82 (before the
    package was restructured; tests/fixtures) load and give the same outputs."""
    fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
    out = run_python(f"""
        import os, numpy as np, keras, tensorflow as tf
        import tfbigconv
        d = {fixtures!r}
        want = np.load(os.path.join(d, "a6d1a82_expected.npz"))
        model = keras.models.load_model(os.path.join(d, "a6d1a82_model.keras"))
        loaded = tf.saved_model.load(os.path.join(d, "a6d1a82_savedmodel"))
        r = loaded(tf.constant(want["x"]))
        def rel(a, b):
            return float(np.linalg.norm(np.asarray(a) - b) / np.linalg.norm(b))
        print("ERRORS", rel(model(want["x"]), want["keras_y"]), rel(r["y"], want["saved_y"]),
              rel(r["dx"], want["saved_dx"]))
    """, cwd=str(tmp_path))
    errors = [float(v) for v in out.split("ERRORS")[1].split()]
    assert len(errors) == 3 and max(errors) < TOL, errors
