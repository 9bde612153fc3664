"""BigConv1D and BigDepthwiseConv1D (tfbigconv/keras/layers.py) against Keras' Conv1D
and DepthwiseConv1D: same weights, outputs and gradients; causal padding; config,
saving and loading; convert_model on 1-D layers; training. (Same arguments and
defaults: test_keras_layers.py.)"""
import keras
import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from tfbigconv.keras import BigConv1D, BigDepthwiseConv1D
from conftest import random_case
from reference import rel_l2

TOL = 1e-5  # float32

CONV_CASES = [
    dict(filters=4, kernel_size=31, padding="same"),
    dict(filters=3, kernel_size=9, strides=2),
    dict(filters=4, kernel_size=17, padding="causal", dilation_rate=2),
    dict(filters=6, kernel_size=7, groups=3, padding="same", activation="relu"),
    dict(filters=4, kernel_size=15, use_bias=False, algorithm="fft"),
    dict(filters=2, kernel_size=40, padding="causal", algorithm="direct"),
]
DEPTHWISE_CASES = [
    dict(kernel_size=31, padding="same"),
    dict(kernel_size=7, depth_multiplier=3, strides=2),
    dict(kernel_size=5, depth_multiplier=2, dilation_rate=3, padding="same", algorithm="fft"),
    dict(kernel_size=9, use_bias=False, activation="tanh", algorithm="direct"),
]
INPUT_SHAPE = (2, 67, 6)  # NWC


def _split(kwargs):
    kwargs = dict(kwargs)
    return kwargs, {k: kwargs.pop(k) for k in ("algorithm", "workspace_limit") if k in kwargs}


def _out_and_grads(layer, x, seed, channels_first=False):
    x = tf.convert_to_tensor(x)
    if channels_first:
        x = tf.transpose(x, (0, 2, 1))
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = layer(x)
        if channels_first:
            out = tf.transpose(out, (0, 2, 1))
        loss = tf.reduce_sum(out * random_case(out.shape, seed))
    grads = tape.gradient(loss, [x] + layer.trainable_weights)
    if channels_first:
        grads[0] = tf.transpose(grads[0], (0, 2, 1))
    return out, grads


def _check_parity(ref, big, data_format, seed):
    x = random_case(INPUT_SHAPE, seed)
    ref.build(x.shape)
    big.build(x.shape if data_format == "channels_last" else (2, 6, 67))
    weights = [random_case(w.shape, seed + 1 + i) for i, w in enumerate(ref.get_weights())]
    ref.set_weights(weights)
    big.set_weights(weights)
    out_ref, grads_ref = _out_and_grads(ref, x, seed + 100)
    out_big, grads_big = _out_and_grads(big, x, seed + 100, data_format == "channels_first")
    assert out_big.shape == out_ref.shape
    assert rel_l2(out_big, out_ref) < TOL
    for g_big, g_ref in zip(grads_big, grads_ref, strict=True):
        assert rel_l2(g_big, g_ref) < TOL


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_conv1d_parity(case, data_format):
    kwargs, big_only = _split(CONV_CASES[case])
    if data_format == "channels_first" and kwargs.get("padding") == "causal":
        pytest.skip("Keras' reference runs channels_last only; causal is covered there")
    _check_parity(keras.layers.Conv1D(**kwargs), BigConv1D(**kwargs, **big_only,
                                                            data_format=data_format),
                  data_format, case)


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("case", range(len(DEPTHWISE_CASES)))
def test_depthwise_conv1d_parity(case, data_format):
    kwargs, big_only = _split(DEPTHWISE_CASES[case])
    _check_parity(keras.layers.DepthwiseConv1D(**kwargs),
                  BigDepthwiseConv1D(**kwargs, **big_only, data_format=data_format),
                  data_format, 10 + case)


def test_depthwise_causal_is_left_padded_valid():
    """BigDepthwiseConv1D's extra padding: "causal" as Conv1D has it (Hyena's long
    filters), against Keras' DepthwiseConv1D on the left-padded input."""
    x = random_case((2, 300, 4), 0)
    big = BigDepthwiseConv1D(200, padding="causal", depth_multiplier=2)
    ref = keras.layers.DepthwiseConv1D(200, padding="valid", depth_multiplier=2)
    big.build(x.shape)
    ref.build((2, 499, 4))
    weights = [random_case(w.shape, 1 + i) for i, w in enumerate(ref.get_weights())]
    big.set_weights(weights)
    ref.set_weights(weights)
    out = big(x)
    assert out.shape == (2, 300, 8) == big.compute_output_shape(x.shape)
    assert rel_l2(out, ref(np.pad(x, ((0, 0), (199, 0), (0, 0))))) < 1e-4
    assert big.get_config()["padding"] == "causal"
    assert BigDepthwiseConv1D.from_config(big.get_config()).padding == "causal"


def test_save_load_and_fit(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((128, 3)),
        BigConv1D(4, 33, padding="causal", activation="relu", name="c"),
        BigDepthwiseConv1D(65, padding="causal", depth_multiplier=2, algorithm="fft", name="dw"),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    x, y = random_case((16, 128, 3), 1), random_case((16, 1), 2)
    history = model.fit(x, y, epochs=4, batch_size=8, verbose=0).history["loss"]
    assert history[-1] < history[0]
    model.save(tmp_path / "m.keras")
    again = keras.models.load_model(tmp_path / "m.keras")
    assert type(again.get_layer("dw")) is BigDepthwiseConv1D
    assert again.get_layer("dw").algorithm == "fft"
    assert rel_l2(again(x), model(x)) < 1e-6


def test_convert_model_swaps_1d_layers():
    keras.utils.set_random_seed(3)
    inp = keras.Input((90, 4))
    h = keras.layers.Conv1D(4, 31, padding="causal", name="long")(inp)
    h = keras.layers.DepthwiseConv1D(21, padding="same", name="dw")(h)
    h = keras.layers.Conv1D(2, 3, padding="same", name="short")(h)
    model = keras.Model(inp, h)
    converted = tfbigconv.convert_model(model, min_kernel_size=15)
    types = {layer.name: type(layer).__name__ for layer in converted.layers}
    assert types["long"] == "BigConv1D" and types["dw"] == "BigDepthwiseConv1D"
    assert types["short"] == "Conv1D"
    x = random_case((2, 90, 4), 4)
    assert rel_l2(converted(x), model(x)) < TOL
    # a 1-D kernel's length is held against the width of (height, width)
    kept = tfbigconv.convert_model(model, min_kernel_size=(1, 25))
    assert type(kept.get_layer("long")) is BigConv1D
    assert type(kept.get_layer("dw")) is keras.layers.DepthwiseConv1D
