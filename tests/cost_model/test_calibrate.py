"""Calibrating the CPU cost model (tfbigconv/cost_model/calibrate.py;
`python -m tfbigconv calibrate`): the channel-block probe and the im2col
table's cases, and the round trip of a measured profile into both compiled
modules of a fresh process."""
import json

from tfbigconv import _core, host
from tfbigconv.cost_model import calibrate, profiles
from conftest import run_cli as run


CHECK_MODEL = """
import json, sys
import numpy as np, tensorflow as tf
import tfbigconv
from tfbigconv import _core
from tfbigconv.cost_model import profiles
# The op's run-time choice (unknown shapes) must follow the loaded model:
# its output is bitwise that of the algorithm the model makes fastest.
x = tf.constant(np.random.default_rng(0).standard_normal((2, 40, 40, 2)).astype(np.float32))
w = tf.constant(np.random.default_rng(1).standard_normal((9, 9, 2, 3)).astype(np.float32))
spec = [tf.TensorSpec([None, None, None, 2])]
run = lambda a: tf.function(lambda x: tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm=a),
                            input_signature=spec)(x).numpy()
auto = run("auto")
same = [a for a in ("direct", "fft") if np.array_equal(auto, run(a))]
print(json.dumps({"source": profiles.active_source, "values": _core.get_cost_model(),
                  "op_choice": same}))
"""


def test_a_slow_measurement_is_not_repeated_in_later_rounds(monkeypatch):
    # Round-robin over the keys; a key whose first round took over
    # REPEAT_BELOW_S a call keeps that time, the others take their best.
    results = {"fast": [0.010, 0.008], "slow": [calibrate.REPEAT_BELOW_S * 2, 0.001]}
    calls = []

    def fake_time(fn, budget_s, warm=False, share_s=None):
        key = fn()
        calls.append((key, warm))
        return results[key][sum(1 for k, _ in calls if k == key) - 1]

    monkeypatch.setattr(calibrate, "_time", fake_time)
    progress = calibrate._Progress(4, show=False)
    best = calibrate._best_times({"fast": lambda: "fast", "slow": lambda: "slow"}, 0.1, 2,
                                 progress)
    assert calls == [("fast", False), ("slow", False), ("fast", True)]
    assert best == {"fast": 0.008, "slow": calibrate.REPEAT_BELOW_S * 2}
    assert progress.done == 4  # a skipped measurement still counts on the bar


def test_channel_block_is_the_count_before_the_first_that_costs_more():
    """calibrate.channel_block, on timings like those measured on the oneDNN and
    Eigen builds (RESULTS.md): the probe stops at the first count over
    BLOCK_TOLERANCE x one channel's time, and a faster count after it (oneDNN's
    filter gradient switching path) does not count."""
    probe = calibrate.BLOCK_PROBE
    onednn = dict(zip(probe, (4.33, 4.09, 4.17, 4.33, 4.33, 8.12)))
    eigen_input = dict(zip(probe, (2.51, 3.19, 4.53, 6.77, 12.72, 27.76)))
    slow_path = {1: 17.94, 2: 17.92, 4: 35.16}  # stopped at 4
    slow_then_fast = dict(zip(probe, (14.5, 29.0, 56.0, 112.0, 4.07, 2.51)))
    assert calibrate.channel_block(onednn) == 16
    assert calibrate.channel_block(eigen_input) == 2
    assert calibrate.channel_block(slow_path) == 2
    assert calibrate.channel_block(slow_then_fast) == 1
    assert calibrate.channel_block({c: 1.0 * c for c in probe}) == 1
    assert calibrate.channel_block({c: 1.0 for c in probe}) == probe[-1]


def test_im2col_table_cases_fill_the_channel_block():
    """With a block of 1 the table's cases are the square-ish ones it always
    had; with 16 the written channels are a whole block wherever the product
    allows; every case has the product it stands for."""
    assert calibrate.im2col_axes()[1] == (1, 16, 256, 2048)
    assert [calibrate.table_case(p, 1) for p in calibrate.im2col_axes()[1]] == \
        [(1, 1), (4, 4), (16, 16), (32, 64)]
    assert [calibrate.table_case(p, 16) for p in calibrate.im2col_axes()[1]] == \
        [(1, 1), (1, 16), (16, 16), (32, 64)]
    assert [calibrate.table_case(p, 2) for p in calibrate.im2col_axes()[1]] == \
        [(1, 1), (4, 4), (16, 16), (32, 64)]
    for block in (1, 2, 4, 8, 16, 32):
        for p in calibrate.im2col_axes()[1]:
            other, written = calibrate.table_case(p, block)
            assert other * written == p
            assert written % block == 0 or written == p


def test_calibration_round_trip(tmp_path):
    cache = tmp_path / "cache"
    r = run(["-m", "tfbigconv", "calibrate", "--quick"], XDG_CACHE_HOME=str(cache))
    assert r.returncode == 0, r.stderr
    profile = cache / "tfbigconv" / "cost_model.json"
    doc = json.loads(profile.read_text())
    assert doc["meta"]["quick"] and doc["meta"]["format"] == profiles.FORMAT
    assert doc["meta"]["cpu"] == profiles.this_cpu()  # what machine_mismatch compares
    assert doc["meta"]["tf_onednn"] == host.tf_onednn() is not None
    _, shipped_meta = profiles.read_profile_and_meta(profiles.SHIPPED_PATH)
    assert doc["meta"]["gpu_grids"] == shipped_meta["gpu_grids"]
    fields = _core.cost_model_fields()
    assert set(doc["values"]) == set(fields)
    # A fresh process loads the user's profile into _core and the op library.
    for fast, other in (("direct", "fft"), ("fft", "direct")):
        values = dict(doc["values"])
        for name in fields:
            if name.startswith(other) and "per_unit" not in name and "flops" not in name:
                values[name] = 1.0  # a second per call: never chosen
        profile.write_text(json.dumps({"meta": doc["meta"], "values": values}))
        r = run(["-c", CHECK_MODEL], XDG_CACHE_HOME=str(cache))
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert got["source"] == "user"
        assert got["values"] == [values[n] for n in fields]
        assert got["op_choice"] == [fast]
    # A broken profile is ignored with a warning, falling back to the shipped one.
    profile.write_text("{not json")
    r = run(["-c", CHECK_MODEL], XDG_CACHE_HOME=str(cache))
    assert r.returncode == 0 and "ignoring cost model" in r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["source"] == "shipped"


def test_a_cpu_only_profile_takes_the_main_profiles_gpu_values(tmp_path):
    """calibrate(cpu_only=True) (benchmarks/calibrate.py --cpu-only, the shipped
    CPU profiles) writes no GPU values and no gpu_grids; read, its GPU values
    are the main profile's."""
    path = tmp_path / "p.json"
    calibrate.calibrate(str(path), quick=True, log=lambda line: None, progress=False,
                        cpu_only=True)
    doc = json.loads(path.read_text())
    assert doc["values"] and not any(profiles.is_gpu_field(n) for n in doc["values"])
    assert "gpu_grids" not in doc["meta"]
    main = profiles.shipped_values()
    values, _ = profiles.read_profile_and_meta(str(path), main)
    got = dict(zip(_core.cost_model_fields(), values))
    assert {n: v for n, v in got.items() if profiles.is_gpu_field(n)} == \
        {n: v for n, v in main.items() if profiles.is_gpu_field(n)}


def test_progress_bar_counts_every_measurement(tmp_path, monkeypatch):
    """The progress bar's total is the calibration's measurements, exactly (its
    time left is then right), and the per-measurement lines go to absl's log."""
    seen = {}
    finish = calibrate._Progress.finish

    def spy(self):
        seen["done"], seen["total"] = self.done, self.total
        finish(self)

    monkeypatch.setattr(calibrate._Progress, "finish", spy)
    lines = []
    calibrate.calibrate(str(tmp_path / "p.json"), quick=True, log=lines.append, progress=False)
    assert seen["done"] == seen["total"] > 0
    assert any("model / measured" in line for line in lines)
    assert not any(" ms" in line and "x" in line.split(":")[0] for line in lines)  # details


def test_table_cases_are_sized_by_the_active_profile():
    """A TF-table case the active profile expects to run over CALL_S a call is
    shrunk to about CALL_S (at most 64x), else it keeps the table's work."""
    work = 2e9
    rate_at = lambda seconds: work / seconds  # noqa: E731  (FLOP/s for a call of `seconds`)
    assert calibrate._sized(work, None) == work
    assert calibrate._sized(work, rate_at(calibrate.CALL_S / 2)) == work
    assert abs(calibrate._sized(work, rate_at(10 * calibrate.CALL_S)) - work / 10) < 1
    assert abs(calibrate._sized(work, rate_at(calibrate.CALL_S), 10) - work / 10) < 1
    assert calibrate._sized(work, rate_at(1e6)) == work / 64


def test_a_measurement_short_of_time_takes_one_call_after_its_warm_up():
    """_time within a share of the budget (_Clock.share): the warm-up and one
    call where the share is spent, else calls until budget_s (at least two)."""
    calls = []
    fn = lambda: calls.append(1)  # noqa: E731
    calibrate._time(fn, budget_s=1.0, reps=5, share_s=0.0)
    assert len(calls) == 2
    calls.clear()
    calibrate._time(fn, budget_s=1.0, reps=5)
    assert len(calls) == 6
    assert calibrate._Clock(None).call_s() == calibrate.CALL_S
    assert calibrate._Clock(0.0, pending=10).call_s() == calibrate.MIN_CALL_S


def test_calibrate_keeps_its_time_budget(tmp_path):
    """With no time left (a budget of 0 s) calibrate still takes every
    measurement once, each short, and no second round, and writes a profile
    the planner can use; without a budget it takes the second round."""
    def run_once(budget_s):
        path = tmp_path / f"p{budget_s}.json"
        calibrate.calibrate(str(path), quick=True, rounds=2, log=lambda line: None,
                            progress=False, budget_s=budget_s)
        return json.loads(path.read_text())

    short, unlimited = run_once(0.0), run_once(None)
    assert short["meta"]["budget_s"] == 0.0 and short["meta"]["repeated"] == 0
    assert unlimited["meta"]["repeated"] > 0
    fields = _core.cost_model_fields()
    assert set(short["values"]) == set(fields)
    values = short["values"]
    for name in fields:
        v = values[name]
        assert v == v and abs(v) != float("inf"), name  # no NaN or Inf
        if "flops_per_second" in name or "dtype_slowdown" in name:
            assert v > 0, name
        if name.startswith(profiles.CHANNEL_BLOCK):
            assert v in calibrate.BLOCK_PROBE, name
    loaded, _ = profiles.read_profile_and_meta(str(tmp_path / "p0.0.json"))
    assert len(loaded) == len(fields)


def test_the_half_slow_path_side_is_found_by_bisection():
    """The first side whose time per tap is HALF_SLOW_PATH_FACTOR x side 7's (a
    step, as oneDNN's bfloat16 filter gradient has on Zen 4), in a few calls;
    none where no side is slow."""
    timed = []
    none = 1e6

    def step_at(first_slow):
        def seconds_at(side):
            timed.append(side)
            return side ** 2 * (1e-3 if side >= first_slow else 1e-6)
        return seconds_at

    sides = list(range(8, 32))
    for first_slow in (8, 15, 25, 31):
        timed.clear()
        assert calibrate.half_slow_path_side(step_at(first_slow), 7, sides, none) == first_slow
        assert len(timed) <= 1 + 5  # side 7, then a bisection of 24 sides
    assert calibrate.half_slow_path_side(step_at(32), 7, sides, none) == none
    # Twice the time per tap is not a slow path.
    assert calibrate.half_slow_path_side(
        lambda s: s ** 2 * (2e-6 if s > 7 else 1e-6), 7, sides, none) == none
