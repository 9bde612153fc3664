"""The planner (plan.cc through _core.plan_pass): every candidate's estimate,
the budget, the choice and its reason, and the cost model's fields."""
import math

import pytest

from tfbigconv import _core

ATTRS = dict(strides=[1, 1, 1, 1], explicit_paddings=[], data_format="NHWC",
             dilations=[1, 1, 1, 1])
PASSES = ("forward", "backprop_input", "backprop_filter")
MIB = 1 << 20


def plan(x, w, pass_="forward", padding="SAME", algorithm="auto", limit=1 << 34,
         im2col=True, dtype="float32", workers=3, **attrs):
    return _core.plan_pass(list(x), list(w), padding=padding, pass_=pass_, dtype=dtype,
                           algorithm=algorithm, workspace_limit=limit, workers=workers,
                           im2col_available=im2col, **dict(ATTRS, **attrs))


CASES = [
    ((8, 64, 64, 16), (3, 3, 16, 16)),
    ((2, 96, 96, 1), (31, 31, 1, 3)),
    ((16, 321, 481, 1), (135, 135, 1, 3)),
    ((4, 56, 56, 32), (31, 31, 1, 32)),
    ((3, 37, 41, 6), (7, 5, 3, 4)),
]


@pytest.mark.parametrize("x,w", CASES)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("limit", [1 << 34, 64 * MIB, 6 * MIB])
def test_choice_fits_and_is_the_fastest_that_fits(x, w, pass_, limit):
    p = plan(x, w, pass_, limit=limit)
    assert p["limit"] == limit
    est = {a: p[a] for a in ("im2col", "direct", "fft")}
    usable = {a: e for a, e in est.items() if e["available"] and e["fits"]}
    assert p["chosen"] in usable
    chosen = est[p["chosen"]]
    assert chosen["workspace_bytes"] <= limit
    assert chosen["seconds"] == min(e["seconds"] for e in usable.values())
    for a, e in est.items():
        assert math.isfinite(e["seconds"]) and e["peak_bytes"] >= e["workspace_bytes"] >= 0
        if e["available"]:
            assert e["fits"] == (e["workspace_bytes"] <= limit), a
    # The reason names the choice and every runner-up's estimate or why it is out.
    assert p["reason"].startswith(f"auto: {p['chosen']}")
    for a in est:
        assert a in p["reason"]


def test_small_filters_go_to_im2col_and_huge_ones_to_fft():
    assert plan((8, 64, 64, 16), (3, 3, 16, 16))["chosen"] == "im2col"
    for pass_ in PASSES:
        assert plan((16, 321, 481, 1), (135, 135, 1, 3), pass_, padding="VALID")["chosen"] == "fft"


def test_estimates_grow_with_the_filter():
    prev = None
    for k in (3, 7, 15, 31, 63):
        p = plan((2, 128, 128, 8), (k, k, 8, 8))
        cur = (p["im2col"]["seconds"], p["direct"]["seconds"], p["im2col"]["workspace_bytes"])
        if prev:
            assert all(c > q for c, q in zip(cur, prev)), (k, cur, prev)
        prev = cur


def test_fft_workspace_shrinks_with_the_limit_and_time_does_not_fall():
    x, w = (16, 321, 481, 1), (135, 135, 1, 3)
    last = None
    for limit in (1 << 34, 256 * MIB, 64 * MIB, 16 * MIB, 4 * MIB):
        f = plan(x, w, padding="VALID", algorithm="fft", limit=limit)["fft"]
        assert f["fits"] and f["workspace_bytes"] <= limit
        if last:
            assert f["workspace_bytes"] <= last["workspace_bytes"]
            assert f["seconds"] >= last["seconds"] * 0.999
        last = f


def test_im2col_is_out_when_unavailable_or_too_big():
    p = plan((8, 64, 64, 16), (3, 3, 16, 16), im2col=False)
    assert not p["im2col"]["available"] and p["chosen"] != "im2col"
    assert "im2col unavailable" in p["reason"]
    # One image's patch matrix: out_h * out_w * KH * KW * Cin floats.
    p = plan((2, 64, 64, 4), (9, 9, 4, 4), limit=64 * 64 * 81 * 4 * 4 - 1)
    assert p["im2col"]["workspace_bytes"] == 64 * 64 * 81 * 4 * 4
    assert not p["im2col"]["fits"] and p["chosen"] != "im2col"


def test_forced_algorithm_that_does_not_fit_states_the_minimum():
    x, w = (4, 200, 200, 1), (63, 63, 1, 3)
    with pytest.raises(RuntimeError, match=r"at least (\d+) bytes") as e:
        plan(x, w, algorithm="fft", limit=1024)
    minimum = int(e.value.args[0].split("at least ")[1].split()[0])
    assert plan(x, w, algorithm="fft", limit=minimum)["chosen"] == "fft"
    with pytest.raises(RuntimeError, match="no algorithm fits"):
        plan(x, w, limit=1024, im2col=False)
    with pytest.raises(RuntimeError, match="not available"):
        plan(x, w, algorithm="im2col", im2col=False)
    with pytest.raises(RuntimeError, match="algorithm must be"):
        plan(x, w, algorithm="winograd")


def test_forced_algorithms_are_obeyed():
    for a in ("im2col", "direct", "fft"):
        p = plan((2, 64, 64, 4), (15, 15, 4, 4), algorithm=a)
        assert p["chosen"] == a and p["reason"] == f"{a} requested"


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="pass must be"):
        plan((1, 8, 8, 1), (3, 3, 1, 1), pass_="sideways")
    with pytest.raises(ValueError, match="dtype"):
        plan((1, 8, 8, 1), (3, 3, 1, 1), dtype="int8")
    with pytest.raises(ValueError, match="padding"):
        plan((1, 8, 8, 1), (3, 3, 1, 1), padding="FULL")


def test_cost_model_round_trip_and_validation():
    fields, values = _core.cost_model_fields(), _core.get_cost_model()
    assert len(fields) == len(values) == len(set(fields))
    try:
        faster = list(values)
        faster[fields.index("direct_flops_per_second")] *= 2
        _core.set_cost_model(faster)
        assert _core.get_cost_model() == faster
        bad = list(values)
        bad[fields.index("fft_seconds_per_transform_flop")] = float("nan")
        with pytest.raises(ValueError, match="fft_seconds_per_transform_flop"):
            _core.set_cost_model(bad)
        with pytest.raises(ValueError, match="needs"):
            _core.set_cost_model(values[:-1])
        assert _core.get_cost_model() == faster
    finally:
        _core.set_cost_model(values)


def test_the_model_moves_the_choice():
    """Making direct 1000x faster in the model makes auto pick it."""
    fields, values = _core.cost_model_fields(), _core.get_cost_model()
    x, w = (16, 321, 481, 1), (135, 135, 1, 3)
    try:
        assert plan(x, w, padding="VALID")["chosen"] == "fft"
        fast = list(values)
        fast[fields.index("direct_flops_per_second")] *= 1000
        _core.set_cost_model(fast)
        assert plan(x, w, padding="VALID")["chosen"] == "direct"
    finally:
        _core.set_cost_model(values)
