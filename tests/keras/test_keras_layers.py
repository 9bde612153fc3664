"""tfbigconv.keras layers (tfbigconv/keras/layers.py) against keras.layers.Conv2D /
DepthwiseConv2D, in both Keras flavours (`flavour`: Keras 3, and Keras 2 = tf_keras
with tfbigconv/keras/keras2.py) where the test is not about Keras 3 alone
(convert_model: test_convert.py; the six layers in both: test_keras_flavours.py).

Parity: the same weights give the same outputs and gradients (input, kernel,
bias) as the Keras layers, by relative L2 error. Keras' TensorFlow backend
cannot run "channels_first" on CPU, so that reference is the channels_last
Keras layer on transposed data.
"""
import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from tfbigconv.keras import BigConv2D, BigDepthwiseConv2D
from conftest import TOLERANCE, random_case
from flavours import flavour  # noqa: F401  (the fixture)
from reference import rel_l2

TOL = 1e-5  # float32, for outputs and gradients

CONV_CASES = [
    dict(filters=4, kernel_size=15, padding="same"),
    dict(filters=3, kernel_size=(9, 5), strides=2),
    dict(filters=4, kernel_size=7, padding="same", strides=(2, 3)),
    dict(filters=2, kernel_size=5, padding="same", dilation_rate=(2, 3)),
    dict(filters=6, kernel_size=7, groups=3, padding="same"),
    dict(filters=4, kernel_size=7, use_bias=False, activation="relu"),
    dict(filters=4, kernel_size=9, padding="same", activation="tanh", algorithm="fft"),
    dict(filters=3, kernel_size=(6, 11), padding="same", strides=2, algorithm="direct"),
]
DEPTHWISE_CASES = [
    dict(kernel_size=15, padding="same"),
    dict(kernel_size=(7, 5), depth_multiplier=3, strides=2),
    dict(kernel_size=5, depth_multiplier=2, dilation_rate=2, padding="same"),
    dict(kernel_size=5, strides=2, dilation_rate=(2, 1), padding="same"),
    dict(kernel_size=9, use_bias=False, activation="relu", algorithm="fft"),
    dict(kernel_size=8, depth_multiplier=2, padding="same", algorithm="direct"),
]
INPUT_SHAPE = (2, 23, 19, 6)  # NHWC; 6 channels so that groups=3 divides them


@pytest.fixture
def float32_policy(flavour):
    yield
    flavour.keras.mixed_precision.set_global_policy("float32")


def _split(kwargs):
    kwargs = dict(kwargs)
    big_only = {k: kwargs.pop(k) for k in ("algorithm", "workspace_limit") if k in kwargs}
    return kwargs, big_only


def _to_nchw(a):
    return tf.transpose(a, (0, 3, 1, 2))


def _to_nhwc(a):
    return tf.transpose(a, (0, 2, 3, 1))


def _outputs_and_grads(layer, x, cotangent_seed, channels_first=False):
    """Output and d(sum(out * r))/d(input, weights) for a random cotangent r, all NHWC."""
    x = tf.convert_to_tensor(x)
    if channels_first:
        x = _to_nchw(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = layer(x)
        if channels_first:
            out = _to_nhwc(out)
        r = tf.constant(random_case(out.shape, cotangent_seed), dtype=out.dtype)
        loss = tf.reduce_sum(out * r)
    grads = tape.gradient(loss, [x] + layer.trainable_weights)
    if channels_first:
        grads[0] = _to_nhwc(grads[0])
    return out, grads


def refusal(make):
    """The ValueError message `make()` raises, or None when it makes the layer."""
    try:
        make()
    except ValueError as e:
        return str(e)
    return None


def _check_parity(ref_cls, big_cls, kwargs, data_format, seed):
    kwargs, big_only = _split(kwargs)
    x = random_case(INPUT_SHAPE, seed)
    # tf_keras refuses strides with dilations in DepthwiseConv2D; so do we there.
    refused = refusal(lambda: ref_cls(**kwargs, data_format="channels_last"))
    if refused:
        assert refusal(lambda: big_cls(**kwargs, **big_only, data_format=data_format)) == refused
        return
    ref = ref_cls(**kwargs, data_format="channels_last")
    big = big_cls(**kwargs, **big_only, data_format=data_format)
    ref.build(x.shape)
    channels_first = data_format == "channels_first"
    big.build(_to_nchw(x).shape if channels_first else x.shape)
    weights = [random_case(w.shape, seed + 1 + i) for i, w in enumerate(ref.get_weights())]
    ref.set_weights(weights)
    big.set_weights(weights)

    out_ref, grads_ref = _outputs_and_grads(ref, x, seed + 100)
    out_big, grads_big = _outputs_and_grads(big, x, seed + 100, channels_first)
    assert out_big.shape == out_ref.shape
    assert rel_l2(out_big.numpy(), out_ref.numpy()) < TOL
    names = ["input"] + [w.name for w in ref.trainable_weights]
    assert len(grads_big) == len(grads_ref) == len(names)
    for name, g_big, g_ref in zip(names, grads_big, grads_ref):
        err = rel_l2(g_big.numpy(), g_ref.numpy())
        assert err < TOL, f"gradient wrt {name}: rel L2 {err}"


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_conv2d_parity(flavour, case, data_format):
    _check_parity(flavour.layers.Conv2D, flavour.big.BigConv2D, CONV_CASES[case], data_format,
                  10 * case)


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("case", range(len(DEPTHWISE_CASES)))
def test_depthwise_parity(flavour, case, data_format):
    _check_parity(flavour.layers.DepthwiseConv2D, flavour.big.BigDepthwiseConv2D,
                  DEPTHWISE_CASES[case], data_format, 10 * case + 5)


def test_unknown_spatial_size_and_float64(flavour):
    """Inputs of any size through one model (the op's run-time path); float64 layers."""
    K, big_layers = flavour.keras, flavour.big
    inp = K.Input((None, None, 2), dtype="float64")
    big = K.Model(inp, big_layers.BigDepthwiseConv2D(15, padding="same", depth_multiplier=2,
                                                     dtype="float64")(
        big_layers.BigConv2D(4, 15, padding="same", dtype="float64")(inp)))
    ref = K.Sequential([K.Input((None, None, 2), dtype="float64"),
                        K.layers.Conv2D(4, 15, padding="same", dtype="float64"),
                        K.layers.DepthwiseConv2D(15, padding="same", depth_multiplier=2,
                                                 dtype="float64")])
    ref.set_weights([random_case(w.shape, 20 + i, np.float64) for i, w in enumerate(ref.weights)])
    big.set_weights(ref.get_weights())
    predict = tf.function(big, input_signature=[tf.TensorSpec([None, None, None, 2], tf.float64)])
    for i, shape in enumerate([(1, 20, 30, 2), (2, 41, 17, 2)]):
        x = random_case(shape, 30 + i, np.float64)
        out = predict(x)
        assert out.dtype == tf.float64
        assert rel_l2(out.numpy(), ref(x).numpy()) < TOLERANCE["float64"]


def test_depthwise_matches_tf_nn_depthwise_conv2d(flavour):
    """Output channel c * multiplier + m, as tf.nn.depthwise_conv2d orders them."""
    x = random_case((1, 20, 20, 3), 1)
    w = random_case((9, 9, 3, 4), 2)
    layer = flavour.big.BigDepthwiseConv2D(9, depth_multiplier=4, padding="same", use_bias=False)
    layer.build(x.shape)
    layer.set_weights([w])
    ref = tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME")
    assert rel_l2(layer(x).numpy(), ref.numpy()) < TOL


@pytest.mark.parametrize("name", ["Conv2D", "DepthwiseConv2D", "Conv1D", "DepthwiseConv1D",
                                  "Conv3D"])
def test_same_arguments_and_defaults_as_keras(flavour, name):
    """The signature help() and inspect show: the flavour's class's (its constructor
    takes *args: test_keras_flavours.py checks that they mean the same), plus two
    keyword-only arguments."""
    big = inspect.signature(getattr(flavour.big, "Big" + name)).parameters
    ref = inspect.signature(getattr(flavour.layers, name).__init__).parameters
    extra = {"algorithm": "auto", "workspace_limit": 0}
    assert [p for p in big if p not in extra] == list(ref)[1:]  # without self
    for name, p in list(ref.items())[1:]:
        assert big[name].default == p.default and big[name].kind == p.kind, name
    for name, default in extra.items():
        assert big[name].default == default and big[name].kind is inspect.Parameter.KEYWORD_ONLY


def test_config_round_trip(flavour):
    K, big = flavour.keras, flavour.big
    layer = big.BigConv2D(5, (15, 17), strides=2, padding="same", groups=1, activation="relu",
                          kernel_regularizer="l2", bias_initializer="ones", algorithm="fft",
                          workspace_limit=1 << 26, name="big")
    config = layer.get_config()
    ref = K.layers.Conv2D(5, (15, 17), strides=2, padding="same", activation="relu",
                          kernel_regularizer="l2", bias_initializer="ones",
                          name="big").get_config()
    assert {k: v for k, v in config.items() if k not in ("algorithm", "workspace_limit")} == ref
    assert config["algorithm"] == "fft" and config["workspace_limit"] == 1 << 26
    again = big.BigConv2D.from_config(config)
    assert again.get_config() == config

    dw = big.BigDepthwiseConv2D(31, depth_multiplier=2, algorithm="direct")
    dw_again = K.saving.deserialize_keras_object(K.saving.serialize_keras_object(dw))
    assert type(dw_again) is big.BigDepthwiseConv2D
    assert dw_again.get_config() == dw.get_config()
    assert dw_again.algorithm == "direct" and dw_again.depth_multiplier == 2


def test_registered_for_loading():
    del keras.saving.get_custom_objects()["tfbigconv>BigConv2D"]
    assert keras.saving.get_registered_object("tfbigconv>BigConv2D") is None
    names = tfbigconv.register_all()
    assert names == ["tfbigconv>BigConv1D", "tfbigconv>BigConv2D", "tfbigconv>BigConv3D",
                     "tfbigconv>BigDepthwiseConv1D", "tfbigconv>BigDepthwiseConv2D",
                     "tfbigconv>BigDepthwiseConv3D", "tfbigconv>FusedLinearConv",
                     "tfbigconv>FusedBiasMap"]
    assert keras.saving.get_registered_object("tfbigconv>BigConv2D") is BigConv2D
    assert keras.saving.get_registered_object("tfbigconv>BigDepthwiseConv2D") is BigDepthwiseConv2D


def test_the_package_exports_all_eight_layers(flavour):
    """tfbigconv.keras (Keras 3) and tfbigconv.keras.keras2 (tf_keras) each hold the
    six Big layers and fuse_linear's two, under the same names."""
    from tfbigconv.keras import layers
    names = ["BigConv1D", "BigConv2D", "BigConv3D", "BigDepthwiseConv1D", "BigDepthwiseConv2D",
             "BigDepthwiseConv3D", "FusedLinearConv", "FusedBiasMap"]
    assert tfbigconv.keras.__all__ == names
    assert [getattr(tfbigconv.keras, n) for n in names] == [getattr(layers, n) for n in names]
    assert [n for n in flavour.big.__all__ if n in names] == names
    assert all(issubclass(getattr(flavour.big, n), flavour.layers.Layer) for n in names)
    # Registered under the names saved files carry: "tfbigconv>BigConv2D", ...
    assert [flavour.keras.saving.get_registered_name(getattr(flavour.big, n)) for n in names] \
        == ["tfbigconv>" + n for n in names]


def test_jit_support_declared_where_no_gpu_is_visible(monkeypatch):
    """CPU only: the layers declare XLA support, so jit_compile=True compiles the
    model (on the pure-TF path, tests/keras/test_keras_xla.py) and "auto" stays
    off (Keras' rule on CPU-only machines). With a GPU visible they do not, so
    Keras' "auto" keeps our kernels and jit_compile=True falls back with a warning."""
    layer = BigConv2D(2, 15)
    assert layer.supports_jit is True and BigDepthwiseConv2D(15).supports_jit is True
    big = keras.Sequential([keras.Input((20, 20, 1)), layer])
    big.compile(loss="mse", jit_compile=True)
    assert big.jit_compile is True
    big.compile(loss="mse")
    assert big.jit_compile is False  # "auto" on a CPU-only machine
    gpu = tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: [gpu] if kind in (None, "GPU") else [])
    on_gpu = BigConv2D(2, 15)
    assert on_gpu.supports_jit is False
    big = keras.Sequential([keras.Input((20, 20, 1)), on_gpu])
    with pytest.warns(UserWarning, match="jit_compile"):
        big.compile(loss="mse", jit_compile=True)
    assert big.jit_compile is False
    big.compile(loss="mse")
    assert big.jit_compile is False


@pytest.mark.parametrize("kwargs,match", [
    (dict(algorithm="winograd"), "algorithm"),
    (dict(algorithm=None), "algorithm"),
    (dict(workspace_limit=-1), "workspace_limit"),
    (dict(workspace_limit=1.5), "workspace_limit"),
    (dict(workspace_limit=True), "workspace_limit"),
])
def test_bad_arguments(flavour, kwargs, match):
    with pytest.raises(ValueError, match=match):
        flavour.big.BigConv2D(2, 15, **kwargs)
    with pytest.raises(ValueError, match=match):
        flavour.big.BigDepthwiseConv2D(15, **kwargs)


@pytest.mark.parametrize("name,args,kwargs", [("Conv2D", (5, 15), dict(groups=2)),
                                              ("Conv2D", (0, 15), {}),
                                              ("DepthwiseConv2D", (15,), dict(depth_multiplier=0))])
def test_keras_argument_checks_still_apply(flavour, name, args, kwargs):
    """The flavour's own checks, with its messages (tf_keras takes depth_multiplier=0)."""
    theirs = refusal(lambda: getattr(flavour.layers, name)(*args, **kwargs))
    assert refusal(lambda: getattr(flavour.big, "Big" + name)(*args, **kwargs)) == theirs
    assert theirs or flavour.name == "keras2"


def test_fit_lowers_loss(flavour):
    K = flavour.keras
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 40, 40, 1)).astype(np.float32)
    true = rng.standard_normal((15, 15, 1, 1)).astype(np.float32) / 15
    y = tf.nn.conv2d(x, true, 1, "VALID").numpy()
    K.utils.set_random_seed(0)
    model = K.Sequential([K.Input((40, 40, 1)), flavour.big.BigConv2D(1, 15, use_bias=False)])
    model.compile(optimizer=K.optimizers.Adam(0.01), loss="mse")
    history = model.fit(x, y, batch_size=8, epochs=15, verbose=0).history["loss"]
    assert history[-1] < 0.05 * history[0], history


@pytest.mark.parametrize("policy,dtype", [("mixed_float16", "float16"),
                                          ("mixed_bfloat16", "bfloat16")])
def test_mixed_precision(flavour, policy, dtype, float32_policy):
    K, BigConv2D, BigDepthwiseConv2D = flavour.keras, flavour.big.BigConv2D, \
        flavour.big.BigDepthwiseConv2D
    x = random_case((2, 30, 30, 4), 7)
    ref = K.layers.Conv2D(4, 15, padding="same", dtype="float32")
    ref_dw = K.layers.DepthwiseConv2D(15, depth_multiplier=2, dtype="float32")
    ref.build(x.shape)
    ref_dw.build(x.shape)
    K.mixed_precision.set_global_policy(policy)
    big = BigConv2D(4, 15, padding="same")
    big_dw = BigDepthwiseConv2D(15, depth_multiplier=2)
    for r, b in ((ref, big), (ref_dw, big_dw)):
        b.build(x.shape)
        weights = [random_case(w.shape, 8 + i) for i, w in enumerate(r.get_weights())]
        r.set_weights(weights)
        b.set_weights(weights)
        assert b.compute_dtype == dtype and all(w.dtype == "float32" for w in b.weights)
        # The reference sees the inputs the mixed layer sees: rounded to dtype.
        xr = tf.cast(tf.cast(x, dtype), tf.float32)
        with tf.GradientTape() as tape:
            out = b(x)
            loss = tf.reduce_sum(tf.cast(out, tf.float32) ** 2)
        grads = tape.gradient(loss, b.trainable_weights)
        assert out.dtype == dtype
        assert rel_l2(tf.cast(out, tf.float32).numpy(), r(xr).numpy()) < TOLERANCE[dtype]
        assert all(g.dtype == tf.float32 and np.all(np.isfinite(g.numpy())) for g in grads)

    model = K.Sequential([K.Input((30, 30, 4)), BigConv2D(2, 15, padding="same"),
                          BigDepthwiseConv2D(15, padding="same")])
    model.compile(optimizer=K.optimizers.Adam(0.01), loss="mse")
    y = tf.nn.conv2d(x, random_case((15, 15, 4, 2), 9) / 30, 1, "SAME").numpy()
    history = model.fit(x, y, epochs=5, verbose=0).history["loss"]
    assert all(np.isfinite(history)) and history[-1] < history[0], history
