"""tfbigconv/keras_model.py: which Keras a model is, and cloning one with its
nested models, under Keras 3 and tf_keras."""
import pytest
import tensorflow as tf

from flavours import flavour  # noqa: F401  (the fixture)
from tfbigconv.keras_model import clone_model, keras_of


def _nested(keras):
    inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="inner_dense")],
                             name="inner")
    x = keras.Input((4,))
    return keras.Model(x, keras.layers.Dense(2, name="head")(inner(x)))


def test_keras_of_names_the_module(flavour):
    model = _nested(flavour.keras)
    assert keras_of(model) is flavour.keras
    assert keras_of(model.layers[1]) is flavour.keras  # the nested model
    assert keras_of(tf.Module()) is None and keras_of(None) is None


def test_clone_model_recurses_into_nested_models(flavour):
    model = _nested(flavour.keras)
    seen = []

    def clone(layer):
        seen.append(layer.name)
        return layer.__class__.from_config(layer.get_config())

    copy = clone_model(model, clone)
    assert {"inner_dense", "head"} <= set(seen)
    assert copy is not model and copy.count_params() == model.count_params()
    with pytest.raises(ValueError, match="model must be a Keras model"):
        clone_model(tf.Module(), clone)
