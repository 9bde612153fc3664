"""Calibrates the planner's CPU cost model on this machine.

Times the direct and FFT kernels (through the ops) and TensorFlow's own
Conv2D and DepthwiseConv2dNative ops and their backprops on a fixed set of
convolutions, all pinned to the CPU (on a machine with a GPU, TensorFlow
would otherwise place them there), fits the model's CPU constants
(cost_model.h, CostModel) and writes a profile that profiles.py loads; the
GPU constants are kept from the active profile (gpu_fit.py fits those).
`python -m tfbigconv calibrate` writes the user's profile, within a time
budget (BUDGET_S); benchmarks/calibrate.py writes the one shipped in the package.
"""
import datetime
import functools
import math
import time

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tfbigconv import _core, arguments, host, kernels, timer
from tfbigconv._native import ops as native
from tfbigconv.cost_model import profiles

@functools.cache
def im2col_axes():
    """The im2col table's (filter sides, channel products) (cost_model.h: kIm2colSideAxis,
    kIm2colChannelAxis), read from the field names: not at import, which needs no library."""
    names = [n for n in _core.cost_model_fields()
             if n.startswith("im2col_flops_per_second.forward.side")]
    return (tuple(sorted({int(n.split(".side")[1].split(".")[0]) for n in names})),
            tuple(sorted({int(n.split(".channels")[1]) for n in names})))


SLOWDOWN_DTYPES = ("float16", "bfloat16", "float64")
# TF's Conv2D channel block per pass and filter side (cost_model.h,
# im2col_channel_block): the channels the pass writes are timed at these
# counts, in order, until one takes over BLOCK_TOLERANCE x one channel's time;
# the block is the count before it (oneDNN on AVX-512: 1-16 take the same time,
# 32 twice, but its filter gradient's slow path from side 15 runs pairs: 2).
BLOCK_PROBE = (1, 2, 4, 8, 16, 32)
BLOCK_TOLERANCE = 1.5
# A measurement whose calls take longer is not repeated in a later round: its
# two or more calls already span half a second or more. The three slowest of a
# calibration on a Xeon (TF's float16 and side-31 filter gradients, 0.4-1.0 s
# a call where the profile being scaled expected 0.05 s) spent 4.6 s in their
# second rounds, 8% of the calibration.
REPEAT_BELOW_S = 0.25
# The longest call a TF-table case is sized for where the active profile knows
# its rate (_sized). TF's kernels are timed eagerly (tracing a graph for each
# took longer than its calls; eager dispatch is ~0.05 ms of a call of 10 ms or
# more), our ops in graphs, as they run (the per-call cost is fitted).
CALL_S = 0.05
# The CLI's time budget for the measurements: with TensorFlow's import (5-9 s)
# and the fits, `python -m tfbigconv calibrate` takes at most a minute. Without
# one it took 55 s on a 2-core Xeon and 96 s on a 2-core Zen 3 (TF's own
# kernels). Within a budget every measurement is taken once first (the fits
# need them all), each with a share of the time left: fewer calls, and TF's
# table cases sized down to MIN_CALL_S a call, where that is short; then a
# second round while time is left (_Clock).
BUDGET_S = 45.0
# The shortest call a case is sized down to under a budget: TF's per-call cost
# (~0.1 ms a graph call) stays about 1% of it.
MIN_CALL_S = 0.01
# TF's Conv2D filter gradient in the half types leaves its fast path from
# a filter side (cost_model.h, im2col_half_slow_path_side): oneDNN's bfloat16 on
# Zen 4 (AVX512_BF16, no AMX) from side 15 with 16->16 channels (4.3 s on one
# 40x40 image), from 25 with 3->8. Timed on one small image of 16->16 channels
# (HALF_SLOW_PATH_CASE: input, output channels) at side 7 and, by bisection,
# at sides 8 to the table's last (one step, as measured); a side is on the
# slow path where its call takes HALF_SLOW_PATH_FACTOR x side 7's per tap
# (measured: over 500x). A call over HALF_SLOW_PATH_CAP_S is timed once.
HALF_SLOW_PATH_CASE = ((1, 16, 16, 16), 16)
HALF_SLOW_PATH_FACTOR = 10.0
HALF_SLOW_PATH_CAP_S = 0.1

# (input NHWC, filter HWIO, padding): convolutions for the direct and FFT fits,
# spanning channels, filter sizes and both kernels' shapes of work.
KERNEL_CASES = (
    ((1, 32, 32, 1), (3, 3, 1, 1), "SAME"),  # tiny: pins the per-call overhead
    ((1, 48, 48, 4), (5, 5, 4, 4), "SAME"),
    ((8, 160, 160, 1), (3, 3, 1, 3), "SAME"),
    ((8, 160, 160, 1), (9, 9, 1, 3), "SAME"),
    ((8, 160, 160, 1), (9, 9, 1, 2), "SAME"),  # two-channel column tiles
    ((8, 256, 256, 1), (31, 31, 1, 3), "VALID"),
    ((8, 64, 64, 16), (3, 3, 16, 16), "SAME"),
    ((8, 64, 64, 16), (7, 7, 16, 16), "SAME"),
    ((4, 64, 64, 16), (15, 15, 16, 16), "SAME"),
    ((2, 64, 64, 64), (5, 5, 64, 64), "SAME"),
    ((4, 64, 64, 32), (15, 15, 1, 32), "SAME"),  # depthwise: the groups kernel
    ((8, 112, 112, 32), (3, 3, 1, 32), "SAME"),
    ((8, 56, 56, 128), (7, 7, 1, 128), "SAME"),
    ((2, 256, 256, 1), (63, 63, 1, 1), "SAME"),
    ((2, 64, 64, 32), (31, 31, 32, 32), "SAME"),
    ((16, 160, 240, 1), (61, 61, 1, 3), "VALID"),
    ((2, 128, 128, 64), (3, 3, 64, 64), "SAME"),
    ((4, 96, 96, 16), (13, 13, 16, 16), "SAME"),
    ((4, 80, 80, 24), (9, 9, 24, 24), "SAME"),
    ((2, 384, 384, 1), (5, 5, 1, 1), "SAME"),
)
ATTRS = dict(strides=[1, 1, 1, 1], explicit_paddings=[], data_format="NHWC", dilations=[1, 1, 1, 1])


class _Clock:
    """A calibration's time budget (None: none). `pending` counts the first
    round's measurements still to take, which the fits need all of: each gets
    an even share of the time left (share), later rounds what remains (left)."""

    def __init__(self, budget_s, pending=0):
        self.start = time.perf_counter()
        self.end = None if budget_s is None else self.start + budget_s
        self.pending, self.done = pending, 0

    def left(self):
        return math.inf if self.end is None else max(0.0, self.end - time.perf_counter())

    def share(self):
        return self.left() / max(1, self.pending)

    def took(self, count=1):
        self.pending = max(0, self.pending - count)
        self.done += count

    def spare(self):
        """Seconds left beyond what the pending measurements need at the pace so far."""
        pace = (time.perf_counter() - self.start) / max(1, self.done)
        return self.left() - self.pending * pace

    def call_s(self):
        """The longest call a case is sized for: CALL_S, or a quarter of a share
        (a warm-up and two calls, with the tracing), down to MIN_CALL_S."""
        return min(CALL_S, max(MIN_CALL_S, self.share() / 4))


def _time(fn, budget_s, reps=5, first_cap_s=2.0, warm=False, share_s=math.inf):
    """Median seconds of fn() (after one warm-up call unless `warm`: fn ran
    before, in an earlier round): calls until budget_s of them, at least two,
    or where the calibration is short of time, until the measurement has taken
    `share_s` (_Clock.share), at least one after the warm-up. A warm-up over
    first_cap_s is too slow to repeat: it is the measurement (not sooner: a
    first call can take 0.7 s more, in-process setup)."""
    return float(np.median(timer.calls_seconds(fn, reps, warm_up=not warm,
                                               alone_above_s=first_cap_s, enough_s=budget_s,
                                               share_s=share_s)))


# While calibrate runs: operands by (shape, dtype, seed), which a case's passes
# and algorithms share, cut from one pool of normal values (drawing them took a
# quarter of a calibration; the values do not change a kernel's time).
_operands = None
_pool = np.zeros(0, np.float32)


def _random(shape, dtype=tf.float32, seed=0):
    global _pool
    key = (tuple(shape), tf.as_dtype(dtype).name, seed)
    if _operands is None:
        values = np.random.default_rng(seed).standard_normal(key[0], dtype=np.float32)
        return tf.cast(tf.constant(values), dtype)
    if key not in _operands:
        size, start = math.prod(key[0]), 4099 * seed  # the seeds' operands differ
        if len(_pool) < start + size:
            _pool = np.random.default_rng(0).standard_normal(2 * (start + size), np.float32)
        _operands[key] = tf.cast(tf.constant(_pool[start:start + size].reshape(key[0])), dtype)
    return _operands[key]


def _pass_fn(pass_, x_shape, w_shape, padding, dtype, forward, backprop_input, backprop_filter,
             graph=True):
    """A callable running one pass on fixed random operands, as a traced graph
    (or eagerly: no tracing, for probe.py's sub-second timings). The op
    callables take (x, w), (input_sizes, w, dy) and (x, filter_sizes, dy)."""
    x, w = _random(x_shape, dtype), _random(w_shape, dtype, seed=1)
    y_shape = _core.conv_geometry(list(x_shape), list(w_shape), padding=padding,
                                  **ATTRS).output_shape
    dy = _random(y_shape, dtype, seed=2)
    if pass_ == "forward":
        f = lambda: forward(x, w)  # noqa: E731
    elif pass_ == "backprop_input":
        f = lambda: backprop_input(tf.constant(x_shape, tf.int32), w, dy)  # noqa: E731
    else:
        f = lambda: backprop_filter(x, tf.constant(w_shape, tf.int32), dy)  # noqa: E731
    f = tf.function(f) if graph else f
    return lambda: f().numpy()


# The callables timing one pass, here, in probe.py and in benchmarks: our op
# with a forced algorithm (float32), TF's Conv2D ops and TF's depthwise ops.
def kernel_fn(algorithm, pass_, x_shape, w_shape, padding, graph=True):
    """One pass of our op with a forced algorithm."""
    a = dict(ATTRS, padding=padding, algorithm=algorithm, workspace_limit_bytes=0)
    return _pass_fn(pass_, x_shape, w_shape, padding, tf.float32,
                    lambda x, w: native.big_conv2d(x, w, **a),
                    lambda s, w, dy: native.big_conv2d_backprop_input(s, w, dy, **a),
                    lambda x, s, dy: native.big_conv2d_backprop_filter(x, s, dy, **a), graph)


class _Progress:
    """One progress bar over every measurement of a calibration, with the time
    left (keras.utils.Progbar); silent where `show` is False."""

    def __init__(self, total, show):
        self.done, self.total = 0, total
        self.bar = keras.utils.Progbar(total, unit_name="measurement") if show else None

    def advance(self, count=1):
        if count <= 0:
            return
        self.done = min(self.total, self.done + count)
        if self.bar is not None:
            self.bar.update(self.done)

    def finish(self):
        self.advance(self.total - self.done)


def _measurements(cases, rounds):
    """How many measurements calibrate takes at most (its progress bar's total)."""
    passes, sides = len(arguments.PASSES), len(im2col_axes()[0])
    kernels = 2 * len(cases) * passes
    blocks = passes * sides * len(BLOCK_PROBE)  # the probe stops early where it can
    tables = (passes * sides * len(im2col_axes()[1]) + 2 * passes * sides
              + len(profiles.DTYPE_SLOWDOWNS) * passes * (1 + len(SLOWDOWN_DTYPES)))
    return (kernels + blocks + tables) * rounds


def _best_times(fns, budget_s, rounds, progress, clock=None):
    """{key: the smallest of `rounds` median times of fns[key]}, measured
    round-robin so that the machine's slow minutes spread over all of them
    (one round where the first took over REPEAT_BELOW_S)."""
    clock = clock or _Clock(None)
    best = _first_times(fns, budget_s, progress, clock)
    _more_rounds(fns, best, budget_s, rounds, progress, clock)
    return best


def _first_times(fns, budget_s, progress, clock):
    """{key: median time of fns[key]}, each in its share of the clock's time."""
    best = {}
    for key, fn in fns.items():
        best[key] = _time(fn, budget_s, share_s=clock.share())
        clock.took()
        progress.advance()
    return best


def _more_rounds(fns, best, budget_s, rounds, progress, clock):
    """Rounds 2..`rounds` over fns (warm), round-robin, while the clock has time
    left, keeping each key's best in `best`; keys over REPEAT_BELOW_S are not
    repeated. Returns how many were measured again."""
    again = 0
    for _ in range(1, rounds):
        for key, fn in fns.items():
            progress.advance()
            left = clock.left()
            if best[key] > REPEAT_BELOW_S or left <= 0:
                continue  # long enough not to need a second round, or no time
            best[key] = min(best[key], _time(fn, budget_s, warm=True, share_s=left))
            again += 1
    return again


def im2col_fn(pass_, x_shape, w_shape, padding, dtype, graph=True):
    """One pass of TensorFlow's own convolution ops."""
    spec = arguments.ConvSpec.of(dict(ATTRS, padding=padding)).with_filter(x_shape[3], w_shape)
    return _pass_fn(
        pass_, x_shape, w_shape, padding, dtype,
        lambda x, w: kernels.tf_forward(x, w, spec, depthwise=False),
        lambda s, w, dy: kernels.tf_backprop_input(s, w, dy, spec, depthwise=False),
        lambda x, s, dy: kernels.tf_backprop_filter(x, s, dy, spec, depthwise=False), graph)


def depthwise_fn(pass_, x_shape, w_shape, padding, dtype, graph=True):
    """One pass of TensorFlow's depthwise ops (w_shape in TF's [KH, KW, C, 1] form)."""
    ours = [w_shape[0], w_shape[1], 1, w_shape[2] * w_shape[3]]
    spec = arguments.ConvSpec.of(dict(ATTRS, padding=padding)).with_filter(x_shape[3], ours)
    return _pass_fn(
        pass_, x_shape, ours, padding, dtype,
        lambda x, w: kernels.tf_forward(x, w, spec, depthwise=True),
        lambda s, w, dy: kernels.tf_backprop_input(s, w, dy, spec, depthwise=True),
        lambda x, s, dy: kernels.tf_backprop_filter(x, ours, dy, spec, depthwise=True), graph)


def _sized(target, rate, slowdown=1.0, call_s=CALL_S):
    """The work (FLOPs) of a timed case: `target`, or less where the active
    profile's `rate` (FLOP/s; None: unknown) over `slowdown` makes a call of it
    take over call_s (CALL_S, less under a short budget; down to target / 64).
    TF's Conv2D filter gradient from side 15 (oneDNN's slow path, 0.3-0.6
    GFLOP/s) and half-precision gradients ran seconds a call at `target`: half
    of a calibration's time."""
    seconds = target * slowdown / rate if rate else 0.0
    if seconds <= call_s:
        return target
    return max(target / 64, target * call_s / seconds)


def _dtype_slowdown_fns(target, prior, call_s=CALL_S):
    """{timing key: fn} for the dtype slowdowns of TF's kernels, per kernel and
    pass, at side 7: Conv2D at 16x16 channels, DepthwiseConv2dNative at 32
    channels (as its rate table); keys <prefix><pass>.<dtype>, float32 included.
    Each pass's case is sized for its slowest dtype (_sized, by the active
    profile `prior`); every dtype of a pass runs the same case."""
    rates = {profiles.DTYPE_SLOWDOWNS[0]: ("im2col_flops_per_second.{}.side7.channels256",
                                           target),
             profiles.DTYPE_SLOWDOWNS[1]: (f"{profiles.DEPTHWISE_TABLE}{{}}.side7", target / 10)}
    fns = {}
    for prefix, make in zip(profiles.DTYPE_SLOWDOWNS, (im2col_fn, depthwise_fn)):
        rate_key, work = rates[prefix]
        for pass_ in arguments.PASSES:
            slowest = max([1.0] + [prior.get(f"{prefix}{pass_}.{n}", 1.0) for n in SLOWDOWN_DTYPES])
            work_p = _sized(work, prior.get(rate_key.format(pass_)), slowest, call_s)
            if prefix == profiles.DTYPE_SLOWDOWNS[0]:
                xs, ws = _im2col_case(7, 16, 16, work_p)
            else:  # the depthwise table's case
                xs, ws = _im2col_case(7, 32, 1, work_p)
                ws = ws[:2] + (32, 1)
            for name in ("float32",) + SLOWDOWN_DTYPES:
                fns[f"{prefix}{pass_}.{name}"] = make(pass_, xs, ws, "SAME", tf.as_dtype(name),
                                                      graph=False)
    return fns


def half_slow_path_side(seconds_at, fast_side, sides, none):
    """The first of `sides` (ascending) on the half type's slow path, by
    bisection, with seconds_at(side) its filter gradient's time; `none` where
    none is. A side is slow where its time per tap is HALF_SLOW_PATH_FACTOR x
    fast_side's."""
    base = seconds_at(fast_side) / fast_side ** 2
    slow = lambda s: seconds_at(s) / s ** 2 >= HALF_SLOW_PATH_FACTOR * base  # noqa: E731
    lo, hi = 0, len(sides)  # the first slow side is in sides[lo:hi], or none
    while lo < hi:
        mid = (lo + hi) // 2
        if slow(sides[mid]):
            hi = mid
        else:
            lo = mid + 1
    return float(sides[lo]) if lo < len(sides) else none


def _half_slow_path_sides(log):
    """{profile field: side} for each half type (half_slow_path_side)."""
    (n, h, w, cin), cout = HALF_SLOW_PATH_CASE
    fast_side = im2col_axes()[0][1]
    sides = list(range(fast_side + 1, im2col_axes()[0][-1] + 1))
    defaults = dict(zip(_core.cost_model_fields(), _core.default_cost_model()))
    values = {}
    for dtype in profiles.HALF_TYPES:
        seconds = {}

        def seconds_at(side):
            fn = im2col_fn("backprop_filter", (n, h, w, cin), (side, side, cin, cout), "SAME",
                           tf.as_dtype(dtype), graph=False)
            seconds[side] = _time(fn, 0.0, reps=2, first_cap_s=HALF_SLOW_PATH_CAP_S)
            return seconds[side]

        field = f"{profiles.HALF_SLOW_PATH}{dtype}"
        values[field] = half_slow_path_side(seconds_at, fast_side, sides, defaults[field])
        log(f"im2col backprop_filter {dtype}: slow path from side {values[field]:g} ("
            + ", ".join(f"side {s}: {t * 1e3:.2f} ms" for s, t in sorted(seconds.items())) + ")")
    return values


def _im2col_case(side, cin, cout, target_flops):
    """(input, filter) of about target_flops, SAME padding, batch 2."""
    px = target_flops / (2 * 2 * side * side * cin * cout)
    hw = int(min(1024, max(side + 1, math.sqrt(px))))
    return (2, hw, hw, cin), (side, side, cin, cout)


def _in_out(pass_, other, written):
    """(in, out) channels of a case where the pass writes `written` channels
    (forward and filter gradient: out; input gradient: in)."""
    return (written, other) if pass_ == "backprop_input" else (other, written)


def table_case(product, block):
    """(other, written) channels of the im2col table's case for a channel
    product: the written ones the smallest multiple of the channel block that
    is at least the square root and divides the product (else the product), so
    that the case wastes none of a block, as the model counts a layer (1, 16,
    256, 2048 with a block of 1: 1x1, 4x4, 16x16, 32x64; with 16: 1x16)."""
    fits = [c for c in range(1, product + 1)
            if product % c == 0 and c % block == 0 and c * c >= product]
    written = min(fits) if fits else product
    return product // written, written


def _block_case(pass_, side, written, quick, work=1e9):
    """(input, filter): side x side, SAME, the pass writing `written` channels
    and 16 the other way, on an image sized so that 16 written channels are
    about `work` FLOPs (1 GFLOP: per-call costs would hide the blocks)."""
    (n, h, w, _), _ = _im2col_case(side, 16, 16, 2e6 if quick else work)
    cin, cout = _in_out(pass_, 16, written)
    return (n, h, w, cin), (side, side, cin, cout)


def channel_block(seconds):
    """The channel block from {channels written: seconds}, in BLOCK_PROBE's
    order (it may stop early): the count before the first one over
    BLOCK_TOLERANCE x one channel's time."""
    block = 1
    for c, t in seconds.items():
        if t > BLOCK_TOLERANCE * seconds[1]:
            break
        block = c
    return float(block)


def _channel_blocks(quick, rounds, budget_s, log, progress, clock=None, prior=None):
    """{profile field: block} for every pass and side, timed count by count.
    Under a clock each count's first time takes its share, a second round only
    where the time left allows it; the image is sized (_sized, by the active
    profile `prior`'s rate at 16x16 channels) for clock.call_s()."""
    clock, prior = clock or _Clock(None), prior or {}
    values = {}
    for pass_ in arguments.PASSES:
        for side in im2col_axes()[0]:
            seconds = {}
            rate = prior.get(f"im2col_flops_per_second.{pass_}.side{side}.channels256")
            work = _sized(1e9, rate, call_s=clock.call_s())
            for i, c in enumerate(BLOCK_PROBE):
                fn = im2col_fn(pass_, *_block_case(pass_, side, c, quick, work), "SAME",
                               tf.float32, graph=False)
                seconds[c] = _time(fn, budget_s, share_s=clock.share())
                clock.took()
                for _ in range(1, rounds):
                    if clock.spare() > 2 * max(2 * seconds[c], budget_s):  # margin 2x
                        seconds[c] = min(seconds[c], _time(fn, budget_s, warm=True))
                progress.advance(rounds)
                if channel_block(seconds) < c:  # past the block: no need to time more
                    skipped = len(BLOCK_PROBE) - i - 1
                    progress.advance(rounds * skipped)
                    clock.took(skipped)
                    break
            block = channel_block(seconds)
            values[f"{profiles.CHANNEL_BLOCK}{pass_}.side{side}"] = block
            log(f"im2col {pass_} side {side}: written channels in blocks of {block:g} ("
                + ", ".join(f"{c}: {t * 1e3:.2f} ms" for c, t in seconds.items()) + ")")
    return values


def _fit(terms, seconds, positive=(0,)):
    """Non-negative least squares of seconds ~ terms . coefficients, in relative error.

    Solves every subset of the terms and keeps the best all-non-negative
    solution (there are at most five terms) whose coefficients at `positive`
    (the rates the model divides by) are not zero.
    """
    t = np.asarray(terms, float)
    s = np.asarray(seconds, float)
    A, b = t / s[:, None], np.ones(len(s))
    best, best_err = None, np.inf
    for mask in range(1, 1 << t.shape[1]):
        cols = [j for j in range(t.shape[1]) if mask >> j & 1]
        x, *_ = np.linalg.lstsq(A[:, cols], b, rcond=None)
        if np.any(x < 0):
            continue
        full = np.zeros(t.shape[1])
        full[cols] = x
        err = float(np.sum((A @ full - b) ** 2))
        if all(full[j] > 0 for j in positive) and err < best_err:
            best, best_err = full, err
    if best is None:
        raise RuntimeError("no fit of the timings has positive rates; calibrate again on an idle machine")
    return [float(v) for v in best]


def _model_terms(algorithm, pass_, x_shape, w_shape, padding):
    p = _core.plan_pass(list(x_shape), list(w_shape), padding=padding, pass_=pass_,
                        dtype="float32", device="CPU", algorithm=algorithm, workspace_limit=0,
                        workers=host.current().threads(), tf_kernel="", **ATTRS)
    return getattr(p, algorithm).terms


def calibrate(output, quick=False, rounds=None, log=print, progress=True, cpu_only=False,
              budget_s=None):
    """Measures, fits and writes a profile to `output`; returns its values.

    quick: tiny problems and (unless `rounds` says) one round, for tests of the
    round trip (the numbers are then not meaningful). rounds: each measurement
    is the best of this many (default 2), taken round-robin. log: the summary
    lines (each measurement's result goes to absl's log at verbosity 1).
    progress: a progress bar with the time left. cpu_only: a profile without
    the GPU values (read, it takes the main profile's). budget_s: seconds the
    measurements may take (None: no limit; the CLI's is BUDGET_S): every
    measurement is taken once, each in its share of the time left (fewer
    calls, and smaller TF-table cases, where that is short), and again only
    while time is left; the profile's meta says how many were (repeated).
    """
    global _operands, _pool
    _operands = {}
    try:
        # Hundreds of one-pass graphs, each called first without Grappler, as
        # autotuning's are (host.without_graph_optimizer: ~4 ms less a graph).
        with tf.device("/CPU:0"), host.without_graph_optimizer():
            return _calibrate_cpu(output, quick, rounds, log, progress, cpu_only, budget_s)
    finally:
        _operands, _pool = None, np.zeros(0, np.float32)


def _detail(line):
    logging.vlog(1, "calibrate: %s", line)


def _calibrate_cpu(output, quick, rounds, log, show_progress, cpu_only, budget_s):
    rounds = rounds or (1 if quick else 2)
    rep_s = 0.02 if quick else 0.1  # a measurement's calls take about this long
    cases = [((1, 24, 24, 1), (5, 5, 1, 2), "SAME"), ((1, 24, 24, 4), (3, 3, 4, 4), "SAME"),
             ((1, 32, 32, 2), (9, 9, 2, 2), "VALID")] if quick else KERNEL_CASES
    clock = _Clock(budget_s, pending=_measurements(cases, 1))
    progress = _Progress(_measurements(cases, rounds), show_progress)
    summary = []  # printed after the progress bar
    kernel_fns = {(algorithm, pass_, case): kernel_fn(algorithm, pass_, *case)
                  for algorithm in ("direct", "fft") for case in cases
                  for pass_ in arguments.PASSES}
    times = _first_times(kernel_fns, rep_s, progress, clock)
    target = 2e6 if quick else 2e9
    # The active profile: it sizes the TF-table cases, and its GPU values are kept.
    prior = dict(zip(_core.cost_model_fields(), _core.get_cost_model()))
    values = _channel_blocks(quick, rounds, rep_s / 3, _detail, progress, clock, prior)
    fns, macs = {}, {}
    call_s = clock.call_s()
    for pass_ in arguments.PASSES:
        for side in im2col_axes()[0]:
            block = int(values[f"{profiles.CHANNEL_BLOCK}{pass_}.side{side}"])
            for product in im2col_axes()[1]:
                cin, cout = _in_out(pass_, *table_case(product, block))
                key = f"im2col_flops_per_second.{pass_}.side{side}.channels{cin * cout}"
                work = _sized(target, prior.get(key), call_s=call_s)
                x_shape, w_shape = _im2col_case(side, cin, cout, work)
                fns[key] = im2col_fn(pass_, x_shape, w_shape, "SAME", tf.float32, graph=False)
                macs[key] = _core.conv_geometry(list(x_shape), list(w_shape), padding="SAME",
                                                **ATTRS).macs
    for table, multiplier in ((profiles.DEPTHWISE_TABLE, 1), (profiles.MULTIPLIER_TABLE, 2)):
        for pass_ in arguments.PASSES:
            for side in im2col_axes()[0]:
                # TF's depthwise kernels run at ~10 GFLOP/s: a tenth of the work.
                key = f"{table}{pass_}.side{side}"
                work = _sized(target / 10, prior.get(key), call_s=call_s)
                x_shape, w_shape = _im2col_case(side, 32, 1, work)
                w_shape = w_shape[:2] + (32, multiplier)
                fns[key] = depthwise_fn(pass_, x_shape, w_shape, "SAME", tf.float32,
                                        graph=False)
                macs[key] = _core.conv_geometry(list(x_shape), [side, side, 1, 32 * multiplier],
                                                padding="SAME", **ATTRS).macs
    fns.update(_dtype_slowdown_fns(target, prior, call_s))
    values.update(_half_slow_path_sides(_detail))
    times.update(_first_times(fns, rep_s, progress, clock))
    # Later rounds over every measurement, kernels and tables, while time is left.
    every = {**kernel_fns, **fns}
    repeated = _more_rounds(every, times, rep_s, rounds, progress, clock)
    progress.finish()
    fits = {}
    for algorithm in ("direct", "fft"):
        keys = [k for k in kernel_fns if k[0] == algorithm]
        terms = [_model_terms(algorithm, pass_, *case) for _, pass_, case in keys]
        seconds = [times[k] for k in keys]
        for (_, pass_, (x_shape, w_shape, padding)), t in zip(keys, seconds):
            _detail(f"{algorithm:6s} {pass_:15s} {x_shape} x {w_shape} {padding}: {t * 1e3:.2f} ms")
        fits[algorithm] = _fit(terms, seconds, positive=(0, 1) if algorithm == "direct" else (0,))
        predicted = np.asarray(terms) @ np.asarray(fits[algorithm])
        ratio = predicted / np.asarray(seconds)
        summary.append(f"{algorithm} model / measured: median {np.median(ratio):.2f}, "
                       f"range {ratio.min():.2f}-{ratio.max():.2f}")
    values.update({name: profiles.coefficient(name, c)
                   for names, fit in ((profiles.DIRECT_TERMS, fits["direct"]),
                                      (profiles.FFT_TERMS, fits["fft"]))
                   for name, c in zip(names, fit)})
    if budget_s is not None and rounds > 1:
        summary.append(f"within the {budget_s:g} s budget: {repeated} of {len(every)} "
                       f"measurements taken again (call size {call_s * 1e3:.0f} ms)")
    for line in summary:
        log(line)
    for key, m in macs.items():
        values[key] = 2 * m / times[key]
        _detail(f"{key}: {values[key] / 1e9:.1f} GFLOP/s")
    for prefix in profiles.DTYPE_SLOWDOWNS:
        for pass_ in arguments.PASSES:
            for name in SLOWDOWN_DTYPES:
                key, base = f"{prefix}{pass_}.{name}", f"{prefix}{pass_}.float32"
                values[key] = times[key] / times[base]
                _detail(f"{key}: {values[key]:.2f}x float32's time")
    ordered = [values[name] if name in values else prior[name]  # GPU: kept
               for name in _core.cost_model_fields()]
    missing = [n for n in _core.cost_model_fields() if n not in values and not profiles.is_gpu_field(n)]
    assert not missing, missing
    cpu = profiles.this_cpu()
    meta = dict(created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                machine=f"{cpu['name']}, {cpu['cpus']} CPUs", cpu=cpu,
                tensorflow=tf.__version__, tf_onednn=host.tf_onednn(),
                quick=bool(quick), rounds=rounds, budget_s=budget_s, repeated=repeated,
                seconds=round(time.perf_counter() - clock.start, 1),
                fits={"direct": fits["direct"], "fft": fits["fft"]})
    if "gpu_grids" in profiles.active_meta and not cpu_only:  # the GPU section kept, and its source
        meta.update(gpu_grids=profiles.active_meta.get("gpu_grids"))
    profiles.write_profile(output, ordered, meta, cpu_only=cpu_only)
    log(f"wrote {output}")
    return ordered
