"""tfbigconv.fuse_linear (tfbigconv/keras/fuse_model.py) and big.FusedLinearConv
(tfbigconv/keras/fused.py), in both Keras flavours (`flavour`: Keras 3, and Keras
2 = tf_keras, whose fused models hold tfbigconv.keras.keras2's layers): the
issue's blocks fused, compared with the unfused Keras model over the whole
output (borders included) by relative L2 error. Training through
big.FusedLinearConv is tested in test_fusion_train.py."""
import numpy as np
import pytest

import tfbigconv
from conftest import random_case
from flavours import flavour  # noqa: F401  (the fixture)
from reference import rel_l2

TOL = 1e-5  # float32


def randomize(model, seed=0, scale=0.3):
    """Random weights; BatchNormalization variances positive."""
    rng = np.random.default_rng(seed)
    for w in model.weights:
        value = rng.standard_normal(w.shape) * scale
        if "variance" in w.name:
            value = np.abs(value) + 0.5
        w.assign(value.astype(np.float32))
    return model


def seed_block(keras, h, w, c, k, bias=True):
    """The issue's block: p = 1x1 (C -> C/2); d = depthwise KxK(p) - p; l = KxK(p); concat."""
    L = keras.layers
    x = keras.Input((h, w, c))
    p = L.Conv2D(c // 2, 1, use_bias=bias, name="p")(x)
    d = L.DepthwiseConv2D(k, padding="same", use_bias=bias, name="dw")(p)
    d = L.Subtract(name="sub")([d, p])
    low = L.Conv2D(c // 2, k, padding="same", use_bias=bias, name="low")(p)
    y = L.Concatenate(name="cat")([d, low])
    return keras.Model(x, L.ReLU(name="relu")(y))


def repvgg_block(keras, h, w, c):
    L = keras.layers
    x = keras.Input((h, w, c))
    a = L.BatchNormalization(name="bn3")(L.Conv2D(c, 3, padding="same", use_bias=False,
                                                  name="conv3")(x))
    b = L.BatchNormalization(name="bn1")(L.Conv2D(c, 1, use_bias=False, name="conv1")(x))
    i = L.BatchNormalization(name="bn_id")(x)
    return keras.Model(x, L.ReLU()(L.Add(name="add")([a, b, i])))


def replknet_block(keras, h, w, c):
    L = keras.layers
    x = keras.Input((h, w, c))
    a = L.BatchNormalization(name="bn31")(L.DepthwiseConv2D(31, padding="same", use_bias=False,
                                                            name="dw31")(x))
    b = L.BatchNormalization(name="bn5")(L.DepthwiseConv2D(5, padding="same", use_bias=False,
                                                           name="dw5")(x))
    return keras.Model(x, L.Add(name="add")([a, b]))


def depthwise_chain(keras, h, w, c, padding):
    L = keras.layers
    x = keras.Input((h, w, c))
    y = x
    for i in range(3):
        y = L.DepthwiseConv2D(7, padding=padding, name=f"dw{i}")(y)
    return keras.Model(x, y)


def float64_twin(keras, model):
    """`model` computed in float64: the float64 reference."""
    twin = keras.models.clone_model(model, clone_function=lambda layer: layer.__class__.from_config(
        {**layer.get_config(), "dtype": "float64"}))
    twin.set_weights(model.get_weights())
    return twin


def check(keras, model, trainable=False, batch=2, seed=1):
    """fuse_linear in fused mode (recompute and auto: test_fusion_train.py) against the
    model in float64; the fused model is the model's flavour."""
    fused, reports = tfbigconv.fuse_linear(model, trainable=trainable, mode="fused")
    assert type(fused) is type(model)
    x = random_case((batch,) + tuple(model.inputs[0].shape[1:]), seed)
    want = float64_twin(keras, model)(x).numpy()
    assert want.dtype == np.float64
    err = rel_l2(fused(x).numpy(), want)
    assert err < TOL, (err, [str(r) for r in reports])
    return fused, reports


@pytest.mark.parametrize("k,c,bias", [(3, 16, True), (7, 32, True), (31, 64, True),
                                      (7, 16, False)])
def test_seed_block(flavour, k, c, bias):
    keras, L, big = flavour.keras, flavour.layers, flavour.big
    model = randomize(seed_block(keras, 40, 36, c, k, bias))
    fused, (report,) = check(keras, model)
    assert report.status == "fused" and report.kernel_size == (k, k)
    assert report.layers == ["p", "dw", "sub", "low", "cat"]
    assert report.bias == ("map" if bias else "none")
    convs = [layer for layer in fused.layers if isinstance(layer, (L.Conv2D, L.DepthwiseConv2D))]
    assert [type(layer) for layer in convs] == [big.BigConv2D]
    assert report.kept_bytes_after < report.kept_bytes_before


def test_seed_block_trainable_forward(flavour):
    keras, big = flavour.keras, flavour.big
    model = randomize(seed_block(keras, 30, 28, 16, 7))
    fused, (report,) = check(keras, model, trainable=True)
    assert any(isinstance(layer, big.FusedLinearConv) for layer in fused.layers)
    assert sorted(flavour.weight_name(w) for w in fused.trainable_weights) == sorted(
        ["p_kernel", "p_bias", "dw_kernel", "dw_bias", "low_kernel", "low_bias"])


def test_repvgg_block(flavour):
    keras = flavour.keras
    model = randomize(repvgg_block(keras, 20, 18, 8))
    fused, (report,) = check(keras, model)
    assert report.kernel_size == (3, 3) and report.bias == "vector"
    assert len(report.layers) == 6


def test_replknet_block(flavour):
    keras = flavour.keras
    model = randomize(replknet_block(keras, 40, 38, 16))
    fused, (report,) = check(keras, model)
    assert report.kernel_size == (31, 31) and report.groups == 16 and report.bias == "vector"


def test_depthwise_chain_valid_fuses_to_19(flavour):
    keras = flavour.keras
    model = randomize(depthwise_chain(keras, 40, 36, 8, "valid"))
    fused, (report,) = check(keras, model)
    assert report.kernel_size == (19, 19) and report.groups == 8


@pytest.mark.parametrize("trainable", [False, True])
def test_depthwise_chain_same_fuses_with_patched_borders(flavour, trainable):
    """Three SAME 7x7 convs: the intermediates' zero padding is not a single conv's, so
    the outputs within 9 of the borders come from the unfused convs on input strips."""
    keras, big = flavour.keras, flavour.big
    model = randomize(depthwise_chain(keras, 48, 44, 8, "same"))
    fused, (report,) = check(keras, model, trainable=trainable)
    assert report.status == "fused" and report.kernel_size == (19, 19)
    assert report.exact.startswith("borders patched") and "9/9" in report.exact
    assert [type(layer) for layer in fused.layers[1:]] == [big.FusedLinearConv]
    assert fused.layers[1].trainable == trainable


def test_strided_same_chain_is_refused_with_reason(flavour):
    keras, L = flavour.keras, flavour.layers
    x = keras.Input((30, 30, 4))
    y = L.DepthwiseConv2D(3, padding="same", name="a")(x)
    y = L.DepthwiseConv2D(3, strides=2, padding="same", name="b")(y)
    model = randomize(keras.Model(x, y))
    fused, (report,) = check(keras, model)  # the refused subgraph is kept: same outputs
    assert report.status == "refused" and "stride 1" in report.reason
    assert [layer.name for layer in fused.layers[1:]] == ["a", "b"]


def test_pad_once_then_valid_and_strides(flavour):
    keras, L, big = flavour.keras, flavour.layers, flavour.big
    x = keras.Input((33, 31, 6))
    y = L.ZeroPadding2D(((4, 2), (3, 5)))(x)
    y = L.Conv2D(6, 5, strides=2, groups=3, name="a")(y)
    y = big.BigDepthwiseConv2D(3, strides=(1, 2), name="b")(y)  # Keras: equal strides only
    y = L.Conv2D(4, 1, name="c")(y)
    model = randomize(keras.Model(x, y))
    fused, (report,) = check(keras, model)
    assert report.strides == (2, 4) and report.bias == "vector"


def test_resnet_style_conv_bn_next_to_other_layers(flavour):
    """conv + BN before an Add with a projection shortcut: two subgraphs, both fused;
    the ReLU between blocks is kept."""
    keras, L = flavour.keras, flavour.layers
    x = keras.Input((16, 16, 8))
    a = L.BatchNormalization()(L.Conv2D(8, 3, padding="same")(x))
    s = L.BatchNormalization()(L.Conv2D(8, 1)(x))
    y = L.ReLU()(L.Add()([a, s]))
    y = L.BatchNormalization()(L.Conv2D(4, 3, padding="same")(y))
    model = randomize(keras.Model(x, y))
    fused, reports = check(keras, model)
    assert [r.status for r in reports] == ["fused", "fused"]
    assert [r.kernel_size for r in reports] == [(3, 3), (3, 3)]


def test_measure_fills_times(flavour):
    keras = flavour.keras
    model = randomize(seed_block(keras, 20, 20, 8, 5))
    _, (report,) = tfbigconv.fuse_linear(model, measure=2)
    assert report.seconds_before > 0 and report.seconds_after > 0
    assert "measured" in str(report)


def test_bad_arguments(flavour):
    keras = flavour.keras
    with pytest.raises(ValueError, match="model"):
        tfbigconv.fuse_linear("not a model")
    model = seed_block(keras, 10, 10, 4, 3)
    with pytest.raises(ValueError, match="measure"):
        tfbigconv.fuse_linear(model, measure=-1)
    with pytest.raises(ValueError, match="algorithm"):
        tfbigconv.fuse_linear(model, algorithm="nope")


def test_unknown_spatial_size_is_refused(flavour):
    keras, L = flavour.keras, flavour.layers
    x = keras.Input((None, None, 4))
    y = L.Conv2D(4, 3)(L.Conv2D(4, 3)(x))
    _, (report,) = tfbigconv.fuse_linear(keras.Model(x, y))
    assert report.status == "refused" and "static" in report.reason


def test_saving_fused_models(flavour, tmp_path):
    keras, big = flavour.keras, flavour.big
    model = randomize(seed_block(keras, 20, 18, 8, 5))
    x = random_case((2, 20, 18, 8), 3)
    for trainable in (False, True):
        fused, _ = tfbigconv.fuse_linear(model, trainable=trainable)
        path = str(tmp_path / f"fused{trainable}.keras")
        fused.save(path)
        loaded = keras.models.load_model(path)
        assert rel_l2(loaded(x).numpy(), fused(x).numpy()) < 1e-7
    assert any(isinstance(layer, big.FusedBiasMap) for layer in
               tfbigconv.fuse_linear(model)[0].layers)


def test_max_mac_ratio_refuses_costlier_kernels(flavour):
    keras = flavour.keras
    model = randomize(seed_block(keras, 20, 20, 8, 5))
    _, (report,) = tfbigconv.fuse_linear(model, max_mac_ratio=2)
    assert report.status == "refused" and "multiply-adds" in report.reason
    assert report.macs_after > 2 * report.macs_before
    _, (report,) = tfbigconv.fuse_linear(randomize(repvgg_block(keras, 12, 12, 4)), max_mac_ratio=1)
    assert report.status == "fused" and report.macs_after < report.macs_before
    with pytest.raises(ValueError, match="max_mac_ratio"):
        tfbigconv.fuse_linear(model, max_mac_ratio=0)


def test_same_chain_with_batchnorm_patched_for_inference(flavour, tmp_path):
    keras, L = flavour.keras, flavour.layers
    x = keras.Input((36, 34, 6))
    y = L.BatchNormalization(name="bn0")(x)
    y = L.Conv2D(6, 5, padding="same", name="a")(y)
    y = L.BatchNormalization(name="bn1")(y)
    y = L.Conv2D(4, 3, padding="same", groups=2, name="b")(y)
    model = randomize(keras.Model(x, y))
    fused, (report,) = check(keras, model)
    assert report.status == "fused" and report.exact.startswith("borders patched")
    assert report.kernel_size == (7, 7) and len(report.layers) == 4
    path = str(tmp_path / "patched.keras")
    fused.save(path)
    data = random_case((2, 36, 34, 6), 5)
    assert rel_l2(keras.models.load_model(path)(data).numpy(), model(data).numpy()) < TOL


@pytest.mark.parametrize("rank", [1, 3])
def test_chains_of_1d_and_3d_convolutions_are_refused_with_reason(flavour, rank):
    """fuse_linear stays 2-D: a linear chain in another rank is reported, not merged."""
    keras, big = flavour.keras, flavour.big
    conv = keras.layers.Conv1D if rank == 1 else keras.layers.Conv3D
    shape = (40, 3) if rank == 1 else (8, 9, 10, 3)
    inp = keras.Input(shape)
    h = conv(4, 5, padding="same", name="a")(inp)
    h = big.BigConv1D(4, 7, padding="same", name="b")(h) if rank == 1 else \
        big.BigConv3D(4, 3, padding="same", name="b")(h)
    out = conv(2, 3, padding="same", activation="relu", name="c")(h)
    model = keras.Model(inp, out)
    fused, reports = tfbigconv.fuse_linear(model)
    refused = [r for r in reports if r.status == "refused"]
    assert [r.layers for r in refused] == [["a", "b"]]
    assert "2-D convolutions only" in refused[0].reason
    x = random_case((2,) + shape, 0)
    assert rel_l2(fused(x), model(x)) < 1e-6
