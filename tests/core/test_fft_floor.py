"""The floor of an FFT pass (fft_cpu_floor.h through _core.fft_floor): which
transforms it runs and their flops, counted here from the plan and the geometry
alone (the pruning rules restated, not read from the kernel)."""
import math

import pytest

from tfbigconv import _core

ATTRS2 = dict(explicit_paddings=[], data_format="NHWC", dilations=[1] * 4, strides=[1] * 4)
ATTRS3 = dict(explicit_paddings=[], data_format="NDHWC", dilations=[1] * 5, strides=[1] * 5)


def real_flops(n):
    return 2.5 * n * math.log2(n) if n > 1 else 0.0


def complex_flops(n):
    return 2 * real_flops(n)


def fields(core_struct):
    """A _core struct's fields as a dict (the tests change some)."""
    return {k: getattr(core_struct, k) for k in dir(core_struct) if not k.startswith("_")}


def expected_plane_floor(geometry, plan, in_planes, out_planes, filter_planes, filter_extent):
    """(transforms, flops) of a 2-D/3-D plan: per item, each input plane's forward
    transform over the window's rows and slices that hold input, each output plane's
    inverse over the rows and slices the tile keeps; filter planes over their extent."""
    fd, fh, fw = plan.fft_d, plan.fft_h, plan.fft_w
    bw = fw // 2 + 1

    def forward(z, r):
        if z <= 0 or r <= 0:
            return 0.0
        return z * (r * real_flops(fw) + bw * complex_flops(fh)) + fh * bw * complex_flops(fd)

    def inverse(vd, vh):
        return fh * bw * complex_flops(fd) + vd * (bw * complex_flops(fh) + vh * real_flops(fw))

    g = geometry
    axes = [("d", "front"), ("h", "top"), ("w", "left")]
    transforms = filter_planes
    flops = filter_planes * forward(*filter_extent)
    for _image in range(g["batch"]):
        for td in range(plan.tiles_d):
            for th in range(plan.tiles_h):
                for tw in range(plan.tiles_w):
                    extent = {}
                    for (a, pad), t in zip(axes, (td, th, tw)):
                        o0 = t * getattr(plan, f"tile_{a}")
                        v = min(getattr(plan, f"tile_{a}"), g[f"out_{a}"] - o0)
                        need = v - 1 + g[f"filter_{a}"]
                        first = o0 - g[f"pad_{pad}"]
                        lo = min(need, max(0, -first))
                        hi = max(lo, min(need, g[f"in_{a}"] - first))
                        extent[a] = (v, hi - lo)
                    if all(e[1] > 0 for e in extent.values()):
                        transforms += in_planes
                        flops += in_planes * forward(extent["d"][1], extent["h"][1])
                    transforms += out_planes
                    flops += out_planes * inverse(extent["d"][0], extent["h"][0])
    return transforms, flops


CASES_2D = [  # x, w, padding: one tile, several tiles with padding, grouped
    ((2, 20, 24, 1), (5, 5, 1, 3), "VALID"),
    ((2, 70, 90, 2), (31, 31, 2, 3), "SAME"),
    ((1, 33, 29, 4), (7, 9, 2, 6), "SAME"),
]


@pytest.mark.parametrize("x,w,padding", CASES_2D)
def test_2d_forward_counts_input_and_output_planes_pruned(x, w, padding):
    r = _core.fft_floor(list(x), list(w), padding=padding, pass_="forward", num_threads=2,
                        **ATTRS2)
    g = fields(_core.conv_geometry(list(x), list(w), padding=padding, **ATTRS2))
    g["pad_front"], g["in_d"], g["filter_d"], g["out_d"] = 0, 1, 1, 1
    transforms, flops = expected_plane_floor(g, r.plan, x[3], w[3], 0, (0, 0))
    assert r.transforms == transforms
    assert r.flops == pytest.approx(flops, rel=1e-12)
    assert r.seconds > 0


def test_filter_planes_count_where_asked_and_in_the_filter_gradient():
    x, w = (2, 40, 44, 2), (9, 9, 2, 3)
    args = dict(input_shape=list(x), filter_shape=list(w), padding="VALID", num_threads=1,
                **ATTRS2)
    cached = _core.fft_floor(pass_="forward", **args)
    counted = _core.fft_floor(pass_="forward", count_filter=True, **args)
    # One forward transform of each (co, ci) filter plane over its 9 x 9 taps.
    plan = counted.plan
    bw = plan.fft_w // 2 + 1
    one = 9 * real_flops(plan.fft_w) + bw * complex_flops(plan.fft_h)
    assert counted.transforms - cached.transforms == 2 * 3
    assert counted.flops - cached.flops == pytest.approx(6 * one, rel=1e-12)
    # The filter gradient's filter is dL/doutput: always transformed.
    bpf = _core.fft_floor(pass_="backprop_filter", **args)
    bpf_cached = _core.fft_floor(pass_="backprop_filter", count_filter=False, **args)
    assert bpf.transforms > bpf_cached.transforms


def test_3d_same_prunes_padding_slices():
    x, w = (1, 10, 12, 11, 2), (5, 5, 5, 1, 2)
    r = _core.fft_floor(list(x), list(w), padding="SAME", pass_="forward", num_threads=2,
                        **ATTRS3)
    g = fields(_core.conv_geometry(list(x), list(w), padding="SAME", **ATTRS3))
    transforms, flops = expected_plane_floor(g, r.plan, x[4], w[4], 0, (0, 0))
    assert r.transforms == transforms
    assert r.flops == pytest.approx(flops, rel=1e-12)


def causal_1d(batch, length, channels, taps):
    return dict(input_shape=[batch, 1, length, channels], filter_shape=[1, taps, 1, channels],
                strides=[1] * 4, padding="EXPLICIT",
                explicit_paddings=[0, 0, 0, 0, taps - 1, 0, 0, 0], data_format="NHWC",
                dilations=[1] * 4)


def test_lane_plans_count_lane_group_transforms():
    args = causal_1d(3, 500, 20, 300)
    r = _core.fft_floor(pass_="forward", num_threads=2, **args)
    assert r.plan.lanes
    groups = math.ceil(20 / 8)
    # Per item and lane group: a forward and an inverse transform of 8 rows.
    assert r.transforms == r.plan.items * groups * 2
    assert r.flops == pytest.approx(r.transforms * 8 * real_flops(r.plan.fft_w))


def test_fused_backward_counts_three_per_image_and_one_for_the_filter():
    args = causal_1d(3, 500, 20, 300)
    r = _core.fft_floor(pass_="lane_backprop", num_threads=2, **args)
    groups = math.ceil(20 / 8)
    assert r.transforms == groups * (3 * 3 + 1)
    assert r.flops == pytest.approx(r.transforms * 8 * real_flops(r.plan.fft_w))
    assert r.plan.fft_w >= 500 + 299


def test_bad_pass_and_unserved_fused_backward_raise_value_error():
    args = dict(input_shape=[1, 20, 20, 1], filter_shape=[5, 5, 1, 1], padding="VALID",
                **ATTRS2)
    with pytest.raises(ValueError, match="pass must be"):
        _core.fft_floor(pass_="sideways", **args)
    with pytest.raises(ValueError, match="fused backward"):
        _core.fft_floor(pass_="lane_backprop", **args)
