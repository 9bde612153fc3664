"""BigConv3D and BigDepthwiseConv3D (tfbigconv/keras/layers.py): Conv3D parity
(outputs and gradients), the depthwise 3-D layer Keras lacks against the float64
reference, config, fit, save and load, and convert_model on Conv3D."""
import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from tfbigconv.keras import BigConv3D, BigDepthwiseConv3D
from conftest import random_case
from reference import conv3d_reference, rel_l2

TOL = 1e-5


@pytest.mark.parametrize("kwargs", [
    dict(filters=4, kernel_size=5, padding="same"),
    dict(filters=3, kernel_size=(3, 5, 4), strides=(1, 2, 1), activation="relu"),
    dict(filters=2, kernel_size=3, use_bias=False, algorithm="fft"),
])
def test_conv3d_parity(kwargs):
    kwargs = dict(kwargs)
    big_only = {k: kwargs.pop(k) for k in ("algorithm",) if k in kwargs}
    x = random_case((2, 9, 10, 8, 3), 0)
    ref, big = keras.layers.Conv3D(**kwargs), BigConv3D(**kwargs, **big_only)
    ref.build(x.shape)
    big.build(x.shape)
    weights = [random_case(w.shape, 1 + i) for i, w in enumerate(ref.get_weights())]
    ref.set_weights(weights)
    big.set_weights(weights)
    xt = tf.constant(x)
    grads = []
    for layer in (ref, big):
        with tf.GradientTape() as tape:
            tape.watch(xt)
            out = layer(xt)
            loss = tf.reduce_sum(out * random_case(out.shape, 9))
        grads.append([out] + tape.gradient(loss, [xt] + layer.trainable_weights))
    for a, b in zip(*grads):
        assert rel_l2(b, a) < TOL


def test_grouped_conv3d_runs_where_keras_cannot_on_the_cpu():
    x = random_case((1, 6, 7, 8, 4), 0)
    layer = BigConv3D(6, 3, groups=2, padding="same", use_bias=False)
    layer.build(x.shape)
    w = random_case(layer.kernel.shape, 1)
    layer.set_weights([w])
    assert rel_l2(layer(x), conv3d_reference(x, w, padding="SAME")) < TOL


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_depthwise_conv3d_against_the_reference(data_format):
    x = random_case((2, 8, 9, 7, 3), 2)
    layer = BigDepthwiseConv3D((3, 5, 3), depth_multiplier=2, strides=(1, 2, 1),
                               padding="same", data_format=data_format)
    xin = np.ascontiguousarray(x.transpose(0, 4, 1, 2, 3)) if data_format == "channels_first" \
        else x
    layer.build(xin.shape)
    kernel, bias = random_case(layer.kernel.shape, 3), random_case(layer.bias.shape, 4)
    layer.set_weights([kernel, bias])
    assert layer.kernel.shape == (3, 5, 3, 3, 2)
    out = layer(xin).numpy()
    if data_format == "channels_first":
        out = out.transpose(0, 2, 3, 4, 1)
    ref = conv3d_reference(x, kernel.reshape(3, 5, 3, 1, 6), (1, 2, 1), "SAME") + bias
    assert out.shape == layer.compute_output_shape(x.shape) or data_format == "channels_first"
    assert rel_l2(out, ref) < TOL


def test_depthwise_conv3d_takes_depthwise_conv2d_arguments_in_3d():
    """In DepthwiseConv2D's order, with defaults for 3-D (strides 1, not (1, 1))."""
    ours = inspect.signature(BigDepthwiseConv3D).parameters
    theirs = inspect.signature(keras.layers.DepthwiseConv2D.__init__).parameters
    assert [p for p in ours if p not in ("algorithm", "workspace_limit")] == list(theirs)[1:]
    assert ours["strides"].default == ours["dilation_rate"].default == 1
    layer = BigDepthwiseConv3D(3, 2, "same", 2)
    assert (layer.strides, layer.padding, layer.depth_multiplier) == ((2, 2, 2), "same", 2)
    assert BigDepthwiseConv3D(3).dilation_rate == (1, 1, 1)


def test_depthwise_21_trains_saves_and_loads(tmp_path):
    """The issue's model: BigDepthwiseConv3D(21, padding="same") trains with fit, saves
    and reloads (small volumes here; bench_conv3d times the big one)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((24, 24, 24, 2)),
        BigDepthwiseConv3D(21, padding="same", name="dw"),
        keras.layers.GlobalAveragePooling3D(),
        keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    x, y = random_case((4, 24, 24, 24, 2), 1), random_case((4, 1), 2)
    history = model.fit(x, y, epochs=4, batch_size=2, verbose=0).history["loss"]
    assert history[-1] < history[0]
    model.save(tmp_path / "m.keras")
    again = keras.models.load_model(tmp_path / "m.keras")
    assert type(again.get_layer("dw")) is BigDepthwiseConv3D
    assert again.get_layer("dw").kernel_size == (21, 21, 21)
    assert rel_l2(again(x), model(x)) < 1e-6


def test_convert_model_swaps_conv3d():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((10, 20, 20, 2)),
                              keras.layers.Conv3D(3, (3, 15, 15), padding="same", name="big"),
                              keras.layers.Conv3D(2, 3, padding="same", name="small")])
    converted = tfbigconv.convert_model(model)
    assert type(converted.get_layer("big")) is BigConv3D
    assert type(converted.get_layer("small")) is keras.layers.Conv3D
    x = random_case((2, 10, 20, 20, 2), 4)
    assert rel_l2(converted(x), model(x)) < TOL
