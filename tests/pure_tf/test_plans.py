"""The pure-TF path's plan (tfbigconv/pure_tf/plans.py): its Python copies of the
compiled library's shape rules and good FFT sizes, the estimates, and `plan`'s
choice, also as explain(..., xla=True) shows it."""
import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from tfbigconv import _core
from tfbigconv import pure_tf


def test_good_fft_size_is_the_planners():
    sizes = list(range(1, 3000)) + [2**32 - 5, 2**32]  # the planner's table ends at 2^32
    assert [pure_tf.good_fft_size(n) for n in sizes] == [_core.good_fft_size(n) for n in sizes]


def test_estimates_pick_tf_conv_for_small_filters_and_fft_for_large():
    def fft_wins(geometry, xla=True):
        conv, fft = pure_tf.estimates(*geometry.values(), xla=xla)
        return fft < conv

    big = dict(n=16, h=321, w=481, cin=1, cout=3, kh=135, kw=135, groups=1, fft_h=324,
               fft_w=486, out_h=187, out_w=347)
    assert fft_wins(big)
    small = dict(big, cin=16, cout=16, kh=3, kw=3, out_h=319, out_w=479)
    assert not fft_wins(small)
    # XLA's depthwise convolution is slow on the CPU: the FFT wins there even at 3x3.
    dw = dict(n=8, h=56, w=56, cin=128, cout=128, kh=3, kw=3, groups=128, fft_h=60, fft_w=60,
              out_h=56, out_w=56)
    assert fft_wins(dw, xla=True)
    assert not fft_wins(dw, xla=False)


def test_pure_tf_rejects_a_filter_larger_than_the_input(monkeypatch):
    with pytest.raises(ValueError, match="larger than the padded input"):
        pure_tf.check_geometry((1, 10, 10, 1), (12, 3, 1, 1), [1] * 4, "VALID", [], "NHWC",
                               [1] * 4)
    # One row more than the input is an empty output, as in tf.nn.conv2d.
    pure_tf.check_geometry((1, 10, 10, 1), (11, 3, 1, 1), [1] * 4, "VALID", [], "NHWC", [1] * 4)
    with pytest.raises(ValueError, match="multiple"):
        pure_tf.check_geometry((1, 10, 10, 3), (3, 3, 2, 1), [1] * 4, "VALID", [], "NHWC",
                               [1] * 4)


def test_padding_rule_is_the_cores():
    """pure_tf's Python copies of the shape rules (they must run without _core)
    agree with _core.conv_geometry: output sizes, and which geometries fail."""
    rng = np.random.default_rng(12)
    for _ in range(400):
        fmt = ["NHWC", "NCHW"][rng.integers(2)]
        k, s, d = rng.integers(1, 8, 2), rng.integers(1, 4, 2), rng.integers(1, 4, 2)
        size = rng.integers(1, 20, 2)
        mode = ["SAME", "VALID", "EXPLICIT"][rng.integers(3)]
        pads = rng.integers(0, 5, 4)
        hd, wd = (1, 2) if fmt == "NHWC" else (2, 3)
        in_shape = [2, 0, 0, 3] if fmt == "NHWC" else [2, 3, 0, 0]
        in_shape[hd], in_shape[wd] = int(size[0]), int(size[1])
        strides, dil, explicit = [1] * 4, [1] * 4, []
        strides[hd], strides[wd], dil[hd], dil[wd] = int(s[0]), int(s[1]), int(d[0]), int(d[1])
        if mode == "EXPLICIT":
            explicit = [0] * 8
            explicit[2 * hd:2 * hd + 2] = [int(pads[0]), int(pads[1])]
            explicit[2 * wd:2 * wd + 2] = [int(pads[2]), int(pads[3])]
        f_shape = [int(k[0]), int(k[1]), 3, 4]
        args = (in_shape, f_shape, strides, mode, explicit, fmt, dil)
        try:
            want = _core.conv_geometry(*args).output_shape
        except ValueError:
            with pytest.raises(ValueError):
                pure_tf.check_geometry(*args)
            continue
        pure_tf.check_geometry(*args)
        got = [pure_tf.pads_1d(in_shape[dd], f_shape[i], strides[dd], dil[dd], mode,
                               explicit[2 * dd:2 * dd + 2])[2] for i, dd in enumerate((hd, wd))]
        assert got == [want[hd], want[wd]], args


def test_explain_xla_shows_the_pure_tf_plan():
    big = tfbigconv.explain((16, 321, 481, 1), (135, 135, 1, 3), padding="VALID", xla=True)
    assert big.chosen == {"forward": "fft", "backprop_input": "fft", "backprop_filter": "fft"}
    assert "rfft2d/irfft2d 324x486" in str(big)  # good sizes of the 321 x 481 input
    small = tfbigconv.explain((8, 64, 64, 16), (3, 3, 16, 16), padding="SAME", xla=True)
    assert set(small.chosen.values()) == {"tf"} and "TensorFlow's convolution" in str(small)
    with pytest.raises(tf.errors.InvalidArgumentError, match="larger than the padded input"):
        tfbigconv.explain((1, 8, 8, 1), (10, 3, 1, 1), xla=True)


def test_plan_of_a_large_3d_filter():
    """3-D: the transforms at good sizes of each padded side, the FFT estimated
    faster; algorithm "tf" and a workspace_limit below one image's spectra run
    TensorFlow's convolution."""
    args = ([2, 24, 24, 24, 2], [15, 15, 15, 2, 2], [1] * 5, "SAME", [], "NDHWC", [1] * 5,
            "float32")
    p = pure_tf.plan(*args, "auto", 0, xla=True)
    assert p.branch == pure_tf.Branch.FFT and p.fft == (pure_tf.good_fft_size(38),) * 3
    assert p.fft_seconds < p.tf_seconds and p.fits and p.out == (24,) * 3
    assert p.pads == (7, 7) * 3
    assert p.per_image_bytes == (2 + 2) * 40 * 40 * 21 * 8  # complex64 spectra
    assert pure_tf.plan(*args, "tf", 0, xla=True).branch == pure_tf.Branch.TF
    small = pure_tf.plan(*args, "auto", p.per_image_bytes - 1, xla=True)
    assert small.branch == pure_tf.Branch.TF and not small.fits
