"""benchmarks/bench_models.py's models (benchmarks/large_kernel_models.py), at tiny sizes:
each tfbigconv variant computes the same function as the stock one. No timing."""
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from conftest import TOLERANCE
from flavours import flavour  # noqa: F401  (the fixture)
from reference import rel_l2

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import bench_models  # noqa: E402
import large_kernel_models as lkm  # noqa: E402

TOL = TOLERANCE["float32"]


def batch(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def same_weights_copy(build):
    """Two models from `build()`, the second with the first's weights."""
    a, b = build(), build()
    b.set_weights(a.get_weights())
    return a, b


def test_replknet_converts_every_large_kernel_and_computes_the_same(flavour):
    stock, ours = same_weights_copy(lambda: lkm.replknet(flavour.keras, 64, lkm.REPLKNET_TINY))
    # algorithm="fft": our kernel, not TF's that "auto" may pick at this size.
    ours, report = tfbigconv.convert_model(ours, 13, algorithm="fft", in_place=True, report=True)
    # One LargeConv per RepLKBlock (1 + 1 + 2 + 1), its 5x5 branch left stock.
    assert len(report.converted) == 5 and not report.not_converted
    x = batch((2, 64, 64, 3))
    assert rel_l2(ours(x, training=False), stock(x, training=False)) < TOL
    # In training mode ~30 BatchNorms normalize by the statistics of 2 small maps,
    # which amplifies float32 rounding (1.2e-5 seen with oneDNN off); a wrong
    # convolution is off by O(1).
    assert rel_l2(ours(x, training=True), stock(x, training=True)) < 10 * TOL


def test_replknet_merged_path_matches_and_routes(flavour):
    model = lkm.replknet(flavour.keras, 64, lkm.REPLKNET_TINY)
    x = batch((2, 64, 64, 3))
    unmerged = model(x, training=False).numpy()
    assert lkm.reparameterize(model) == 5
    assert rel_l2(model(x, training=False), unmerged) < TOL
    fn = tf.function(lambda x: model(x, training=False))
    with tfbigconv.route(13, algorithm="fft") as scope:
        routed = fn(x)
    assert len(scope.routed) == 5  # every merged tf.nn.depthwise_conv2d
    assert rel_l2(routed, unmerged) < TOL


def test_hyena_bigconv1d_block_matches_the_fft_block(flavour):
    fft, ours = (lkm.hyena(flavour.keras, 512, 16, conv) for conv in ("fft", "bigconv"))
    ours.set_weights(fft.get_weights())
    x = batch((2, 512, 16))
    # The block adds its output to x: compare what it adds.
    assert rel_l2(ours(x).numpy() - x, fft(x).numpy() - x) < TOL
    # The FFT block against a direct causal convolution (float64).
    u, k = batch((1, 64, 3), 1), batch((64, 3), 2)
    direct = np.stack([[np.dot(k[:t + 1][::-1, c].astype(np.float64), u[0, :t + 1, c])
                        for c in range(3)] for t in range(64)])[None]
    assert rel_l2(lkm.fft_causal_conv(tf.constant(u), tf.constant(k)), direct) < TOL
    assert rel_l2(lkm.bigconv_causal_conv(tf.constant(u), tf.constant(k)), direct) < TOL


def test_uxnet_split_and_converted_compute_the_grouped_block(flavour):
    def build(depthwise):
        # layer scale 1, so that the depthwise convolution shows in the output
        return lkm.uxnet(flavour.keras, 12, 7, 3, layer_scale_init=1.0, depthwise=depthwise)
    grouped, split = build("grouped"), build("split")
    split.set_weights(grouped.get_weights())
    ours = build("grouped")
    ours.set_weights(grouped.get_weights())
    ours, report = tfbigconv.convert_model(ours, 7, algorithm="fft", in_place=True, report=True)
    assert len(report.converted) == 1
    x = batch((1, 12, 12, 12, 3))
    try:
        ref = grouped(x).numpy() - x
    except tf.errors.InvalidArgumentError:  # tf_keras runs TF's CPU Conv3D: no groups
        ref = split(x).numpy() - x
    assert rel_l2(split(x).numpy() - x, ref) < TOL
    assert rel_l2(ours(x).numpy() - x, ref) < TOL


def test_bench_variants_share_weights_and_count_conversions():
    import keras
    stock, ours, facts = bench_models.variants(keras, "uxnet", "s12-k13-c2-b1",
                                               {"min_kernel_size": 13})
    assert facts["converted"] == 1
    assert all(np.array_equal(a, b) for a, b in zip(stock.get_weights(), ours.get_weights()))


@pytest.mark.parametrize("model, label", [("replknet", "r224"), ("replknet", "tiny-r64-b2-x3"),
                                          ("hyena", "L2048-b1"), ("uxnet", "tiny-s48-k13-c8-b1")])
def test_bad_point_labels_raise(model, label):
    with pytest.raises(ValueError, match="bad point"):
        bench_models.parse_point(model, label)
