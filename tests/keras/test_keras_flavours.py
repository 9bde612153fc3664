"""The six Big layers under both Keras flavours (`flavour`: Keras 3, or Keras 2 =
tf_keras, whose classes are tfbigconv/keras/keras2.py; the logic is shared, in
tfbigconv/keras/base.py): outputs against the flavour's own layers in float64,
configs, fit, save/load (.keras and .h5, and SavedModel in tf_keras; Keras 3
exports SavedModels with model.export: test_keras_saving.py), mixed precision;
and, for tf_keras only, `tf.keras.Sequential` under TF_USE_LEGACY_KERAS=1."""
import numpy as np
import pytest
import tensorflow as tf

from conftest import TESTS_DIR, random_case, run_python
from flavours import flavour  # noqa: F401  (the fixture)
from reference import rel_l2

TOL = 1e-5

# name -> (Big layer, the flavour's layer or None (no DepthwiseConv3D), input shape,
# arguments). Filters as large as the inputs, so that the FFT paths run too.
CASES = {
    "conv2d": ("Conv2D", (2, 18, 16, 2),
               dict(filters=3, kernel_size=15, padding="same", strides=(1, 2),
                    activation="relu")),
    "depthwise2d": ("DepthwiseConv2D", (2, 18, 16, 2),
                    dict(kernel_size=(15, 13), padding="valid", depth_multiplier=2)),
    "conv1d": ("Conv1D", (2, 40, 3), dict(filters=4, kernel_size=31, padding="causal")),
    "depthwise1d": ("DepthwiseConv1D", (2, 40, 3),
                    dict(kernel_size=25, padding="same", depth_multiplier=2)),
    "conv3d": ("Conv3D", (1, 9, 8, 10, 2),
               dict(filters=2, kernel_size=(7, 5, 9), padding="same")),
    "depthwise3d": ("DepthwiseConv3D", (1, 9, 8, 10, 2),
                    dict(kernel_size=(7, 5, 9), padding="same", depth_multiplier=2)),
}
SAVE_FORMATS = {"keras3": ["model.keras", "model.h5"],
                "keras2": ["model.keras", "model.h5", "saved_model"]}


def classes(flavour, case):
    """(our layer, the flavour's layer or None) for a case."""
    name = CASES[case][0]
    return getattr(flavour.big, "Big" + name), getattr(flavour.layers, name, None)


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
def test_matches_the_flavours_layer_in_float64(flavour, case):
    big_cls, ref_cls = classes(flavour, case)
    _, shape, kwargs = CASES[case]
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
    assert isinstance(big, flavour.layers.Layer)
    assert rel_l2(got, want) <= TOL


@pytest.mark.parametrize("case", [c for c in CASES if c != "depthwise3d"])
def test_config_is_the_flavours_plus_ours(flavour, case):
    """The same arguments and config as the flavour's layer, plus algorithm and
    workspace_limit, which from_config restores; weights have the flavour's names."""
    big_cls, ref_cls = classes(flavour, case)
    _, shape, kwargs = CASES[case]
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


# Each case's arguments by position, in its Keras class's order (DepthwiseConv2D's for
# the 3-D depthwise layer), and the same by name.
POSITIONAL = {
    "conv2d": ((3, 15, (1, 2), "same"),
               dict(filters=3, kernel_size=15, strides=(1, 2), padding="same")),
    "depthwise2d": (((15, 13), 1, "valid", 2),
                    dict(kernel_size=(15, 13), strides=1, padding="valid", depth_multiplier=2)),
    "conv1d": ((4, 31, 2, "causal"), dict(filters=4, kernel_size=31, strides=2, padding="causal")),
    "depthwise1d": ((25, 1, "causal", 2),
                    dict(kernel_size=25, strides=1, padding="causal", depth_multiplier=2)),
    "conv3d": ((2, (7, 5, 9), 1, "same"),
               dict(filters=2, kernel_size=(7, 5, 9), strides=1, padding="same")),
    "depthwise3d": (((7, 5, 9), 2, "same", 2),
                    dict(kernel_size=(7, 5, 9), strides=2, padding="same", depth_multiplier=2)),
}


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("case", CASES)
def test_positions_and_defaults_are_the_flavours(flavour, case, data_format):
    """The Big constructor passes every argument but algorithm and workspace_limit
    to the flavour's class: positions mean what they mean there, and the defaults are
    its own (tf_keras' Conv1D is channels_last whatever image_data_format says)."""
    big_cls, ref_cls = classes(flavour, case)
    args, kwargs = POSITIONAL[case]
    backend = flavour.keras.backend
    before = backend.image_data_format()
    backend.set_image_data_format(data_format)
    try:
        big = big_cls(*args, name="l", workspace_limit=7)
        config = big.get_config()
        assert (config.pop("algorithm"), config.pop("workspace_limit")) == ("auto", 7)
        by_name = big_cls(name="l", **kwargs).get_config()
        assert config == {k: v for k, v in by_name.items()
                          if k not in ("algorithm", "workspace_limit")}
        if ref_cls is not None and (case == "conv1d" or "causal" not in args):
            assert config == ref_cls(*args, name="l").get_config()
        if case == "depthwise1d":
            assert big.padding == "causal"
    finally:
        backend.set_image_data_format(before)


def test_bad_arguments_name_the_argument(flavour):
    with pytest.raises(ValueError, match="algorithm"):
        flavour.big.BigConv2D(2, 3, algorithm="nope")
    with pytest.raises(ValueError, match="workspace_limit"):
        flavour.big.BigDepthwiseConv2D(3, workspace_limit=-1)


@pytest.mark.parametrize("case", CASES)
def test_fit_reduces_loss(flavour, case):
    K = flavour.keras
    big_cls, _ = classes(flavour, case)
    _, shape, kwargs = CASES[case]
    K.utils.set_random_seed(0)
    model = K.Sequential([K.Input(shape[1:]), big_cls(name="big", **kwargs),
                          K.layers.Flatten(), K.layers.Dense(1)])
    x = random_case((8,) + shape[1:], 2)
    y = random_case((8, 1), 3)
    model.compile(optimizer=K.optimizers.Adam(1e-3), loss="mse")
    before = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=5, batch_size=4, verbose=0)
    after = model.evaluate(x, y, verbose=0)
    assert np.isfinite(after) and after < before


def all_six(flavour):
    """A functional model with all six layers (a 1-D, a 2-D and a 3-D input) and its
    outputs on fixed data."""
    K = flavour.keras
    K.utils.set_random_seed(0)
    inputs, outputs = [], []
    for conv, dw in (("conv1d", "depthwise1d"), ("conv2d", "depthwise2d"),
                     ("conv3d", "depthwise3d")):
        x = K.Input(CASES[conv][1][1:])
        inputs.append(x)
        for case in (conv, dw):
            y = classes(flavour, case)[0](
                name=case, algorithm="direct" if case == conv else "fft",
                workspace_limit=1 << 26, **CASES[case][2])(x)
            outputs.append(K.layers.Flatten()(y))
    model = K.Model(inputs, K.layers.Concatenate()(outputs))
    for i, w in enumerate(model.weights):
        w.assign(random_case(w.shape, 20 + i) * 0.2)
    data = [random_case((2,) + CASES[c][1][1:], 5 + i)
            for i, c in enumerate(("conv1d", "conv2d", "conv3d"))]
    return model, data, model.predict(data, verbose=0)


def test_save_load_round_trip(flavour, tmp_path):
    model, data, out = all_six(flavour)
    for fmt in SAVE_FORMATS[flavour.name]:
        path = str(tmp_path / fmt)
        model.save(path)
        loaded = flavour.keras.models.load_model(path)
        for case in CASES:
            layer = loaded.get_layer(case)
            assert type(layer) is classes(flavour, case)[0], (fmt, case, type(layer))
            assert layer.workspace_limit == 1 << 26
            assert layer.algorithm == ("fft" if case.startswith("depthwise") else "direct")
        assert rel_l2(loaded.predict(data, verbose=0), out) <= TOL, fmt


@pytest.fixture
def mixed_float16(flavour):
    flavour.keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    flavour.keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("case", CASES)
def test_mixed_precision_computes_in_float16(flavour, case, mixed_float16):
    big_cls, _ = classes(flavour, case)
    _, shape, kwargs = CASES[case]
    x = random_case(shape, 1)
    big = big_cls(**kwargs)
    big.build(shape)
    seeded_weights(big, 10)
    got = big(x)
    assert big.compute_dtype == "float16" and got.dtype == tf.float16
    assert all(w.dtype == tf.float32 for w in big.weights)
    flavour.keras.mixed_precision.set_global_policy("float32")
    full = big_cls.from_config({**big.get_config(), "dtype": "float32"})
    full.build(shape)
    full.set_weights(big.get_weights())
    assert rel_l2(got, full(x)) <= 1e-2


def test_legacy_tf_keras_sequential_accepts_the_layer():
    """The issue's reproducer: under TF_USE_LEGACY_KERAS=1, tf.keras is tf_keras, whose
    Sequential refused the Keras 3 layer ("must be an instance of class Layer")."""
    pytest.importorskip("tf_keras")
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
