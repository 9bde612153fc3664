"""How good is algorithm="auto"? Its time against the best of tf, direct and fft.

Measured on a grid of geometries, as forward and as forward + backward; "tf" is
TensorFlow's own best kernel for the case.

Grid: GRID below, 64 geometries (each label names its dtype and data_format):
  - dense float32 NHWC (34): filter sizes 1-95, channels 1-128, batch 1-64,
    images 28-512 px, strides 1-2; four of them narrow (1-3 channels out, or in,
    beside 32-64);
  - depthwise float32 NHWC (9): K 3-63, multiplier 1-2, batch 1-64, strides 1-2;
  - grouped float32 NHWC (6): 2-16 groups, K 3-31, strides 1-2;
  - half (9): float16 and bfloat16, dense, depthwise and grouped, NHWC;
  - NCHW (6): dense, depthwise and grouped, float32 and half.
--quick runs 10 of them (one or two of each class) for 1 round: about 2 minutes.
--random SEED,COUNT runs COUNT geometries drawn off the grid instead (random_grid: the
classes, dtypes and layouts mixed as users have them), because a planner tuned on a grid
says little beyond it.
The old float32-only grid's slowest cases (seconds per call for every contender) were
dropped. Run time of the default (--rounds 2) on the 2-core development machine:
about 16 minutes when the machine is otherwise idle, up to about 25 with another job
on it. Estimated from 23 geometries measured one at a time while other jobs ran
(5-10 s for small ones; 35-55 s for the most expensive, where TF's half-precision or
depthwise gradients take seconds) and, for the rest, from the per-call times of the
previous run in RESULTS.md.

Contenders, each a tf.function:
    auto      tfbigconv.bigconv2d(..., algorithm="auto") with autotuning on (the
              environment variable TFBIGCONV_AUTOTUNE unset); every geometry worker gets
              a fresh TFBIGCONV_AUTOTUNE_CACHE file, so each geometry starts cold
    auto-est  the same with TFBIGCONV_AUTOTUNE=0: the cost model's choice alone
    tf        TensorFlow's best kernel for the case, with TF's own gradients:
              tf.nn.depthwise_conv2d for depthwise (filter [K,K,1,C*m] reshaped to
              [K,K,C,m]), else tf.nn.conv2d (grouped through the filter's in-depth).
              Where TF's CPU kernels cannot run the case (NCHW, grouped gradients) it
              shows "unsupported" and is not counted
    direct    bigconv2d(..., algorithm="direct") for every pass
    fft       bigconv2d(..., algorithm="fft") for every pass
"fwd" times y = conv(x, w); "fwd+bwd" times y and both gradients of sum(y * g)
for a fixed random g (a training step's convolution work).

Each geometry runs in its own subprocess (machinery: _harness.py). Inside it, the
contenders are measured for --rounds rounds (the machine is noisy). Each round, every
contender makes a warm-up call, then the timed calls are interleaved, one call of each
contender per cycle, so that a burst of load hits all of them alike; a contender gets
2 to 15 calls, more while its calls add up to under 0.6 s (short calls are the noisy
ones), and its round's time is their median. A contender whose calls take over 2 s gets
one timed call and no more rounds; the smallest round median counts; the order rotates
each round. (Before 2026-11-22 each contender's calls ran back to back, up to 5 of them:
on millisecond calls that made auto and the contender running the same algorithm
differ by up to 1.7x.) The first round's warm-up call (tracing, planning,
autotuning and one run) is reported as "first call". auto-est is traced first and auto's
fwd+bwd before auto's fwd: the fwd+bwd first call tunes all three passes cold, the fwd
first call may reuse the forward pass's tuning from it (one process, one in-memory cache).

A forced contender (tf, direct, fft) whose planner estimate exceeds --skip-s seconds is
not run ("skipped"); one whose single call runs past --call-limit seconds is stopped
(the worker exits), shown as "> T s (killed)", and the geometry rerun without it; so is
one that crashes the worker. --timeout bounds a whole geometry worker (auto included).

Regret = time / best measured time of {tf, direct, fft} on the same geometry and mode,
for auto and for auto-est separately (it can be below 1: auto may mix algorithms per
pass); "vs tf" = time / tf's time where tf ran. Where auto's graph has the same ops as
tf's (autotuning chose TF's kernels for every pass: the same kernels run), a ratio over
1.1 is the machine's noise: such cases are listed apart and not counted against the
target. Likewise where auto runs the best contender's own kernels (the same ops with the
same algorithms, e.g. fft for every pass against the fft contender): a regret over 1.1
there is listed apart and left out of the max (the median and 90th percentile keep it). Targets (issue 11, autotuning on):
regret median <= 1.05, 90th percentile <= 1.2, max <= 1.5; never > 1.1 x tf.

The seed case (200, 321, 481, 1) x (135, 135, 1, 3) VALID also runs with
workspace_limit = 256 MiB: its peak RSS increase (autotuning included) must stay within
input + output + 256 MiB + 10%.

Usage:
    python benchmarks/bench_dispatch.py [--quick | --random SEED,COUNT] [--only SUBSTR] [--rounds 2]
                                        [--out F.md] [--json F.json]
"""
import argparse
import collections
import contextlib
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time

import _harness

MIB = 1 << 20
CONTENDERS = ("auto", "auto-est", "tf", "direct", "fft")
BASELINES = ("tf", "direct", "fft")  # regret is measured against the best of these
AUTOS = ("auto", "auto-est")
MODES = ("fwd", "fwd+bwd")
PASSES = ("forward", "backprop_input", "backprop_filter")
CLASSES = ("dense", "grouped", "depthwise", "half", "NCHW")
TARGETS = {"median": 1.05, "p90": 1.2, "max": 1.5, "vs_tf": 1.1}
DTYPE_TAG = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}  # no tag inside another

# One convolution: input (n, h, w, cin) in logical NHWC order (transposed for NCHW),
# filter (k, k, cin / groups, cout); groups == cin > 1 is depthwise (multiplier cout / cin).
Geometry = collections.namedtuple(
    "Geometry", "n h w cin k cout stride groups padding dtype data_format")


def G(n, h, w, cin, k, cout, stride=1, groups=1, padding="SAME", dtype="float32",
      data_format="NHWC"):
    return Geometry(n, h, w, cin, k, cout, stride, groups, padding, dtype, data_format)


def DW(n, h, w, c, k, multiplier=1, stride=1, **kw):
    return G(n, h, w, c, k, c * multiplier, stride, groups=c, **kw)


GRID = [
    # dense, float32, NHWC: the old grid without its slowest cases
    G(1, 32, 32, 1, 1, 1),
    G(8, 64, 64, 16, 1, 16),
    G(8, 128, 128, 128, 1, 128),
    G(4, 128, 128, 32, 3, 32),
    G(16, 64, 64, 64, 3, 64),
    G(2, 256, 256, 3, 3, 16, 2),
    G(64, 32, 32, 32, 3, 32),
    G(1, 512, 512, 1, 3, 1),
    G(4, 64, 64, 128, 3, 128),
    G(8, 128, 128, 8, 5, 8),
    G(32, 32, 32, 16, 5, 16, 2),
    G(2, 128, 128, 64, 7, 64),
    G(8, 128, 128, 1, 7, 3),
    G(32, 28, 28, 4, 7, 4),  # issue 11: auto ran tf.nn.conv2d at 3.6x direct's time
    G(64, 32, 32, 3, 7, 16, 2),
    G(8, 64, 64, 32, 11, 32),
    G(4, 256, 256, 1, 15, 3),
    G(1, 512, 512, 3, 15, 8, 2),
    G(4, 64, 64, 64, 15, 64),
    G(64, 64, 64, 1, 15, 1),
    G(16, 64, 64, 8, 21, 8),
    G(2, 256, 256, 4, 21, 4, 2),
    G(4, 128, 128, 1, 31, 3),
    G(1, 512, 512, 1, 31, 1),
    G(16, 64, 64, 4, 45, 4),
    G(2, 256, 256, 1, 45, 3, padding="VALID"),
    G(4, 128, 128, 8, 63, 8),
    G(16, 321, 481, 1, 63, 3, padding="VALID"),  # the seed case's shape, smaller filter
    G(1, 512, 512, 1, 63, 1),
    G(4, 256, 256, 3, 95, 3, padding="VALID"),
    # narrow dense layers (image heads and stems), where TF's kernels run whole
    # blocks of 16 channels (RESULTS.md, "TF's Conv2D channel block")
    G(8, 96, 96, 32, 9, 3),
    G(4, 128, 128, 64, 7, 1),
    G(4, 64, 64, 64, 13, 3),
    G(8, 96, 96, 3, 9, 64),
    # depthwise, float32, NHWC
    DW(64, 32, 32, 32, 3),
    DW(8, 112, 112, 32, 3, stride=2),
    DW(8, 56, 56, 128, 7),
    DW(4, 56, 56, 64, 13),  # issue 11: auto ran grouped Conv2D at 27x direct's time
    DW(8, 56, 56, 128, 15),
    DW(8, 56, 56, 128, 31),  # issue 11's acceptance case
    DW(2, 64, 64, 32, 21, multiplier=2),
    DW(1, 128, 128, 64, 31, stride=2),
    DW(4, 64, 64, 32, 63),
    # grouped (not depthwise), float32, NHWC
    G(32, 28, 28, 16, 3, 16, groups=4),
    G(16, 32, 32, 32, 5, 64, groups=2),
    G(8, 64, 64, 64, 7, 64, groups=4),
    G(4, 64, 64, 32, 15, 32, 2, groups=4),
    G(2, 128, 128, 64, 31, 64, groups=16),
    G(1, 128, 128, 16, 31, 16, groups=4),
    # half precision, NHWC
    G(16, 64, 64, 64, 3, 64, dtype="float16"),
    G(16, 64, 64, 64, 3, 64, dtype="bfloat16"),
    G(64, 32, 32, 3, 7, 16, 2, dtype="bfloat16"),
    G(4, 128, 128, 16, 15, 16, dtype="bfloat16"),
    G(4, 128, 128, 1, 31, 3, dtype="float16"),
    G(1, 512, 512, 1, 63, 1, dtype="bfloat16"),
    DW(8, 56, 56, 128, 7, dtype="float16"),
    DW(8, 56, 56, 128, 31, dtype="bfloat16"),
    G(8, 64, 64, 64, 7, 64, groups=4, dtype="bfloat16"),
    # NCHW
    G(16, 64, 64, 64, 3, 64, data_format="NCHW"),
    G(4, 128, 128, 16, 15, 16, data_format="NCHW"),
    G(2, 256, 256, 4, 21, 4, 2, data_format="NCHW", dtype="float16"),
    DW(8, 56, 56, 128, 15, data_format="NCHW"),
    DW(4, 64, 64, 32, 31, stride=2, data_format="NCHW", dtype="bfloat16"),
    G(8, 64, 64, 64, 7, 64, 2, groups=4, data_format="NCHW"),
]
# One of each class, small and quick: a smoke test.
QUICK_LABELS = (
    "8x64x64 16->16 K=1 s=1 SAME fp32 NHWC",
    "4x256x256 1->3 K=15 s=1 SAME fp32 NHWC",
    "64x32x32 dw32 K=3 s=1 SAME fp32 NHWC",
    "8x56x56 dw128 K=7 s=1 SAME fp32 NHWC",
    "32x28x28 16->16 g4 K=3 s=1 SAME fp32 NHWC",
    "4x64x64 32->32 g4 K=15 s=2 SAME fp32 NHWC",
    "16x64x64 64->64 K=3 s=1 SAME bf16 NHWC",
    "8x56x56 dw128 K=7 s=1 SAME fp16 NHWC",
    "16x64x64 64->64 K=3 s=1 SAME fp32 NCHW",
    "8x64x64 64->64 g4 K=7 s=2 SAME fp32 NCHW",
)


def random_grid(seed, count):
    """`count` geometries drawn like user layers, off GRID, sized for the 2-core
    machine: dense, depthwise (multiplier 1-2) and grouped; K 3-63; batch 1-16;
    images 14-160 px; stride 1-2; 1 in 4 in half precision, 1 in 5 NCHW, 1 in 5
    VALID. Draws whose direct forward would exceed 30 GFLOP, or that are on GRID,
    are skipped."""
    import numpy as np
    rng = np.random.default_rng(seed)
    sides = [14, 19, 28, 32, 37, 56, 64, 80, 96, 112, 128, 160]
    ks = [3, 5, 7, 9, 11, 13, 15, 17, 21, 25, 31, 41, 51, 63]
    out = []
    while len(out) < count:
        n = int(rng.choice([1, 2, 4, 8, 16]))
        h = int(rng.choice(sides))
        w = int(rng.choice(sides)) if rng.random() < 0.3 else h
        k = int(rng.choice(ks))
        stride = int(rng.choice([1, 1, 1, 2]))
        dtype = str(rng.choice(["float16", "bfloat16"])) if rng.random() < 0.25 else "float32"
        data_format = "NCHW" if rng.random() < 0.2 else "NHWC"
        padding = "VALID" if rng.random() < 0.2 and k <= min(h, w) else "SAME"
        kind = rng.choice(["dense", "dense", "depthwise", "depthwise", "grouped"])
        if kind == "dense":
            g = G(n, h, w, int(rng.choice([1, 3, 8, 16, 32, 64])), k,
                  int(rng.choice([1, 3, 8, 16, 32, 64])), stride, padding=padding, dtype=dtype,
                  data_format=data_format)
        elif kind == "depthwise":
            g = DW(n, h, w, int(rng.choice([16, 32, 64, 128])), k,
                   multiplier=int(rng.choice([1, 1, 1, 2])), stride=stride, padding=padding,
                   dtype=dtype, data_format=data_format)
        else:
            groups = int(rng.choice([2, 4, 8]))
            c = int(rng.choice([16, 32, 64]))
            g = G(n, h, w, c, k, c, stride, groups=groups, padding=padding, dtype=dtype,
                  data_format=data_format)
        if k > 2 * max(h, w):
            continue
        flops = 2.0 * n * (h / stride) * (w / stride) * k * k * (g.cin // g.groups) * g.cout
        if flops > 30e9 or g in GRID or g in out:
            continue
        out.append(g)
    return out


def label(g):
    if g.groups == g.cin > 1:
        m = g.cout // g.cin
        ch = f"dw{g.cin}" + (f"x{m}" if m > 1 else "")
    else:
        ch = f"{g.cin}->{g.cout}" + (f" g{g.groups}" if g.groups > 1 else "")
    return (f"{g.n}x{g.h}x{g.w} {ch} K={g.k} s={g.stride} {g.padding} "
            f"{DTYPE_TAG[g.dtype]} {g.data_format}")


def classes(g):
    """The classes of the per-class breakdown a geometry counts in (one or more)."""
    out = ["depthwise" if g.groups == g.cin > 1 else "grouped" if g.groups > 1 else "dense"]
    if g.dtype != "float32":
        out.append("half")
    if g.data_format == "NCHW":
        out.append("NCHW")
    return out


def shapes(g):
    """(input shape in data_format order, filter shape)."""
    x = (g.n, g.cin, g.h, g.w) if g.data_format == "NCHW" else (g.n, g.h, g.w, g.cin)
    return x, (g.k, g.k, g.cin // g.groups, g.cout)


def short_error(e):
    """The first informative line of an exception's message, at most 100 characters."""
    lines = [l.strip() for l in str(getattr(e, "message", None) or e).splitlines()]
    skip = ("Graph execution error", "Detected at node", "File ", "[[", "Cause:")
    lines = [l for l in lines if l and not l.startswith(skip)] or [type(e).__name__]
    # TF's gradient ops fail in either order; a line saying what is unsupported says most
    lines = [l for l in lines if "support" in l] or lines
    text = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", lines[0])
    return text[:100]


def short_algorithm(a):
    if a is None:
        return "?"
    mark = "*" if a.endswith("*") else ""
    a = a.rstrip("*")
    if "Depthwise" in a:
        return "tfdw" + mark
    if a.startswith("tf") or a == "im2col":
        return "tf" + mark
    return {"direct": "di", "fft": "ff"}.get(a, a) + mark


def choice_text(chosen, mode):
    if not chosen:
        return "?"
    passes = PASSES[:1] if mode == "fwd" else PASSES
    return "/".join(short_algorithm(chosen.get(p)) for p in passes)


# ---------------------------------------------------------------------------- worker

def is_tf_row(r):
    # "im2col" before issue 11, "tf.Conv2D" / "tf.DepthwiseConv2dNative" after it
    return r.algorithm == "im2col" or r.algorithm.startswith("tf.")


def estimate_s(e, contender, mode, depthwise):
    """The planner's estimated time of a forced contender: None (unknown: run it) or
    seconds (inf: the planner says it cannot run)."""
    passes = PASSES[:1] if mode == "fwd" else PASSES
    if contender in AUTOS:
        return None
    total = 0.0
    for p in passes:
        rows = [r for r in e.rows if r.pass_ == p]
        if contender == "tf":
            rows = [r for r in rows if is_tf_row(r)]
            if depthwise:  # old planners only had grouped Conv2D, not what `tf` runs here
                rows = [r for r in rows if "Depthwise" in r.algorithm]
            seconds = [r.seconds for r in rows if r.available]
            if not seconds:
                return None  # let TF itself say whether it can run it
            total += min(seconds)
        else:
            rows = [r for r in rows if r.algorithm == contender and r.available and r.fits]
            total += rows[0].seconds if rows else float("inf")
    return total


def build(contender, mode, g, x, w, g_out):
    import tensorflow as tf
    import tfbigconv
    fmt, s = g.data_format, g.stride
    if contender == "tf" and g.groups == g.cin > 1:
        strides = [1, 1, s, s] if fmt == "NCHW" else [1, s, s, 1]
        dw_shape = (g.k, g.k, g.cin, g.cout // g.cin)

        def conv(x, w):
            return tf.nn.depthwise_conv2d(x, tf.reshape(w, dw_shape), strides, g.padding,
                                          data_format=fmt)
    elif contender == "tf":
        def conv(x, w):
            return tf.nn.conv2d(x, w, s, g.padding, data_format=fmt)
    else:
        algorithm = "auto" if contender in AUTOS else contender

        def conv(x, w):
            return tfbigconv.bigconv2d(x, w, s, g.padding, data_format=fmt,
                                       algorithm=algorithm)
    if mode == "fwd":
        f = tf.function(conv)
        call = lambda: f(x, w).numpy()  # noqa: E731
        call.op_types = lambda: _harness.op_types(f, x, w)
        return call
    return _harness.build_step(conv, x, w, g_out)


class Progress:
    """What the worker has measured so far and the call it is in, kept in a file after
    each step: the parent's clue when the worker dies, and the start of the rerun
    without that call. A call that runs past its limit ends the worker (a TF call
    cannot be interrupted from Python)."""

    def __init__(self, path, resume):
        self.path = path
        load = lambda d: {tuple(k.split("|")): v for k, v in d.items()}
        self.medians = load(resume.get("medians", {}))  # key: [median of each round]
        self.first_call = load(resume.get("first_call", {}))  # key: seconds
        self.failed = load(resume.get("failed", {}))  # key: {"error" or "unsupported": ...}
        self.key, self.start, self.limit = None, 0.0, None
        threading.Thread(target=self._watch, daemon=True).start()

    def timed(self, key, call, limit):
        """Runs call() under the watchdog; returns its time in seconds."""
        self.key, self.start, self.limit = key, time.monotonic(), limit
        self.save()
        t0 = time.perf_counter()
        call()
        elapsed = time.perf_counter() - t0
        self.limit = None
        return elapsed

    def save(self, over_limit=False):
        dump = lambda d: {"|".join(k): v for k, v in d.items()}
        state = {"key": list(self.key) if self.key else None, "over_limit": over_limit,
                 "limit": self.limit, "medians": dump(self.medians),
                 "first_call": dump(self.first_call), "failed": dump(self.failed)}
        with open(self.path + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(self.path + ".tmp", self.path)  # the parent never reads half a file

    def _watch(self):
        while True:
            time.sleep(0.2)
            limit = self.limit
            if limit is not None and time.monotonic() - self.start > limit:
                self.save(over_limit=True)
                os._exit(3)


MIN_CALLS, MAX_CALLS, ROUND_BUDGET_S = 2, 15, 0.6


def wants_more(times):
    """Whether a contender gets another timed call this round: at least one; a second
    unless the first was slow; then more, up to MAX_CALLS, while its calls this round
    add up to under ROUND_BUDGET_S (the short calls are the noisy ones)."""
    if not times:
        return True
    if times[0] > _harness.SLOW_CALL_S:
        return False
    return len(times) < MIN_CALLS or (len(times) < MAX_CALLS and sum(times) < ROUND_BUDGET_S)


def call_once(progress, key, call, spec, first=False):
    """One call of a contender under the watchdog; its seconds, or None when it failed
    (recorded in progress.failed). first: the warm-up call (its time is the first call's
    on round one)."""
    limit = None if key[0] in AUTOS else spec["call_limit"]
    env = _harness.autotune_off() if key[0] == "auto-est" else contextlib.nullcontext()
    try:
        with env:
            t = progress.timed(key, call, limit)
    except Exception as err:  # one contender failing must not end the geometry
        what = "unsupported" if key[0] == "tf" else "error"
        progress.failed[key] = {what: short_error(err)}
        return None
    if first:
        progress.first_call.setdefault(key, t)
    return t


def worker_geometry(spec):
    # the cache lives beside the progress file: the parent removes both, even after a kill
    with _harness.fresh_autotune_env(under=os.path.dirname(spec["progress"])):
        return measure_geometry(spec)


def measure_geometry(spec):
    import numpy as np
    import tensorflow as tf
    import tfbigconv
    g = Geometry(*spec["geometry"])
    depthwise = g.groups == g.cin > 1
    x_shape, w_shape = shapes(g)
    rng = np.random.default_rng(0)
    fan_in = g.k * g.k * (g.cin // g.groups)
    x = tf.cast(rng.standard_normal(x_shape, dtype=np.float32), g.dtype)
    # scaled so that half-precision outputs and gradients stay far from overflow
    w = tf.cast(rng.standard_normal(w_shape, dtype=np.float32) / np.sqrt(fan_in), g.dtype)

    def explain():
        return tfbigconv.explain(x_shape, w_shape, strides=g.stride, padding=g.padding,
                                 data_format=g.data_format, dtype=g.dtype)
    with _harness.autotune_off():
        e = explain()
    g_out = tf.cast(rng.standard_normal(e.geometry.output_shape, dtype=np.float32), g.dtype)

    progress = Progress(spec["progress"], spec.get("resume", {}))
    results, calls = {}, {}
    killed = {tuple(k[:2]): k[2] for k in spec["killed"]}
    # auto-est first (nothing tuned yet), then auto's fwd+bwd (all three passes tuned cold)
    order = [(c, m) for c in ("auto-est", "auto") for m in reversed(MODES)]
    order += [(c, m) for c in BASELINES for m in MODES]
    for c, mode in order:
        if (c, mode) in killed:  # its rounds before the kill, if any, still count
            if not progress.medians.get((c, mode)):
                results[(c, mode)] = killed[(c, mode)]
            continue
        est = estimate_s(e, c, mode, depthwise)
        if est is not None and est > spec["skip_s"]:
            results[(c, mode)] = {"skipped_est_s": est}
            continue
        calls[(c, mode)] = build(c, mode, g, x, w, g_out)

    _harness.warm_up(g.dtype)
    keys = list(calls)
    for rnd in range(spec["rounds"]):
        # Rotate the order each round: the first contender measured after another
        # one runs in a differently warmed machine.
        order_r = keys[rnd % len(keys):] + keys[:rnd % len(keys)]
        times = {}
        for key in order_r:  # warm-up; in the first round also tracing, planning, autotuning
            done = progress.medians.get(key, [])
            if key in progress.failed or len(done) > rnd:
                continue  # failed, or measured in this round before a rerun
            if done and done[0] > _harness.SLOW_CALL_S:
                continue  # too slow to repeat
            t = call_once(progress, key, calls[key], spec, first=True)
            if t is not None:
                times[key] = []
        # Then the timed calls, interleaved: one call of each contender per cycle, so
        # that a burst of load on the shared machine hits all of them alike.
        for _cycle in range(MAX_CALLS):
            live = [k for k in order_r if k in times and wants_more(times[k])]
            if not live:
                break
            for key in live:
                t = call_once(progress, key, calls[key], spec)
                if t is None:
                    del times[key]
                else:
                    times[key].append(t)
        for key, ts in times.items():
            progress.medians.setdefault(key, []).append(statistics.median(ts))
    progress.key = None
    progress.save()
    results.update(progress.failed)
    for key, m in progress.medians.items():
        if key not in results:
            results[key] = {"median_s": min(m), "first_call_s": progress.first_call[key]}
    # After auto ran: explain() may now show the tuned (measured) choice.
    try:
        after = explain()
        # "*" marks a choice the autotuner measured
        tuned = {p: a + ("*" if after.how.get(p) == "measured" else "")
                 for p, a in after.chosen.items()}
    except Exception as err:
        tuned = {"error": short_error(err)}
    # Where auto's graph runs the very kernels of a baseline's (the same ops with the
    # same algorithms), a time ratio between them is the machine's noise, not a choice.
    kernels = {key: call.op_types() for key, call in calls.items()}
    same_as = {f"{c}|{mode}": [b for b in BASELINES if (b, mode) in kernels
                               and kernels[(c, mode)] == kernels[(b, mode)]]
               for c in AUTOS for mode in MODES if (c, mode) in kernels}
    return {"results": [{"contender": c, "mode": mode, **r} for (c, mode), r in results.items()],
            "chosen_est": e.chosen, "chosen_after": tuned, "macs": e.geometry.macs,
            "same_graph_as": same_as}


def worker_seed_budget(spec):
    with _harness.fresh_autotune_env():
        return measure_seed_budget(spec)


def measure_seed_budget(spec):
    import numpy as np
    import tensorflow as tf
    import tfbigconv
    limit = spec["limit"]
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((200, 321, 481, 1), dtype=np.float32))
    w = tf.constant(rng.standard_normal((135, 135, 1, 3), dtype=np.float32))
    f = tf.function(lambda x: tfbigconv.bigconv2d(x, w, 1, "VALID", workspace_limit=limit))
    f(x[:1]).numpy()  # warm-up (traces for batch 1; the full call retraces)
    r = _harness.measure_call(lambda: f(x).numpy(), reps=3)
    e = tfbigconv.explain((200, 321, 481, 1), (135, 135, 1, 3), padding="VALID", budget=limit)
    fft = next(row for row in e.rows if row.pass_ == "forward" and row.chosen)
    return {"median_s": r["median_s"], "rss_increase_bytes": r["rss_increase_bytes"],
            "in_bytes": 200 * 321 * 481 * 4, "out_bytes": 200 * 187 * 347 * 3 * 4,
            "limit": limit, "chosen": fft.algorithm, "plan": fft.note}


def worker(spec):
    out = worker_geometry(spec) if spec["method"] == "geometry" else worker_seed_budget(spec)
    print(json.dumps(out))


# ---------------------------------------------------------------------------- report

def percentile(v, q):
    v = sorted(v)
    i = (len(v) - 1) * q
    lo, hi = int(i), min(int(i) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (i - lo)


def fmt_ms(r):
    if r is None:
        return "-"
    if "skipped_est_s" in r:
        est = r["skipped_est_s"]
        return "n/a (planner)" if est == float("inf") else f"skipped (est. {est:.0f} s)"
    if "killed_after_s" in r:
        return f"> {r['killed_after_s']:g} s (killed)"
    if "crashed" in r:
        return f"crashed ({r['crashed'][:50]})"
    if "unsupported" in r:
        return f"unsupported ({r['unsupported'][:50]})"
    if "error" in r:
        return f"error ({r['error'][:50]})"
    return f"{1e3 * r['median_s']:.1f}"


def fmt_s(v):
    return "-" if v is None else f"{v:.3f}" if v < 10 else f"{v:.0f}"


def stats_line(v):
    if not v:
        return "- | - | -"
    return f"{statistics.median(v):.3f} | {percentile(v, 0.9):.3f} | {max(v):.2f}"


def regret_verdict(v, counted_for_max, vs_tf_over):
    """Median and 90th percentile over every regret v; the max over counted_for_max (v
    without the cases where auto ran the best contender's own kernels)."""
    if not v:
        return "-"
    ok = (statistics.median(v) <= TARGETS["median"] and percentile(v, 0.9) <= TARGETS["p90"]
          and max(counted_for_max, default=0) <= TARGETS["max"] and not vs_tf_over)
    return "met" if ok else "MISSED"


def run_geometry(g, args, rounds, progress):
    """Runs one geometry's worker; when a contender runs past its limit or crashes the
    worker, reruns it without that contender, keeping what was measured before. Returns
    the worker's result (or {"error": ...})."""
    spec = {"method": "geometry", "geometry": list(g), "rounds": rounds, "skip_s": args.skip_s,
            "call_limit": args.call_limit, "killed": [], "progress": progress}
    while True:
        if os.path.exists(progress):
            os.remove(progress)
        res = _harness.run_worker(__file__, spec, timeout=args.timeout)
        if "error" not in res or not os.path.exists(progress):
            break
        with open(progress) as f:
            state = json.load(f)
        if state["key"] is None or state["key"] in [k[:2] for k in spec["killed"]]:
            break  # it failed outside any contender's call
        if state["over_limit"]:
            why = {"killed_after_s": state["limit"]}
        elif "timeout" in res["error"]:
            why = {"killed_after_s": args.timeout, "whole_worker": True}
        else:
            why = {"crashed": res["error"][:100]}
        spec["killed"].append(state["key"] + [why])
        spec["resume"] = {k: state[k] for k in ("medians", "first_call", "failed")}
        print(f"{label(g)}: {state['key']} {fmt_ms(why)}; rerunning without it", file=sys.stderr)
    if os.path.exists(progress):
        os.remove(progress)
    return res


def summarize(points):
    """points: per geometry {"geometry", "classes", "by"}; returns the markdown sections."""
    regrets = {(c, m): [] for c in AUTOS for m in MODES}
    vs_tf = {(c, m): [] for c in AUTOS for m in MODES}
    over_tf = {(c, m): [] for c in AUTOS for m in MODES}
    over_tf_same = {(c, m): [] for c in AUTOS for m in MODES}  # same graph as tf: noise
    # Regret over 1.1 where auto ran the best baseline's own kernels: noise; not in the max.
    regret_same = {(c, m): [] for c in AUTOS for m in MODES}
    counted_max = {(c, m): [] for c in AUTOS for m in MODES}  # the regrets the max judges
    per_class = {(cls, c, m): [] for cls in CLASSES for c in AUTOS for m in MODES}
    first_calls = {(c, m): [] for c in AUTOS for m in MODES}
    no_baseline = []
    tables = {m: [] for m in MODES}
    for p in points:
        g, by = p["geometry"], p["by"]
        for mode in MODES:
            timed = {c: by[(c, mode)]["median_s"] for c in CONTENDERS
                     if "median_s" in by.get((c, mode), {})}
            best = min((timed[c] for c in BASELINES if c in timed), default=None)
            if best is None:
                no_baseline.append(f"{label(g)} {mode}")
            cells = {}
            for c in AUTOS:
                if c not in timed:
                    cells[c] = ("-", "-")
                    continue
                regret = timed[c] / best if best else None
                ratio = timed[c] / timed["tf"] if "tf" in timed else None
                # the baselines whose kernels auto's graph runs: a ratio to them is noise
                same_as = p.get("same_graph_as", {}).get(f"{c}|{mode}", [])
                if regret is not None:
                    regrets[(c, mode)].append(regret)
                    best_name = min((b for b in BASELINES if b in timed), key=timed.get)
                    if best_name in same_as and regret > TARGETS["vs_tf"]:
                        regret_same[(c, mode)].append(
                            f"{label(g)} ({regret:.2f}x, {best_name})")
                    else:
                        counted_max[(c, mode)].append(regret)
                    for cls in p["classes"]:
                        per_class[(cls, c, mode)].append(regret)
                if ratio is not None:
                    vs_tf[(c, mode)].append(ratio)
                    if ratio > TARGETS["vs_tf"]:
                        (over_tf_same if "tf" in same_as else over_tf)[(c, mode)].append(
                            f"{label(g)} ({ratio:.2f}x)")
                first = by[(c, mode)].get("first_call_s")
                if first is not None:
                    first_calls[(c, mode)].append(first)
                cells[c] = (f"{regret:.2f}" if regret else "-", f"{ratio:.2f}" if ratio else "-")
            auto_first = by.get(("auto", mode), {}).get("first_call_s")
            tables[mode].append(
                f"| {label(g)} | "
                + " | ".join(fmt_ms(by.get((c, mode))) for c in CONTENDERS)
                + f" | {fmt_s(auto_first)} | {cells['auto'][0]} | {cells['auto-est'][0]} | "
                  f"{cells['auto'][1]} | {cells['auto-est'][1]} | "
                  f"{choice_text(p['chosen_est'], mode)} | {choice_text(p['chosen_after'], mode)} |")

    summary = ["Regret = time / best of {tf, direct, fft} measured on the same geometry and "
               f"mode. Targets with autotuning on: median <= {TARGETS['median']}, 90th "
               f"percentile <= {TARGETS['p90']}, max <= {TARGETS['max']}, never > "
               f"{TARGETS['vs_tf']} x tf.", "",
               "| mode | contender | geometries | regret median | 90th pct | max | "
               "max without noise (see below) | "
               "time/tf max | geometries > 1.1 x tf (of those tf ran) | "
               "> 1.1 x tf running tf's own graph (not counted) | targets |",
               "|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode in MODES:
        for c in AUTOS:
            r, t, o = regrets[(c, mode)], vs_tf[(c, mode)], over_tf[(c, mode)]
            kept = counted_max[(c, mode)]
            summary.append(f"| {mode} | {c} | {len(r)} | {stats_line(r)} | "
                           f"{f'{max(kept):.2f}' if kept else '-'} | "
                           f"{f'{max(t):.2f}' if t else '-'} | {len(o)} of {len(t)} | "
                           f"{len(over_tf_same[(c, mode)])} | {regret_verdict(r, kept, o)} |")
    for mode in MODES:
        for c in AUTOS:
            if regret_same[(c, mode)]:
                summary.append(f"\n{c}, {mode}, regret > 1.1 but running the best contender's "
                               "own kernels (the same ops and algorithms; the ratio is the "
                               "machine's noise, left out of the max): "
                               + "; ".join(regret_same[(c, mode)]))
            if over_tf[(c, mode)]:
                summary.append(f"\n{c}, {mode}, > 1.1 x tf: " + "; ".join(over_tf[(c, mode)]))
            if over_tf_same[(c, mode)]:
                summary.append(f"\n{c}, {mode}, > 1.1 x tf but running the tf contender's own "
                               "graph (the same kernels; the ratio is the machine's noise): "
                               + "; ".join(over_tf_same[(c, mode)]))
    if no_baseline:
        summary.append("\nNo baseline ran (not counted): " + "; ".join(no_baseline))

    breakdown = ["| class | mode | geometries | auto median | auto 90th pct | auto max | "
                 "auto-est median | auto-est 90th pct | auto-est max |",
                 "|---|---|---|---|---|---|---|---|---|"]
    for cls in CLASSES:
        for mode in MODES:
            a, e = per_class[(cls, "auto", mode)], per_class[(cls, "auto-est", mode)]
            breakdown.append(f"| {cls} | {mode} | {len(a)} | {stats_line(a)} | {stats_line(e)} |")

    firsts = ["| mode | auto first call median s | max s | auto-est first call median s | "
              "max s | autotuning's cost (auto - auto-est) median s | max s |",
              "|---|---|---|---|---|---|---|"]
    med = lambda v: fmt_s(statistics.median(v)) if v else "-"
    mx = lambda v: fmt_s(max(v)) if v else "-"
    for mode in MODES:
        a, e = first_calls[("auto", mode)], first_calls[("auto-est", mode)]
        diff = []  # fwd: auto's forward pass was tuned in its fwd+bwd call, so no difference
        if mode == "fwd+bwd":
            diff = [p["by"][("auto", mode)]["first_call_s"] - p["by"][("auto-est", mode)]["first_call_s"]
                    for p in points
                    if all("first_call_s" in p["by"].get((c, mode), {}) for c in AUTOS)]
        firsts.append(f"| {mode} | {med(a)} | {mx(a)} | {med(e)} | {mx(e)} | {med(diff)} | {mx(diff)} |")
    firsts.append("\nFirst call = tracing + planning (+ autotuning for auto) + one run, after the "
                  "process's one-time costs were paid on a tiny convolution. auto's fwd+bwd first "
                  "call tunes all three passes cold (auto-est, traced before it, may have warmed "
                  "the planner for this geometry); auto's fwd first call comes after it and "
                  "reuses its forward pass's tuning.")

    head = ("| geometry | " + " | ".join(f"{c} ms" for c in CONTENDERS)
            + " | auto first call s | auto regret | auto-est regret | auto/tf | auto-est/tf | "
              "estimated choice | auto's choice (* measured) |")
    sep = "|" + "---|" * (len(CONTENDERS) + 8)
    detail = []
    for mode in MODES:
        detail += [f"#### {mode}", "", head, sep] + tables[mode] + [""]
    return summary, breakdown, firsts, detail


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help=f"{len(QUICK_LABELS)} geometries, 1 round")
    p.add_argument("--only", help="run only the geometries whose label contains this")
    p.add_argument("--random", metavar="SEED,COUNT",
                   help="instead of GRID, COUNT geometries drawn off it (random_grid)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--skip-s", type=float, default=10.0,
                   help="skip a forced contender whose planner estimate exceeds this")
    p.add_argument("--call-limit", type=float, default=10.0,
                   help="seconds one call of a forced contender may take; past it the "
                        "contender is left out and the geometry rerun")
    p.add_argument("--timeout", type=float, default=180,
                   help="per geometry worker, seconds; the contender it was running when "
                        "killed is left out and the geometry rerun")
    p.add_argument("--no-seed", action="store_true", help="leave out the seed-budget case")
    p.add_argument("--out", help="append the tables, with the command, to this file")
    p.add_argument("--json", help="write the raw results here")
    args = _harness.parse_args_or_work(p, worker)
    import tensorflow as tf
    if args.random:
        seed, count = (int(v) for v in args.random.split(","))
        grid = random_grid(seed, count)
    else:
        grid = [g for g in GRID if label(g) in QUICK_LABELS] if args.quick else GRID
    if args.only:
        grid = [g for g in grid if args.only in label(g)]
    rounds = 1 if args.quick else args.rounds
    # outside the repository, so that no run leaves a stray file in it
    progress_dir = tempfile.mkdtemp(prefix="bench_dispatch_")
    progress = os.path.join(progress_dir, "progress.json")
    points, errors, raw = [], [], []
    start = time.monotonic()
    for i, g in enumerate(grid):
        t0 = time.monotonic()
        res = run_geometry(g, args, rounds, progress)
        raw.append({"geometry": list(g), "label": label(g), **res})
        if "error" in res:
            print(f"{label(g)}: {res['error']}", file=sys.stderr)
            errors.append(f"{label(g)}: {res['error']}")
            continue
        by = {(r["contender"], r["mode"]): r for r in res["results"]}
        points.append({"geometry": g, "classes": classes(g), "by": by,
                       "chosen_est": res["chosen_est"], "chosen_after": res["chosen_after"],
                       "same_graph_as": res.get("same_graph_as", {})})
        cells = " ".join(f"{c}={fmt_ms(by.get((c, m)))}" for m in MODES for c in CONTENDERS)
        print(f"[{i + 1}/{len(grid)} {time.monotonic() - t0:.0f} s] {label(g)}: {cells}",
              file=sys.stderr)

    shutil.rmtree(progress_dir, ignore_errors=True)
    summary, breakdown, firsts, detail = summarize(points)
    seed_line, seed = "", None
    if not args.no_seed and not args.quick and not args.only and not args.random:
        seed_line, seed = seed_budget(args.timeout)
    _, _, header = _harness.run_header(tf.__version__)
    elapsed = f"Run time {(time.monotonic() - start) / 60:.1f} min, {len(grid)} geometries."
    body = "\n".join(summary + ["", "Per class (a geometry can be in several):", ""] + breakdown
                     + ["", "Autotuning's first-call cost:", ""] + firsts
                     + ([""] + ["Geometry errors: " + "; ".join(errors)] if errors else [])
                     + ([""] + [seed_line] if seed_line else []) + ["", elapsed, ""] + detail)
    _harness.publish(args, "bench_dispatch", header, body, {"grid": raw, "seed_budget": seed})


def seed_budget(timeout):
    """(markdown line, raw result) of the seed case under a 256 MiB workspace limit."""
    seed = _harness.run_worker(__file__, {"method": "seed_budget", "limit": 256 * MIB},
                               timeout=timeout)
    if "error" in seed:
        return f"Seed case with a 256 MiB budget: error {seed['error']}", seed
    allowed = (seed["in_bytes"] + seed["out_bytes"] + seed["limit"]) * 1.1
    line = (f"Seed case (200, 321, 481, 1) x (135, 135, 1, 3) VALID, auto, "
            f"workspace_limit 256 MiB: {seed['chosen']} ({seed['plan']}), "
            f"{1e3 * seed['median_s']:.0f} ms, peak RSS increase "
            f"{seed['rss_increase_bytes'] / MIB:.0f} MiB against the allowed "
            f"(in + out + 256 MiB) x 1.1 = {allowed / MIB:.0f} MiB: "
            f"{'met' if seed['rss_increase_bytes'] <= allowed else 'MISSED'}")
    return line, seed


if __name__ == "__main__":
    main()
