"""The GPU cost model (tfbigconv/cost_model/gpu_fit.py; `python -m tfbigconv
fit-gpu`): its features and prediction, which the C++ planner evaluates alike,
fitting it to grid files (scripts/gpu_check.sh --calibrate) into a profile's
GPU section, a GPU section from before the later features, the floor of its
estimates, and benchmarks/gpu_replace_rows.py on grid files."""
import csv
import json
import math
import os

import numpy as np
import pytest

import tfbigconv
from tfbigconv import _core
from tfbigconv.cost_model import gpu_fit, profiles
from tfbigconv.planning import planner
from conftest import ROOT, run_cli as run

PASSES = planner.PASSES
# Geometries like the H100 grids' (N, H, W, Cin, Cout, K, groups, stride).
GRID = [
    (16, 56, 56, 64, 64, 3, 1, 1), (8, 64, 64, 32, 32, 3, 4, 1), (2, 128, 128, 3, 16, 11, 1, 1),
    (8, 128, 128, 64, 64, 7, 1, 2), (32, 32, 32, 64, 64, 5, 64, 1), (4, 128, 128, 32, 32, 31, 1, 1),
    (2, 64, 64, 16, 16, 51, 1, 1), (1, 128, 128, 1, 3, 63, 1, 1), (2, 224, 224, 32, 32, 31, 4, 1),
    (8, 32, 32, 128, 128, 31, 128, 2), (16, 321, 481, 1, 3, 135, 1, 1),
    (32, 56, 56, 256, 256, 13, 256, 1), (2, 321, 481, 128, 128, 15, 128, 2),
    (1, 56, 56, 32, 32, 7, 4, 1),
]


def shipped():
    return dict(zip(_core.cost_model_fields(), profiles.read_profile(profiles.SHIPPED_PATH)))


def gpu_explain_seconds(geometry, pass_, candidate, dtype):
    x, f, strides = gpu_fit.shapes(geometry)
    e = tfbigconv.explain(x, f, strides=strides, padding="SAME", dtype=dtype, device="GPU")
    rows = [r for r in e.rows if r.pass_ == pass_
            and (r.algorithm == candidate or (candidate == "tf" and r.algorithm.startswith("tf")))]
    assert len(rows) == 1
    return rows[0].seconds


def test_predict_equals_the_planners_estimate():
    """gpu_fit.predict (Python) and the C++ planner evaluate the same model."""
    values = dict(zip(_core.cost_model_fields(), _core.get_cost_model()))
    for geometry in (GRID[0], GRID[1], GRID[4], GRID[9]):
        for dtype in ("float32", "bfloat16"):
            for p in PASSES:
                for c in ("tf", "direct", "fft"):
                    want = gpu_explain_seconds(geometry, p, c, dtype)
                    got = gpu_fit.predict(values, geometry, p, c, dtype)
                    assert got == pytest.approx(want, rel=1e-9), (geometry, dtype, p, c)


def write_grid(path, times):
    """A grid CSV with `times` {(geometry, dtype, pass, algo): seconds} and rows fit() must skip."""
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["N", "H", "W", "Cin", "Cout", "K", "groups", "stride", "dtype", "pass",
                      "algo", "kernel_ms", "note"])
        for (g, dtype, p, algo), s in times.items():
            out.writerow(list(g) + [dtype, p, algo, f"{s * 1e3:.6g}", ""])
            if algo == "direct":  # the run-time choice, a skipped and a broken measurement
                out.writerow(list(g) + [dtype, p, "auto", "1e6", "ignored"])
                out.writerow(list(g) + [dtype, p, "fft", "nan", "skipped: flops"])
                out.writerow(list(g) + [dtype, p, "cudnn", "0", "broken"])


def test_fit_gpu_cli_updates_only_the_gpu_section(tmp_path):
    """Grid times 2x the shipped model's (float32) and 4x (half): the fitted
    model predicts them closely, its CPU values are the profile's own, and
    the planner uses the fitted values."""
    truth = shipped()
    times = {}
    for i, g in enumerate(GRID):
        for dtype, factor in (("float32", 2.0), ("bfloat16", 4.0)):
            for p in PASSES:
                for algo, c in gpu_fit.CANDIDATES.items():
                    noise = math.exp(0.02 * math.sin(7 * i + len(p)))
                    times[(g, dtype, p, algo)] = (factor * noise *
                                                  gpu_fit.predict(truth, g, p, c, dtype))
    grid = tmp_path / "grid.csv"
    write_grid(grid, times)
    assert len(gpu_fit.read_grid([str(grid)])) == len(times)

    # A profile with a CPU section of its own (a calibration of this machine).
    profile = tmp_path / "profile.json"
    cpu = {k: v for k, v in truth.items() if not k.startswith("gpu.")}
    cpu["direct_flops_per_second"] = 1.25e11
    cpu["fft_seconds_per_call"] = 7e-4
    profile.write_text(json.dumps({"meta": {"format": 1, "machine": "test box"}, "values": cpu}))

    r = run(["-m", "tfbigconv", "fit-gpu", str(grid), "--output", str(profile)])
    assert r.returncode == 0, r.stderr
    assert f"wrote {profile}" in r.stdout
    doc = json.loads(profile.read_text())
    assert doc["meta"]["machine"] == "test box" and doc["meta"]["gpu_grids"] == ["grid.csv"]
    fitted = doc["values"]
    assert set(fitted) == set(_core.cost_model_fields())
    for k, v in cpu.items():
        assert fitted[k] == v, k
    changed = [k for k in fitted if k.startswith("gpu.") and fitted[k] != truth[k]]
    # The coefficients and the floor of each (candidate, pass, dtype class), but
    # those the fit holds at 0: a half-only feature's in float32, and a feature
    # that is 0 on every row of its group in both fits (the cuDNN depthwise
    # class of our filter gradients' problems).
    zero = [k for k in fitted if k.startswith("gpu.") and fitted[k] == truth[k] == 0.0]
    assert all(k.endswith(gpu_fit.HALF_ONLY_FEATURES) for k in zero), zero
    assert len(changed) + len(zero) == 3 * 3 * 2 * (len(gpu_fit.FEATURES) + 1)
    # The half-only feature: fitted (non-zero) in the half class, 0 in float32's,
    # though the grid has layers in its class in both.
    half_only = [k for k in fitted if k.startswith("gpu.") and k.endswith(gpu_fit.HALF_ONLY_FEATURES)]
    assert all(fitted[k] == 0.0 for k in half_only if ".float32." in k)
    assert any(fitted[k] != 0.0 for k in half_only if ".half." in k)

    ratios = {"float32": [], "bfloat16": []}
    for (g, dtype, p, algo), s in times.items():
        ratios[dtype].append(gpu_fit.predict(fitted, g, p, gpu_fit.CANDIDATES[algo], dtype) / s)
    for dtype, rs in ratios.items():
        assert 0.9 < float(np.median(rs)) < 1.1, dtype
        assert 0.5 < min(rs) and max(rs) < 2.0, dtype

    # The planner, given the fitted profile, estimates what predict() says.
    saved = _core.get_cost_model()
    try:
        _core.set_cost_model(profiles.read_profile(str(profile)))
        for p in PASSES:
            for c in ("tf", "direct", "fft"):
                assert gpu_explain_seconds(GRID[3], p, c, "float16") == pytest.approx(
                    gpu_fit.predict(fitted, GRID[3], p, c, "float16"), rel=1e-9)
    finally:
        _core.set_cost_model(saved)


def test_fit_gpu_cli_without_usable_rows(tmp_path):
    grid = tmp_path / "empty.csv"
    write_grid(grid, {})
    r = run(["-m", "tfbigconv", "fit-gpu", str(grid), "--output", str(tmp_path / "p.json")])
    assert r.returncode == 2 and "no cudnn/direct/fft rows" in r.stderr
    assert not (tmp_path / "p.json").exists()


def test_gpu_features_bend_with_the_filter_side():
    """Two later features are log side squared and log side x log pixels
    (cost_model.h GpuModelTerms), for every candidate."""
    assert gpu_fit.FEATURES[-3:] == profiles.LATER_GPU_FEATURES
    assert gpu_fit.FEATURES[6:8] == ("log_side_squared", "log_side_x_log_pixels")
    x, f, strides = gpu_fit.shapes((2, 30, 40, 6, 10, 13, 2, 2))
    for c in ("tf", "direct", "fft"):
        _, t = _core.gpu_terms(x, f, strides, "SAME", [], "NHWC", [1, 1, 1, 1], "forward", c)
        assert len(t) == len(gpu_fit.FEATURES)
        assert t[1] == pytest.approx(math.log(13))
        assert t[6] == pytest.approx(t[1] ** 2) and t[7] == pytest.approx(t[1] * t[5])
    _, t = _core.gpu_terms(x, f, strides, "SAME", [], "NHWC", [1, 1, 1, 1], "forward", "tf")
    assert t[5] == pytest.approx(math.log(2 * 15 * 20))


@pytest.mark.parametrize("geometry,in_class", [
    ((8, 224, 224, 128, 128, 7, 128, 1), True),   # depthwise 7x7
    ((2, 64, 64, 384, 384, 5, 384, 2), True),     # 5x5, stride 2
    ((8, 32, 32, 32, 32, 3, 32, 1), True),
    ((8, 64, 64, 128, 128, 9, 128, 1), False),    # side 9
    ((2, 40, 40, 8, 16, 5, 8, 1), False),         # multiplier 2
    ((2, 64, 64, 64, 64, 7, 64, 3), False),       # stride 3
    ((4, 64, 64, 32, 32, 3, 4, 1), False),        # grouped, not depthwise
    ((16, 56, 56, 64, 64, 3, 1, 1), False),       # dense
])
def test_cudnn_depthwise_class_is_a_half_precision_feature(geometry, in_class):
    """The last GPU feature is 1 for the depthwise layers TF sends to cuDNN's
    dedicated kernels in float16 (multiplier 1, square side 1/3/5/7, stride
    1 or 2), for TF's kernel; the fit gives it a coefficient in the half class
    only."""
    x, f, strides = gpu_fit.shapes(geometry)
    _, t = _core.gpu_terms(x, f, strides, "SAME", [], "NHWC", [1, 1, 1, 1], "forward", "tf")
    assert t[gpu_fit.FEATURES.index("cudnn_depthwise_class")] == (1.0 if in_class else 0.0)
    values = shipped()
    for name, v in values.items():
        if name.endswith(".float32.cudnn_depthwise_class"):
            assert v == 0.0, name
    assert any(v != 0.0 for k, v in values.items() if k.endswith(".half.cudnn_depthwise_class"))


def test_a_gpu_profile_from_before_the_side_features_keeps_its_model(tmp_path):
    """A GPU section fitted without the later features reads them as 0 (its
    own model), not as the defaults' coefficients; the planner then gives the
    six-feature model's estimate."""
    truth = shipped()
    old = {k: v for k, v in truth.items()
           if k.split(".")[-1] not in profiles.LATER_GPU_FEATURES}
    path = tmp_path / "old_gpu.json"
    path.write_text(json.dumps({"meta": {"format": 1}, "values": old}))
    for defaults in (None, truth):
        values = dict(zip(_core.cost_model_fields(), profiles.read_profile(str(path), defaults)))
        later = [k for k in values if k.split(".")[-1] in profiles.LATER_GPU_FEATURES]
        assert len(later) == 3 * 3 * 2 * len(profiles.LATER_GPU_FEATURES)
        assert all(values[k] == 0.0 for k in later)
        assert all(values[k] == v for k, v in old.items())
    g = (4, 64, 64, 16, 16, 31, 1, 1)
    x, f, strides = gpu_fit.shapes(g)
    saved = _core.get_cost_model()
    try:
        _core.set_cost_model(profiles.read_profile(str(path)))
        for c in ("tf", "direct", "fft"):
            work, t = _core.gpu_terms(x, f, strides, "SAME", [], "NHWC", [1, 1, 1, 1], "forward", c)
            prefix = f"gpu.{c}.forward.float32."
            six = work * math.exp(sum(old[prefix + n] * v for n, v in zip(gpu_fit.FEATURES[:6], t)))
            assert gpu_explain_seconds(g, "forward", c, "float32") == pytest.approx(
                max(six, old[prefix + "floor_seconds"]), rel=1e-9)
    finally:
        _core.set_cost_model(saved)
    # A profile that names them keeps them.
    path.write_text(json.dumps({"meta": {"format": 1}, "values": truth}))
    assert profiles.read_profile(str(path)) == [truth[n] for n in _core.cost_model_fields()]


def test_gpu_floor_bounds_estimates_and_a_tie_goes_to_tf():
    """A GPU estimate never goes below its group's floor (the shortest call
    measured); where all three sit at equal floors, TF's kernel is chosen."""
    values = shipped()
    floors = [k for k in values if k.endswith(".floor_seconds")]
    assert len(floors) == 3 * 3 * 2 and all(values[k] > 0 for k in floors)
    saved = _core.get_cost_model()
    try:
        # small, but over the planner's SMALL_PASS_MACS, below which precision decides
        small = (1, 32, 32, 16, 16, 3, 1, 1)
        for k in floors:
            values[k] = 1.0
        _core.set_cost_model([values[n] for n in _core.cost_model_fields()])
        x, f, strides = gpu_fit.shapes(small)
        e = tfbigconv.explain(x, f, strides=strides, padding="SAME", device="GPU")
        assert all(r.seconds == 1.0 for r in e.rows), e
        assert set(e.chosen.values()) == {"tf.Conv2D"}, e.chosen
        values[floors[0]] = -1.0
        with pytest.raises(ValueError, match="floor_seconds"):
            _core.set_cost_model([values[n] for n in _core.cost_model_fields()])
    finally:
        _core.set_cost_model(saved)


def test_gpu_replace_rows_swaps_only_the_remeasured_rows(tmp_path):
    """benchmarks/gpu_replace_rows.py: a re-measured row takes its old row's
    place, every other byte of the grid stays, and a row the grid lacks is
    refused without writing anything."""
    script = os.path.join(ROOT, "benchmarks", "gpu_replace_rows.py")
    g1, g2 = GRID[0], GRID[1]
    # write_grid adds auto, fft and cudnn rows beside each direct one: 24 rows.
    times = {(g, "float32", p, "direct"): 1e-3 * (i + 1)
             for i, (g, p) in enumerate((g, p) for g in (g1, g2) for p in PASSES)}
    into = tmp_path / "into"
    into.mkdir()
    write_grid(into / "grid.csv", times)
    before = (into / "grid.csv").read_bytes()
    new = tmp_path / "grid.csv"
    write_grid(new, {(g1, "float32", "forward", "direct"): 0.5})
    r = run([script, str(new), "--into", str(into)])
    assert r.returncode == 0, r.stderr
    assert "4 of 24 rows replaced" in r.stdout
    rows = {(r_["geometry"], r_["pass_"], r_["algo"]): r_["seconds"]
            for r_ in gpu_fit.read_grid([str(into / "grid.csv")])}
    assert len(rows) == 6 and rows[(g1, "forward", "direct")] == pytest.approx(0.5)
    assert rows[(g2, "forward", "direct")] == pytest.approx(times[(g2, "float32", "forward",
                                                                   "direct")])
    # Putting the old row back restores the file byte for byte.
    write_grid(new, {(g1, "float32", "forward", "direct"):
                     times[(g1, "float32", "forward", "direct")]})
    assert run([script, str(new), "--into", str(into)]).returncode == 0
    assert (into / "grid.csv").read_bytes() == before
    # A geometry the grid does not hold: refused, nothing written.
    write_grid(new, {(GRID[2], "float32", "forward", "direct"): 0.5})
    r = run([script, str(new), "--into", str(into)])
    assert r.returncode == 2 and "no row in" in r.stderr
    assert (into / "grid.csv").read_bytes() == before
