"""Measured choices (tfbigconv/planning/autotune.py): a wrong cost model is corrected
by timing, the cache survives the process and ignores what it cannot trust,
TFBIGCONV_AUTOTUNE=0 turns timing off, and explain() says which choices were
measured.

The rest of the suite runs with autotuning off (conftest.py); the tests here
turn it on with the `autotuning` fixture, each with its own cache file."""
import contextlib
import json
import logging
import math
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from tfbigconv.arguments import Algorithm
from tfbigconv.planning import autotune, candidates, planner, timing
from tfbigconv.planning.plan import Estimate, Plan
from conftest import TOLERANCE, random_case
from reference import (conv2d_reference, conv2d_reference_backprop_filter,
                       conv2d_reference_backprop_input, rel_l2)

PASSES = planner.PASSES
ATTRS = dict(strides=[1, 1, 1, 1], padding="SAME", explicit_paddings=[], data_format="NHWC",
             dilations=[1, 1, 1, 1])
# TF's Conv2D on one input channel and a 31x31 filter is far slower than
# direct and fft on the CPU (measured 19 ms against 0.4 ms on the development
# machine; 1.1 ms against 0.46 ms on an AVX-512 host where TF runs oneDNN),
# while the shipped model puts all three within 1.5x: every pass of it is timed.
WIDE = ((1, 64, 64, 1), (31, 31, 1, 2))
# Grouped (not depthwise): TF's grouped Conv2D is untrusted on the CPU; its
# forward pass measured 6 ms against 0.4 ms for direct.
GROUPED = ((2, 32, 32, 16), (9, 9, 2, 16))
# A dense 5x5 layer: TF's Conv2D and ours are within reach of each other in
# every pass, so every pass times TF's kernel against ours.
DENSE = ((4, 16, 16, 8), (5, 5, 8, 8))
# A 3x3 layer: TF's Conv2D is estimated 10x faster than ours: nothing to time.
SMALL = ((4, 28, 28, 8), (3, 3, 8, 8))


def rows(e, pass_):
    return {r.algorithm: r for r in e.rows if r.pass_ == pass_}


def internal(name):
    """explain()'s row name -> the planner's candidate name."""
    return "tf" if name.startswith("tf") else name


def forbid_timing(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("autotune.measure called")
    monkeypatch.setattr(autotune, "measure", fail)


def graph_of(fn, *args):
    return tf.function(fn).get_concrete_function(*args).graph


def cpu_bigconv2d(*args, **kwargs):
    """explain()'s default device, also where a GPU is visible."""
    with tf.device("/CPU:0"):
        return tfbigconv.bigconv2d(*args, **kwargs)


def big_ops(graph, op_type="BigConv2D"):
    return [op for op in graph.get_operations() if op.type == op_type]


def make_tf_look_best(model, x_shape, w_shape, pass_="forward"):
    """Scales the model's TF Conv2D rate for `pass_` so that its estimate is
    half the best of ours: wrong (it is really >10x slower on WIDE), but
    close enough that autotuning times it."""
    e = tfbigconv.explain(x_shape, w_shape, padding="SAME")
    r = rows(e, pass_)
    ours = min(r["direct"].seconds, r["fft"].seconds)
    model(f"im2col_flops_per_second.{pass_}", r["tf.Conv2D"].seconds / (0.5 * ours))
    e = tfbigconv.explain(x_shape, w_shape, padding="SAME")
    assert e.chosen[pass_] == "tf.Conv2D" and e.how[pass_] == "estimated"
    assert autotune.NEAR_FACTOR > 2


def test_wide_case_has_candidates_to_time_in_every_pass():
    """What the tests below assume of the shipped model (if a recalibration
    changes it, pick another WIDE case)."""
    for p in PASSES:
        plan = planner.plan(p, WIDE[0], WIDE[1], ATTRS, "float32", "auto", 0, "CPU")
        assert len(autotune.candidates_to_time(plan)) >= 2, (p, plan.reason)
    plan = planner.plan("backprop_filter", WIDE[0], WIDE[1], ATTRS, "float32", "auto", 0, "CPU")
    assert "tf" not in autotune.candidates_to_time(plan), plan.reason


# ---- (a) a wrong cost model ends with the measured fastest -----------------

def test_wrong_estimate_is_corrected_by_timing(model, autotuning, monkeypatch):
    make_tf_look_best(model, *WIDE)
    x, w = random_case(WIDE[0], 0), random_case(WIDE[1], 1)
    conv_fn = lambda x: cpu_bigconv2d(x, w, 1, "SAME")  # noqa: E731

    monkeypatch.setenv("TFBIGCONV_AUTOTUNE", "0")  # the estimate alone: TF's Conv2D
    types = {op.type for op in graph_of(conv_fn, x).get_operations()}
    assert "Conv2D" in types and "BigConv2D" not in types

    monkeypatch.setenv("TFBIGCONV_AUTOTUNE", "1")
    e = tfbigconv.explain(*WIDE, padding="SAME", autotune=True)
    assert e.how["forward"] == "measured"
    fwd = rows(e, "forward")
    measured = {n: r.measured_seconds for n, r in fwd.items()}
    assert all(s is not None and s > 0 for s in measured.values()), measured
    # The fastest, but for a near tie (autotune.PREFERENCE: direct over fft).
    candidate = {"tf.Conv2D": "tf", "direct": "direct", "fft": "fft"}
    winner = autotune.fastest({candidate[n]: t for n, t in measured.items()})
    assert candidate.get(e.chosen["forward"]) == winner, measured
    assert e.chosen["forward"] in ("direct", "fft"), measured
    assert measured["tf.Conv2D"] > autotune.TF_MARGIN * measured[e.chosen["forward"]], measured
    verdict = ("measured fastest" if e.chosen["forward"] == min(measured, key=measured.get)
               else "kept: ")
    assert verdict in e.reasons["forward"], e.reasons["forward"]

    # bigconv2d makes the same choice, from the cache: nothing is timed again.
    forbid_timing(monkeypatch)
    ops = big_ops(graph_of(conv_fn, x))
    assert len(ops) == 1
    assert ops[0].get_attr("planned_algorithm").decode() == e.chosen["forward"]
    got = cpu_bigconv2d(x, w, 1, "SAME").numpy()
    assert rel_l2(got, conv2d_reference(x, w, (1, 1), "SAME")) < 1e-4


def test_untrusted_tf_kernel_made_free_by_the_model_is_timed_and_the_fastest_wins(
        model, autotuning):
    """A profile that makes (grouped) Conv2D look free: without timing auto
    does not trust it; with timing it is measured, and the fastest wins (which
    one that is depends on the host: oneDNN's grouped Conv2D can beat ours)."""
    model("im2col_flops_per_second", 1e6)
    e = tfbigconv.explain(*GROUPED, padding="SAME")
    tf_row = rows(e, "forward")["tf.Conv2D"]
    assert tf_row.available and "measured fastest" in tf_row.note
    assert tf_row.seconds < 1e-6 and e.chosen["forward"] in ("direct", "fft")

    e = tfbigconv.explain(*GROUPED, padding="SAME", autotune=True)
    measured = {n: r.measured_seconds for n, r in rows(e, "forward").items()}
    assert measured["tf.Conv2D"] is not None, "the untrusted candidate must be timed"
    assert e.how["forward"] == "measured"
    assert e.chosen["forward"] == min((n for n in measured if measured[n] is not None),
                                      key=measured.get), measured


def train_step(x_shape, w_shape):
    """(step, x, w): bigconv2d's forward and both gradients on the CPU under
    tf.function, on random float64 data; step(x, w) returns [y, dx, dw] and
    checks them against the float64 reference."""
    x, w = random_case(x_shape, 2, np.float64), random_case(w_shape, 3, np.float64)
    dy = random_case(candidates.output_shape(x_shape, w_shape, ATTRS), 4, np.float64)

    @tf.function
    def step(x, w):
        with tf.device("/CPU:0"), tf.GradientTape() as t:
            t.watch([x, w])
            y = tfbigconv.bigconv2d(x, w, 1, "SAME")
        return [y] + t.gradient(y, [x, w], output_gradients=tf.constant(dy))

    def checked(xt, wt):
        y, dx, dw = step(xt, wt)
        args = ((1, 1), "SAME")
        assert rel_l2(y.numpy(), conv2d_reference(x, w, *args)) < 1e-10
        assert rel_l2(dx.numpy(), conv2d_reference_backprop_input(dy, w, x_shape, *args)) < 1e-10
        assert rel_l2(dw.numpy(), conv2d_reference_backprop_filter(x, dy, w_shape, *args)) < 1e-10
        return step.get_concrete_function(xt, wt).graph

    return checked, tf.constant(x), tf.constant(w)


def test_measured_choice_reaches_every_pass_of_the_graph(autotuning, monkeypatch):
    """With timings that contradict the estimates (here: fft fastest in every
    pass), bigconv2d's forward op and both gradient ops run what was measured
    fastest, and the results are right."""
    calls = []

    def fake_measure(pass_, names, input_shape, filter_shape, attrs, dtype, device, order=None,
                     **kwargs):
        calls.append((pass_, tuple(sorted(names)), tuple(input_shape)))
        return {n: (1e-4 if n == "fft" else 1.0) for n in names}

    monkeypatch.setattr(autotune, "measure", fake_measure)
    x_shape, w_shape = GROUPED
    step, x, w = train_step(x_shape, w_shape)
    graph = step(x, w)  # results checked against float64
    assert sorted(c[0] for c in calls) == sorted(PASSES)
    assert all("fft" in c[1] and len(c[1]) >= 2 and c[2] == x_shape for c in calls)
    for op_type in ("BigConv2D", "BigConv2DBackpropInput", "BigConv2DBackpropFilter"):
        ops = big_ops(graph, op_type)
        assert len(ops) == 1 and ops[0].get_attr("planned_algorithm") == b"fft", op_type
    # Remembered: tracing again times nothing.
    calls.clear()
    tf.function(lambda x: cpu_bigconv2d(x, w, 1, "SAME")).get_concrete_function(x)
    assert calls == []


def test_timing_runs_on_a_reduced_batch_and_scales(autotuning, monkeypatch):
    seen = []
    real = candidates.run_pass

    def spy(pass_, chosen, x, w, dy, a, device=None):
        seen.append((pass_, chosen, int(x.shape[0]), int(dy.shape[0])))
        return real(pass_, chosen, x, w, dy, a, device)

    monkeypatch.setattr(candidates, "run_pass", spy)
    x_shape = (32,) + WIDE[0][1:]
    seconds = autotune.measure("backprop_filter", ["direct", "fft"], x_shape, WIDE[1], ATTRS,
                               "float32", "CPU")
    assert set(seconds) == {"direct", "fft"} and all(s > 0 for s in seconds.values())
    assert {s[1] for s in seen} == {"direct", "fft"}
    assert all(s[2] == s[3] == timing.TIMING_BATCH for s in seen)
    # each candidate is traced once and its graph timed, as it runs under tf.function
    assert sorted(s[1] for s in seen) == ["direct", "fft"]
    seen.clear()
    autotune.measure("forward", ["direct", "fft"], x_shape, WIDE[1], ATTRS, "float32", "CPU",
                     batch=7)
    assert seen and all(s[2] == 7 for s in seen)


class FakeClock:
    """time.perf_counter for autotune.measure: each candidate's call takes its
    given seconds, whatever the machine does (a pair: the first call, then
    every later one)."""

    def __init__(self, seconds):
        self.now, self.seconds, self.calls = 0.0, seconds, []

    def perf_counter(self):
        return self.now

    def run_pass(self, pass_, chosen, x, w, dy, a, device=None):
        first, later = (self.seconds[chosen] if isinstance(self.seconds[chosen], tuple)
                        else (self.seconds[chosen],) * 2)
        self.now += later if chosen in self.calls else first
        self.calls.append(chosen)
        return tf.zeros([1])


def fake_clock(monkeypatch, seconds):
    """A FakeClock(seconds) that autotune times candidates on, each candidate's
    call run by it instead of a traced graph."""
    clock = FakeClock(seconds)
    autotune.clear_memory()  # no graphs traced for an earlier clock
    monkeypatch.setattr(autotune.time, "perf_counter", clock.perf_counter)
    monkeypatch.setattr(timing, "_pass_fn",
                        lambda pass_, name, *args: lambda: clock.run_pass(pass_, name, *args))
    return clock


def fake_measure(monkeypatch, seconds, names, order=None, budget_s=None):
    clock = fake_clock(monkeypatch, seconds)
    result = autotune.measure("forward", names, SMALL[0], SMALL[1], ATTRS, "float32", "CPU",
                              order=order, batch=SMALL[0][0], budget_s=budget_s)
    return clock.calls, result


def test_timing_stops_at_its_budget(monkeypatch):
    """The issue-40 reproducer's shape: a candidate estimated fast that takes far
    longer. No call starts once the budget is spent; what was never called counts
    as infinitely slow, and the rest decide."""
    calls, seconds = fake_measure(monkeypatch, {"direct": 0.05, "tf": 2.0, "fft": 0.06},
                                  ["direct", "tf", "fft"], budget_s=0.5)
    assert calls == ["direct", "tf"]  # tf's warm-up spent the budget: fft never runs
    assert seconds["fft"] == float("inf") and autotune.fastest(seconds) == "direct"
    # Within the budget, rounds stop when it is spent.
    calls, _ = fake_measure(monkeypatch, {"direct": 0.1, "fft": 0.1}, ["direct", "fft"],
                            budget_s=0.35)
    assert len(calls) == 4
    # No budget: as before.
    calls, _ = fake_measure(monkeypatch, {"direct": 0.1, "fft": 0.1}, ["direct", "fft"])
    assert len(calls) == 2 * (1 + timing.MIN_ROUNDS)


def test_budget_default_and_override(monkeypatch):
    monkeypatch.delenv(autotune.ENV_BUDGET, raising=False)
    assert autotune.budget_seconds(0.001, 3) == autotune.MIN_BUDGET_S
    assert autotune.budget_seconds(1.0, 3) == pytest.approx(autotune.BUDGET_FACTOR * 3.0)
    monkeypatch.setenv(autotune.ENV_BUDGET, "2.5")
    assert autotune.budget_seconds(1.0, 3) == 2.5
    monkeypatch.setenv(autotune.ENV_BUDGET, "soon")
    with pytest.warns(UserWarning, match=autotune.ENV_BUDGET):
        assert autotune.budget_seconds(1.0, 3) == pytest.approx(autotune.BUDGET_FACTOR * 3.0)


def test_refine_keeps_to_the_budget_and_caches_what_was_not_timed(autotuning, monkeypatch):
    """refine(): once the budget is spent no further timing (re-timing, confirmation,
    widening) starts, and the cache entry covers the candidates never called, so
    the next trace does not time them again."""
    monkeypatch.setenv(autotune.ENV_BUDGET, "0.2")
    clock = fake_clock(monkeypatch, {"tf": 0.5, "direct": 0.01, "fft": 0.01})
    x, f = WIDE
    p = planner.plan("forward", x, f, ATTRS, "float32", "auto", 0, "CPU")
    names = autotune.candidates_to_time(p)
    assert len(names) >= 2
    # TF's kernel is called first (its estimate made lowest) and spends the budget.
    for n in names:
        p = p.with_estimate(n, seconds=2e-4 if n == "tf" else 1e-3)
    p = autotune.refine(p, x, f, ATTRS, "float32", "CPU", 0, enabled=True)
    assert clock.calls == ["tf"]
    assert p.chosen == "tf" and "not timed (budget spent)" in p.reason
    clock.calls.clear()
    autotune.clear_memory()
    q = planner.plan("forward", x, f, ATTRS, "float32", "auto", 0, "CPU")
    for n in names:
        q = q.with_estimate(n, seconds=2e-4 if n == "tf" else 1e-3)
    q = autotune.refine(q, x, f, ATTRS, "float32", "CPU", 0, enabled=True)
    assert clock.calls == [] and q.chosen == "tf"  # from the cache file


def test_an_untrusted_tf_kernel_is_timed_after_ours(autotuning, monkeypatch):
    """TF's kernel where its estimate is not trusted runs after our candidates,
    however low its estimate: a slow call of it that spends the budget must not
    leave ours untimed and win by default (TF's float16 NCHW input gradient
    took 1.4 s, against 3 ms of ours)."""
    monkeypatch.setenv(autotune.ENV_BUDGET, "0.2")
    clock = fake_clock(monkeypatch, {"tf": 0.5, "direct": 0.01, "fft": 0.01})
    x, f = WIDE
    p = planner.plan("forward", x, f, ATTRS, "float32", "auto", 0, "CPU")
    p = p.replace(tf_for_auto="measured")
    for n in ("tf", "direct", "fft"):
        p = p.with_estimate(n, seconds=1e-4 if n == "tf" else 1e-3)
    names = autotune.candidates_to_time(p)
    assert "tf" in names and len(names) >= 2
    p = autotune.refine(p, x, f, ATTRS, "float32", "CPU", 0, enabled=True)
    assert clock.calls[0] != "tf" and p.chosen != "tf"
    assert math.isfinite(p.measured[p.chosen])


@pytest.mark.parametrize("trusted", [True, False])
def test_a_candidate_estimated_hopeless_factor_x_the_best_is_never_timed(trusted):
    hopeless = timing.HOPELESS_FACTOR
    p = planned(hopeless * 0.001, 0.001, 0.0015, trusted=trusted)
    # Not even when the measured best (5 s) would widen to it.
    assert "tf" not in autotune.candidates_to_time(p) + autotune.widened(p, {"direct": 5.0})
    assert autotune.candidates_to_time(p) == ["direct", "fft"]
    p = p.with_estimate("tf", seconds=hopeless * 0.001 * 0.99)  # a check across models
    assert "tf" in autotune.candidates_to_time(p)
    # Ours too: fft at 10x tf's estimate is left out, direct and tf meet.
    assert autotune.candidates_to_time(planned(0.001, 0.0029, hopeless * 0.001)) == [
        "tf", "direct"]
    assert autotune.widened(planned(0.001, 0.002, hopeless * 0.001), {"tf": 1.0, "direct": 1.0}) == []


def test_the_issue_59_first_step_does_not_time_tf_filter_gradient():
    """Issue 59's first step: TF's bfloat16 filter gradient of BigConv2D(8, 31)
    on 8 96x96x3 images took 9 s a call to time, for fft's 0.07 s. With its
    estimate over HOPELESS_FACTOR x fft's it is not timed."""
    p = planned(0.0025 * timing.HOPELESS_FACTOR, 0.0211, 0.0025, pass_="backprop_filter")
    assert "tf" not in autotune.candidates_to_time(p)


def test_a_candidate_that_runs_hopeless_factor_x_the_quickest_is_called_once(monkeypatch):
    """Its warm-up call is its time: neither the second call nor the rounds a
    cheap candidate gets (a call of HOPELESS_ABOVE_S or more)."""
    quick = timing.HOPELESS_ABOVE_S / 2
    slow = timing.HOPELESS_FACTOR * quick * 1.01
    assert slow < timing.REPEAT_BELOW_S  # repeated, but for the rule under test
    calls, seconds = fake_measure(monkeypatch, {"direct": quick, "fft": quick * 1.1, "tf": slow},
                                  ["direct", "tf", "fft"])
    assert calls.count("tf") == 1 and calls.count("direct") > 1
    assert seconds["tf"] == pytest.approx(slow)
    # Under HOPELESS_FACTOR: a second call (ABANDON_FACTOR's one-time costs).
    below = timing.HOPELESS_FACTOR * quick * 0.99
    calls, _ = fake_measure(monkeypatch, {"direct": quick, "fft": quick * 1.1, "tf": below},
                            ["direct", "tf", "fft"])
    assert calls.count("tf") == 2
    # A short call is not judged hopeless: it may be one-time costs.
    tiny = timing.HOPELESS_ABOVE_S / (2 * timing.HOPELESS_FACTOR)
    calls, _ = fake_measure(monkeypatch, {"direct": tiny, "tf": (tiny * 11, tiny)},
                            ["direct", "tf"])
    assert calls.count("tf") > 1


def test_an_untrusted_candidate_whose_probe_is_hopeless_is_not_run_on_the_batch(monkeypatch):
    """A probed candidate (one image first) whose probe, scaled to the batch, is
    HOPELESS_FACTOR x the quickest: the probe is its time, with budget to spare."""
    clock = fake_clock(monkeypatch, {"direct": 0.004, "tf": 0.03})  # s per call
    x_shape = (4,) + SMALL[0][1:]
    got = autotune.measure("forward", ["direct", "tf"], x_shape, SMALL[1], ATTRS, "float32",
                           "CPU", batch=4, budget_s=100.0, probe={"tf"})
    # tf's one-image call scales to 0.12 s for 4: 30x direct's 0.004 s.
    assert clock.calls.count("tf") == 1
    assert got["tf"] == pytest.approx(0.12) and got["direct"] == pytest.approx(0.004)


def test_timing_interleaves_candidates_after_their_warm_ups(monkeypatch):
    names = ["direct", "fft", "tf"]
    calls, seconds = fake_measure(monkeypatch, {"direct": 0.001, "fft": 0.0012, "tf": 0.0011},
                                  names)
    assert calls[:3] == names  # the warm-ups, in the order given
    rounds = [calls[i:i + 3] for i in range(3, len(calls), 3)]
    assert all(sorted(r) == sorted(names) for r in rounds)  # one call of each per round
    assert rounds[0] != rounds[1]  # the order rotates
    # cheap rounds of near ties go on to MAX_ROUNDS
    assert len(rounds) == timing.MAX_ROUNDS
    assert seconds == pytest.approx({"direct": 0.001, "fft": 0.0012, "tf": 0.0011})


def test_rounds_past_the_minimum_time_only_near_ties(monkeypatch):
    # After MIN_ROUNDS, fft (1.5x direct) is out: CLEAR_FACTOR; direct and tf
    # (1.1x) go on. With tf at 1.4x too, the rounds stop there.
    assert timing.CLEAR_FACTOR < 1.4 < 1.5 < timing.EARLY_CLEAR_FACTOR
    calls, seconds = fake_measure(monkeypatch, {"direct": 0.001, "fft": 0.0015, "tf": 0.0011},
                                  ["direct", "fft", "tf"])
    assert calls.count("fft") == 1 + timing.MIN_ROUNDS
    assert calls.count("direct") == calls.count("tf") == 1 + timing.MAX_ROUNDS
    assert seconds == pytest.approx({"direct": 0.001, "fft": 0.0015, "tf": 0.0011})
    calls, _ = fake_measure(monkeypatch, {"direct": 0.001, "fft": 0.0015, "tf": 0.0014},
                            ["direct", "fft", "tf"])
    assert len(calls) == 3 * (1 + timing.MIN_ROUNDS)


def test_after_one_round_only_what_is_clearly_behind_is_out(monkeypatch):
    # fft at 2x direct (over EARLY_CLEAR_FACTOR) is out after the first round,
    # tf at 1.5x is not; past MIN_ROUNDS tf is out too (CLEAR_FACTOR).
    calls, seconds = fake_measure(monkeypatch, {"direct": 0.001, "fft": 0.002, "tf": 0.0015},
                                  ["direct", "fft", "tf"])
    assert calls.count("fft") == 2  # its warm-up and the first round
    assert calls.count("tf") == calls.count("direct") == 1 + timing.MIN_ROUNDS
    assert seconds == pytest.approx({"direct": 0.001, "fft": 0.002, "tf": 0.0015})
    # and when one candidate is left, no more rounds
    calls, _ = fake_measure(monkeypatch, {"direct": 0.001, "fft": 0.002}, ["direct", "fft"])
    assert calls == ["direct", "fft", "direct", "fft"]


def test_timing_rounds_stop_when_dear_and_skip_slow_candidates(monkeypatch):
    # fft's calls take ABANDON_FACTOR x direct's: after its warm-up and one more
    # call (the warm-up was cheap) it is not repeated; rounds of direct + tf cost
    # over EXTRA_ROUNDS_BELOW_S, so MIN_ROUNDS of them.
    slow = timing.ABANDON_FACTOR * 0.06
    calls, seconds = fake_measure(monkeypatch, {"direct": 0.06, "fft": slow, "tf": 0.07},
                                  ["direct", "fft", "tf"])
    assert calls.count("fft") == 2
    assert calls.count("direct") == calls.count("tf") == 1 + timing.MIN_ROUNDS
    # a warm-up over REPEAT_BELOW_S is never repeated either
    calls, _ = fake_measure(monkeypatch, {"direct": timing.REPEAT_BELOW_S, "fft": 0.3},
                            ["direct", "fft"])
    assert calls == ["direct", "fft"]


def test_a_round_drops_what_it_shows_to_be_abandon_factor_slower(monkeypatch):
    # Measured (16x64x64 8->8 K=21 forward): warm-ups carry one-time costs (fft
    # 13 ms then 5, direct 24 then 11, tf 29 then 18), so all three looked
    # within ABANDON_FACTOR and started the rounds; the first round showed tf at
    # 3.6x fft and direct at 2.2x (EARLY_CLEAR_FACTOR): neither is called
    # again, and fft, left alone, is not either.
    calls, seconds = fake_measure(
        monkeypatch, {"fft": (0.013, 0.005), "direct": (0.024, 0.011), "tf": (0.029, 0.018)},
        ["fft", "direct", "tf"])
    assert calls[:3] == ["fft", "direct", "tf"]
    assert calls.count("tf") == calls.count("fft") == calls.count("direct") == 2
    assert seconds == pytest.approx({"fft": 0.005, "direct": 0.011, "tf": 0.018})


def test_a_slow_first_call_alone_does_not_abandon_a_candidate(monkeypatch):
    # TF's first run carries its kernel setup (5x its later calls): judged
    # on the warm-up alone it would be abandoned at 4x direct and lose; its
    # second call shows it is the faster, and it joins the rounds.
    calls, seconds = fake_measure(monkeypatch, {"direct": 0.010, "tf": (0.040, 0.008)},
                                  ["direct", "tf"])
    assert calls[:3] == ["direct", "tf", "tf"]
    assert calls.count("tf") > 2
    assert seconds == pytest.approx({"direct": 0.010, "tf": 0.008})
    assert autotune.fastest(seconds) == "tf"


def test_a_second_call_that_lowers_the_quickest_does_not_abandon_the_others(monkeypatch):
    # A process's first calls (measured, WIDE forward with oneDNN: TF 14 ms then
    # 1.2 ms; direct 5.5 then 0.6; fft 3.8 then 0.5): TF's second call made the
    # quickest 1.2 ms, and direct and fft, judged on their warm-ups alone, were
    # abandoned; TF won at twice their time.
    calls, seconds = fake_measure(
        monkeypatch, {"tf": (0.014, 0.0012), "direct": (0.0055, 0.0006),
                      "fft": (0.0038, 0.0005)}, ["tf", "direct", "fft"])
    assert calls[:4] == ["tf", "direct", "fft", "tf"]
    assert calls.count("direct") > 2 and calls.count("fft") > 2
    assert seconds == pytest.approx({"tf": 0.0012, "direct": 0.0006, "fft": 0.0005})
    assert autotune.fastest(seconds) == "fft"


def test_tf_kernel_is_kept_unless_ours_is_clearly_faster():
    m = autotune.TF_MARGIN
    assert autotune.fastest({"tf": 1.0, "direct": 1.0 / (0.99 * m), "fft": 3.0}) == "tf"
    assert autotune.fastest({"tf": 1.0, "direct": 1.0 / (1.01 * m), "fft": 3.0}) == "direct"
    assert autotune.fastest({"tf": 1.0, "direct": 2.0, "fft": 0.5}) == "fft"
    # No TF kernel: direct wins a near tie with fft, which rounds every output.
    assert autotune.fastest({"direct": 1.0, "fft": 1.0 / (0.99 * m)}) == "direct"
    assert autotune.fastest({"direct": 1.0, "fft": 1.0 / (1.01 * m)}) == "fft"
    assert autotune.fastest({"tf": 1.05, "direct": 1.0, "fft": 0.99}) == "tf"


def test_a_narrow_win_over_tf_is_timed_again_and_must_hold():
    again = []

    def timed(results):
        def f(names):
            again.append(sorted(names))
            return results.pop(0)
        return f

    m = autotune.TF_MARGIN
    # Direct beat TF by 1.3x once, then not: TF's kernel stays.
    first = {"tf": 1.3, "direct": 1.0, "fft": 5.0}
    got = autotune.confirmed(dict(first), timed([{"tf": 1.0, "direct": 1.05}]))
    assert again == [["direct", "tf"]] and autotune.fastest(got) == "tf"
    assert got == {"tf": 1.0, "direct": 1.05, "fft": 5.0}
    # It holds a second time: direct, with the second timing's numbers.
    again.clear()
    got = autotune.confirmed(dict(first), timed([{"tf": 1.2 * m, "direct": 1.0}]))
    assert again == [["direct", "tf"]] and autotune.fastest(got) == "direct"
    # A win by CONFIRM_BELOW x or more, a TF win, or no TF kernel: no second timing.
    again.clear()
    wide = {"tf": autotune.CONFIRM_BELOW, "direct": 1.0}
    assert autotune.confirmed(dict(wide), timed([])) == wide
    assert autotune.confirmed({"tf": 1.0, "direct": 1.0}, timed([])) == {"tf": 1.0, "direct": 1.0}
    assert autotune.confirmed({"direct": 1.0, "fft": 0.5}, timed([])) == {"direct": 1.0, "fft": 0.5}
    assert again == []
    # When the first winner falls, the next of ours that beat TF must hold too.
    got = autotune.confirmed({"tf": 1.5, "direct": 1.0, "fft": 1.2},
                             timed([{"tf": 1.5, "direct": 1.6}, {"tf": 1.5, "fft": 1.45}]))
    assert again == [["direct", "tf"], ["fft", "tf"]] and autotune.fastest(got) == "tf"


def test_pairs_to_time():
    """The gradient passes are timed together when their choices are a pair
    other than TF's two kernels, each measured against TF's, winning by under
    CONFIRM_BELOW x in sum, and TF's kernel may run for auto in both."""
    def plan(chosen, measured, tf_for_auto="trusted", tf_available=True):
        return planned(1, 1, 1, tf_ok=tf_available, tf_for_auto=tf_for_auto, chosen=chosen,
                       measured=measured)
    c = autotune.CONFIRM_BELOW
    assert autotune.pairs_to_time(plan("direct", {"tf": 1.3, "direct": 1.0}),
                                  plan("tf", {"tf": 1.0, "fft": 2.0})) == ["tf+tf", "direct+tf"]
    assert autotune.pairs_to_time(plan("fft", {"tf": 1.0, "fft": 0.8}),
                                  plan("direct", {"tf": 1.0, "direct": 0.9})) == ["tf+tf", "fft+direct"]
    # TF's pair, a pass not measured against TF, or a wide win: nothing.
    assert autotune.pairs_to_time(plan("tf", {"tf": 1.0, "direct": 1.2}),
                                  plan("tf", {"tf": 1.0, "fft": 2.0})) == []
    assert autotune.pairs_to_time(plan("direct", {"direct": 1.0, "fft": 2.0}),
                                  plan("tf", {"tf": 1.0, "fft": 2.0})) == []
    assert autotune.pairs_to_time(plan("direct", None), plan("tf", {"tf": 1.0})) == []
    assert autotune.pairs_to_time(plan("direct", {"tf": c * 2.0 - 1.0, "direct": 1.0}),
                                  plan("tf", {"tf": 1.0})) == []
    # TF's kernel out for a pass (a cache from before may still hold its time).
    for out in (dict(tf_available=False), dict(tf_for_auto="never")):
        assert autotune.pairs_to_time(plan("direct", {"tf": 1.3, "direct": 1.0}),
                                      plan("fft", {"tf": 1.0, "fft": 0.9}, **out)) == []


@pytest.mark.parametrize("forward", ["direct", "tf"])
@pytest.mark.parametrize("together, want_bpi", [((2.0, 2.1), "tf"), ((2.3, 2.0), "direct")])
def test_gradient_pair_must_win_timed_together(autotuning, monkeypatch, forward, together, want_bpi):
    """Pass by pass, direct beats TF's dL/dinput kernel by 1.3x. Timed together
    with dL/dfilter (TF's kernel in both pairs), the pair must still be
    TF_MARGIN x faster than TF's two kernels, else both gradients are TF's.
    Both the forward op's gradient and TF's forward (routed) decide alike, the
    results are right, and the decision is cached."""
    tf_pair, mixed = together
    times = {"forward": {forward: 0.1},
             "backprop_input": {"tf": 1.3, "direct": 1.0},
             "backprop_filter": {"tf": 1.0},
             "gradients": {"tf+tf": tf_pair, "direct+tf": mixed}}
    calls = []

    def fake_measure(pass_, names, *args, **kwargs):
        calls.append((pass_, sorted(names)))
        return {n: times[pass_].get(n, 5.0) for n in names}

    monkeypatch.setattr(autotune, "measure", fake_measure)
    step, x, w = train_step(*DENSE)
    graph = step(x, w)  # results checked against float64
    assert ("gradients", ["direct+tf", "tf+tf"]) in calls
    assert len(big_ops(graph, "BigConv2D")) == (forward != "tf")
    bpi_ops = big_ops(graph, "BigConv2DBackpropInput")
    if want_bpi == "direct":
        assert len(bpi_ops) == 1 and bpi_ops[0].get_attr("planned_algorithm") == b"direct"
    else:
        assert bpi_ops == [] and big_ops(graph, "Conv2DBackpropInput")
    assert big_ops(graph, "BigConv2DBackpropFilter") == []
    # Cached, in the file too: explain() shows the pair's decision, and times nothing.
    keys = json.loads(autotuning.read_text())["entries"]
    assert sum(json.loads(k)[0] == "gradients" for k in keys) == 1
    autotune.clear_memory()
    forbid_timing(monkeypatch)
    e = tfbigconv.explain(*DENSE, padding="SAME", dtype="float64")
    assert internal(e.chosen["backprop_input"]) == want_bpi
    assert internal(e.chosen["backprop_filter"]) == "tf"
    assert "timed together" in e.reasons["backprop_input"]


def test_gradient_pairs_are_timed_as_one_graph_of_both_passes(monkeypatch):
    """measure() on GRADIENTS runs each pair's two passes in one graph."""
    traced = []
    real = candidates.run_pass
    monkeypatch.setattr(candidates, "run_pass", lambda pass_, name, *a: traced.append((pass_, name))
                        or real(pass_, name, *a))
    x_shape, w_shape = DENSE
    got = autotune.measure(timing.GRADIENTS, ["tf+tf", "direct+fft"], x_shape, w_shape, ATTRS,
                           "float32", "CPU")
    assert sorted(got) == ["direct+fft", "tf+tf"]
    assert all(np.isfinite(t) and t > 0 for t in got.values())
    assert sorted(traced) == [("backprop_filter", "fft"), ("backprop_filter", "tf"),
                              ("backprop_input", "direct"), ("backprop_input", "tf")]


def test_cache_entries_of_gradient_pairs_are_checked(tmp_path):
    assert autotune._valid_name("tf+tf") and autotune._valid_name("fft")
    for bad in ("direct+tf+fft", "winograd+tf", "", "+tf", 3):
        assert not autotune._valid_name(bad), bad
    v = autotune._version()
    entries = {"good": {"chosen": "tf+tf", "seconds": {"tf+tf": 1.0, "direct+tf": 1.2}, "version": v},
               "bad name": {"chosen": "tf", "seconds": {"tf": 1.0, "im2col+tf": 1.2}, "version": v},
               "chosen not timed": {"chosen": "fft+tf", "seconds": {"tf+tf": 1.0}, "version": v}}
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"format": autotune.FORMAT, "entries": entries}))
    with pytest.warns(UserWarning, match="ignoring 2 stale or invalid entries"):
        assert list(autotune._load(str(path))) == ["good"]


def test_kept_tf_kernel_says_so(monkeypatch):
    p = planned(1, 1, 2, chosen="direct")
    p = autotune._apply(p, {"seconds": {"tf": 1.0, "direct": 0.95}})
    assert p.chosen == "tf"
    assert p.reason.startswith(f"auto: tf kept: direct measured less than {autotune.TF_MARGIN:g}x faster")


def test_timing_batch_is_bounded():
    t, floor = timing.TIMING_BATCH, timing.MIN_TIMED_S
    assert autotune.timing_batch(1, 1e-6) == 1 and autotune.timing_batch(0, 1.0) == 1
    assert autotune.timing_batch(t, 1e-9) == t
    assert autotune.timing_batch(64, 100.0) == t          # slow: the fewest images
    assert autotune.timing_batch(64, floor / 1000) == 64  # fast: the whole batch
    # In between: enough images for MIN_TIMED_S by the estimate, no more.
    n = autotune.timing_batch(64, floor * 4)
    assert t <= n < 64 and n * floor * 4 / 64 >= floor > (n - 1) * floor * 4 / 64


def planned(tf_s, direct_s, fft_s, trusted=True, tf_ok=True, tf_for_auto=None, chosen="tf",
            measured=None, pass_="forward"):
    """A planned pass as autotune sees it: estimated seconds per candidate."""
    e = lambda s, ok=True: Estimate(ok, True, s, 0, 0, "")  # noqa: E731
    return Plan(pass_, "CPU", 0, "tf.Conv2D", e(tf_s, tf_ok), e(direct_s), e(fft_s),
                Algorithm(chosen), "estimates", {},
                tf_for_auto or ("trusted" if trusted else "measured"), measured)


def test_candidates_to_time():
    p = planned
    near, cross = autotune.NEAR_FACTOR, timing.HOPELESS_FACTOR
    assert autotune.candidates_to_time(p(1, 1.5, 100)) == ["tf", "direct"]
    # TF's kernel against our fastest: timed across models under HOPELESS_FACTOR apart.
    assert autotune.candidates_to_time(p(1, near * 1.01, near * 2)) == ["tf", "direct"]
    assert autotune.candidates_to_time(p(1, cross * 0.99, cross * 2)) == ["tf", "direct"]
    assert autotune.candidates_to_time(p(1, cross * 1.01, cross * 2)) == []  # far apart
    assert autotune.candidates_to_time(p(cross * 2, 1, near * 2)) == []  # one left
    # A TF kernel excluded for precision is never timed.
    never = p(1, 1.5, 100, tf_for_auto="never")
    assert autotune.candidates_to_time(never) == []
    assert autotune.candidates_to_time(p(1, 2, 2.5, tf_ok=False)) == ["direct", "fft"]
    # An untrusted TF estimate is timed however low it is, and under HOPELESS_FACTOR x
    # our best; it is not the yardstick.
    assert autotune.candidates_to_time(p(1e-9, 1, 100, trusted=False)) == ["tf", "direct"]
    assert autotune.candidates_to_time(p(cross * 0.99, 1, 1.2, trusted=False)) == [
        "tf", "direct", "fft"]
    assert autotune.candidates_to_time(p(cross * 1.01, 1, 1.2, trusted=False)) == [
        "direct", "fft"]


def test_candidates_left_out_are_timed_when_the_best_was_underestimated():
    near = autotune.NEAR_FACTOR
    p = planned(1, near * 1.01, near * 1.005)  # direct left out: tf and fft timed
    assert autotune.candidates_to_time(p) == ["tf", "fft"]
    assert autotune.widened(p, {"tf": 1.0, "fft": 2.9}) == []  # the estimates held
    assert autotune.widened(p, {"tf": 6.0, "fft": 6.1}) == ["direct"]
    # Not a TF kernel excluded for precision, nor one that does not fit.
    never = planned(near * 2, 1, near * 1.5, tf_for_auto="never")
    assert autotune.widened(never, {"direct": 5.0, "fft": 6.0}) == []
    big = planned(1, near * 1.01, near * 1.005)
    big = big.with_estimate("direct", fits=False)
    assert autotune.widened(big, {"tf": 6.0, "fft": 6.1}) == []


def test_refine_times_a_left_out_candidate_beside_the_winner(autotuning, monkeypatch):
    """As measured on (4, 14, 32, 1) x (13, 13, 1, 32): TF's dL/dinput took 6x
    its estimate, and direct, left out at 3.04x that estimate, was fastest."""
    near = autotune.NEAR_FACTOR
    true = {"tf": 6.0, "direct": 4.0, "fft": 6.1}
    calls = []

    def fake_measure(pass_, names, *args, **kwargs):
        calls.append(sorted(names))
        return {n: true[n] for n in names}

    monkeypatch.setattr(autotune, "measure", fake_measure)
    p = planned(1, near * 1.01, near * 1.005, pass_="backprop_input")
    shapes = ((4, 14, 32, 1), (13, 13, 1, 32))
    p = autotune.refine(p, *shapes, ATTRS, "float32", "CPU", 0)
    # fft and tf; direct beside the winner, tf; direct's win by 1.5x, confirmed.
    assert calls == [["fft", "tf"], ["direct", "tf"], ["direct", "tf"]]
    assert p.chosen == "direct" and set(p.measured) == {"tf", "direct", "fft"}
    assert "direct 4e+03 ms" in p.reason
    # The cache holds all three: the same plan again times nothing.
    again = planned(1, near * 1.01, near * 1.005, pass_="backprop_input")
    forbid_timing(monkeypatch)
    assert autotune.refine(again, *shapes, ATTRS, "float32", "CPU", 0).chosen == "direct"


# ---- (b) the cache round-trips across processes ----------------------------

CROSS = """
import json, sys
import numpy as np, tensorflow as tf
import tfbigconv
from tfbigconv.planning import autotune
x_shape, w_shape = (1, 64, 64, 1), (31, 31, 1, 2)
if sys.argv[1] == "read":
    def fail(*args, **kwargs):
        raise AssertionError("timed again")
    autotune.measure = fail
e = tfbigconv.explain(x_shape, w_shape, padding="SAME", autotune=sys.argv[1] == "write")
planned = {}
if sys.argv[1] == "read":  # bigconv2d, autotuning on, takes its choices from the cache
    x = tf.constant(np.ones(x_shape, np.float32))
    w = tf.constant(np.ones(w_shape, np.float32))
    def step(x):
        with tf.device("/CPU:0"), tf.GradientTape() as t:
            t.watch(x)
            y = tfbigconv.bigconv2d(x, w, 1, "SAME")
        return t.gradient(y, x)
    g = tf.function(step).get_concrete_function(x).graph
    planned = {op.type: op.get_attr("planned_algorithm").decode()
               for op in g.get_operations() if op.type.startswith("BigConv2D")}
    planned["types"] = sorted({op.type for op in g.get_operations()})
print(json.dumps({"how": e.how, "chosen": e.chosen, "planned": planned,
                  "measured": {r.pass_ + "/" + r.algorithm: r.measured_seconds for r in e.rows}}))
"""


def run_script(arg, **env):
    full = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **env)
    r = subprocess.run([sys.executable, "-c", CROSS, arg], env=full, capture_output=True,
                       text=True, cwd=os.path.dirname(__file__))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_cache_round_trips_across_processes(tmp_path):
    cache = tmp_path / "tune.json"
    first, _ = run_script("write", TFBIGCONV_AUTOTUNE_CACHE=str(cache), TFBIGCONV_AUTOTUNE="1")
    assert first["how"] == dict.fromkeys(PASSES, "measured")
    doc = json.loads(cache.read_text())
    assert doc["format"] == autotune.FORMAT and len(doc["entries"]) == 3
    for entry in doc["entries"].values():
        assert entry["version"] == autotune._version()  # this build
        assert entry["chosen"] == autotune.fastest(entry["seconds"])

    second, stderr = run_script("read", TFBIGCONV_AUTOTUNE_CACHE=str(cache),
                                TFBIGCONV_AUTOTUNE="1")
    assert "ignoring" not in stderr
    assert second["how"] == first["how"] and second["chosen"] == first["chosen"]
    assert second["measured"] == first["measured"]
    # The graph runs the cached winners: our ops carry them, TF's kernels where tf won.
    planned = second["planned"]
    ours = {"forward": "BigConv2D", "backprop_input": "BigConv2DBackpropInput"}
    for pass_, op_type in ours.items():
        chosen = internal(first["chosen"][pass_])
        if chosen == "tf":
            assert op_type not in planned
        else:
            assert planned[op_type] == chosen

    # Another cache file: nothing known, so explain() shows estimates only.
    third, _ = run_script("read", TFBIGCONV_AUTOTUNE_CACHE=str(tmp_path / "other.json"),
                          TFBIGCONV_AUTOTUNE="0")
    assert third["how"] == dict.fromkeys(PASSES, "estimated")
    assert all(v is None for v in third["measured"].values())


# ---- (c) corrupt and stale caches are ignored with a warning ---------------

def test_corrupt_cache_is_ignored_with_a_warning_and_replaced(autotuning):
    autotuning.write_text("{not json")
    with pytest.warns(UserWarning, match="ignoring autotune cache"):
        e = tfbigconv.explain(*WIDE, padding="SAME", autotune=True)
    assert e.how["forward"] == "measured"
    doc = json.loads(autotuning.read_text())  # rewritten, valid
    assert doc["format"] == autotune.FORMAT and len(doc["entries"]) == 3

    for bad in ('{"format": 99, "entries": {}}', '[1, 2]', '{"format": 1}'):
        autotuning.write_text(bad)
        autotune.clear_memory()
        with pytest.warns(UserWarning, match="ignoring autotune cache"):
            e = tfbigconv.explain(*WIDE, padding="SAME")
        assert e.how == dict.fromkeys(PASSES, "estimated")


def test_stale_entries_are_ignored_with_a_warning(autotuning, monkeypatch):
    tfbigconv.explain(*WIDE, padding="SAME", autotune=True)
    doc = json.loads(autotuning.read_text())
    keys = sorted(doc["entries"])
    assert len(keys) == 3
    doc["entries"][keys[0]]["version"] = "0.0.0-older"
    doc["entries"][keys[1]]["chosen"] = "winograd"
    autotuning.write_text(json.dumps(doc))
    autotune.clear_memory()
    with pytest.warns(UserWarning, match="ignoring 2 stale or invalid entries"):
        e = tfbigconv.explain(*WIDE, padding="SAME")
    assert sorted(e.how.values()) == ["estimated", "estimated", "measured"]
    # Timing again replaces the stale entries (and only those are timed).
    calls = []
    real = autotune.measure
    monkeypatch.setattr(autotune, "measure",
                        lambda pass_, *a, **k: calls.append(pass_) or real(pass_, *a, **k))
    with warnings_as_errors():  # warned once, when read
        e = tfbigconv.explain(*WIDE, padding="SAME", autotune=True)
    assert len(calls) == 2 and e.how == dict.fromkeys(PASSES, "measured")
    autotune.clear_memory()
    with warnings_as_errors():  # the file holds only valid entries now
        assert tfbigconv.explain(*WIDE, padding="SAME").how == dict.fromkeys(PASSES, "measured")


def test_unwritable_cache_warns_and_still_decides(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("TFBIGCONV_AUTOTUNE_CACHE", str(blocker / "tune.json"))
    autotune.clear_memory()
    try:
        with pytest.warns(UserWarning, match="could not write autotune cache"):
            e = tfbigconv.explain(*WIDE, padding="SAME", autotune=True)
        assert e.how["forward"] == "measured"  # remembered in this process
    finally:
        autotune.clear_memory()


@contextlib.contextmanager
def warnings_as_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# ---- (d) TFBIGCONV_AUTOTUNE=0: estimates only ------------------------------

def test_autotune_off_gives_estimates_only(model, autotuning, monkeypatch):
    make_tf_look_best(model, *WIDE)
    monkeypatch.setenv("TFBIGCONV_AUTOTUNE", "0")
    forbid_timing(monkeypatch)
    for value in ("0", "false", "off"):
        monkeypatch.setenv("TFBIGCONV_AUTOTUNE", value)
        assert not autotune.enabled()
        e = tfbigconv.explain(*WIDE, padding="SAME", autotune=None)
        assert e.how == dict.fromkeys(PASSES, "estimated")
        assert e.chosen["forward"] == "tf.Conv2D"
        assert all(r.measured_seconds is None for r in e.rows)
        x, w = random_case(WIDE[0], 5), random_case(WIDE[1], 6)
        types = {op.type for op in
                 graph_of(lambda x: cpu_bigconv2d(x, w, 1, "SAME"), x).get_operations()}
        assert "Conv2D" in types and "BigConv2D" not in types
    assert not autotuning.exists()
    monkeypatch.delenv("TFBIGCONV_AUTOTUNE")
    assert autotune.enabled() and not autotune.enabled(False) and autotune.enabled(True)


# ---- (e) explain() shows what was measured ---------------------------------

def test_explain_shows_measured_and_estimated(autotuning, monkeypatch):
    e = tfbigconv.explain(*WIDE, padding="SAME", autotune=True)
    assert e.how == dict.fromkeys(PASSES, "measured")
    # backprop_filter: TF's Conv2D is estimated far slower: never timed.
    bpf = rows(e, "backprop_filter")
    assert bpf["tf.Conv2D"].measured_seconds is None
    assert bpf["direct"].measured_seconds > 0 and bpf["fft"].measured_seconds > 0
    text = str(e)
    assert "measured" in text.splitlines()[0]
    for p in PASSES:
        assert f"{p}: measured; auto: {internal(e.chosen[p])} " in text
    # explain(autotune=False) shows the cached measurements, times nothing.
    forbid_timing(monkeypatch)
    again = tfbigconv.explain(*WIDE, padding="SAME")
    assert again.how == e.how and again.chosen == e.chosen
    assert [r.measured_seconds for r in again.rows] == [r.measured_seconds for r in e.rows]
    # Nothing close to time (fft far ahead of direct and, by over HOPELESS_FACTOR,
    # of TF's Conv2D): estimated even with autotuning on.
    far = tfbigconv.explain((8, 256, 256, 1), (101, 101, 1, 1), padding="VALID", autotune=True)
    assert far.how == dict.fromkeys(PASSES, "estimated")
    assert "forward: estimated; auto: fft" in str(far)


def test_dilated_depthwise_measured_fastest_on_tf_runs_its_depthwise_gradients(
        autotuning, monkeypatch):
    """Timed fastest on TF's kernels in every pass, a dilated depthwise layer runs
    grouped Conv2D forward and tf.nn.depthwise_conv2d's gradient path (SpaceToBatchND
    around DepthwiseConv2dNativeBackprop*), as planned: not the Conv2D forward's
    own registered gradients, which TF's grouped Conv2D gradients would be."""
    # over planner.SMALL_PASS_MACS (1.18M multiply-adds), where TF's kernels may run for auto
    x_shape, w_shape, dil = (4, 64, 64, 8), (3, 3, 1, 8), (2, 3)
    monkeypatch.setattr(autotune, "measure",
                        lambda pass_, names, *a, **k: {n: 0.1 if n == "tf" else 1.0 for n in names})
    x, w = random_case(x_shape, 5, np.float32), random_case(w_shape, 6, np.float32)
    y64 = conv2d_reference(x, w, (1, 1), "SAME", dil)
    dy = random_case(y64.shape, 7, np.float32)

    @tf.function
    def step(x, w):
        with tf.device("/CPU:0"), tf.GradientTape() as t:
            t.watch([x, w])
            y = tfbigconv.bigconv2d(x, w, 1, "SAME", dilations=dil)
        return [y] + t.gradient(y, [x, w], output_gradients=tf.constant(dy))

    got = step(tf.constant(x), tf.constant(w))
    types = {op.type for op in step.get_concrete_function(tf.constant(x), tf.constant(w))
             .graph.get_operations()}
    assert {"Conv2D", "SpaceToBatchND", "DepthwiseConv2dNativeBackpropInput",
            "DepthwiseConv2dNativeBackpropFilter"} <= types, types
    assert not types & {"Conv2DBackpropInput", "Conv2DBackpropFilter", "BigConv2D"}, types
    refs = (y64, conv2d_reference_backprop_input(dy, w, x_shape, (1, 1), "SAME", dil),
            conv2d_reference_backprop_filter(x, dy, w_shape, (1, 1), "SAME", dil))
    for g, r in zip(got, refs):
        assert rel_l2(g.numpy(), r) < TOLERANCE["float32"]


def test_a_long_autotuning_says_so_once(autotuning, monkeypatch, caplog):
    """A pass whose timing is expected to take over ANNOUNCE_ABOVE_S logs one INFO
    line (absl): what is timed, why, and where the result is cached; a short one
    logs nothing."""
    monkeypatch.setattr(autotune, "measure",
                        lambda pass_, names, *args, **kwargs: {n: 1.0 for n in names})
    caplog.set_level(logging.INFO, logger="absl")
    for estimate, lines, width in ((1e-4, 0, 32), (1.0, 1, 33)):  # two cache keys
        shapes = ((4, 14, width, 1), (13, 13, 1, 32))
        caplog.clear()
        p = planned(estimate, estimate * 1.2, estimate * 1.5)
        assert autotune.expected_seconds(p, ["tf", "direct", "fft"], 4, 4) == pytest.approx(
            (1 + timing.MIN_ROUNDS) * estimate * 3.7)
        autotune.refine(p, *shapes, ATTRS, "float32", "CPU", 0)
        said = [r.getMessage() for r in caplog.records if "autotuning" in r.getMessage()]
        assert len(said) == lines, said
        if lines:
            assert "timing tf, direct, fft" in said[0] and str(autotune.cache_path()) in said[0]


def test_a_confirmation_the_budget_cut_short_does_not_overturn_a_win():
    """A second timing that did not call the winner (math.inf: its budget was
    spent) leaves the winner's first time; what it did call replaces the old."""
    import math
    first = {"tf": 0.040, "fft": 0.025, "direct": 0.050}
    asked = []

    def timed(names):
        asked.append(names)
        return {"tf": 0.038, "fft": math.inf}

    seconds = autotune.confirmed(dict(first), timed)
    assert asked == [["tf", "fft"]]
    assert seconds == {"tf": 0.038, "fft": 0.025, "direct": 0.050}
    assert autotune.fastest(seconds) == "fft"


def test_an_untrusted_candidate_is_probed_on_one_image_first(monkeypatch):
    """A candidate in `probe` (TF's kernel where its estimate is not trusted)
    runs on one image first; if its call on the whole timing batch would then
    overrun the budget, that probe is its time and it is not called again."""
    now, calls, per_image = [0.0], [], {"direct": 0.01, "tf": 0.5}

    def run(name, x):
        calls.append((name, int(x.shape[0])))
        now[0] += per_image[name] * int(x.shape[0])
        return tf.zeros([1])

    monkeypatch.setattr(autotune.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(timing, "_pass_fn",
                        lambda pass_, name, x, w, dy, a, device: lambda: run(name, x))
    n = SMALL[0][0]
    assert n > 1

    def measure():
        calls.clear()
        return autotune.measure("forward", ["direct", "tf"], SMALL[0], SMALL[1], ATTRS,
                                "float32", "CPU", batch=n, budget_s=0.5, probe={"tf"})

    seconds = measure()
    assert ("tf", 1) in calls and ("tf", n) not in calls
    assert seconds["tf"] == pytest.approx(0.5 * n)  # the probe, scaled to the batch
    assert autotune.fastest(seconds) == "direct"
    per_image["tf"] = 0.005  # its whole call fits: timed as the others are
    seconds = measure()
    assert ("tf", 1) in calls and ("tf", n) in calls and autotune.fastest(seconds) == "tf"


def test_timing_operands_are_kept_for_the_layers_other_timings(monkeypatch):
    """The passes, the gradient pair and the re-timings of one layer time the
    same random operands, made once; another layer's replace them, operands
    over OPERANDS_KEPT_BYTES are not kept, and clear_memory() drops them."""
    autotune.clear_memory()
    shapes = ([2, 9, 9, 3], [3, 3, 3, 4], [2, 9, 9, 4])
    *first, kept = timing._timing_operands(*shapes, "float32", "CPU")
    *again, kept_again = timing._timing_operands(*shapes, "float32", "CPU")
    assert kept and kept_again and all(a is b for a, b in zip(first, again))
    assert [t.shape.as_list() for t in first] == list(shapes)
    assert all(np.all(np.abs(t.numpy()) <= 1) for t in first)
    other = timing._timing_operands(*shapes, "bfloat16", "CPU")
    assert other[0].dtype == tf.bfloat16 and len(timing._operands) == 1
    assert all(a is not b for a, b in zip(first, timing._timing_operands(*shapes, "float32", "CPU")[:3]))
    autotune.clear_memory()
    assert not timing._operands
    monkeypatch.setattr(timing, "OPERANDS_KEPT_BYTES", 16)
    assert timing._timing_operands(*shapes, "float32", "CPU")[3] is False
    assert not timing._operands


def test_a_layers_candidates_are_traced_once(monkeypatch):
    """A re-timing of the same layer (a confirmation, a widening) reuses the
    candidates' traced graphs: tracing again cost each its tracing and a new
    graph's first call. Another layer, clear_memory() or operands too big to
    keep trace anew."""
    autotune.clear_memory()
    traces = []
    real = timing._pass_fn
    monkeypatch.setattr(timing, "_pass_fn",
                        lambda pass_, name, *a: traces.append((pass_, name)) or real(pass_, name, *a))
    x, f = SMALL

    def measure(names, pass_="forward"):
        return autotune.measure(pass_, names, x, f, ATTRS, "float32", "CPU", batch=x[0])

    measure(["direct", "fft"])
    assert sorted(traces) == [("forward", "direct"), ("forward", "fft")]
    seconds = measure(["direct", "fft"])  # a re-timing: nothing traced
    assert len(traces) == 2 and all(math.isfinite(t) for t in seconds.values())
    measure(["direct"], "backprop_input")  # another pass of the layer: its own graphs
    assert traces[2:] == [("backprop_input", "direct")]
    autotune.clear_memory()
    measure(["direct"])
    assert traces[3:] == [("forward", "direct")]
    monkeypatch.setattr(timing, "OPERANDS_KEPT_BYTES", 16)
    autotune.clear_memory()
    measure(["direct"])
    measure(["direct"])
    assert traces[4:] == [("forward", "direct")] * 2
