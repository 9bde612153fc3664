"""explain's messages for shapes of a rank no op takes (issue 52, item 8): it takes
1-D (3 dimensions, as bigconv1d), 2-D (4) and 3-D (5, as bigconv3d) shapes, each
with its filter layout."""
import pytest
import tensorflow as tf

import tfbigconv


@pytest.mark.parametrize("input_shape,filter_shape,fragment", [
    ([100, 3], [3, 3, 1, 1], "input_shape must have 3 dimensions \\(1-D, as bigconv1d\\), 4 "
                             "\\(2-D\\) or 5 \\(3-D, as bigconv3d\\), got 2: \\[100, 3\\]"),
    ([1, 1, 8, 8, 8, 1], [3, 3, 3, 1, 1], "input_shape must have 3 dimensions .* got 6"),
    ([1, 8, 8, 1], [3, 3, 1], "filter_shape must be \\[height, width, in_depth / groups, "
                              "out_depth\\] for a 2-D input_shape"),
    ([1, 8, 1], [1, 3, 1, 1], "filter_shape must be \\[width, in_channels / groups, "
                              "out_channels\\] for a 1-D input_shape"),
    ([1, 8, 8, 8, 1], [3, 3, 1, 1], "filter_shape must be \\[depth, height, width, "
                                    "in_depth / groups, out_depth\\] for a 3-D input_shape"),
])
def test_explain_names_the_ranks_it_takes(input_shape, filter_shape, fragment):
    with pytest.raises(tf.errors.InvalidArgumentError, match=fragment) as info:
        tfbigconv.explain(input_shape, filter_shape)
    assert "must be rank 4" not in str(info.value)


def test_explain_1d_explicit_and_causal_messages_are_1d():
    with pytest.raises(tf.errors.InvalidArgumentError, match="list of 3 \\[before, after\\]"):
        tfbigconv.explain([1, 8, 1], [3, 1, 1], padding="EXPLICIT")
    with pytest.raises(tf.errors.InvalidArgumentError, match="CAUSAL padding puts"):
        tfbigconv.explain([1, 8, 1], [9, 1, 1], padding="CAUSAL", dilations=2**29)


def test_explain_under_xla_shows_the_3d_plan_bigconv3d_runs():
    """The pure path's 3-D plan (pure_tf.plan: rfft2d over height and width, an FFT
    over depth) for a large kernel, TF's conv3d for a small one, and the geometry
    checked in 3-D terms."""
    big = tfbigconv.explain([2, 32, 32, 32, 2], [15, 15, 15, 2, 2], padding="SAME", xla=True)
    assert big.chosen["forward"] == "fft" and len(big.fft) == 3
    assert "fft/ifft over depth" in str(big)
    small = tfbigconv.explain([2, 8, 8, 8, 2], [3, 3, 3, 2, 2], padding="SAME", xla=True)
    assert small.chosen["forward"] == "tf" and "tf.nn.conv3d" in str(small)
    with pytest.raises(tf.errors.InvalidArgumentError, match="larger than the padded input "
                                                             "along depth"):
        tfbigconv.explain([2, 8, 8, 8, 2], [12, 3, 3, 2, 2], padding="VALID", xla=True)
