"""The Big layers under Keras 2 (tf_keras; tfbigconv/keras/keras2.py, logic shared
with the Keras 3 classes in tfbigconv/keras/base.py): outputs against tf_keras'
own layers, configs, fit, save/load in .keras, .h5 and SavedModel, mixed
precision, and `tf.keras.Sequential` under TF_USE_LEGACY_KERAS=1."""
import numpy as np
import pytest
import tensorflow as tf

from conftest import TESTS_DIR, random_case, run_python
from reference import rel_l2

tf_keras = pytest.importorskip("tf_keras")  # optional: `make deps` installs it

from tfbigconv.keras import keras2 as k2  # noqa: E402

TOL = 1e-5

# name -> (Big layer, tf_keras' layer or None (no DepthwiseConv3D), input shape, arguments).
# Filters as large as the inputs, so that the FFT paths run too.
CASES = {
    "conv2d": (k2.BigConv2D, tf_keras.layers.Conv2D, (2, 18, 16, 2),
               dict(filters=3, kernel_size=15, padding="same", strides=(1, 2),
                    activation="relu")),
    "depthwise2d": (k2.BigDepthwiseConv2D, tf_keras.layers.DepthwiseConv2D, (2, 18, 16, 2),
                    dict(kernel_size=(15, 13), padding="valid", depth_multiplier=2)),
    "conv1d": (k2.BigConv1D, tf_keras.layers.Conv1D, (2, 40, 3),
               dict(filters=4, kernel_size=31, padding="causal")),
    "depthwise1d": (k2.BigDepthwiseConv1D, tf_keras.layers.DepthwiseConv1D, (2, 40, 3),
                    dict(kernel_size=25, padding="same", depth_multiplier=2)),
    "conv3d": (k2.BigConv3D, tf_keras.layers.Conv3D, (1, 9, 8, 10, 2),
               dict(filters=2, kernel_size=(7, 5, 9), padding="same")),
    "depthwise3d": (k2.BigDepthwiseConv3D, None, (1, 9, 8, 10, 2),
                    dict(kernel_size=(7, 5, 9), padding="same", depth_multiplier=2)),
}


def depthwise3d_reference(x, kernel, bias, padding):
    """DepthwiseConv2D's definition in 3-D, one tf.nn.conv3d per (channel,
    multiplier), output channel c * multiplier + m."""
    channels, multiplier = kernel.shape[-2:]
    outs = [tf.nn.conv3d(x[..., c:c + 1], kernel[..., c:c + 1, m:m + 1], [1] * 5,
                         padding.upper())
            for c in range(channels) for m in range(multiplier)]
    return tf.concat(outs, -1) + bias


def seeded_weights(layer, seed):
    layer.set_weights([random_case(w.shape, seed + i) * 0.2 for i, w in enumerate(layer.weights)])


@pytest.mark.parametrize("case", CASES)
def test_matches_tf_keras_layer_in_float64(case):
    big_cls, ref_cls, shape, kwargs = CASES[case]
    x = random_case(shape, 1)
    big = big_cls(**kwargs)
    big.build(shape)
    seeded_weights(big, 10)
    got = big(x).numpy()
    weights = [w.astype(np.float64) for w in big.get_weights()]
    if ref_cls is None:
        want = depthwise3d_reference(x.astype(np.float64), *weights, kwargs["padding"])
    else:
        ref = ref_cls(dtype="float64", **kwargs)
        ref.build(shape)
        ref.set_weights(weights)
        want = ref(x.astype(np.float64))
    assert isinstance(big, tf_keras.layers.Layer)
    assert rel_l2(got, want) <= TOL


@pytest.mark.parametrize("case", [c for c in CASES if CASES[c][1] is not None])
def test_config_is_tf_keras_layers_plus_ours(case):
    """The same arguments and config as tf_keras' layer, plus algorithm and
    workspace_limit, which from_config restores; weights have tf_keras' names."""
    big_cls, ref_cls, shape, kwargs = CASES[case]
    big = big_cls(algorithm="fft", workspace_limit=1 << 20, name="l", **kwargs)
    ref = ref_cls(name="l", **kwargs)
    config = big.get_config()
    assert (config.pop("algorithm"), config.pop("workspace_limit")) == ("fft", 1 << 20)
    assert config == ref.get_config()
    again = big_cls.from_config(big.get_config())
    assert (again.algorithm, again.workspace_limit) == ("fft", 1 << 20)
    big.build(shape)
    ref.build(shape)
    assert [w.name for w in big.weights] == [w.name for w in ref.weights]


def test_bad_arguments_raise_as_in_keras3():
    with pytest.raises(ValueError, match="algorithm"):
        k2.BigConv2D(2, 3, algorithm="nope")
    with pytest.raises(ValueError, match="workspace_limit"):
        k2.BigDepthwiseConv2D(3, workspace_limit=-1)


def small_model(case):
    big_cls, _, shape, kwargs = CASES[case]
    tf_keras.utils.set_random_seed(0)
    return tf_keras.Sequential([
        tf_keras.Input(shape[1:]),
        big_cls(name="big", **kwargs),
        tf_keras.layers.Flatten(),
        tf_keras.layers.Dense(1),
    ])


@pytest.mark.parametrize("case", CASES)
def test_fit_reduces_loss(case):
    model = small_model(case)
    shape = CASES[case][2]
    x = random_case((8,) + shape[1:], 2)
    y = random_case((8, 1), 3)
    model.compile(optimizer=tf_keras.optimizers.Adam(1e-3), loss="mse")
    before = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=5, batch_size=4, verbose=0)
    after = model.evaluate(x, y, verbose=0)
    assert np.isfinite(after) and after < before


@pytest.fixture(scope="module")
def all_six():
    """A functional model with all six layers (a 1-D, a 2-D and a 3-D input) and its
    outputs on fixed data."""
    tf_keras.utils.set_random_seed(0)
    inputs, outputs = [], []
    for conv, dw in (("conv1d", "depthwise1d"), ("conv2d", "depthwise2d"),
                     ("conv3d", "depthwise3d")):
        x = tf_keras.Input(CASES[conv][2][1:])
        inputs.append(x)
        for case in (conv, dw):
            big_cls, _, _, kwargs = CASES[case]
            y = big_cls(name=case, algorithm="direct" if case == conv else "fft",
                        workspace_limit=1 << 26, **kwargs)(x)
            outputs.append(tf_keras.layers.Flatten()(y))
    model = tf_keras.Model(inputs, tf_keras.layers.Concatenate()(outputs))
    for i, w in enumerate(model.weights):
        w.assign(random_case(w.shape, 20 + i) * 0.2)
    data = [random_case((2,) + CASES[c][2][1:], 5 + i)
            for i, c in enumerate(("conv1d", "conv2d", "conv3d"))]
    return model, data, model.predict(data, verbose=0)


@pytest.mark.parametrize("fmt", ["model.keras", "model.h5", "saved_model"])
def test_save_load_round_trip(all_six, fmt, tmp_path):
    model, data, out = all_six
    path = str(tmp_path / fmt)
    model.save(path)
    loaded = tf_keras.models.load_model(path)
    for case in CASES:
        layer = loaded.get_layer(case)
        assert type(layer) is CASES[case][0], (case, type(layer))
        assert layer.workspace_limit == 1 << 26
        assert layer.algorithm == ("fft" if case.startswith("depthwise") else "direct")
    assert rel_l2(loaded.predict(data, verbose=0), out) <= TOL


@pytest.fixture
def mixed_float16():
    tf_keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    tf_keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("case", CASES)
def test_mixed_precision_computes_in_float16(case, mixed_float16):
    big_cls, _, shape, kwargs = CASES[case]
    x = random_case(shape, 1)
    big = big_cls(**kwargs)
    big.build(shape)
    seeded_weights(big, 10)
    got = big(x)
    assert big.compute_dtype == "float16" and got.dtype == tf.float16
    assert all(w.dtype == tf.float32 for w in big.weights)
    tf_keras.mixed_precision.set_global_policy("float32")
    full = big_cls.from_config({**big.get_config(), "dtype": "float32"})
    full.build(shape)
    full.set_weights(big.get_weights())
    assert rel_l2(got, full(x)) <= 1e-2


def test_legacy_tf_keras_sequential_accepts_the_layer():
    """The issue's reproducer: under TF_USE_LEGACY_KERAS=1, tf.keras is tf_keras, whose
    Sequential refused the Keras 3 layer ("must be an instance of class Layer")."""
    out = run_python("""
        import numpy as np, tensorflow as tf, tf_keras
        from tfbigconv.keras.keras2 import BigConv2D
        assert tf.keras.Sequential is tf_keras.Sequential
        model = tf.keras.Sequential([tf.keras.Input((32, 32, 1)), BigConv2D(2, 15, padding="same")])
        print(model.predict(np.ones((1, 32, 32, 1), np.float32), verbose=0).shape)
        """, cwd=TESTS_DIR, env={"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert out.strip().endswith("(1, 32, 32, 2)")


def test_importing_tfbigconv_leaves_tf_keras_out():
    out = run_python("""
        import sys, tfbigconv
        print("tf_keras" in sys.modules)
        """, cwd=TESTS_DIR, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert out.strip().endswith("False")


def test_mirrored_strategy_matches_single_device():
    """tf.distribute under tf_keras, as test_keras_distribute.py under Keras 3: two
    logical CPUs (set before TensorFlow starts, hence a fresh process), the same
    weights after model.fit mirrored as on one device."""
    out = run_python("""
        import numpy as np, tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        import tf_keras
        from tfbigconv.keras.keras2 import BigConv2D, BigDepthwiseConv2D

        rng = np.random.default_rng(0)
        x = rng.standard_normal((16, 24, 24, 2)).astype(np.float32)
        y = rng.standard_normal((16, 1)).astype(np.float32)

        def build():
            return tf_keras.Sequential([
                tf_keras.Input((24, 24, 2)),
                BigConv2D(3, 15, padding="same", activation="relu"),
                BigDepthwiseConv2D(13, padding="same", depth_multiplier=2),
                tf_keras.layers.GlobalAveragePooling2D(),
                tf_keras.layers.Dense(1),
            ])

        tf_keras.utils.set_random_seed(0)
        initial = build().get_weights()

        def train(strategy):
            with strategy.scope():
                model = build()
                model.set_weights(initial)
                model.compile(optimizer=tf_keras.optimizers.SGD(0.01), loss="mse")
            history = model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
            return model.get_weights(), history.history["loss"]

        mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        assert mirrored.num_replicas_in_sync == 2
        w_single, _ = train(tf.distribute.get_strategy())
        w_mirror, loss = train(mirrored)
        assert loss[-1] < loss[0], loss
        print(max(float(np.linalg.norm(a - b) / np.linalg.norm(a))
                  for a, b in zip(w_single, w_mirror)))
        """, cwd=TESTS_DIR, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    # Float32 gradients summed over two replicas in another order: tf_keras' own
    # Conv2D and DepthwiseConv2D in this model differ by 1.6e-5 as well.
    assert float(out.strip().splitlines()[-1]) <= 1e-4
