"""Models with tfbigconv's Keras layers save and load in a fresh process
(.keras and SavedModel), also files saved by an earlier version. (Importing
tfbigconv refuses a TensorFlow other than the one the ops were built against:
test_native.py.)"""
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from tfbigconv.keras import BigConv2D, BigDepthwiseConv2D
from conftest import TESTS_DIR, random_case, run_python

TOL = 1e-5


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


@pytest.mark.native
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


def test_files_saved_by_an_earlier_version_load(tmp_path):
    """A .keras file and a SavedModel made by tfbigconv at a6d1a82 (before the
    package was restructured; tests/fixtures) load and give the same outputs."""
    fixtures = os.path.join(TESTS_DIR, "fixtures")
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


@pytest.mark.native
def test_1d_and_3d_layers_export_and_load_in_fresh_process(tmp_path):
    """A SavedModel with BigConv1D and BigDepthwiseConv3D serves, gradients included,
    in a process that only imports tfbigconv."""
    keras.utils.set_random_seed(1)
    inp1, inp3 = keras.Input((64, 2)), keras.Input((10, 11, 12, 2))
    h1 = keras.layers.GlobalAveragePooling1D()(
        tfbigconv.keras.BigConv1D(3, 17, padding="causal")(inp1))
    h3 = keras.layers.GlobalAveragePooling3D()(
        tfbigconv.keras.BigDepthwiseConv3D(5, padding="same", depth_multiplier=2)(inp3))
    model = keras.Model([inp1, inp3], keras.layers.Concatenate()([h1, h3]))
    x1, x3 = random_case((2, 64, 2), 2), random_case((2, 10, 11, 12, 2), 3)
    model.export(str(tmp_path / "sm"), verbose=False)
    np.savez(tmp_path / "d.npz", x1=x1, x3=x3, out=model([x1, x3]).numpy())
    out = run_python(f"""
        import numpy as np, tensorflow as tf, tfbigconv
        tfbigconv.register_all()
        d = np.load("d.npz")
        loaded = tf.saved_model.load("sm")
        x3 = tf.constant(d["x3"])
        with tf.GradientTape() as tape:
            tape.watch(x3)
            out = loaded.serve([tf.constant(d["x1"]), x3])
        grad = tape.gradient(out, x3)
        err = np.linalg.norm(out.numpy() - d["out"]) / np.linalg.norm(d["out"])
        assert err < {TOL} and grad.shape == x3.shape and np.isfinite(grad.numpy()).all(), err
        print("ok", err)
    """, cwd=tmp_path)
    assert out.startswith("ok")
