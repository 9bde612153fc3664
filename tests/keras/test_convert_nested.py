"""convert_model (tfbigconv/keras/convert.py) on models written as their authors
write them, in both Keras flavours (`flavour`): convolutions three levels deep in
custom layers (an attribute, a list, a dict, a nested Sequential, a Functional
inside a custom layer) in a subclassed model, converted in place or in a copy; the
result against a float64 twin, fit, save and "load, then convert"; the report and
its warning."""
import warnings

import numpy as np
import pytest

import tfbigconv
from conftest import random_case
from flavours import flavour  # noqa: F401  (the fixture)
from reference import rel_l2

TOL = 1e-5  # float32
SHAPE = (2, 20, 20, 4)  # (batch, height, width, channels)
LARGE = 6  # large convolutions per Block: 19 (attribute), 15 and 17 (list), 15x21 (dict),
# 15 (Sequential), 21 (Functional)


def custom_classes(keras):
    """Net (a subclassed model) -> Block -> Branches: custom layers as models are written."""
    L = keras.layers
    _, h, w, c = SHAPE

    class Branches(L.Layer):  # level 3: a list and a dict of convolutions
        def __init__(self, channels, **kwargs):
            super().__init__(**kwargs)
            self.channels = channels
            self.chain = [L.DepthwiseConv2D(15, padding="same"),
                          L.Conv2D(channels, 17, padding="same")]
            self.by_kind = {"wide": L.Conv2D(channels, (15, 21), padding="same"),
                            "small": L.Conv2D(channels, 3, padding="same")}

        def call(self, x):
            for layer in self.chain:
                x = layer(x)
            return self.by_kind["wide"](x) + self.by_kind["small"](x)

        def get_config(self):
            return {**super().get_config(), "channels": self.channels}

    class Block(L.Layer):  # level 2: an attribute, a nested Sequential, a Functional
        def __init__(self, channels, **kwargs):
            super().__init__(**kwargs)
            self.channels = channels
            self.large = L.DepthwiseConv2D(19, padding="same")
            self.branches = Branches(channels)
            self.seq = keras.Sequential([keras.Input((h, w, channels)),
                                         L.Conv2D(channels, 15, padding="same"),
                                         L.BatchNormalization()])
            x = keras.Input((h, w, channels))
            self.func = keras.Model(x, L.Add()([L.DepthwiseConv2D(21, padding="same")(x), x]))

        def call(self, x):
            return self.func(self.seq(self.branches(self.large(x))))

        def get_config(self):
            return {**super().get_config(), "channels": self.channels}

    class Net(keras.Model):  # level 1: a subclassed model
        def __init__(self, channels=c, **kwargs):
            super().__init__(**kwargs)
            self.channels = channels
            self.stem = L.Conv2D(channels, 3, padding="same")
            self.blocks = [Block(channels)]
            self.head = keras.Sequential([L.GlobalAveragePooling2D(), L.Dense(1)])

        def call(self, x):
            x = self.stem(x)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

        def get_config(self):
            return {"channels": self.channels, "name": self.name}

    return {"Branches": Branches, "Block": Block, "Net": Net}


def net(keras, seed, floatx="float32"):
    """A built Net with non-trivial BatchNormalization statistics."""
    keras.backend.set_floatx(floatx)
    try:
        keras.utils.set_random_seed(seed)
        model = custom_classes(keras)["Net"]()
        model(random_case(SHAPE, 0).astype(floatx))
    finally:
        keras.backend.set_floatx("float32")
    bn = model.blocks[0].seq.layers[-1]
    bn.moving_mean.assign(random_case(bn.moving_mean.shape, seed + 1).astype(floatx))
    return model


def twin64(keras, model):
    """`model`'s Net in float64, with its weights."""
    twin = net(keras, 0, "float64")
    twin.set_weights([w.astype(np.float64) for w in model.get_weights()])
    return twin


def wrapped(keras, seed):
    """Net inside a Functional model (Keras can copy and save that)."""
    inp = keras.Input(SHAPE[1:])
    return keras.Model(inp, net(keras, seed)(inp))


def conv_types(model):
    """{class name: count} of the convolution layers anywhere in `model`."""
    counts = {}
    for layer in model._flatten_layers(include_self=False):
        if "Conv" in type(layer).__name__:
            counts[type(layer).__name__] = counts.get(type(layer).__name__, 0) + 1
    return counts


FULLY_CONVERTED = {"BigConv2D": 3, "BigDepthwiseConv2D": 3, "Conv2D": 2}  # stem and 3x3 stay


def test_in_place_converts_every_level_and_matches_float64(flavour):
    keras = flavour.keras
    model = net(keras, 3)
    twin = twin64(keras, model)
    x = random_case(SHAPE, 4)
    want = twin(x.astype(np.float64)).numpy()
    before = model(x).numpy()
    assert rel_l2(before, want) < TOL
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    model.predict(x, verbose=0)  # a predict function traced with Keras' layers

    same, report = tfbigconv.convert_model(model, algorithm="fft", in_place=True, report=True)
    assert same is model
    assert conv_types(model) == FULLY_CONVERTED
    assert report.not_converted == () and len(report.converted) == LARGE
    assert all(c.in_custom_layer for c in report.converted)
    paths = {c.path: c for c in report.converted}
    block = model.blocks[0]
    large = paths[f"{block.name}/{block.large.name}"]
    assert (large.layer, large.kernel_size) == ("DepthwiseConv2D", (19, 19))
    wide = block.branches.by_kind["wide"]
    assert paths[f"{block.name}/{block.branches.name}/{wide.name}"].kernel_size == (15, 21)
    assert type(wide) is flavour.big.BigConv2D and wide.algorithm == "fft"
    assert f"{block.name}/{block.func.name}/" in str(report) and "15x21" in str(report)
    assert rel_l2(model(x).numpy(), want) < TOL
    assert rel_l2(model.predict(x, verbose=0), want) < TOL  # traced again with ours

    y = random_case((8, 1), 5)
    data = random_case((8,) + SHAPE[1:], 6)
    loss = model.evaluate(data, y, verbose=0)
    model.fit(data, y, epochs=3, batch_size=4, verbose=0)
    after = model.evaluate(data, y, verbose=0)
    assert np.isfinite(after) and after < loss


def test_copy_converts_inside_custom_layers_and_leaves_the_model(flavour):
    keras = flavour.keras
    model = wrapped(keras, 7)
    x = random_case(SHAPE, 8)
    want = model(x).numpy()
    converted = tfbigconv.convert_model(model)
    assert converted is not model
    assert conv_types(converted) == FULLY_CONVERTED
    assert "BigConv2D" not in conv_types(model)  # the original is untouched
    assert rel_l2(converted(x).numpy(), want) < TOL


def test_subclassed_model_without_in_place_says_how(flavour):
    model = net(flavour.keras, 0)
    with pytest.raises(ValueError, match="in_place=True"):
        tfbigconv.convert_model(model)


def test_save_and_load_as_documented(flavour, tmp_path):
    """Custom layers build Keras' own convolutions when loaded, so a converted model
    loads as: build it, convert it, load the weights; a file saved before the
    conversion: load it, then convert."""
    keras = flavour.keras
    stock = wrapped(keras, 9)
    stock_path = str(tmp_path / "stock.keras")
    stock.save(stock_path)
    converted = tfbigconv.convert_model(stock)
    x = random_case(SHAPE, 10)
    want = converted(x).numpy()
    path = str(tmp_path / "converted.keras")
    converted.save(path)

    built = tfbigconv.convert_model(wrapped(keras, 11), in_place=True)
    built.load_weights(path)
    assert conv_types(built) == FULLY_CONVERTED
    assert rel_l2(built(x).numpy(), want) < TOL

    loaded = keras.models.load_model(stock_path, custom_objects=custom_classes(keras))
    assert "BigConv2D" not in conv_types(loaded)
    again, report = tfbigconv.convert_model(loaded, in_place=True, report=True)
    assert conv_types(again) == FULLY_CONVERTED
    assert len(report.converted) == LARGE and "then load_weights" in str(report)
    assert rel_l2(again(x).numpy(), want) < TOL


def test_report_names_what_it_cannot_convert(flavour):
    keras = flavour.keras
    L = keras.layers

    class OddConv(L.Conv2D):  # a user's subclass: its call may differ from Conv2D's
        pass

    class Holder(L.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.odd = OddConv(2, 17, padding="same", name="odd")
            self.up = L.Conv2DTranspose(2, 15, padding="same", name="up")
            self.small = OddConv(2, 3, padding="same", name="small_odd")

        def call(self, x):
            return self.up(self.small(self.odd(x)))

    inp = keras.Input(SHAPE[1:])
    model = keras.Model(inp, L.Conv2D(2, 15, padding="same", name="plain")(
        Holder(name="holder")(inp)))
    converted, report = tfbigconv.convert_model(model, report=True)
    assert [c.path for c in report.converted] == ["plain"]
    odd, up = report.not_converted
    assert (odd.path, odd.layer, odd.kernel_size) == ("holder/odd", "OddConv", (17, 17))
    assert "subclass of Conv2D" in odd.reason and flavour.big.__name__ in odd.reason
    assert up.path == "holder/up" and "no layer for Conv2DTranspose" in up.reason
    assert "holder/odd (OddConv, 17x17): a subclass of Conv2D" in str(report)

    only_odd = keras.Model(inp, Holder(name="holder2")(inp))
    with pytest.warns(RuntimeWarning, match="holder2/odd"):
        tfbigconv.convert_model(only_odd, in_place=True)
    with warnings.catch_warnings():  # nothing large: nothing to say
        warnings.simplefilter("error")
        tfbigconv.convert_model(only_odd, min_kernel_size=31)
