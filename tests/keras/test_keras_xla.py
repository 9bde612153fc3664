"""Keras models with tfbigconv layers under XLA: model.compile(jit_compile=True)
trains on bigconv2d's pure-TensorFlow path (pure_tf.py), with the loss
curve of the same model trained on our kernels outside XLA."""
import keras
import numpy as np
import pytest

import tfbigconv
from tfbigconv import pure_tf


def _model():
    keras.utils.set_random_seed(3)
    return keras.Sequential([
        keras.Input((24, 24, 3)),
        tfbigconv.keras.BigConv2D(4, 9, padding="same"),
        keras.layers.BatchNormalization(),
        keras.layers.ReLU(),
        tfbigconv.keras.BigDepthwiseConv2D(7, padding="same", depth_multiplier=2),
        keras.layers.BatchNormalization(),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(1)])


class _BatchLosses(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


def _train(jit_compile, weights):
    model = _model()
    model.set_weights(weights)
    model.compile(keras.optimizers.SGD(0.05), "mse", jit_compile=jit_compile)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((48, 24, 24, 3)).astype(np.float32)
    y = rng.standard_normal((48, 1)).astype(np.float32)
    losses = _BatchLosses()
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[losses])
    return losses.losses, model.get_weights()


@pytest.mark.native  # the reference curve is our kernels'
def test_jit_compile_true_trains_with_the_same_loss_curve(monkeypatch):
    weights = _model().get_weights()
    plain_losses, plain_weights = _train(False, weights)
    why = []
    conv2d = pure_tf.conv2d
    monkeypatch.setattr(pure_tf, "conv2d", lambda *a, **k: why.append(k["why"]) or conv2d(*a, **k))
    xla_losses, xla_weights = _train(True, weights)
    assert why and set(why) == {"XLA compiles this function"}  # both layers, when traced
    assert len(xla_losses) == len(plain_losses) == 6
    assert all(np.isfinite(xla_losses))
    np.testing.assert_allclose(xla_losses, plain_losses, rtol=1e-4)
    assert plain_losses[-1] != plain_losses[0]  # it trained
    # Six SGD steps through BatchNorm carry float32 rounding (the FFT's, XLA's
    # orders of summation) into the weights, most into the small ones (a bias
    # before BatchNorm gets no gradient beyond rounding): all weights together.
    flat = lambda ws: np.concatenate([w.ravel() for w in ws])  # noqa: E731
    a, b = flat(xla_weights), flat(plain_weights)
    assert np.linalg.norm(a - b) <= 1e-4 * np.linalg.norm(b)
