"""tfbigconv.fuse (the tfbigconv.fusion package: the kernel algebra of
fusion/algebra.py and the programs of fusion/program.py) against running the
unfused convolutions.

Every fused map is compared over its whole output, borders included, in
float64, with the unfused program (fuse.run_program, itself checked against
tests/reference.py here); a fusion that cannot be exact must raise
NotFusable with a reason instead.
"""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings, strategies as st

import tfbigconv
from tfbigconv import fuse
from tfbigconv.fusion import program as fusion_program
from conftest import random_case
from reference import conv2d_reference, rel_l2

TOL = 1e-12  # float64


def conv_step(src, kernel, bias=None, groups=1, depthwise=False, strides=(1, 1),
              dilations=(1, 1), padding="valid"):
    return dict(op="conv", src=src, kernel=kernel, bias=bias, groups=groups, depthwise=depthwise,
                strides=list(strides), dilations=list(dilations), padding=padding)


def weights_for(shapes, seed):
    return {name: tf.constant(random_case(shape, seed + i, np.float64))
            for i, (name, shape) in enumerate(sorted(shapes.items()))}


def check_fused(program, weights, x, patch=False):
    """Fuses the program and compares it with running it unfused; returns the map."""
    _, h, w, c = x.shape
    ref = fuse.run_program(program, weights, x).numpy()
    m = fuse.compose_program(program, weights, (h, w), c, tf.float64, patch_borders=patch)
    bias = m.bias
    if m.bias_padded and not m.patched:
        bias = fuse.bias_map(program, weights, (h, w), c, tf.float64)
    got = fuse.apply_fused(x, m, bias, program=program, weights=weights).numpy()
    err = rel_l2(got, ref)
    assert err < TOL, f"rel L2 {err}"
    return m


def test_tfbigconv_fuse_is_the_fusion_package():
    """The public names tfbigconv.fuse and tfbigconv.fuse_train are the fusion
    package (its algebra's and programs' names) and its train module."""
    from tfbigconv import fusion
    from tfbigconv.fusion import algebra, train
    assert tfbigconv.fuse is fusion and tfbigconv.fuse_train is train
    assert fuse.NotFusable is algebra.NotFusable
    assert fuse.compose_program is fusion_program.compose_program
    assert all(hasattr(fuse, name) for name in fuse.__all__)


def test_run_program_matches_numpy_reference():
    x = tf.constant(random_case((2, 13, 11, 4), 0, np.float64))
    w = weights_for({"k": (3, 5, 2, 6), "b": (6,)}, 1)
    program = [conv_step(0, "k", "b", groups=2, strides=(2, 1), dilations=(1, 2), padding="same")]
    got = fuse.run_program(program, w, x).numpy()
    ref = conv2d_reference(x.numpy(), w["k"].numpy(), (2, 1), "SAME", (1, 2)) + w["b"].numpy()
    assert rel_l2(got, ref) < TOL


def test_sequential_kernel_size_stride_and_bias():
    """d1 (K1 - 1) + s1 d2 (K2 - 1) + 1, stride s1 s2, bias b2 + sum W2 b1 (VALID chain)."""
    x = tf.constant(random_case((2, 40, 35, 3), 0, np.float64))
    w = weights_for({"a": (3, 2, 3, 4), "ab": (4,), "b": (4, 3, 4, 5), "bb": (5,)}, 1)
    program = [conv_step(0, "a", "ab", strides=(2, 3), dilations=(2, 1)),
               conv_step(1, "b", "bb", strides=(1, 2), dilations=(1, 2))]
    m = check_fused(program, w, x)
    assert m.kernel_size == (2 * 2 + 2 * 1 * 3 + 1, 1 * 1 + 3 * 2 * 2 + 1)
    assert m.strides == (2, 6) and not m.bias_padded


@pytest.mark.parametrize("g1,g2,fused", [(4, 4, 4), (2, 4, 2), (4, 2, 2), (2, 3, 1), (1, 6, 1),
                                         (6, 1, 1)])
def test_groups_kept_where_aligned(g1, g2, fused):
    x = tf.constant(random_case((1, 16, 15, 12), 0, np.float64))
    w = weights_for({"a": (3, 3, 12 // g1, 12), "b": (3, 3, 12 // g2, 24)}, 1)
    m = check_fused([conv_step(0, "a", groups=g1), conv_step(1, "b", groups=g2)], w, x)
    assert m.groups == fused


@pytest.mark.parametrize("k1,k2", [((1, 1), (5, 5)), ((5, 3), (1, 1)), ((1, 1), (1, 1))])
def test_one_by_one_compositions(k1, k2):
    x = tf.constant(random_case((2, 14, 13, 6), 0, np.float64))
    w = weights_for({"a": k1 + (6, 2), "b": k2 + (4, 9)}, 1)
    check_fused([conv_step(0, "a", depthwise=True, strides=(2, 1)),
                 conv_step(1, "b", groups=3, strides=(1, 2))], w, x)


def test_depthwise_chain_7_7_7_is_19():
    x = tf.constant(random_case((2, 30, 28, 8), 0, np.float64))
    w = weights_for({n: (7, 7, 8, 1) for n in "abc"} | {"bb": (8,)}, 1)
    program = [conv_step(0, "a", depthwise=True), conv_step(1, "b", "bb", depthwise=True),
               conv_step(2, "c", depthwise=True)]
    m = check_fused(program, w, x)
    assert m.kernel_size == (19, 19) and m.groups == 8


def test_parallel_sum_difference_and_identity_centred():
    """RepVGG-like: 3x3 + 1x1 - identity, all SAME: the small kernels land in the centre."""
    x = tf.constant(random_case((2, 11, 12, 5), 0, np.float64))
    w = weights_for({"a": (3, 3, 5, 5), "b": (1, 1, 5, 5), "ab": (5,)}, 1)
    program = [conv_step(0, "a", "ab", padding="same"), conv_step(0, "b", padding="same"),
               dict(op="add", srcs=[1, 2]), dict(op="subtract", srcs=[3, 0])]
    m = check_fused(program, w, x)
    kernel = m.kernel.numpy()
    a, b = w["a"].numpy(), w["b"].numpy()[0, 0]
    assert np.allclose(kernel[1, 1], a[1, 1] + b - np.eye(5))
    assert np.allclose(kernel[0], a[0]) and not m.bias_padded


def test_concat_and_batchnorm_before_and_after():
    x = tf.constant(random_case((2, 12, 10, 4), 0, np.float64))
    shapes = {"a": (3, 3, 4, 3), "b": (5, 5, 4, 2), "s0": (4,), "t0": (4,), "s1": (5,),
              "t1": (5,)}
    w = weights_for(shapes, 1)
    program = [dict(op="affine", src=0, scale="s0", shift="t0"),  # BN before a padded conv
               conv_step(1, "a", padding="same"), conv_step(1, "b", padding="same"),
               dict(op="concat", srcs=[2, 3]), dict(op="affine", src=4, scale="s1", shift="t1")]
    m = check_fused(program, w, x)
    assert m.bias_padded  # the shift before the padding varies near the borders


def test_batchnorm_affine_matches_keras():
    import keras
    bn = keras.layers.BatchNormalization(epsilon=1e-3)
    x = random_case((3, 4, 5, 6), 0)
    bn.build(x.shape)
    bn.set_weights([random_case((6,), i) if i != 3 else np.abs(random_case((6,), i))
                    for i in range(4)])
    scale, shift = fuse.batchnorm_affine(*bn.weights, bn.epsilon)
    assert rel_l2(x * scale.numpy() + shift.numpy(), bn(x, training=False).numpy()) < 1e-6


def test_regroup_and_dilate():
    k = tf.constant(random_case((2, 3, 2, 12), 0, np.float64))
    dense = fuse.regroup(k, 6, 1).numpy()  # block diagonal
    assert dense.shape == (2, 3, 12, 12)
    for g in range(6):
        block = dense[:, :, 2 * g:2 * g + 2, :]
        assert np.array_equal(block[..., 2 * g:2 * g + 2], k.numpy()[..., 2 * g:2 * g + 2])
        assert not np.any(np.delete(block, range(2 * g, 2 * g + 2), axis=3))
    d = fuse.dilate_kernel(k, (2, 3)).numpy()
    assert d.shape == (3, 7, 2, 12) and np.array_equal(d[::2, ::3], k.numpy())
    assert np.count_nonzero(d) == np.count_nonzero(k.numpy())


@pytest.mark.parametrize("program,reason", [
    ([conv_step(0, "a", padding="same"), conv_step(1, "a", padding="same")], "padding"),
    ([conv_step(0, "a", strides=(2, 2), padding="same"), conv_step(0, "a", padding="same"),
      dict(op="add", srcs=[1, 2])], None),  # shapes differ: Keras would not build it
])
def test_refusals_say_why(program, reason):
    w = weights_for({"a": (3, 3, 3, 3)}, 1)
    with pytest.raises(fuse.NotFusable) as e:
        fuse.compose_program(program, w, (9, 9), 3, tf.float64)
    assert str(e.value) and (reason is None or reason in str(e.value))


@pytest.mark.parametrize("size", [(40, 37), (20, 19), (12, 40)])
def test_same_chain_patched_borders(size):
    """Three SAME 7x7 depthwise convs with biases: refused as one kernel, exact with the
    border rows and columns taken from the unfused program on strips; on small
    inputs the strips cover everything and the program runs as it is."""
    x = tf.constant(random_case((2,) + size + (4,), 0, np.float64))
    w = weights_for({n: (7, 7, 4, 1) for n in "abc"} | {"bb": (4,)}, 1)
    program = [conv_step(0, "a", depthwise=True, padding="same"),
               conv_step(1, "b", "bb", depthwise=True, padding="same"),
               conv_step(2, "c", depthwise=True, padding="same")]
    with pytest.raises(fuse.NotFusable, match="padding"):
        fuse.compose_program(program, w, size, 4, tf.float64)
    m = check_fused(program, w, x, patch=True)
    assert m.patched and m.kernel_size == (19, 19)
    (top, bottom, rows), _ = fuse.border_strips(m)
    assert (top, m.out_size[0] - bottom, rows) == (9, 9, 20)


def test_patching_needs_stride_one():
    w = weights_for({"a": (3, 3, 2, 2)}, 1)
    program = [conv_step(0, "a", padding="same"), conv_step(1, "a", strides=(2, 2),
                                                             padding="same")]
    with pytest.raises(fuse.NotFusable, match="stride 1"):
        fuse.compose_program(program, w, (16, 16), 2, tf.float64, patch_borders=True)


def test_pad_once_then_valid_is_exact():
    """ZeroPadding2D then VALID convs: the intermediates are never padded."""
    x = tf.constant(random_case((2, 10, 9, 3), 0, np.float64))
    w = weights_for({"a": (3, 3, 3, 4), "ab": (4,), "b": (5, 5, 4, 2)}, 1)
    program = [dict(op="pad", src=0, pads=[3, 3, 3, 3]), conv_step(1, "a", "ab"),
               conv_step(2, "b")]
    m = check_fused(program, w, x)
    assert m.out_size == (10, 9) and not m.bias_padded


# ----- random linear DAGs: fused exactly, or refused with a reason ----------------------

@st.composite
def programs(draw, stride_one=False):
    """A random program with its weight shapes and input shape (NHWC)."""
    c = draw(st.sampled_from([2, 4, 6]))
    low = 24 if stride_one else 6
    h, w = draw(st.integers(low, 40)), draw(st.integers(low, 40))
    shapes = [(h, w, c)]  # per value: (height, width, channels)
    program, weights = [], {}
    for i in range(draw(st.integers(2, 6))):
        convs = ["conv"] * (6 if stride_one else 3)
        op = draw(st.sampled_from(convs + ["pad", "add", "concat", "affine"]))
        last = [len(shapes) - 1] * (3 if stride_one else 0)  # favour chains
        src = draw(st.sampled_from(last + list(range(len(shapes)))))
        sh, sw, sc = shapes[src]
        if op == "conv":
            kmin = 2 if stride_one else 1  # stride 1: mostly padded chains, to patch
            k = (draw(st.integers(kmin, 4)), draw(st.integers(kmin, 4)))
            s = (1, 1) if stride_one else (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
            d = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
            padding = draw(st.sampled_from(["same", "same", "valid", "explicit"]))
            if padding == "explicit":
                padding = [draw(st.integers(0, 3)) for _ in range(4)]
            pads = fusion_program.conv_pads(dict(padding=padding, strides=s, dilations=d), (sh, sw),
                                            k)
            eff = [(kk - 1) * dd + 1 for kk, dd in zip(k, d)]
            out = [(n + p0 + p1 - e) // ss + 1
                   for n, p0, p1, e, ss in zip((sh, sw), pads[::2], pads[1::2], eff, s)]
            if min(out) < 1:
                continue
            depthwise = draw(st.booleans())
            name = f"k{i}"
            if depthwise:
                mult = draw(st.integers(1, 2))
                weights[name], groups, cout = (k[0], k[1], sc, mult), sc, sc * mult
            else:
                groups = draw(st.sampled_from([g for g in (1, 2, 3, 6) if sc % g == 0]))
                cout = groups * draw(st.integers(1, 2))
                weights[name] = (k[0], k[1], sc // groups, cout)
            bias = None
            if draw(st.booleans()):
                bias = f"b{i}"
                weights[bias] = (cout,)
            program.append(conv_step(src, name, bias, groups, depthwise, s, d, padding))
            shapes.append((out[0], out[1], cout))
        elif op == "pad":
            pads = [draw(st.integers(0, 2)) for _ in range(4)]
            program.append(dict(op="pad", src=src, pads=pads))
            shapes.append((sh + pads[0] + pads[1], sw + pads[2] + pads[3], sc))
        elif op == "affine":
            weights[f"s{i}"] = weights[f"t{i}"] = (sc,)
            program.append(dict(op="affine", src=src, scale=f"s{i}", shift=f"t{i}"))
            shapes.append(shapes[src])
        else:
            same = [v for v, shp in enumerate(shapes)
                    if shp[:2] == (sh, sw) and (op == "concat" or shp[2] == sc)]
            other = draw(st.sampled_from(same))
            if op == "add":
                op = draw(st.sampled_from(["add", "subtract"]))
            program.append(dict(op=op, srcs=[src, other]))
            shapes.append((sh, sw, sc + shapes[other][2] if op == "concat" else sc))
    return program, weights, (h, w, c)


FUSED = []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          derandomize=True)  # the share fused below is then the same on every run
@given(programs(), st.integers(0, 2**20), st.booleans())
def test_property_random_dags_fused_exactly_or_refused(case, seed, patch):
    program, shapes, (h, w, c) = case
    if not program:
        return
    weights = weights_for(shapes, seed)
    x = tf.constant(random_case((2, h, w, c), seed, np.float64))
    try:
        fuse.compose_program(program, weights, (h, w), c, tf.float64, patch_borders=patch)
    except fuse.NotFusable as e:
        assert len(str(e)) > 20
        FUSED.append(False)
        return
    check_fused(program, weights, x, patch)  # compares with the unfused program
    FUSED.append(True)


def test_property_fused_some_and_refused_some():
    """The property test above did both (it runs first in this file)."""
    if len(FUSED) < 100:
        pytest.skip("runs after test_property_random_dags_fused_exactly_or_refused")
    assert 0.2 < np.mean(FUSED) < 0.95, np.mean(FUSED)


PATCHED = []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(stride_one=True), st.integers(0, 2**20))
def test_property_stride_one_dags_with_patched_borders(case, seed):
    """Stride-1 DAGs on larger inputs, border patching on: always fused, and exact."""
    program, shapes, (h, w, c) = case
    if not program:
        return
    weights = weights_for(shapes, seed)
    x = tf.constant(random_case((1, h, w, c), seed, np.float64))
    m = check_fused(program, weights, x, patch=True)
    PATCHED.append(m.patched)


def test_property_patched_some():
    if len(PATCHED) < 20:
        pytest.skip("runs after test_property_stride_one_dags_with_patched_borders")
    assert np.mean(PATCHED) > 0.1, np.mean(PATCHED)
