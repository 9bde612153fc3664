"""convert_model (tfbigconv/keras/convert.py): Keras models with large-filter
Conv2D and DepthwiseConv2D layers get tfbigconv's layers in their place, with
the same weights and outputs, in both Keras flavours (`flavour`): a tf_keras
model gives a tf_keras model with the layers of tfbigconv.keras.keras2."""
import pytest

import tfbigconv
from conftest import random_case
from flavours import flavour  # noqa: F401  (the fixture)
from reference import rel_l2

TOL = 1e-5  # float32


def _conv_model(keras, seed):
    keras.utils.set_random_seed(seed)
    inner = keras.Sequential([keras.Input((32, 32, 4)),
                              keras.layers.Conv2D(4, 21, padding="same", name="inner_big"),
                              keras.layers.BatchNormalization()], name="inner")
    inp = keras.Input((32, 32, 3))
    h = keras.layers.Conv2D(4, 15, padding="same", activation="relu", name="c15")(inp)
    h = keras.layers.DepthwiseConv2D((17, 19), depth_multiplier=1, padding="same", name="dw")(h)
    h = inner(h)
    h = keras.layers.Conv2D(4, 3, padding="same", name="c3")(h)
    h = keras.layers.Conv2D(2, (3, 31), padding="same", name="c3x31")(h)
    model = keras.Model(inp, h)
    # Non-trivial BatchNormalization statistics, so that copying them matters.
    model.get_layer("inner").layers[1].moving_mean.assign(random_case((4,), seed + 1))
    return model


def _layer_types(model):
    return {layer.name: type(layer).__name__ for layer in model._flatten_layers(include_self=False)}


def test_convert_model(flavour):
    model = _conv_model(flavour.keras, 0)
    before = _layer_types(model)
    x = random_case((2, 32, 32, 3), 11)
    converted = tfbigconv.convert_model(model, algorithm="direct")
    types = _layer_types(converted)
    assert types["c15"] == "BigConv2D" and types["dw"] == "BigDepthwiseConv2D"
    assert types["inner_big"] == "BigConv2D"
    assert types["c3"] == "Conv2D" and types["c3x31"] == "Conv2D"
    assert converted.get_layer("c15").algorithm == "direct"
    assert _layer_types(model) == before  # the original is untouched
    assert isinstance(converted, flavour.keras.Model)
    assert type(converted.get_layer("c15")) is flavour.big.BigConv2D
    assert type(converted.get_layer("inner").layers[0]) is flavour.big.BigConv2D
    assert rel_l2(converted(x).numpy(), model(x).numpy()) < TOL

    only_larger = tfbigconv.convert_model(model, min_kernel_size=(16, 16))
    types = _layer_types(only_larger)
    assert types["c15"] == "Conv2D" and types["dw"] == "BigDepthwiseConv2D"
    assert tfbigconv.convert_model(model, min_kernel_size=(3, 31)).get_layer("c3x31").__class__ \
        is flavour.big.BigConv2D
    assert rel_l2(only_larger(x).numpy(), model(x).numpy()) < TOL


def test_convert_sequential_and_trains(flavour):
    keras = flavour.keras
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((24, 24, 2)), keras.layers.Conv2D(3, 15),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    converted = tfbigconv.convert_model(model)
    assert isinstance(converted, keras.Sequential)
    assert isinstance(converted.layers[0], flavour.big.BigConv2D)
    x = random_case((8, 24, 24, 2), 12)
    y = random_case((8, 1), 13)
    assert rel_l2(converted(x).numpy(), model(x).numpy()) < TOL
    converted.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    history = converted.fit(x, y, epochs=5, verbose=0).history["loss"]
    assert history[-1] < history[0]


def test_convert_model_bad_arguments(flavour):
    keras = flavour.keras
    model = keras.Sequential([keras.Input((24, 24, 2)), keras.layers.Conv2D(3, 15)])
    for bad in (0, -3, (15,), "15", 2.5, (15, 0)):
        with pytest.raises(ValueError, match="min_kernel_size"):
            tfbigconv.convert_model(model, min_kernel_size=bad)
    with pytest.raises(ValueError, match="algorithm"):
        tfbigconv.convert_model(model, algorithm="gemm")
    with pytest.raises(ValueError, match="model"):
        tfbigconv.convert_model(keras.layers.Conv2D(3, 15))

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.conv = keras.layers.Conv2D(3, 15)

        def call(self, x):
            return self.conv(x)

    sub = Subclassed()
    sub(random_case((1, 24, 24, 2), 0))
    with pytest.raises(ValueError, match="Functional"):
        tfbigconv.convert_model(sub)
