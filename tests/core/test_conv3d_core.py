"""The core in 3-D (geometry with depth, the direct and FFT kernels on numpy arrays
through _core.run_pass): every pass against the float64 reference, across depth
tiles, strides, dilations, padding, groups, layouts and dtypes."""
import numpy as np
import pytest

from tfbigconv import _core
from conftest import TOLERANCE, random_case
from reference import conv3d_reference, conv3d_reference_grads, rel_l2


def attrs(strides, dil, fmt, padding, pads):
    def five(v):
        return [1, *v, 1] if fmt == "NDHWC" else [1, 1, *v]
    explicit = []
    if padding == "EXPLICIT":
        pairs = [(0, 0), *pads, (0, 0)] if fmt == "NDHWC" else [(0, 0), (0, 0), *pads]
        explicit = [v for p in pairs for v in p]
    return five(strides), padding, explicit, fmt, five(dil)


def run(kind, pass_, a, b, sizes, strides=(1, 1, 1), dil=(1, 1, 1), fmt="NDHWC",
        padding="VALID", pads=((0, 0),) * 3, **kw):
    s, p, e, f, d = attrs(strides, dil, fmt, padding, pads)
    shape = sizes if pass_ != "forward" else _core.conv_geometry(
        list(a.shape), list(b.shape), s, p, e, f, d).output_shape
    out = np.full(tuple(shape), np.nan, dtype=a.dtype)
    _core.run_pass(kind, pass_, a, b, list(sizes), s, p, e, f, d, out=out, **kw)
    return out


CASES = [  # input NDHWC, filter DHWIO, strides, dilations, padding, explicit pairs
    ((2, 9, 10, 11, 3), (3, 4, 5, 3, 4), (1, 1, 1), (1, 1, 1), "VALID", None),
    ((1, 12, 9, 8, 2), (5, 3, 3, 2, 3), (2, 1, 2), (1, 2, 1), "SAME", None),
    ((2, 7, 8, 9, 4), (3, 3, 3, 2, 6), (1, 2, 1), (2, 1, 1), "EXPLICIT", ((2, 1), (0, 3), (1, 1))),
    ((1, 10, 10, 10, 6), (5, 5, 5, 1, 6), (1, 1, 1), (1, 1, 1), "SAME", None),   # depthwise
    ((1, 6, 7, 5, 2), (6, 2, 2, 2, 2), (3, 1, 1), (1, 1, 1), "VALID", None),     # deep filter
    ((2, 1, 13, 12, 3), (1, 5, 4, 3, 2), (1, 1, 1), (1, 1, 1), "SAME", None),     # depth 1
    # height and depth 1 in the filter, deep input: the FFT's one-row path per slice
    ((1, 4, 1, 64, 1), (1, 1, 9, 1, 1), (1, 1, 1), (1, 1, 1), "VALID", None),
    ((2, 5, 1, 40, 2), (1, 1, 9, 2, 3), (2, 1, 1), (1, 1, 1), "SAME", None),
    ((1, 4, 1, 64, 1), (4, 1, 33, 1, 1), (1, 1, 1), (1, 1, 1), "VALID", None),
    ((1, 5, 6, 7, 2), (1, 1, 1, 2, 2), (1, 1, 1), (1, 1, 1), "VALID", None),      # 1x1x1
    # 16 groups of one channel, NDHWC: the direct kernel's group vectors
    ((2, 6, 7, 9, 16), (3, 3, 3, 1, 16), (1, 1, 2), (1, 2, 1), "SAME", None),
]


@pytest.mark.parametrize("kind", ["direct", "fft"])
@pytest.mark.parametrize("fmt", ["NDHWC", "NCDHW"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_every_pass_against_the_reference(kind, fmt, case):
    xs, ws, strides, dil, padding, pads = CASES[case]
    pads = pads or ((0, 0),) * 3
    x, w = random_case(xs, case), random_case(ws, case + 1)
    y_ref = conv3d_reference(x, w, strides, padding, dil, "NDHWC", pads)
    dy = random_case(y_ref.shape, case + 2)
    dx_ref, dw_ref = conv3d_reference_grads(x, w, dy, strides, padding, dil, "NDHWC", pads)
    to = (lambda a: np.ascontiguousarray(a.transpose(0, 4, 1, 2, 3))) if fmt == "NCDHW" \
        else (lambda a: a)
    back = (lambda a: a.transpose(0, 2, 3, 4, 1)) if fmt == "NCDHW" else (lambda a: a)
    kw = dict(strides=strides, dil=dil, fmt=fmt, padding=padding, pads=pads)
    tol = 1e-4 if kind == "fft" else TOLERANCE["float32"]
    assert rel_l2(back(run(kind, "forward", to(x), w, [], **kw)), y_ref) < tol
    assert rel_l2(back(run(kind, "backprop_input", to(dy), w, list(to(x).shape), **kw)),
                  dx_ref) < tol
    assert rel_l2(run(kind, "backprop_filter", to(x), to(dy), list(ws), **kw), dw_ref) < tol


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_dtypes(dtype):
    x = random_case((1, 8, 9, 7, 2), 0).astype(dtype)
    w = random_case((4, 3, 5, 2, 3), 1).astype(dtype)
    ref = conv3d_reference(x, w, padding="SAME")
    for kind in ("direct", "fft"):
        got = run(kind, "forward", x, w, [], padding="SAME")
        assert rel_l2(got, ref) < TOLERANCE[dtype] * (10 if kind == "fft" else 1)


@pytest.mark.parametrize("limit", [1 << 30, 1 << 16])
def test_fft_depth_tiles_and_chunks(limit):
    """Small workspace limits cut the output into depth tiles and chunks."""
    x = random_case((2, 17, 8, 9, 3), 5)
    w = random_case((7, 3, 3, 3, 2), 6)
    plan = _core.fft_plan([2, 17, 8, 9, 3], [7, 3, 3, 3, 2], [1] * 5, "SAME", [], "NDHWC",
                          [1] * 5, workspace_limit=limit)
    if limit < 1 << 20:
        assert plan.tiles_d > 1 or plan.chunk < plan.items
    got = run("fft", "forward", x, w, [], padding="SAME", workspace_limit=limit)
    assert rel_l2(got, conv3d_reference(x, w, padding="SAME")) < 1e-4


def test_nan_in_a_tile_falls_back_to_direct():
    x = random_case((1, 9, 9, 9, 2), 7)
    w = random_case((3, 3, 3, 2, 2), 8)
    x[0, 4, 4, 4, 1] = np.nan
    got = run("fft", "forward", x, w, [], padding="SAME")
    want = run("direct", "forward", x, w, [], padding="SAME")
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert rel_l2(got[ok], want[ok]) < 1e-4


def test_geometry_in_3d():
    g = _core.conv_geometry([2, 10, 11, 12, 3], [3, 4, 5, 3, 6], [1, 2, 1, 3, 1], "SAME", [],
                            "NDHWC", [1, 1, 2, 1, 1])
    assert g.output_shape == [2, 5, 11, 4, 6]
    assert (g.in_d, g.filter_d, g.stride_d, g.out_d) == (10, 3, 2, 5)
    assert g.macs == 2 * 5 * 11 * 4 * 6 * 3 * 4 * 5 * 3
    g = _core.conv_geometry([2, 3, 10, 11, 12], [3, 4, 5, 3, 6], [1] * 5, "EXPLICIT",
                            [0, 0, 0, 0, 1, 2, 0, 0, 0, 0], "NCDHW", [1] * 5)
    assert g.output_shape == [2, 6, 11, 8, 8] and (g.pad_front, g.pad_back) == (1, 2)
    for bad, match in [(([2, 10, 11, 3], [3, 3, 3, 3, 1], [1] * 5), "input must be rank 5"),
                       (([2, 10, 11, 12, 3], [3, 3, 3, 1], [1] * 5), "filter must be rank 5"),
                       (([2, 10, 11, 12, 3], [3, 3, 3, 3, 1], [1] * 4), "strides must have 5"),
                       (([2, 1, 11, 12, 3], [3, 3, 3, 3, 1], [1] * 5), "along depth")]:
        with pytest.raises(ValueError, match=match):
            _core.conv_geometry(bad[0], bad[1], bad[2], "VALID", [], "NDHWC", [1] * 5)
