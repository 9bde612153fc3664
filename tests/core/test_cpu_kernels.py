"""The direct and FFT CPU kernels through _core (no TensorFlow in the loop).

First what both kernels must do, parametrized over the algorithm (the direct
kernel in every ISA variant): the geometry matrix, groups and layouts, dtypes,
empty tensors, NaN, results independent of the thread count, and every
gradient pass, each against the float64 reference into NaN-poisoned outputs.
Then what only one has: the direct kernel's tiles, blocking and image blocks;
the FFT's overlap-save tiles, workspace contract, chunking and staged channel
blocks."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tfbigconv import _core

from conftest import (DILATIONS, LARGE_FILTERS, PADDINGS, STRIDES, TOLERANCE, check_core,
                      explicit_pairs, flat_explicit, hw_pair, random_case, run_core, run_core_pass,
                      to4)
from reference import (conv2d_reference, conv2d_reference_backprop_filter,
                       conv2d_reference_backprop_input, rel_l2)

ISAS = _core.supported_isas()
ALGORITHMS = ["direct", "fft"]
# (algorithm, isa): the direct kernel in every ISA variant, the FFT as it runs ("").
KERNELS = ([pytest.param("direct", isa, id=f"direct-{isa}") for isa in ISAS]
           + [pytest.param("fft", "", id="fft")])
FFT_TOL = 1e-4  # float32 through FFTs (docs/ARCHITECTURE.md section 7)


def isa_kw(isa):
    return dict(isa=isa) if isa else {}


def run(kind, x, w, strides=1, padding="VALID", dil=1, fmt="NHWC", pads=((0, 0), (0, 0)), **kw):
    return run_core(kind, x, w, strides, padding, dil, fmt, pads, **kw)


def check(kind, x, w, strides=1, padding="VALID", dil=1, fmt="NHWC", pads=((0, 0), (0, 0)),
          **kw):
    """run_core against the float64 reference; the FFT in float32 to FFT_TOL."""
    tol = FFT_TOL if kind == "fft" and x.dtype == np.float32 else None
    return check_core(kind, x, w, strides, padding, dil, fmt, pads, tol=tol, **kw)


def fft_plan(x_shape, w_shape, strides=1, padding="VALID", dil=1, fmt="NHWC", **kw):
    return _core.fft_plan(list(x_shape), list(w_shape), to4(strides, fmt), padding, [], fmt,
                          to4(dil, fmt), **kw)


# ---- both kernels -----------------------------------------------------------

@pytest.mark.parametrize("kind,isa", KERNELS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("k", [1, 2, 3, 7, 15, 31])
def test_square_filters(kind, isa, dtype, k):
    x = random_case((2, 37, 41, 2), k, dtype)
    w = random_case((k, k, 2, 3), k + 1, dtype)
    check(kind, x, w, 1, "SAME", **isa_kw(isa))


@pytest.mark.parametrize("kind", ALGORITHMS)
@pytest.mark.parametrize("shape,fshape", LARGE_FILTERS)
def test_large_and_nonsquare_filters(kind, shape, fshape):
    check(kind, random_case(shape, 3), random_case(fshape, 4), 1, "VALID")


@pytest.mark.parametrize("kind,isa", KERNELS)
@pytest.mark.parametrize("padding,pads", PADDINGS)
@pytest.mark.parametrize("strides", STRIDES)
@pytest.mark.parametrize("dil", DILATIONS)
def test_padding_strides_dilations(kind, isa, padding, pads, strides, dil):
    # direct: a column tile and two channel vectors; fft: a few channels
    for cout in {"direct": (2, 36), "fft": (2, 7)}[kind]:
        check(kind, random_case((2, 23, 29, 3), 5), random_case((4, 5, 3, cout), 6), strides,
              padding, dil, pads=pads, **isa_kw(isa))


@pytest.mark.parametrize("kind,isa", KERNELS)
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("cin,fin,cout", [
    (6, 3, 4),      # 2 groups (fft: fused mixing)
    (6, 2, 9),      # 3 groups
    (8, 1, 8),      # depthwise
    (8, 1, 16),     # depthwise, multiplier 2
    (4, 1, 128),    # depthwise, multiplier 32 (direct: channel-vector tiles)
    (64, 16, 128),  # 4 groups of 16 -> 32
    (20, 10, 6),    # 2 groups of 10 input channels (fft: blocked mixing)
    (12, 12, 5),    # dense (fft: blocked mixing)
])
def test_groups_and_layouts(kind, isa, fmt, cin, fin, cout):
    shape = (2, 19, 22, cin) if fmt == "NHWC" else (2, cin, 19, 22)
    check(kind, random_case(shape, cin), random_case((5, 6, fin, cout), cout), 2, "SAME", 1, fmt,
          **isa_kw(isa))


@pytest.mark.parametrize("kind", ALGORITHMS)
@pytest.mark.parametrize("dtype", ["float64", "float16", "bfloat16"])
def test_half_and_double(kind, dtype):
    """float16 and float64 as NumPy arrays (inputs rounded first: the reference
    sees the rounded values); bfloat16 as uint16 views plus dtype='bfloat16'."""
    import ml_dtypes
    x64, w64 = random_case((2, 20, 23, 3), 0, np.float64), random_case((9, 9, 3, 5), 1, np.float64)
    if dtype != "bfloat16":
        x, w = x64.astype(dtype), w64.astype(dtype)
        got = run(kind, x, w, 1, "SAME")
        assert rel_l2(got, conv2d_reference(x, w, (1, 1), "SAME")) <= TOLERANCE[dtype]
        return
    xb, wb = x64.astype(ml_dtypes.bfloat16), w64.astype(ml_dtypes.bfloat16)
    geo = _core.conv_geometry(list(xb.shape), list(wb.shape), [1] * 4, "SAME", [], "NHWC", [1] * 4)
    out = np.full(geo.output_shape, 0xFFFF, dtype=np.uint16)  # NaN pattern
    _core.run_pass(kind, "forward", xb.view(np.uint16), wb.view(np.uint16), [], [1] * 4,
                   "SAME", [], "NHWC", [1] * 4, out=out, dtype="bfloat16")
    ref = conv2d_reference(xb.astype(np.float64), wb.astype(np.float64), (1, 1), "SAME")
    assert rel_l2(out.view(ml_dtypes.bfloat16), ref) <= TOLERANCE["bfloat16"]


@pytest.mark.parametrize("kind", ALGORITHMS)
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_batch_zero_and_empty(kind, fmt):
    x = random_case((0, 8, 8, 2) if fmt == "NHWC" else (0, 2, 8, 8), 0)
    out = run(kind, x, random_case((3, 3, 2, 4), 1), fmt=fmt)
    assert out.shape == ((0, 6, 6, 4) if fmt == "NHWC" else (0, 4, 6, 6))
    # Zero output channels.
    assert run(kind, random_case((1, 8, 8, 2), 0),
               random_case((3, 3, 2, 0), 1)).shape == (1, 6, 6, 0)


@pytest.mark.parametrize("kind", ALGORITHMS)
def test_padding_only_windows(kind):
    """Explicit padding larger than the input: windows that see only padding
    give 0 (exactly, in the direct kernel)."""
    x, w = random_case((1, 2, 2, 1), 0), random_case((3, 3, 1, 2), 1)
    out = run(kind, x, w, 1, "EXPLICIT", pads=((4, 4), (4, 4)))
    ref = conv2d_reference(x, w, (1, 1), "EXPLICIT", (1, 1), "NHWC", ((4, 4), (4, 4)))
    assert rel_l2(out, ref) < (1e-6 if kind == "direct" else FFT_TOL)
    if kind == "direct":
        assert np.all(out[:, 0] == 0)


@pytest.mark.parametrize("kind", ALGORITHMS)
def test_nan_propagates(kind):
    """A NaN in the input must reach the output, never be masked."""
    x, w = random_case((1, 9, 9, 1), 0), random_case((3, 3, 1, 2), 1)
    x[0, 4, 4, 0] = np.nan
    out = run(kind, x, w)
    assert np.isnan(out[0, 3, 3]).all() and np.isfinite(out[0, 0, 0]).all()


@pytest.mark.parametrize("kind", ALGORITHMS)
@pytest.mark.parametrize("pass_,x_shape,w_shape", [
    ("forward", (3, 30, 33, 20), (7, 7, 20, 3)),
    ("forward", (3, 30, 33, 20), (7, 7, 20, 64)),
    ("backprop_filter", (3, 30, 33, 20), (7, 7, 20, 64)),
    ("forward", (5, 33, 30, 6), (7, 7, 6, 6)),
])
def test_results_independent_of_thread_count(kind, pass_, x_shape, w_shape):
    """Bit-identical for any thread count, though the direct kernel's image
    blocks follow it."""
    x, w = random_case(x_shape, 0), random_case(w_shape, 1)
    threads = (1, 2, 3, 5, 7)
    if pass_ == "forward":
        outs = [run(kind, x, w, 1, "SAME", num_threads=t) for t in threads]
    else:
        dy = random_case(conv2d_reference(x, w, (1, 1), "SAME").shape, 2)
        if kind == "direct":
            blocks = {_core.direct_blocking(list(x.shape), list(w.shape), [1] * 4, "SAME", [],
                                            "NHWC", [1] * 4, pass_=pass_, workers=t).image_block
                      for t in threads}
            assert len(blocks) > 1, blocks
        outs = [run_core_pass(kind, pass_, x, dy, w.shape, 1, "SAME", num_threads=t)
                for t in threads]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


# ---- both kernels: the gradient passes ---------------------------------------

def tol(dtype, algorithm):
    return 1e-4 if (dtype == "float32" and algorithm == "fft") else TOLERANCE[dtype]


def out_shape(x_shape, w_shape, strides, padding, dil, fmt, pads):
    explicit = [v for p in explicit_pairs(pads, fmt) for v in p] if padding == "EXPLICIT" else []
    return _core.conv_geometry(list(x_shape), list(w_shape), to4(strides, fmt), padding, explicit,
                               fmt, to4(dil, fmt)).output_shape


def check_core_grads(kind, x_shape, w_shape, strides=1, padding="VALID", dil=1, fmt="NHWC",
                     pads=((0, 0), (0, 0)), dtype="float32", **kw):
    x = random_case(x_shape, 1, dtype)
    w = random_case(w_shape, 2, dtype)
    dy = random_case(out_shape(x_shape, w_shape, strides, padding, dil, fmt, pads), 3, dtype)
    args = (hw_pair(strides), padding, hw_pair(dil), fmt, pads)
    dx = run_core_pass(kind, "backprop_input", dy, w, x_shape, strides, padding, dil, fmt, pads, **kw)
    dw = run_core_pass(kind, "backprop_filter", x, dy, w_shape, strides, padding, dil, fmt, pads, **kw)
    assert rel_l2(dx, conv2d_reference_backprop_input(dy, w, x_shape, *args)) <= tol(dtype, kind)
    assert rel_l2(dw, conv2d_reference_backprop_filter(x, dy, w_shape, *args)) <= tol(dtype, kind)


@pytest.mark.parametrize("kind", ALGORITHMS)
@pytest.mark.parametrize("padding,pads", PADDINGS)
@pytest.mark.parametrize("strides", [1, 2, 3, (1, 3), (4, 2)])
@pytest.mark.parametrize("dil", [1, 2, (1, 3)])
def test_core_padding_strides_dilations(kind, padding, pads, strides, dil):
    for cout in (2, 40):
        check_core_grads(kind, (2, 19, 23, 3), (4, 5, 3, cout), strides, padding, dil, pads=pads)


@pytest.mark.parametrize("kind", ALGORITHMS)
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("cin,fin,cout", [(6, 3, 4), (8, 1, 8), (8, 1, 16), (20, 10, 6),
                                          (4, 1, 64), (64, 32, 64)])
def test_core_groups_and_layouts(kind, fmt, cin, fin, cout):
    shape = (2, 15, 17, cin) if fmt == "NHWC" else (2, cin, 15, 17)
    check_core_grads(kind, shape, (5, 4, fin, cout), 2, "SAME", 1, fmt)


@pytest.mark.parametrize("kind", ALGORITHMS)
@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_core_dtypes(kind, dtype):
    check_core_grads(kind, (2, 21, 18, 3), (7, 6, 3, 5), 1, "SAME", dtype=dtype)


@pytest.mark.parametrize("isa", _core.supported_isas())
def test_core_direct_isas(isa):
    check_core_grads("direct", (2, 22, 25, 4), (9, 8, 2, 36), (1, 2), "SAME", isa=isa)
    check_core_grads("direct", (2, 22, 25, 4), (9, 8, 4, 3), 1, "VALID", (2, 1), isa=isa)


@pytest.mark.parametrize("kind", ALGORITHMS)
def test_core_large_filters(kind):
    check_core_grads(kind, (2, 80, 75, 1), (63, 63, 1, 3), 1, "VALID")
    check_core_grads(kind, (1, 40, 44, 2), (31, 31, 2, 3), 1, "SAME")


@pytest.mark.parametrize("kind", ALGORITHMS)
def test_core_empty_reductions(kind):
    """Batch 0: dx is empty and dw must be all zeros."""
    x = random_case((0, 9, 9, 2), 0)
    dy = random_case((0, 7, 7, 3), 1)
    dw = run_core_pass(kind, "backprop_filter", x, dy, (3, 3, 2, 3))
    np.testing.assert_array_equal(dw, np.zeros((3, 3, 2, 3), np.float32))


def test_core_backprop_filter_deterministic_across_threads():
    x, dy = random_case((4, 30, 33, 8), 0), random_case((4, 30, 33, 8), 1)
    for kind in ALGORITHMS:
        outs = [run_core_pass(kind, "backprop_filter", x, dy, (7, 7, 8, 8), 1, "SAME",
                              num_threads=t) for t in (1, 2, 3)]
        for o in outs[1:]:
            np.testing.assert_array_equal(o, outs[0])


# ---- the direct kernel ------------------------------------------------------

@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("cout", [1, 2, 3, 4, 5, 7, 8, 16, 31, 32, 33, 64])
def test_output_channel_tiles(isa, cout):
    """Output channels around the C=1..4 column tiles and the 2-vector channel tiles."""
    check("direct", random_case((2, 13, 21, 3), 1), random_case((5, 4, 3, cout), 2), 1, "SAME",
          isa=isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("width", [1, 3, 4, 5, 8, 9, 15, 16, 17, 23, 24, 25, 33, 49])
def test_output_width_edges(isa, width):
    """Output widths below, at, one over and past the vector (4/8/16) and pixel-group sizes."""
    for cout in (3, 40):
        check("direct", random_case((1, 5, width + 2, 2), width), random_case((3, 3, 2, cout), 7),
              isa=isa)


@pytest.mark.parametrize("height", [1, 2, 3, 5, 6, 11, 12, 13, 24, 25, 37])
def test_output_height_edges(height):
    """Output heights around the row tiles (3, 4, 6, 12) and the 12-row task."""
    for cout in (1, 3, 4, 48):
        check("direct", random_case((2, height + 4, 9, 2), height), random_case((5, 2, 2, cout), 3))


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
    assert b.group_vectors == (groups >= lanes), b
    for strides, dil in ((1, 1), (2, 1), (1, 2), ((2, 1), (1, 3))):
        check("direct", x, w, strides, "SAME", dil, isa=isa)
    y = check("direct", x, w, (2, 1), "VALID", isa=isa)
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
                                 [1] * 4, dtype=dtype).group_vectors
    ref = conv2d_reference(x.astype(np.float64), w.astype(np.float64), (1, 1), "SAME")
    if dtype == "bfloat16":
        out = np.full(ref.shape, 0xFFFF, dtype=np.uint16)  # NaN pattern
        _core.run_pass("direct", "forward", x.view(np.uint16), w.view(np.uint16), [], [1] * 4,
                       "SAME", [], "NHWC", [1] * 4, out=out, dtype="bfloat16")
        got = out.view(ml_dtypes.bfloat16)
    else:
        got = run("direct", x, w, 1, "SAME")
    assert rel_l2(got, ref) <= TOLERANCE[dtype]


def test_blocking_over_filter_rows_and_channels():
    """A filter too big for one L2 block runs in several (ci, kh) blocks."""
    shape, fshape = (1, 40, 44, 48), (31, 31, 48, 40)
    b = _core.direct_blocking(list(shape), list(fshape), [1] * 4, "SAME", [], "NHWC",
                                      [1] * 4)
    assert b.kh_block < 31 or b.ci_block < 48, b
    check("direct", random_case(shape, 1), random_case(fshape, 2), 1, "SAME")


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
            assert b.group_vectors, b
        elif c > lanes or 2 * width <= lanes:
            assert b.channel_vectors, b  # one vector of channels: only where narrow
        # The narrow groups kernel needs 2x less work: only against 12 pixels.
        if width <= 4 and (b.channel_vectors or (b.group_vectors and isa == "avx512")):
            assert b.narrow_pixels, b
        check("direct", random_case(shape, width), random_case(fshape, c), isa=isa)


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
    assert 1 < b.image_block < images and images % b.image_block != 0, b
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
        blocks = -(-16 // b.image_block)
        assert b.tasks >= min(w, 16) and (blocks % w == 0 or blocks == 16), (w, b)
    assert blocking[1].image_block >= blocking[2].image_block > blocking[16].image_block
    assert blocking[64].image_block == 1


def test_isa_selection():
    assert _core.active_isa() in ISAS
    assert "baseline" in ISAS
    with pytest.raises(ValueError, match="isa"):
        run("direct", random_case((1, 5, 5, 1), 0), random_case((3, 3, 1, 1), 1), isa="sse9")


# ---- the FFT kernel ---------------------------------------------------------

def test_both_mixing_paths_are_planned():
    assert fft_plan((1, 16, 16, 1), (3, 3, 1, 4)).fused_mix
    assert not fft_plan((1, 16, 16, 8), (3, 3, 8, 4)).fused_mix


@pytest.mark.parametrize("limit_kib", [6, 9, 14, 20, 40, 100])
@pytest.mark.parametrize("out_hw", [(1, 1), (7, 9), (16, 16), (17, 23), (31, 30)])
def test_tile_edges(limit_kib, out_hw):
    """Small workspace limits force small overlap-save tiles: output sizes
    below, at and past the tile sizes, with partial last tiles."""
    k = 5
    x = random_case((2, out_hw[0] + k - 1, out_hw[1] + k - 1, 1), sum(out_hw))
    w = random_case((k, k, 1, 2), limit_kib)
    limit = limit_kib << 10
    p = fft_plan(x.shape, w.shape, workspace_limit=limit, workers=2)
    assert p.workspace_bytes <= limit
    check("fft", x, w, workspace_limit=limit, num_threads=2)


def test_tiles_used_for_small_filters_on_large_images():
    p = fft_plan((1, 512, 512, 1), (7, 7, 1, 1))
    assert p.tiles_h * p.tiles_w > 1, p


@pytest.mark.parametrize("limit", [2 ** 17, 2 ** 19, 2 ** 21, 2 ** 23, 2 ** 26])
def test_workspace_never_exceeds_limit(limit):
    for shape, fshape in [((4, 100, 90, 3), (21, 21, 3, 4)), ((3, 64, 64, 8), (9, 9, 8, 8)),
                          ((2, 140, 137, 1), (135, 135, 1, 3))]:
        try:
            p = fft_plan(shape, fshape, workspace_limit=limit, workers=3)
        except ValueError as e:
            assert "at least" in str(e)
            continue
        assert p.workspace_bytes <= limit
        assert p.workspace_bytes == (p.filter_spectra_bytes + p.chunk * p.item_spectra_bytes
                                        + 3 * p.worker_bytes)


def test_too_small_limit_states_minimum():
    with pytest.raises(ValueError, match=r"at least (\d+) bytes") as e:
        fft_plan((2, 140, 137, 1), (135, 135, 1, 3), workspace_limit=1000)
    minimum = int(str(e.value).split("at least ")[1].split()[0])
    p = fft_plan((2, 140, 137, 1), (135, 135, 1, 3), workspace_limit=minimum)
    assert p.workspace_bytes <= minimum
    with pytest.raises(ValueError, match="at least"):
        fft_plan((2, 140, 137, 1), (135, 135, 1, 3), workspace_limit=minimum - 1)


def test_results_independent_of_chunking():
    x, w = random_case((6, 40, 44, 3), 0), random_case((9, 9, 3, 4), 1)
    big = run("fft", x, w, 1, "SAME", workspace_limit=1 << 30, num_threads=2)
    plans = set()
    for limit in (60_000, 100_000, 200_000, 1 << 30):
        p = fft_plan(x.shape, w.shape, padding="SAME", workspace_limit=limit, workers=2)
        plans.add((p.tile_h, p.tile_w, p.chunk))
        got = run("fft", x, w, 1, "SAME", workspace_limit=limit, num_threads=2)
        assert rel_l2(got, big) < 1e-6
    assert len(plans) > 2  # the limits really changed the tiling or chunking


def test_agrees_with_direct():
    x, w = random_case((2, 50, 47, 4), 0), random_case((17, 15, 2, 6), 1)
    a = run("fft", x, w, (2, 1), "SAME", (1, 2))
    b = run_core("direct", x, w, (2, 1), "SAME", (1, 2))
    assert rel_l2(a, b) < FFT_TOL


def test_reduction_blocks_bound_the_filter_spectra():
    """A limit below the filter spectra of all input channels, even at the
    smallest tiles, makes the sum over input channels run in blocks."""
    for x_shape, w_shape, limit in [((2, 30, 28, 12), (9, 9, 12, 10), 30_000),
                                    ((2, 20, 22, 12), (7, 7, 6, 8), 12_000)]:  # 2 groups
        p = fft_plan(x_shape, w_shape, padding="SAME", workspace_limit=limit, workers=2)
        assert p.ci_block < w_shape[2] and p.workspace_bytes <= limit, p
        check("fft", random_case(x_shape, 0), random_case(w_shape, 1), 1, "SAME",
              workspace_limit=limit, num_threads=2)


def test_fft_backprop_filter_with_large_batch_fits_small_limit():
    """dL/dfilter's "input channels" are the batch: a limit far below the
    spectra of all of dL/doutput runs in reduction blocks."""
    x, w_shape = random_case((24, 40, 38, 1), 0), (21, 21, 1, 3)
    dy = random_case((24, 20, 18, 3), 1)
    limit = 2 << 20
    dw = run_core_pass("fft", "backprop_filter", x, dy, w_shape, workspace_limit=limit,
                       num_threads=2)
    ref = conv2d_reference_backprop_filter(x, dy, w_shape)
    assert rel_l2(dw, ref) < 1e-4


# ---- staged channel blocks (FftPlan.stage_planes) -----------------------------------

def run_pass_fft(pass_, x, w, strides, padding, dil, fmt, **kw):
    """One pass of the fft kernel: (result, float64 reference)."""
    args = (hw_pair(strides), padding, hw_pair(dil), fmt, ((0, 0), (0, 0)))
    if pass_ == "forward":
        return run("fft", x, w, strides, padding, dil, fmt, **kw), conv2d_reference(x, w, *args)
    y_shape = conv2d_reference(x, w, *args).shape
    dy = random_case(y_shape, 7)
    if pass_ == "backprop_input":
        return (run_core_pass("fft", pass_, dy, w, x.shape, strides, padding, dil, fmt, **kw),
                conv2d_reference_backprop_input(dy, w, x.shape, *args))
    return (run_core_pass("fft", pass_, x, dy, w.shape, strides, padding, dil, fmt, **kw),
            conv2d_reference_backprop_filter(x, dy, w.shape, *args))


def test_stage_planes_planned_and_dropped_under_a_tight_limit():
    x_shape, w_shape = (8, 56, 56, 128), (31, 31, 1, 128)  # issue 11's depthwise case
    p = fft_plan(x_shape, w_shape, padding="SAME", workers=2)
    spectrum = p.fft_h * (p.fft_w // 2 + 1) * 8
    assert p.stage_planes == 8 and p.fused_mix
    assert p.worker_bytes == 8 * p.fft_h * p.fft_w * 4 + spectrum
    tight = fft_plan(x_shape, w_shape, padding="SAME", workers=2,
                 workspace_limit=p.workspace_bytes - 1)
    assert tight.stage_planes == 1 and tight.workspace_bytes < p.workspace_bytes
    assert tight.worker_bytes == tight.fft_h * tight.fft_w * 4 + spectrum
    # Height 1 (1-D) without lanes (a multiplier of 2): up to 64 planes within
    # 8 MiB of staged rows, at least 16 whatever their size; a spectrum each if fused.
    long = fft_plan((2, 1, 4096, 48), (1, 4096, 1, 96), workers=2)
    assert long.fft_h == 1 and long.stage_planes == 64 and long.fused_mix
    assert not long.lanes
    assert long.worker_bytes == 64 * long.fft_w * 4 + 64 * (long.fft_w // 2 + 1) * 8
    assert fft_plan((2, 1, 4096, 16), (1, 4096, 1, 32)).stage_planes == 32  # as many as there are
    for length, want in ((100000, 16), (50000, 27), (20000, 64)):  # 8 MiB / (fft_w * 4 bytes), at least 16
        longer = fft_plan((1, 1, length, 32), (1, length, 1, 64), padding="SAME", workers=2)
        assert longer.stage_planes == max(16, min(64, (8 << 20) // (longer.fft_w * 4))) == want


def test_lane_plans_size_their_groups_and_buffers():
    # 1-D depthwise (LaneFftPlan): groups of 8 lanes, up to 8 groups a task
    # within 8 MiB of staged groups and no more than keep the workers busy; a
    # worker holds its task's groups and two of scratch, the filter a group
    # buffer per group, and no item holds spectra.
    group = lambda p: 8 * p.fft_w * 4
    for x_shape, w_shape, workers, want in [
            ((2, 1, 4096, 96), (1, 4096, 1, 1), 2, 8),     # 12 groups of lanes, 2 items
            ((1, 1, 4096, 96), (1, 4096, 1, 1), 16, 1),    # 12 tasks for 16 workers
            ((1, 1, 100000, 64), (1, 100000, 1, 1), 2, 1),  # 8 MiB hold one group
            ((1, 1, 20000, 64), (1, 20000, 1, 1), 2, 4)]:   # two tasks, one per worker
        w_shape = w_shape[:3] + (x_shape[3],)
        p = fft_plan(x_shape, w_shape, padding="SAME", workers=workers)
        assert p.lanes and p.item_spectra_bytes == 0, p
        per_task = min(8, (8 << 20) // group(p), -(-12 * p.items // workers) if x_shape[3] == 96
                       else -(-8 * p.items // workers))
        assert p.stage_planes == 8 * per_task == 8 * want, p
        assert p.worker_bytes == (per_task + 2) * group(p) + 64
        assert p.filter_spectra_bytes == -(-x_shape[3] // 8) * group(p) + 64
        assert p.workspace_bytes == p.filter_spectra_bytes + workers * p.worker_bytes
    # Fewer than 8 groups, or a multiplier: no lanes.
    assert not fft_plan((2, 1, 4096, 7), (1, 4096, 1, 7), padding="SAME").lanes
    assert not fft_plan((2, 1, 4096, 8), (1, 4096, 1, 16), padding="SAME").lanes
    assert not fft_plan((2, 40, 40, 16), (9, 9, 1, 16), padding="SAME").lanes  # 2-D
    # Few channels: no more planes than a task can have; big transforms: fewer.
    assert fft_plan((1, 40, 40, 1), (9, 9, 1, 3)).stage_planes == 3
    assert fft_plan((1, 400, 400, 8), (135, 135, 1, 8)).stage_planes == 1


@pytest.mark.parametrize("pass_", ["forward", "backprop_input", "backprop_filter"])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("cin,fin,cout,strides,dil", [
    (13, 1, 13, 1, 1),   # depthwise: blocks of 8 and 5 channels
    (11, 1, 22, 2, 1),   # multiplier 2, strided
    (15, 3, 10, 1, 2),   # 5 groups of 3: blocks cross groups, dilated
    (9, 9, 17, (2, 1), 1),  # dense, blocked mixing
])
def test_staged_blocks_match_reference(pass_, fmt, cin, fin, cout, strides, dil):
    shape = (3, 17, 20, cin) if fmt == "NHWC" else (3, cin, 17, 20)
    x, w = random_case(shape, cin), random_case((5, 4, fin, cout), cout)
    got, ref = run_pass_fft(pass_, x, w, strides, "SAME", dil, fmt, num_threads=2)
    assert rel_l2(got, ref) <= FFT_TOL


@pytest.mark.parametrize("pass_", ["forward", "backprop_input", "backprop_filter"])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_height_1_blocks_past_16_planes_match_reference(pass_, fmt):
    # 70 depthwise channels: a block of 64 planes and one of 6 (kMaxStagePlanes1D).
    shape = (2, 1, 300, 70) if fmt == "NHWC" else (2, 70, 1, 300)
    x, w = random_case(shape, 3), random_case((1, 40, 1, 70), 4)
    assert fft_plan(shape, w.shape, padding="SAME", fmt=fmt).stage_planes == 64
    got, ref = run_pass_fft(pass_, x, w, 1, "SAME", 1, fmt, num_threads=2)
    assert rel_l2(got, ref) <= FFT_TOL


def test_height_1_depthwise_plans_keep_no_item_spectra():
    # One output per channel (PlaneLocalFft): a block is transformed, mixed and
    # inverted in its worker's spectra, so the plan holds none per item and
    # takes every item in one chunk; a multiplier of 2 mixes across planes.
    local = fft_plan((8, 1, 2048, 64), (1, 2048, 1, 64), padding="SAME", workers=2)
    assert local.fft_h == 1 and local.fused_mix and local.item_spectra_bytes == 0
    assert local.chunk == local.items >= 8
    assert local.workspace_bytes == local.filter_spectra_bytes + 2 * local.worker_bytes
    mixed = fft_plan((8, 1, 2048, 64), (1, 2048, 1, 128), padding="SAME", workers=2)
    assert mixed.item_spectra_bytes > 0


@pytest.mark.parametrize("pass_", ["forward", "backprop_input", "backprop_filter"])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("strides,dil,multiplier", [
    ((1, 2), 1, 1), ((1, 3), (1, 2), 1), (1, (1, 3), 1),  # plane-local
    ((1, 2), 1, 2),  # a multiplier: mixed through item spectra
])
def test_height_1_depthwise_strided_and_dilated_match_reference(pass_, fmt, strides, dil,
                                                                 multiplier):
    shape = (3, 1, 257, 20) if fmt == "NHWC" else (3, 20, 1, 257)
    x, w = random_case(shape, 1), random_case((1, 31, 1, 20 * multiplier), 2)
    local = fft_plan(shape, w.shape, strides, "SAME", dil, fmt).item_spectra_bytes == 0
    assert local == (multiplier == 1)
    got, ref = run_pass_fft(pass_, x, w, strides, "SAME", dil, fmt, num_threads=2)
    assert rel_l2(got, ref) <= FFT_TOL


LANE_CASES = [  # (x as N,1,W,C; filter taps; strides; dilations; padding)
    ((3, 1, 301, 21), 40, 1, 1, "SAME"),            # groups of 8, 8 and 5 lanes
    ((2, 1, 257, 16), 31, (1, 2), 1, "SAME"),       # backprop_input: a stride-dilated input
    ((2, 1, 200, 9), 13, 1, (1, 3), "VALID"),       # a second group of one lane
    ((3, 1, 3001, 8), 7, 1, 1, "SAME"),             # tiles of a long row: items per image
]


@pytest.mark.parametrize("pass_", ["forward", "backprop_input", "backprop_filter"])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("case", range(len(LANE_CASES)))
def test_lane_plans_match_reference(pass_, fmt, dtype, case):
    # Lane transforms (LaneFftPlan) in every pass: depthwise with one input
    # channel per group, and the filter gradient's sum over the batch; NCHW
    # holds the lanes a row apart, float64 runs vectors of half the lanes.
    shape, k, strides, dil, padding = LANE_CASES[case]
    c = shape[3]
    if fmt == "NCHW":
        shape = (shape[0], c, 1, shape[2])
    x, w = random_case(shape, case), random_case((1, k, 1, c), case + 10)
    if dtype == "float16":  # the reference sees the rounded values
        x, w = x.astype(np.float16), w.astype(np.float16)
    else:
        x, w = x.astype(dtype), w.astype(dtype)
    args = (hw_pair(strides), padding, hw_pair(dil), fmt, ((0, 0), (0, 0)))
    if pass_ == "forward":
        assert fft_plan(shape, w.shape, strides, padding, dil, fmt, dtype=dtype).lanes
        got, ref = run("fft", x, w, strides, padding, dil, fmt, num_threads=2), conv2d_reference(x, w, *args)
    else:
        dy = random_case(conv2d_reference(x, w, *args).shape, 7).astype(x.dtype)
        if pass_ == "backprop_input":
            got = run_core_pass("fft", pass_, dy, w, x.shape, strides, padding, dil, fmt, num_threads=2)
            ref = conv2d_reference_backprop_input(dy, w, x.shape, *args)
        else:
            got = run_core_pass("fft", pass_, x, dy, w.shape, strides, padding, dil, fmt, num_threads=2)
            ref = conv2d_reference_backprop_filter(x, dy, w.shape, *args)
    tol = FFT_TOL if dtype == "float32" else TOLERANCE[dtype]
    assert rel_l2(got.astype(np.float64), ref) <= tol


@pytest.mark.parametrize("pass_", ["forward", "backprop_input", "backprop_filter"])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_lane_plans_of_a_2d_row_filter_match_reference(pass_, fmt):
    # A 1 x k depthwise filter on images: transforms of height 1, an item per
    # output row (EXPLICIT rows of padding above and below read zeros).
    shape = (2, 5, 40, 16) if fmt == "NHWC" else (2, 16, 5, 40)
    x, w = random_case(shape, 1), random_case((1, 9, 1, 16), 2)
    pads = ((1, 2), (4, 4))
    assert _core.fft_plan(list(shape), list(w.shape), to4((2, 1), fmt), "EXPLICIT",
                          flat_explicit(pads, fmt), fmt, to4(1, fmt), workers=2).lanes
    args = ((2, 1), "EXPLICIT", (1, 1), fmt, pads)
    if pass_ == "forward":
        got = run("fft", x, w, (2, 1), "EXPLICIT", 1, fmt, pads, num_threads=2)
        ref = conv2d_reference(x, w, *args)
    else:
        dy = random_case(conv2d_reference(x, w, *args).shape, 3)
        if pass_ == "backprop_input":
            got = run_core_pass("fft", pass_, dy, w, x.shape, (2, 1), "EXPLICIT", 1, fmt, pads, num_threads=2)
            ref = conv2d_reference_backprop_input(dy, w, x.shape, *args)
        else:
            got = run_core_pass("fft", pass_, x, dy, w.shape, (2, 1), "EXPLICIT", 1, fmt, pads, num_threads=2)
            ref = conv2d_reference_backprop_filter(x, dy, w.shape, *args)
    assert rel_l2(got, ref) <= FFT_TOL


def test_lane_plans_on_the_baseline_isa_match_reference():
    # SSE2 vectors hold 4 float32 lanes: a group of 8 is two vector blocks.
    # The ISA is chosen once per process, so this runs in a fresh one.
    code = textwrap.dedent("""
        import numpy as np
        from conftest import random_case, rel_l2, run_core, run_core_pass
        from reference import conv2d_reference, conv2d_reference_backprop_filter
        from tfbigconv import _core
        x, w = random_case((3, 1, 301, 21), 1), random_case((1, 40, 1, 21), 2)
        args = ((1, 1), "SAME", (1, 1), "NHWC", ((0, 0), (0, 0)))
        y = run_core("fft", x, w, 1, "SAME", num_threads=2)
        dy = random_case(y.shape, 3)
        dw = run_core_pass("fft", "backprop_filter", x, dy, w.shape, 1, "SAME", num_threads=2)
        print(rel_l2(y, conv2d_reference(x, w, *args)),
              rel_l2(dw, conv2d_reference_backprop_filter(x, dy, w.shape, *args)))
    """)
    env = dict(os.environ, TFBIGCONV_ISA="baseline")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=os.path.dirname(__file__) + "/..",
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    errs = [float(v) for v in out.stdout.split()]
    assert len(errs) == 2 and all(e <= FFT_TOL for e in errs), errs


def test_lane_filter_gradient_with_a_nan_matches_direct():
    # The filter gradient's lane tasks sum over the batch: a NaN in the
    # gradient sends the item (the whole filter) to the direct kernel.
    x, w = random_case((3, 1, 120, 16), 1), random_case((1, 21, 1, 16), 2)
    y_shape = conv2d_reference(x, w, (1, 1), "SAME", (1, 1), "NHWC", ((0, 0), (0, 0))).shape
    dy = random_case(y_shape, 3)
    dy[2, 0, 50, 11] = np.nan
    got = run_core_pass("fft", "backprop_filter", x, dy, w.shape, 1, "SAME", num_threads=2)
    want = run_core_pass("direct", "backprop_filter", x, dy, w.shape, 1, "SAME")
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    assert np.isnan(want).any() and rel_l2(got[finite], want[finite]) <= FFT_TOL


FUSED_CASES = [  # (x as N,1,W,C; filter taps; stride; dilation; padding)
    ((3, 1, 301, 21), 200, 1, 1, "SAME"),      # groups of 8, 8 and 5 lanes
    ((2, 1, 257, 16), 200, 2, 1, "SAME"),      # strided: dL/dy at every other position
    ((2, 1, 200, 9), 90, 1, 2, "VALID"),       # dilated, a group of one lane
    ((2, 1, 100, 16), 100, 1, 1, "CAUSAL"),    # explicit (k - 1, 0): Hyena's
]


def fused_args(case, fmt, dtype="float32"):
    """x, w, dy and the attributes of a FUSED_CASES case, with the float64 references."""
    shape, k, stride, dil, padding = FUSED_CASES[case]
    c = shape[3]
    pads = ((0, 0), (k - 1, 0)) if padding == "CAUSAL" else ((0, 0), (0, 0))
    padding = "EXPLICIT" if padding == "CAUSAL" else padding
    if fmt == "NCHW":
        shape = (shape[0], c, 1, shape[2])
    np_dtype = np.float16 if dtype == "float16" else np.dtype(dtype)
    x = random_case(shape, case).astype(np_dtype)
    w = random_case((1, k, 1, c), case + 10).astype(np_dtype)
    args = ((1, stride), padding, (1, dil), fmt, pads)
    dy = random_case(conv2d_reference(x, w, *args).shape, case + 20).astype(np_dtype)
    attrs = dict(strides=to4((1, stride), fmt), padding=padding,
                 explicit_paddings=flat_explicit(pads, fmt) if padding == "EXPLICIT" else [],
                 data_format=fmt, dilations=to4((1, dil), fmt))
    refs = (conv2d_reference_backprop_input(dy, w, x.shape, *args),
            conv2d_reference_backprop_filter(x, dy, w.shape, *args))
    return x, w, dy, attrs, refs


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("case", range(len(FUSED_CASES)))
def test_fused_backprop_matches_reference(fmt, dtype, case):
    # Both gradients of a 1-D depthwise convolution from one transform of dL/dy
    # per image (FftLaneBackprop): strides, dilations, partial lane groups,
    # NCHW's lanes a row apart, float64's half-width vectors.
    x, w, dy, attrs, (rdx, rdw) = fused_args(case, fmt, dtype)
    plan = _core.lane_backprop_plan(list(x.shape), list(w.shape), dtype=dtype, workers=2, **attrs)
    assert plan.stage_planes % 8 == 0 and plan.workspace_bytes == 2 * plan.worker_bytes
    dx, dw = _core.run_lane_backprop(x, w, dy, num_threads=2, **attrs)
    tol = FFT_TOL if dtype == "float32" else TOLERANCE[dtype]
    assert rel_l2(dx.astype(np.float64), rdx) <= tol and rel_l2(dw.astype(np.float64), rdw) <= tol


def test_fused_backprop_plan_sizes_its_transforms_and_buffers():
    # Causal: the input after k - 1 zeros, and dL/dy's products, within one
    # transform of the 7-smooth size >= max(pad + in, (out - 1) * stride + k).
    attrs = dict(strides=[1, 1, 1, 1], padding="EXPLICIT", explicit_paddings=[0, 0, 0, 0, 99, 0, 0, 0],
                 data_format="NHWC", dilations=[1, 1, 1, 1])
    p = _core.lane_backprop_plan([2, 1, 100, 16], [1, 100, 1, 16], workers=2, **attrs)
    assert p.fft_w == 200 and p.stage_planes == 8  # two groups, a task each
    # A task's four buffers per group (filter, dL/dy, input, sum) and two of scratch.
    assert p.worker_bytes == (4 * 1 + 2) * 8 * 200 * 4 + 64
    big = _core.lane_backprop_plan([8, 1, 16384, 256], [1, 16384, 1, 256], workers=2,
                                   **dict(attrs, explicit_paddings=[0, 0, 0, 0, 16383, 0, 0, 0]))
    assert big.fft_w == 32768 and big.stage_planes == 64


@pytest.mark.parametrize("x_shape,w_shape,attrs,why", [
    ((2, 1, 300, 7), (1, 200, 1, 7), {}, "fewer channels"),
    ((2, 1, 300, 8), (1, 200, 1, 16), {}, "not depthwise"),
    ((2, 5, 300, 8), (1, 200, 1, 8), {}, "not a 1-D"),
    ((2, 1, 3000, 8), (1, 9, 1, 8), {}, "tiles the row"),
    ((2, 1, 300, 8), (1, 200, 1, 8), {"workspace_limit": 1000}, "within the limit"),
    # dL/dinput's plan fits 150 kB (88 kB), the fused backward's two workers not (188 kB).
    ((2, 1, 300, 8), (1, 200, 1, 8), {"workspace_limit": 150000}, "exceeds the limit"),
])
def test_fused_backprop_refuses_what_it_does_not_serve(x_shape, w_shape, attrs, why):
    with pytest.raises(ValueError, match=why):
        _core.lane_backprop_plan(list(x_shape), list(w_shape), [1, 1, 1, 1], "SAME", [], "NHWC",
                                 [1, 1, 1, 1], workers=2, **attrs)
    x, w = random_case(x_shape, 0), random_case(w_shape, 1)
    dy = random_case(conv2d_reference(x, w, (1, 1), "SAME").shape, 2)
    with pytest.raises(ValueError, match=why):
        _core.run_lane_backprop(x, w, dy, [1, 1, 1, 1], "SAME", [], "NHWC", [1, 1, 1, 1],
                                num_threads=2, **attrs)


def test_fused_backprop_with_a_nan_matches_direct():
    # A NaN in dL/dy: both gradients from the direct kernel, NaNs where TF puts them.
    x, w, dy, attrs, _ = fused_args(0, "NHWC")
    dy[1, 0, 150, 3] = np.nan
    dx, dw = _core.run_lane_backprop(x, w, dy, num_threads=2, **attrs)
    args = ((1, 1), "SAME", (1, 1), "NHWC")
    want_dx = run_core_pass("direct", "backprop_input", dy, w, x.shape, *args)
    want_dw = run_core_pass("direct", "backprop_filter", x, dy, w.shape, *args)
    for got, want in ((dx, want_dx), (dw, want_dw)):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        finite = np.isfinite(want)
        assert np.isnan(want).any() and rel_l2(got[finite], want[finite]) <= FFT_TOL


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_height_1_depthwise_item_with_a_nan_matches_direct(fmt):
    # A plane-local block of 20 channels in each of 3 items; a NaN in item 1's
    # channel 17 sends that item to the direct kernel, the others stay fft.
    shape = (3, 1, 200, 20) if fmt == "NHWC" else (3, 20, 1, 200)
    x, w = random_case(shape, 5), random_case((1, 40, 1, 20), 6)
    x[(1, 0, 77, 17) if fmt == "NHWC" else (1, 17, 0, 77)] = np.nan
    assert fft_plan(shape, w.shape, padding="SAME", fmt=fmt).item_spectra_bytes == 0
    got = run("fft", x, w, 1, "SAME", 1, fmt, num_threads=2)
    want = run_core("direct", x, w, 1, "SAME", 1, fmt)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    assert np.isnan(want).any() and rel_l2(got[finite], want[finite]) <= FFT_TOL


@pytest.mark.parametrize("w_shape", [(6, 7, 1, 12), (6, 7, 4, 12), (6, 7, 12, 5)])
def test_staged_blocks_change_no_result(w_shape):
    """stage_planes > 1 and 1 (a limit one byte below the staged plan: same
    tiles and chunks) give the same bits; partial blocks included."""
    x, w = random_case((2, 21, 19, 12), 0), random_case(w_shape, 1)
    p = fft_plan(x.shape, w.shape, padding="SAME", workers=2)
    tight = fft_plan(x.shape, w.shape, padding="SAME", workers=2,
                 workspace_limit=p.workspace_bytes - 1)
    assert p.stage_planes > 1 and tight.stage_planes == 1
    assert [getattr(tight, k) for k in ("tile_h", "tile_w", "chunk")] == [getattr(p, k) for k in ("tile_h", "tile_w", "chunk")]
    staged = run("fft", x, w, 1, "SAME", num_threads=2)
    np.testing.assert_array_equal(staged, run("fft", x, w, 1, "SAME", num_threads=2,
                                              workspace_limit=p.workspace_bytes - 1))
    assert rel_l2(staged, conv2d_reference(x, w, (1, 1), "SAME")) <= FFT_TOL


def test_staged_block_with_a_nan_channel_matches_direct():
    """A NaN in one channel of a staged block: its tile goes to the direct
    kernel, which places the NaN as tf.nn.conv2d does; other tiles stay fft."""
    x, w = random_case((2, 30, 30, 16), 0), random_case((7, 7, 1, 16), 1)
    x[1, 12, 9, 5] = np.nan
    got = run("fft", x, w, 1, "SAME", num_threads=2)
    want = run_core("direct", x, w, 1, "SAME")
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    assert np.isnan(want).any() and rel_l2(got[finite], want[finite]) <= FFT_TOL


def test_many_groups_keep_threads_busy_with_small_chunks_and_blocks():
    """Each group's transforms are separate tasks, so a grouped plan needs
    fewer items per chunk and fewer input channels per reduction block for
    busy threads: issue 11's depthwise passes stay far below their old 37
    and 69 MiB workspaces (fresh pages cost about 0.4 ms per MiB)."""
    fwd = fft_plan((8, 56, 56, 128), (31, 31, 1, 128), padding="SAME", workers=2)
    assert fwd.chunk < fwd.items and fwd.workspace_bytes < 20 << 20, fwd
    # The filter gradient posed as a convolution: groups = channels, the
    # batch of 8 as each group's input channels, dy as the filter.
    bwd = _core.fft_plan([1, 56, 56, 8 * 128], [56, 56, 8, 128], [1, 1, 1, 1], "EXPLICIT",
                         [0, 0, 15, 15, 15, 15, 0, 0], "NHWC", [1, 1, 1, 1], workers=2)
    assert bwd.ci_block < 8 and bwd.workspace_bytes < 20 << 20, bwd
    # One group: the old rules (8 items a chunk, all input channels a block).
    dense = fft_plan((8, 40, 40, 6), (9, 9, 6, 4), padding="SAME", workers=2)
    assert dense.chunk == 8 and dense.ci_block == 6, dense
