"""The direct CPU kernel through _core (no TensorFlow in the loop): every ISA
variant, NaN-poisoned outputs, tile edges, blocking and thread counts."""
import numpy as np
import pytest

from tfbigconv import _core

from conftest import (DILATIONS, LARGE_FILTERS, PADDINGS, STRIDES, TOLERANCE, check_core,
                      random_case, run_core, run_core_pass)
from reference import (conv2d_reference, conv2d_reference_backprop_filter,
                       conv2d_reference_backprop_input, rel_l2)

ISAS = _core.supported_isas()


def run(x, w, strides=1, padding="VALID", dil=1, fmt="NHWC", pads=((0, 0), (0, 0)), isa="",
        threads=0):
    return run_core("direct", x, w, strides, padding, dil, fmt, pads, isa=isa, num_threads=threads)


def check(x, w, strides=1, padding="VALID", dil=1, fmt="NHWC", pads=((0, 0), (0, 0)), isa=""):
    return check_core("direct", x, w, strides, padding, dil, fmt, pads, isa=isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("cout", [1, 2, 3, 4, 5, 7, 8, 16, 31, 32, 33, 64])
def test_output_channel_tiles(isa, cout):
    """Output channels around the C=1..4 column tiles and the 2-vector channel tiles."""
    check(random_case((2, 13, 21, 3), 1), random_case((5, 4, 3, cout), 2), 1, "SAME", isa=isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("width", [1, 3, 4, 5, 8, 9, 15, 16, 17, 23, 24, 25, 33, 49])
def test_output_width_edges(isa, width):
    """Output widths below, at, one over and past the vector (4/8/16) and pixel-group sizes."""
    for cout in (3, 40):
        check(random_case((1, 5, width + 2, 2), width), random_case((3, 3, 2, cout), 7), isa=isa)


@pytest.mark.parametrize("height", [1, 2, 3, 5, 6, 11, 12, 13, 24, 25, 37])
def test_output_height_edges(height):
    """Output heights around the row tiles (3, 4, 6, 12) and the 12-row task."""
    for cout in (1, 3, 4, 48):
        check(random_case((2, height + 4, 9, 2), height), random_case((5, 2, 2, cout), 3))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("k", [1, 2, 3, 7, 15, 31])
def test_square_filters(isa, dtype, k):
    x = random_case((2, 37, 41, 2), k, dtype)
    w = random_case((k, k, 2, 3), k + 1, dtype)
    check(x, w, 1, "SAME", isa=isa)


@pytest.mark.parametrize("shape,fshape", LARGE_FILTERS)
def test_large_and_nonsquare_filters(shape, fshape):
    check(random_case(shape, 3), random_case(fshape, 4), 1, "VALID")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("padding,pads", PADDINGS)
@pytest.mark.parametrize("strides", STRIDES)
@pytest.mark.parametrize("dil", DILATIONS)
def test_padding_strides_dilations(isa, padding, pads, strides, dil):
    for cout in (2, 36):
        check(random_case((2, 23, 29, 3), 5), random_case((4, 5, 3, cout), 6), strides, padding,
              dil, pads=pads, isa=isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("cin,fin,cout", [
    (6, 3, 4),      # 2 groups
    (6, 2, 9),      # 3 groups
    (8, 1, 8),      # depthwise
    (8, 1, 16),     # depthwise, multiplier 2
    (4, 1, 128),    # depthwise, multiplier 32 (channel-vector tiles)
    (64, 16, 128),  # 4 groups of 16 -> 32
])
def test_groups_and_layouts(isa, fmt, cin, fin, cout):
    shape = (2, 19, 22, cin) if fmt == "NHWC" else (2, cin, 19, 22)
    check(random_case(shape, cin), random_case((5, 6, fin, cout), cout), 2, "SAME", 1, fmt,
          isa=isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("groups", [4, 5, 8, 9, 15, 16, 17, 24, 31, 32, 33, 48])
def test_group_vector_tiles(isa, groups):
    """Depthwise in NHWC runs the groups kernel once there is a vector of
    groups (4, 8 or 16 lanes): group counts around one and two vectors, with
    strides, dilation and every pass."""
    shape, fshape = (2, 13, 17, groups), (5, 4, 1, groups)
    x, w = random_case(shape, groups), random_case(fshape, groups + 1)
    lanes = {"baseline": 4, "avx2": 8, "avx512": 16}[isa]
    b = _core.direct_blocking(list(shape), list(fshape), [1, 2, 2, 1], "SAME", [], "NHWC",
                              [1] * 4, isa=isa)
    assert b["group_vectors"] == (groups >= lanes), b
    for strides, dil in ((1, 1), (2, 1), (1, 2), ((2, 1), (1, 3))):
        check(x, w, strides, "SAME", dil, isa=isa)
    y = check(x, w, (2, 1), "VALID", isa=isa)
    dy = random_case(y.shape, 3)
    got = run_core_pass("direct", "backprop_input", dy, w, shape, (2, 1), "VALID", isa=isa)
    ref = conv2d_reference_backprop_input(dy, w, shape, (2, 1), "VALID")
    assert rel_l2(got, ref) <= TOLERANCE["float32"]
    got = run_core_pass("direct", "backprop_filter", x, dy, fshape, (2, 1), "VALID", isa=isa)
    ref = conv2d_reference_backprop_filter(x, dy, fshape, (2, 1), "VALID")
    assert rel_l2(got, ref) <= TOLERANCE["float32"]


@pytest.mark.parametrize("dtype", ["float64", "float16", "bfloat16"])
def test_group_vector_tiles_other_dtypes(dtype):
    """The groups kernel in double lanes, and in float for the half types."""
    import ml_dtypes
    shape, fshape = (2, 11, 14, 20), (7, 7, 1, 20)
    x64, w64 = random_case(shape, 0, np.float64), random_case(fshape, 1, np.float64)
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    x, w = x64.astype(np_dtype), w64.astype(np_dtype)
    assert _core.direct_blocking(list(shape), list(fshape), [1] * 4, "SAME", [], "NHWC",
                                 [1] * 4, dtype=dtype)["group_vectors"]
    ref = conv2d_reference(x.astype(np.float64), w.astype(np.float64), (1, 1), "SAME")
    if dtype == "bfloat16":
        out = np.full(ref.shape, 0xFFFF, dtype=np.uint16)  # NaN pattern
        _core.run_pass("direct", "forward", x.view(np.uint16), w.view(np.uint16), [], [1] * 4,
                       "SAME", [], "NHWC", [1] * 4, out=out, dtype="bfloat16")
        got = out.view(ml_dtypes.bfloat16)
    else:
        got = run(x, w, 1, "SAME")
    assert rel_l2(got, ref) <= TOLERANCE[dtype]


def test_blocking_over_filter_rows_and_channels():
    """A filter too big for one L2 block runs in several (ci, kh) blocks."""
    shape, fshape = (1, 40, 44, 48), (31, 31, 48, 40)
    b = _core.direct_blocking(list(shape), list(fshape), [1] * 4, "SAME", [], "NHWC",
                                      [1] * 4)
    assert b["kh_block"] < 31 or b["ci_block"] < 48, b
    check(random_case(shape, 1), random_case(fshape, 2), 1, "SAME")


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_batch_zero_and_empty(fmt):
    x = random_case((0, 8, 8, 2) if fmt == "NHWC" else (0, 2, 8, 8), 0)
    out = run(x, random_case((3, 3, 2, 4), 1), fmt=fmt)
    assert out.shape == ((0, 6, 6, 4) if fmt == "NHWC" else (0, 4, 6, 6))
    # Zero output channels.
    assert run(random_case((1, 8, 8, 2), 0), random_case((3, 3, 2, 0), 1)).shape == (1, 6, 6, 0)


def test_zero_input_channels_padding_only_window():
    """Explicit padding larger than the input: windows that see only padding give 0."""
    x = random_case((1, 2, 2, 1), 0)
    out = run(x, random_case((3, 3, 1, 2), 1), 1, "EXPLICIT", pads=((4, 4), (4, 4)))
    ref = conv2d_reference(x, random_case((3, 3, 1, 2), 1), (1, 1), "EXPLICIT", (1, 1), "NHWC",
                           ((4, 4), (4, 4)))
    assert rel_l2(out, ref) < 1e-6
    assert np.all(out[:, 0] == 0)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", ["chans", "groups"])
@pytest.mark.parametrize("width", [1, 2, 3, 4, 5, 7, 8, 9, 13])
def test_narrow_pixel_groups(isa, kind, width):
    """Outputs a few pixels wide run the 4-pixel chans and groups kernels:
    widths around the pixel groups, one vector of channels (or groups) and
    two with a tail."""
    lanes = {"baseline": 4, "avx2": 8, "avx512": 16}[isa]
    for c in (lanes, 2 * lanes + 3):
        shape = (2, 6, width + 2, c)
        fshape = (3, 3, 1, c) if kind == "groups" else (3, 3, c, c)
        b = _core.direct_blocking(list(shape), list(fshape), [1] * 4, "VALID", [], "NHWC",
                                  [1] * 4, isa=isa)
        if kind == "groups":
            assert b["group_vectors"], b
        elif c > lanes or 2 * width <= lanes:
            assert b["channel_vectors"], b  # one vector of channels: only where narrow
        # The narrow groups kernel needs 2x less work: only against 12 pixels.
        if width <= 4 and (b["channel_vectors"] or (b["group_vectors"] and isa == "avx512")):
            assert b["narrow_pixels"], b
        check(random_case(shape, width), random_case(fshape, c), isa=isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("pass_,shape,fshape", [
    ("backprop_filter", (5, 9, 11, 37), (3, 3, 37, 40)),  # chans kernel, 37 images
    ("backprop_filter", (5, 40, 45, 37), (3, 3, 37, 5)),  # cols kernel
    ("backprop_filter", (3, 40, 45, 74), (2, 3, 37, 8)),  # two groups of 37 images
    ("forward", (67, 2, 3, 40), (1, 1, 40, 48)),          # chans kernel, tiny images
])
def test_images_share_packed_filters(isa, pass_, shape, fshape):
    """Tasks of several images (few output pixels each: filter gradients, tiny
    images), with a last block of fewer images. (The groups kernel's panels
    hold as much as its filter, and so do the cols kernel's in a forward pass
    but for huge filters on tiny images: they run an image per task.)"""
    b = _core.direct_blocking(list(shape), list(fshape), [1] * 4, "SAME", [], "NHWC", [1] * 4,
                              isa=isa, pass_=pass_, workers=3)
    images = shape[0] if pass_ == "forward" else fshape[2]
    assert 1 < b["image_block"] < images and images % b["image_block"] != 0, b
    x, w = random_case(shape, 0), random_case(fshape, 1)
    if pass_ == "forward":
        y = run_core("direct", x, w, 1, "SAME", isa=isa, num_threads=3)
        assert rel_l2(y, conv2d_reference(x, w, (1, 1), "SAME")) <= TOLERANCE["float32"]
    else:
        dy = random_case(conv2d_reference(x, w, (1, 1), "SAME").shape, 2)
        got = run_core_pass("direct", pass_, x, dy, fshape, 1, "SAME", isa=isa, num_threads=3)
        ref = conv2d_reference_backprop_filter(x, dy, fshape, (1, 1), "SAME")
        assert rel_l2(got, ref) <= TOLERANCE["float32"]


def test_image_blocks_follow_the_workers():
    """Tasks are split statically, a block per worker: a filter gradient gets
    just enough image blocks for the workers (a multiple of them while few),
    and more with more workers."""
    shape, fshape = (4, 20, 20, 16), (7, 7, 16, 16)  # 16 images of the filter gradient
    blocking = {w: _core.direct_blocking(list(shape), list(fshape), [1] * 4, "SAME", [], "NHWC",
                                         [1] * 4, pass_="backprop_filter", workers=w)
                for w in (1, 2, 3, 16, 64)}
    for w, b in blocking.items():
        blocks = -(-16 // b["image_block"])
        assert b["tasks"] >= min(w, 16) and (blocks % w == 0 or blocks == 16), (w, b)
    assert blocking[1]["image_block"] >= blocking[2]["image_block"] > blocking[16]["image_block"]
    assert blocking[64]["image_block"] == 1


@pytest.mark.parametrize("pass_,cout", [("forward", 3), ("forward", 64),
                                        ("backprop_filter", 64)])
def test_results_independent_of_thread_count(pass_, cout):
    """Bit-identical for any thread count, though image blocks follow it."""
    x, w = random_case((3, 30, 33, 20), 0), random_case((7, 7, 20, cout), 1)
    if pass_ == "forward":
        outs = [run(x, w, 1, "SAME", threads=t) for t in (1, 2, 3, 7)]
    else:
        dy = random_case(conv2d_reference(x, w, (1, 1), "SAME").shape, 2)
        blocks = {_core.direct_blocking(list(x.shape), list(w.shape), [1] * 4, "SAME", [], "NHWC",
                                        [1] * 4, pass_=pass_, workers=t)["image_block"]
                  for t in (1, 2, 3, 7)}
        assert len(blocks) > 1, blocks
        outs = [run_core_pass("direct", pass_, x, dy, w.shape, 1, "SAME", num_threads=t)
                for t in (1, 2, 3, 7)]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


def test_half_and_bfloat16():
    import ml_dtypes
    x64, w64 = random_case((2, 20, 23, 3), 0, np.float64), random_case((9, 9, 3, 5), 1, np.float64)
    # float16: inputs rounded first; the reference sees the rounded values.
    x16, w16 = x64.astype(np.float16), w64.astype(np.float16)
    got = run(x16, w16, 1, "SAME")
    ref = conv2d_reference(x16, w16, (1, 1), "SAME")
    assert rel_l2(got, ref) <= TOLERANCE["float16"]
    # bfloat16: uint16 views plus dtype='bfloat16'.
    xb, wb = x64.astype(ml_dtypes.bfloat16), w64.astype(ml_dtypes.bfloat16)
    geo = _core.conv_geometry(list(xb.shape), list(wb.shape), [1] * 4, "SAME", [], "NHWC", [1] * 4)
    out = np.full(geo["output_shape"], 0xFFFF, dtype=np.uint16)  # NaN pattern
    _core.run_pass("direct", "forward", xb.view(np.uint16), wb.view(np.uint16), [], [1] * 4,
                   "SAME", [], "NHWC", [1] * 4, out=out, dtype="bfloat16")
    ref = conv2d_reference(xb.astype(np.float64), wb.astype(np.float64), (1, 1), "SAME")
    assert rel_l2(out.view(ml_dtypes.bfloat16), ref) <= TOLERANCE["bfloat16"]


def test_nan_propagates():
    """A NaN in the input must reach the output, never be masked."""
    x, w = random_case((1, 9, 9, 1), 0), random_case((3, 3, 1, 2), 1)
    x[0, 4, 4, 0] = np.nan
    out = run(x, w)
    assert np.isnan(out[0, 3, 3]).all() and np.isfinite(out[0, 0, 0]).all()


def test_isa_selection():
    assert _core.active_isa() in ISAS
    assert "baseline" in ISAS
    with pytest.raises(ValueError, match="isa"):
        run(random_case((1, 5, 5, 1), 0), random_case((3, 3, 1, 1), 1), isa="sse9")
