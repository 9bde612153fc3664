"""tfbigconv.fuse_train (tfbigconv/fusion/train.py): recompute mode's gradients against the float64 reference (the
unfused program differentiated by TensorFlow), what it keeps for backprop, training
through FusedLinearConv in each mode against the unfused model (in both Keras
flavours: `flavour`), and the mode choice."""
import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings, strategies as st

import tfbigconv
from tfbigconv import fuse, fuse_train
from conftest import TOLERANCE, random_case
from flavours import flavour  # noqa: F401  (the fixture)
from reference import rel_l2
from test_fusion_algebra import conv_step, programs, weights_for
from test_fusion_model import randomize, seed_block

GRAD_TOL = 1e-5  # float32 gradients against float64, relative L2


def seed_program(k, padding="same", strides=(1, 1)):
    """The issue's block as a program: p = 1x1; d = depthwise KxK(p) - p; l = KxK(p)."""
    step1 = conv_step(0, "p", "pb")
    dw = conv_step(1, "dw", "dwb", depthwise=True, strides=strides, padding=padding)
    low = conv_step(1, "low", "lowb", strides=strides, padding=padding)
    if padding == "valid" or strides != (1, 1):  # d - p needs equal sizes: drop "- p"
        return [step1, dw, low, dict(op="concat", srcs=[2, 3])]
    return [step1, dw, dict(op="subtract", srcs=[2, 1]), low, dict(op="concat", srcs=[3, 4])]


def seed_shapes(c, k):
    return {"p": (1, 1, c, c // 2), "pb": (c // 2,), "dw": (k, k, c // 2, 1), "dwb": (c // 2,),
            "low": (k, k, c // 2, c // 2), "lowb": (c // 2,)}


REPVGG = ([conv_step(0, "k3", padding="same"), dict(op="affine", src=1, scale="s3", shift="t3"),
           conv_step(0, "k1"), dict(op="affine", src=3, scale="s1", shift="t1"),
           dict(op="affine", src=0, scale="si", shift="ti"),
           dict(op="add", srcs=[2, 4]), dict(op="add", srcs=[6, 5])],
          {"k3": (3, 3, 6, 6), "s3": (6,), "t3": (6,), "k1": (1, 1, 6, 6), "s1": (6,),
           "t1": (6,), "si": (6,), "ti": (6,)})

CASES = {
    "seed K=3 SAME": (seed_program(3), seed_shapes(8, 3)),
    "seed K=7 SAME": (seed_program(7), seed_shapes(8, 7)),
    "seed K=7 VALID": (seed_program(7, "valid"), seed_shapes(8, 7)),
    "seed K=3 SAME stride 2": (seed_program(3, strides=(2, 2)), seed_shapes(8, 3)),
    "repvgg with BN affines": REPVGG,
    "pad, dilations, groups, strides": (
        [dict(op="pad", src=0, pads=[1, 2, 0, 3]),
         conv_step(1, "a", "ab", groups=2, strides=(2, 1), dilations=(1, 2)),
         conv_step(2, "b", None, depthwise=True, padding=[1, 0, 2, 1], strides=(1, 2)),
         conv_step(0, "c", "cb", strides=(2, 2), padding=[1, 1, 1, 3]),
         dict(op="concat", srcs=[3, 4])],
        {"a": (3, 2, 3, 4), "ab": (4,), "b": (2, 3, 4, 2), "c": (3, 3, 6, 5), "cb": (5,)}),
}


def gradients(run, program, weights, x, cotangent):
    """Output and gradients (x first, then the weights in sorted order) of
    run(program, weights, x), differentiated by TensorFlow, in the arguments' dtype."""
    names = sorted(weights)
    with tf.GradientTape() as tape:
        tape.watch([x] + [weights[n] for n in names])
        y = run(program, weights, x)
        loss = tf.reduce_sum(y * cotangent)
    return y, tape.gradient(loss, [x] + [weights[n] for n in names])


def reference_gradients(program, weights, x, cotangent):
    """The unfused program's (fuse.run_program)."""
    return gradients(fuse.run_program, program, weights, x, cotangent)


def recompute_gradients(program, weights, x, cotangent):
    return gradients(lambda p, w, x: fuse_train.run_recompute(x, p, w), program, weights, x,
                     cotangent)


def check_gradients(program, shapes, in_shape, seed=0):
    """Recompute mode in float32 against the float64 reference, and in float64 against
    TensorFlow's float64 gradients of the unfused program (tight)."""
    w64 = weights_for(shapes, seed)
    x64 = tf.constant(random_case(in_shape, seed + 100, np.float64))
    y64, ref = reference_gradients(program, w64, x64, 1.0)
    cot = tf.constant(random_case(y64.shape, seed + 200, np.float64))
    y64, ref = reference_gradients(program, w64, x64, cot)
    ref = [tf.zeros_like(v) if r is None else r  # None: the output does not depend on it
           for v, r in zip([x64] + [w64[n] for n in sorted(w64)], ref)]
    got_y, got = recompute_gradients(program, w64, x64, cot)
    assert rel_l2(got_y.numpy(), y64.numpy()) < TOLERANCE["float64"]
    for g, r in zip(got, ref):
        assert rel_l2(g.numpy(), r.numpy()) < TOLERANCE["float64"]
    w32 = {k: tf.cast(v, tf.float32) for k, v in w64.items()}
    x32, cot32 = tf.cast(x64, tf.float32), tf.cast(cot, tf.float32)
    got_y, got = recompute_gradients(program, w32, x32, cot32)
    # A weight's gradient is a sum over every pixel; where its terms cancel
    # (seen: 0.016 from ~1300 terms of size ~1) TensorFlow's own float32
    # gradient of the unfused program is off by more than GRAD_TOL (6.9e-5),
    # so the bound is no tighter than what TensorFlow reaches, twice over.
    _, tf32 = reference_gradients(program, w32, x32, cot32)
    assert rel_l2(got_y.numpy(), y64.numpy()) < TOLERANCE["float32"]
    for name, g, t, r in zip(["x"] + sorted(shapes), got, tf32, ref):
        assert g.dtype == tf.float32
        err = rel_l2(g.numpy(), r.numpy())
        tf_err = np.inf if t is None else rel_l2(t.numpy(), r.numpy())
        bound = max(GRAD_TOL, 2 * tf_err) if np.isfinite(tf_err) else GRAD_TOL
        assert err < bound, (name, err, bound)


@pytest.mark.parametrize("case", sorted(CASES))
def test_recompute_gradients_match_float64_reference(case):
    program, shapes = CASES[case]
    channels = 8 if case.startswith("seed") else 6
    check_gradients(program, shapes, (2, 17, 15, channels))


def test_recompute_gradient_of_a_cancelling_sum():
    """A draw of the property test below: s1's gradient is 0.016, summed from ~1300
    terms of size ~1, and float32 (ours and TensorFlow's alike) misses it by 6.9e-5."""
    program = [{"op": "pad", "src": 0, "pads": [1, 2, 1, 0]},
               {"op": "affine", "src": 1, "scale": "s1", "shift": "t1"},
               {"op": "add", "srcs": [0, 0]},
               {"op": "affine", "src": 2, "scale": "s3", "shift": "t3"}]
    shapes = {"s1": (2,), "t1": (2,), "s3": (2,), "t3": (2,)}
    check_gradients(program, shapes, (2, 37, 18, 2), seed=15146)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(0, 2**20))
def test_property_recompute_gradients_on_random_dags(case, seed):
    """Any linear DAG (strides, dilations, groups, paddings, pads, sums, differences,
    concatenations, affine maps, unused steps): the same gradients as TensorFlow's."""
    program, shapes, (h, w, c) = case
    if not program:
        return
    check_gradients(program, shapes, (2, h, w, c), seed)
    want = fuse_train.value_shapes(program, shapes, (h, w), c)[-1]
    got = fuse.run_program(program, weights_for(shapes, seed),
                           tf.zeros((1, h, w, c), tf.float64)).shape[1:]
    assert tuple(got) == want


def test_recomputed_values_are_the_inner_conv_inputs():
    assert fuse_train.recomputed_values(seed_program(7)) == [1]  # p only, never l or d
    assert fuse_train.recomputed_values(REPVGG[0]) == [1, 3]  # the affines' inputs
    chain = [conv_step(0, "a"), conv_step(0, "unused"), dict(op="pad", src=1, pads=[1, 1, 1, 1]),
             conv_step(3, "b"), conv_step(4, "c")]
    assert fuse_train.recomputed_values(chain) == [3, 4]  # not a's output: pad reads it


# ----- what is kept for backprop ------------------------------------------------------

def saved_for_backprop(model, x):
    """The tensors that ops made inside `model`'s forward pass and read by the ops of the
    gradient: what the graph keeps alive from the forward to the backward pass (the
    model's input and the weights' variables are made outside it)."""
    out = {}

    @tf.function
    def step(x):
        graph = tf.compat.v1.get_default_graph()
        with tf.GradientTape() as tape:
            tape.watch(x)
            start = len(graph.get_operations())
            y = model(x)
            forward = set(graph.get_operations()[start:])
            loss = tf.reduce_sum(tf.square(y))
        end = len(graph.get_operations())
        grads = tape.gradient(loss, [x] + model.trainable_weights)
        out["saved"] = {t.ref(): t for op in graph.get_operations()[end:] for t in op.inputs
                        if t.op in forward}
        return grads

    step.get_concrete_function(x)
    return list(out["saved"].values())


def activations(tensors, batch):
    """The saved tensors with a batch dimension (not weight-sized)."""
    return [t for t in tensors if t.shape.rank == 4 and t.shape[0] == batch]


def test_recompute_keeps_only_the_input(flavour):
    batch, h, w, c = 5, 20, 18, 16
    model = randomize(seed_block(flavour.keras, h, w, c, 7))
    x = tf.constant(random_case((batch, h, w, c), 0))
    unfused = activations(saved_for_backprop(model, x), batch)
    # The checker sees what the unfused block keeps: p = 1x1 conv(x), N x H x W x C/2.
    assert (batch, h, w, c // 2) in [tuple(t.shape) for t in unfused]
    for mode in ("recompute", "fused"):
        fused, (report,) = tfbigconv.fuse_linear(model, trainable=True, mode=mode)
        assert report.mode == mode
        saved = activations(saved_for_backprop(fused, x), batch)
        # Only the ReLU after the block keeps its output; nothing inside the block.
        relu_out = [t for t in saved if "re_lu" in t.name or "relu" in t.name]
        assert [tuple(t.shape) for t in saved] == [(batch, h, w, c)], [t.name for t in saved]
        assert relu_out == saved


# ----- training through FusedLinearConv -----------------------------------------------

def train(keras, model, data, steps, lr=0.05):
    """Plain SGD on a mean-squared loss; returns the losses."""
    opt = keras.optimizers.SGD(lr)
    losses = []
    for i in range(steps):
        x, t = data[i % len(data)]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - t))
        grads = tape.gradient(loss, model.trainable_weights)
        opt.apply_gradients(zip(grads, model.trainable_weights))
        losses.append(float(loss))
    return losses


def head(keras, block):
    x = keras.Input(block.inputs[0].shape[1:])
    return keras.Model(x, keras.layers.Conv2D(3, 1, name="head")(block(x)))


@pytest.mark.parametrize("mode", ["fused", "recompute", "auto"])
def test_training_matches_unfused(flavour, mode):
    """Six SGD steps on the seed block: the same loss curve and the same weights."""
    keras = flavour.keras
    block = randomize(seed_block(keras, 24, 22, 16, 7), scale=0.2)
    fused_block, (report,) = tfbigconv.fuse_linear(block, trainable=True, mode=mode)
    assert report.mode in ("fused", "recompute") and mode in ("auto", report.mode)
    unfused, fused = head(keras, block), head(keras, fused_block)
    fused.get_layer("head").set_weights(unfused.get_layer("head").get_weights())
    data = [(random_case((4, 24, 22, 16), s), random_case((4, 24, 22, 3), s + 10))
            for s in range(3)]
    a = train(keras, unfused, data, 6)
    b = train(keras, fused, data, 6)
    assert a[-1] < a[0]  # it learns
    np.testing.assert_allclose(b, a, rtol=1e-4)
    layer = next(l for l in fused_block.layers if isinstance(l, flavour.big.FusedLinearConv))
    for name in ("p", "dw", "low"):
        got = layer.branch_weights[f"{name}_kernel"].numpy()
        kernel = block.get_layer(name).weights[0]  # "depthwise_kernel" in tf_keras' dw
        assert rel_l2(got, kernel.numpy()) < 1e-4


def repvgg_train_block(keras, h, w, c):
    """RepVGG's branches without BatchNormalization (which trains on batch statistics and
    so is not fused when trainable): 3x3 + 1x1 + identity."""
    L = keras.layers
    x = keras.Input((h, w, c))
    a = L.Conv2D(c, 3, padding="same", name="conv3")(x)
    b = L.Conv2D(c, 1, name="conv1")(x)
    return keras.Model(x, L.ReLU()(L.Add(name="add")([a, b, x])))


@pytest.mark.parametrize("build", [lambda K: seed_block(K, 20, 18, 8, 3),
                                   lambda K: seed_block(K, 20, 18, 8, 7),
                                   lambda K: repvgg_train_block(K, 16, 14, 6)],
                         ids=["seed K=3", "seed K=7", "repvgg"])
def test_keras_gradients_recompute_equal_unfused(flavour, build):
    model = randomize(build(flavour.keras))
    fused, (report,) = tfbigconv.fuse_linear(model, trainable=True, mode="recompute")
    assert report.status == "fused" and report.mode == "recompute"
    x = tf.constant(random_case((3,) + tuple(model.inputs[0].shape[1:]), 4))
    grads = []
    for m in (model, fused):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.square(m(x)))
        grads.append(tape.gradient(loss, m.trainable_weights))
    # FusedLinearConv names the weights layer_attribute, e.g. "p_kernel", and a depthwise
    # kernel "dw_kernel" in both flavours (tf_keras' attribute: "depthwise_kernel").
    fused_grads = dict(zip([flavour.weight_name(w) for w in fused.trainable_weights], grads[1]))
    assert len(fused_grads) == len(grads[0])
    for w, ref in zip(model.trainable_weights, grads[0]):
        path = flavour.weight_path(w)
        got = fused_grads[path.replace("/depthwise_kernel", "/kernel").replace("/", "_")]
        assert rel_l2(got.numpy(), ref.numpy()) < GRAD_TOL, path


# ----- the choice -----------------------------------------------------------------------

def test_auto_picks_the_smaller_estimate_and_reports_why():
    # The seed block with many channels: the fused C -> C kernel is ~4x the branches'
    # multiply-adds, so recompute wins.
    _, (report,) = tfbigconv.fuse_linear(seed_block(keras, 14, 14, 128, 7), trainable=True)
    assert report.mode == "recompute"
    assert report.mode_seconds["fused"] > 2 * report.mode_seconds["recompute"]
    assert "recompute" in str(report) and "batch 32" in report.mode_reason
    # RepVGG: one 3x3 conv instead of a 3x3 and a 1x1 one: fused wins.
    _, (report,) = tfbigconv.fuse_linear(repvgg_train_block(keras, 32, 32, 64), trainable=True)
    assert report.mode == "fused"
    assert report.mode_seconds["fused"] < report.mode_seconds["recompute"]


def test_fused_estimate_counts_the_composition():
    program, shapes = seed_program(7), seed_shapes(64, 7)
    fs = fuse_train.fused_conv_shape(program, shapes, (14, 14), 64)
    assert fs.filter_shape == (7, 7, 64, 64) and fs.bias_map  # p's bias meets padding
    # identity then p, p then dw, p then low: channel products
    assert fs.compose_macs == 64 * 32 + 49 * 64 * 32 + 49 * 64 * 32 * 32
    cheap = fuse_train.estimate_seconds(program, shapes, (14, 14), 64, 4)
    costly = fuse_train.estimate_seconds(
        program, shapes, (14, 14), 64, 4,
        fused_shape=fuse_train.FusedConvShape(**dict(vars(fs), compose_macs=10**12)))
    assert costly["recompute"] == cheap["recompute"]
    assert costly["fused"] > cheap["fused"] + 1  # 10^12 multiply-adds take seconds


def test_mode_argument(flavour):
    FusedLinearConv = flavour.big.FusedLinearConv
    model = seed_block(flavour.keras, 10, 10, 4, 3)
    with pytest.raises(ValueError, match="mode"):
        tfbigconv.fuse_linear(model, trainable=True, mode="fast")
    with pytest.raises(ValueError, match="mode"):
        FusedLinearConv(seed_program(3), [], (10, 10), 4, mode=None)
    fused, _ = tfbigconv.fuse_linear(model, trainable=True, mode="recompute")
    layer = next(l for l in fused.layers if isinstance(l, FusedLinearConv))
    assert layer.get_config()["mode"] == "recompute"
    assert FusedLinearConv.from_config(layer.get_config()).mode == "recompute"
    assert layer.choose_mode(8) == ("recompute", "requested", {})
