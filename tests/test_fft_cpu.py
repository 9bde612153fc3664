"""The FFT CPU kernel through _core (no TensorFlow): the geometry matrix,
overlap-save tile edges, the workspace contract, and independence of the
results from chunking and thread count."""
import numpy as np
import pytest

from tfbigconv import _core

from conftest import (DILATIONS, LARGE_FILTERS, PADDINGS, STRIDES, TOLERANCE, check_core,
                      random_case, run_core, to4)
from reference import conv2d_reference, rel_l2

FFT_TOL = 1e-4  # float32 through FFTs (docs/ARCHITECTURE.md section 7)


def run(x, w, strides=1, padding="VALID", dil=1, fmt="NHWC", pads=((0, 0), (0, 0)), **kw):
    return run_core("fft", x, w, strides, padding, dil, fmt, pads, **kw)


def check(x, w, strides=1, padding="VALID", dil=1, fmt="NHWC", pads=((0, 0), (0, 0)), **kw):
    tol = FFT_TOL if x.dtype == np.float32 else None
    return check_core("fft", x, w, strides, padding, dil, fmt, pads, tol=tol, **kw)


def plan(x_shape, w_shape, strides=1, padding="VALID", dil=1, fmt="NHWC", **kw):
    return _core.fft_plan(list(x_shape), list(w_shape), to4(strides, fmt), padding, [], fmt,
                          to4(dil, fmt), **kw)


@pytest.mark.parametrize("k", [1, 2, 3, 7, 15, 31])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_square_filters(k, dtype):
    check(random_case((2, 37, 41, 2), k, dtype), random_case((k, k, 2, 3), k + 1, dtype), 1, "SAME")


@pytest.mark.parametrize("shape,fshape", LARGE_FILTERS)
def test_large_and_nonsquare_filters(shape, fshape):
    check(random_case(shape, 3), random_case(fshape, 4), 1, "VALID")


@pytest.mark.parametrize("padding,pads", PADDINGS)
@pytest.mark.parametrize("strides", STRIDES)
@pytest.mark.parametrize("dil", DILATIONS)
def test_padding_strides_dilations(padding, pads, strides, dil):
    for cout in (2, 7):
        check(random_case((2, 23, 29, 3), 5), random_case((4, 5, 3, cout), 6), strides, padding,
              dil, pads=pads)


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("cin,fin,cout", [
    (6, 3, 4),      # 2 groups, fused mixing
    (6, 2, 9),      # 3 groups
    (8, 1, 8),      # depthwise
    (8, 1, 16),     # depthwise, multiplier 2
    (20, 10, 6),    # 2 groups of 10 input channels: blocked mixing
    (12, 12, 5),    # dense, blocked mixing
])
def test_groups_and_layouts(fmt, cin, fin, cout):
    shape = (2, 19, 22, cin) if fmt == "NHWC" else (2, cin, 19, 22)
    check(random_case(shape, cin), random_case((5, 6, fin, cout), cout), 2, "SAME", 1, fmt)


def test_both_mixing_paths_are_planned():
    assert plan((1, 16, 16, 1), (3, 3, 1, 4))["fused_mix"]
    assert not plan((1, 16, 16, 8), (3, 3, 8, 4))["fused_mix"]


def test_half_and_double():
    x64, w64 = random_case((2, 20, 23, 3), 0, np.float64), random_case((9, 9, 3, 5), 1, np.float64)
    got = run(x64, w64, 1, "SAME")
    assert rel_l2(got, conv2d_reference(x64, w64, (1, 1), "SAME")) <= TOLERANCE["float64"]
    x16, w16 = x64.astype(np.float16), w64.astype(np.float16)
    got = run(x16, w16, 1, "SAME")
    assert rel_l2(got, conv2d_reference(x16, w16, (1, 1), "SAME")) <= TOLERANCE["float16"]


@pytest.mark.parametrize("limit_kib", [6, 9, 14, 20, 40, 100])
@pytest.mark.parametrize("out_hw", [(1, 1), (7, 9), (16, 16), (17, 23), (31, 30)])
def test_tile_edges(limit_kib, out_hw):
    """Small workspace limits force small overlap-save tiles: output sizes
    below, at and past the tile sizes, with partial last tiles."""
    k = 5
    x = random_case((2, out_hw[0] + k - 1, out_hw[1] + k - 1, 1), sum(out_hw))
    w = random_case((k, k, 1, 2), limit_kib)
    limit = limit_kib << 10
    p = plan(x.shape, w.shape, workspace_limit=limit, workers=2)
    assert p["workspace_bytes"] <= limit
    check(x, w, workspace_limit=limit, num_threads=2)


def test_tiles_used_for_small_filters_on_large_images():
    p = plan((1, 512, 512, 1), (7, 7, 1, 1))
    assert p["tiles_h"] * p["tiles_w"] > 1, p


@pytest.mark.parametrize("limit", [2 ** 17, 2 ** 19, 2 ** 21, 2 ** 23, 2 ** 26])
def test_workspace_never_exceeds_limit(limit):
    for shape, fshape in [((4, 100, 90, 3), (21, 21, 3, 4)), ((3, 64, 64, 8), (9, 9, 8, 8)),
                          ((2, 140, 137, 1), (135, 135, 1, 3))]:
        try:
            p = plan(shape, fshape, workspace_limit=limit, workers=3)
        except ValueError as e:
            assert "at least" in str(e)
            continue
        assert p["workspace_bytes"] <= limit
        assert p["workspace_bytes"] == (p["filter_spectra_bytes"] + p["chunk"] * p["item_spectra_bytes"]
                                        + 3 * p["worker_bytes"])


def test_too_small_limit_states_minimum():
    with pytest.raises(ValueError, match=r"at least (\d+) bytes") as e:
        plan((2, 140, 137, 1), (135, 135, 1, 3), workspace_limit=1000)
    minimum = int(str(e.value).split("at least ")[1].split()[0])
    p = plan((2, 140, 137, 1), (135, 135, 1, 3), workspace_limit=minimum)
    assert p["workspace_bytes"] <= minimum
    with pytest.raises(ValueError, match="at least"):
        plan((2, 140, 137, 1), (135, 135, 1, 3), workspace_limit=minimum - 1)


def test_results_independent_of_chunking():
    x, w = random_case((6, 40, 44, 3), 0), random_case((9, 9, 3, 4), 1)
    big = run(x, w, 1, "SAME", workspace_limit=1 << 30, num_threads=2)
    plans = set()
    for limit in (60_000, 100_000, 200_000, 1 << 30):
        p = plan(x.shape, w.shape, padding="SAME", workspace_limit=limit, workers=2)
        plans.add((p["tile_h"], p["tile_w"], p["chunk"]))
        got = run(x, w, 1, "SAME", workspace_limit=limit, num_threads=2)
        assert rel_l2(got, big) < 1e-6
    assert len(plans) > 2  # the limits really changed the tiling or chunking


def test_results_independent_of_thread_count():
    x, w = random_case((5, 33, 30, 6), 0), random_case((7, 7, 6, 6), 1)
    outs = [run(x, w, 1, "SAME", num_threads=t) for t in (1, 2, 3, 5)]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


def test_batch_zero_and_padding_only_windows():
    assert run(random_case((0, 8, 8, 2), 0), random_case((3, 3, 2, 4), 1)).shape == (0, 6, 6, 4)
    x, w = random_case((1, 2, 2, 1), 0), random_case((3, 3, 1, 2), 1)
    got = run(x, w, 1, "EXPLICIT", pads=((4, 4), (4, 4)))
    ref = conv2d_reference(x, w, (1, 1), "EXPLICIT", (1, 1), "NHWC", ((4, 4), (4, 4)))
    assert rel_l2(got, ref) < FFT_TOL


def test_agrees_with_direct():
    x, w = random_case((2, 50, 47, 4), 0), random_case((17, 15, 2, 6), 1)
    a = run(x, w, (2, 1), "SAME", (1, 2))
    b = run_core("direct", x, w, (2, 1), "SAME", (1, 2))
    assert rel_l2(a, b) < FFT_TOL


def test_reduction_blocks_bound_the_filter_spectra():
    """A limit below the filter spectra of all input channels, even at the
    smallest tiles, makes the sum over input channels run in blocks."""
    for x_shape, w_shape, limit in [((2, 30, 28, 12), (9, 9, 12, 10), 30_000),
                                    ((2, 20, 22, 12), (7, 7, 6, 8), 12_000)]:  # 2 groups
        p = plan(x_shape, w_shape, padding="SAME", workspace_limit=limit, workers=2)
        assert p["ci_block"] < w_shape[2] and p["workspace_bytes"] <= limit, p
        check(random_case(x_shape, 0), random_case(w_shape, 1), 1, "SAME",
              workspace_limit=limit, num_threads=2)


# ---- staged channel blocks (FftPlan.stage_planes) -----------------------------------

def run_pass_fft(pass_, x, w, strides, padding, dil, fmt, **kw):
    """One pass of the fft kernel: (result, float64 reference)."""
    from conftest import hw_pair, run_core_pass
    from reference import conv2d_reference_backprop_filter, conv2d_reference_backprop_input
    args = (hw_pair(strides), padding, hw_pair(dil), fmt, ((0, 0), (0, 0)))
    if pass_ == "forward":
        return run(x, w, strides, padding, dil, fmt, **kw), conv2d_reference(x, w, *args)
    y_shape = conv2d_reference(x, w, *args).shape
    dy = random_case(y_shape, 7)
    if pass_ == "backprop_input":
        return (run_core_pass("fft", pass_, dy, w, x.shape, strides, padding, dil, fmt, **kw),
                conv2d_reference_backprop_input(dy, w, x.shape, *args))
    return (run_core_pass("fft", pass_, x, dy, w.shape, strides, padding, dil, fmt, **kw),
            conv2d_reference_backprop_filter(x, dy, w.shape, *args))


def test_stage_planes_planned_and_dropped_under_a_tight_limit():
    x_shape, w_shape = (8, 56, 56, 128), (31, 31, 1, 128)  # issue 11's depthwise case
    p = plan(x_shape, w_shape, padding="SAME", workers=2)
    spectrum = p["fft_h"] * (p["fft_w"] // 2 + 1) * 8
    assert p["stage_planes"] == 8 and p["fused_mix"]
    assert p["worker_bytes"] == 8 * p["fft_h"] * p["fft_w"] * 4 + spectrum
    tight = plan(x_shape, w_shape, padding="SAME", workers=2,
                 workspace_limit=p["workspace_bytes"] - 1)
    assert tight["stage_planes"] == 1 and tight["workspace_bytes"] < p["workspace_bytes"]
    assert tight["worker_bytes"] == tight["fft_h"] * tight["fft_w"] * 4 + spectrum
    # Few channels: no more planes than a task can have; big transforms: fewer.
    assert plan((1, 40, 40, 1), (9, 9, 1, 3))["stage_planes"] == 3
    assert plan((1, 400, 400, 8), (135, 135, 1, 8))["stage_planes"] == 1


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


@pytest.mark.parametrize("w_shape", [(6, 7, 1, 12), (6, 7, 4, 12), (6, 7, 12, 5)])
def test_staged_blocks_change_no_result(w_shape):
    """stage_planes > 1 and 1 (a limit one byte below the staged plan: same
    tiles and chunks) give the same bits; partial blocks included."""
    x, w = random_case((2, 21, 19, 12), 0), random_case(w_shape, 1)
    p = plan(x.shape, w.shape, padding="SAME", workers=2)
    tight = plan(x.shape, w.shape, padding="SAME", workers=2,
                 workspace_limit=p["workspace_bytes"] - 1)
    assert p["stage_planes"] > 1 and tight["stage_planes"] == 1
    assert [tight[k] for k in ("tile_h", "tile_w", "chunk")] == [p[k] for k in ("tile_h", "tile_w", "chunk")]
    staged = run(x, w, 1, "SAME", num_threads=2)
    np.testing.assert_array_equal(staged, run(x, w, 1, "SAME", num_threads=2,
                                              workspace_limit=p["workspace_bytes"] - 1))
    assert rel_l2(staged, conv2d_reference(x, w, (1, 1), "SAME")) <= FFT_TOL


def test_staged_block_with_a_nan_channel_matches_direct():
    """A NaN in one channel of a staged block: its tile goes to the direct
    kernel, which places the NaN as tf.nn.conv2d does; other tiles stay fft."""
    x, w = random_case((2, 30, 30, 16), 0), random_case((7, 7, 1, 16), 1)
    x[1, 12, 9, 5] = np.nan
    got = run(x, w, 1, "SAME", num_threads=2)
    want = run_core("direct", x, w, 1, "SAME")
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    assert np.isnan(want).any() and rel_l2(got[finite], want[finite]) <= FFT_TOL


def test_many_groups_keep_threads_busy_with_small_chunks_and_blocks():
    """Each group's transforms are separate tasks, so a grouped plan needs
    fewer items per chunk and fewer input channels per reduction block for
    busy threads: issue 11's depthwise passes stay far below their old 37
    and 69 MiB workspaces (fresh pages cost about 0.4 ms per MiB)."""
    fwd = plan((8, 56, 56, 128), (31, 31, 1, 128), padding="SAME", workers=2)
    assert fwd["chunk"] < fwd["items"] and fwd["workspace_bytes"] < 20 << 20, fwd
    # The filter gradient posed as a convolution: groups = channels, the
    # batch of 8 as each group's input channels, dy as the filter.
    bwd = _core.fft_plan([1, 56, 56, 8 * 128], [56, 56, 8, 128], [1, 1, 1, 1], "EXPLICIT",
                         [0, 0, 15, 15, 15, 15, 0, 0], "NHWC", [1, 1, 1, 1], workers=2)
    assert bwd["ci_block"] < 8 and bwd["workspace_bytes"] < 20 << 20, bwd
    # One group: the old rules (8 items a chunk, all input channels a block).
    dense = plan((8, 40, 40, 6), (9, 9, 6, 4), padding="SAME", workers=2)
    assert dense["chunk"] == 8 and dense["ci_block"] == 6, dense
