"""Keras 2 under `tf.keras` (tfbigconv/keras/__init__.py): with TF_USE_LEGACY_KERAS=1,
`tfbigconv.keras` gives the tf_keras layers, as `tf.keras` is tf_keras, while
`tfbigconv.keras.layers` stays Keras 3; registration in both modes; a layer of the
wrong flavour called in a model names the right import (tfbigconv/keras/base.py)."""
import pytest

import tfbigconv
from conftest import TESTS_DIR, random_case, run_python

LEGACY = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}


def test_without_legacy_tfbigconv_keras_is_keras3():
    from tfbigconv.keras import layers
    assert not tfbigconv.keras.legacy_tf_keras()
    assert tfbigconv.keras.BigConv2D is layers.BigConv2D
    assert "tfbigconv>BigDepthwiseConv2D" in tfbigconv.register_all()


def test_under_legacy_tfbigconv_keras_follows_tf_keras(tmp_path):
    pytest.importorskip("tf_keras")
    out = run_python("""
        import numpy as np, tensorflow as tf, tf_keras, keras
        import tfbigconv
        from tfbigconv.keras import BigConv2D, BigDepthwiseConv2D, keras2, layers
        assert tf.keras.Sequential is tf_keras.Sequential
        assert BigConv2D is keras2.BigConv2D and BigDepthwiseConv2D is keras2.BigDepthwiseConv2D
        assert isinstance(layers.BigConv2D(2, 3), keras.layers.Layer)  # still Keras 3

        model = tf.keras.Sequential([tf.keras.Input((24, 24, 2)),
                                     BigConv2D(2, 15, padding="same", name="big")])
        x = np.random.default_rng(0).standard_normal((1, 24, 24, 2)).astype(np.float32)
        out = model.predict(x, verbose=0)

        # Registration in both Kerases: cleared registries are filled again.
        tf_keras.utils.get_custom_objects().clear()
        keras.saving.get_custom_objects().clear()
        names = tfbigconv.register_all()
        assert "tfbigconv>BigConv2D" in names and len(names) == len(set(names))
        assert tf_keras.utils.get_custom_objects()["tfbigconv>BigConv2D"] is keras2.BigConv2D
        assert keras.saving.get_custom_objects()["tfbigconv>BigConv2D"] is layers.BigConv2D
        model.save("legacy.keras")
        loaded = tf.keras.models.load_model("legacy.keras")
        assert type(loaded.get_layer("big")) is keras2.BigConv2D
        assert np.abs(loaded.predict(x, verbose=0) - out).max() <= 1e-5 * np.abs(out).max()

        # convert_model on a tf.keras model gives tf_keras' Big layers.
        stock = tf.keras.Sequential([tf.keras.Input((24, 24, 2)),
                                     tf.keras.layers.DepthwiseConv2D(17, name="dw")])
        assert type(tfbigconv.convert_model(stock).get_layer("dw")) is BigDepthwiseConv2D
        print("legacy ok")
        """, cwd=str(tmp_path), env=LEGACY)
    assert out.strip().endswith("legacy ok")


def test_under_legacy_a_keras3_layer_names_the_right_import():
    pytest.importorskip("tf_keras")
    out = run_python("""
        import tensorflow as tf
        from tfbigconv.keras import layers
        try:
            layers.BigConv2D(2, 15)(tf.keras.Input((24, 24, 2)))
        except TypeError as e:
            print(e)
        """, cwd=TESTS_DIR, env=LEGACY)
    assert "from tfbigconv.keras.keras2 import BigConv2D" in out
    assert "Keras 2 (tf_keras) tensor" in out


def test_a_keras2_layer_in_a_keras3_model_names_the_right_import():
    pytest.importorskip("tf_keras")
    import keras
    from tfbigconv.keras import keras2
    with pytest.raises(TypeError, match="from tfbigconv.keras.layers import BigDepthwiseConv2D"):
        keras2.BigDepthwiseConv2D(15)(keras.Input((24, 24, 2)))
    # On data, a layer of either flavour runs.
    x = random_case((1, 24, 24, 2), 0)
    assert keras2.BigDepthwiseConv2D(15)(x).shape == (1, 10, 10, 2)

