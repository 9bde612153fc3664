"""Timing the candidates of a pass (autotune's measurements): measure() runs each
as a traced graph on random operands, interleaved, and keeps the last layer's
operands and graphs for its other timings. autotune decides what to time and
what the timings mean (docs/planner.md, section 5)."""
import math
import threading

import numpy as np
import tensorflow as tf

from tfbigconv import host, timer
from tfbigconv.planning import candidates

# The images timed (autotune.timing_batch), and the rounds of calls (measure).
TIMING_BATCH = 4
MIN_TIMED_S = 0.03
REPEAT_BELOW_S = 0.25
ABANDON_FACTOR = 3.0
# Never timed: a candidate estimated this x the best estimate
# (autotune.candidates_to_time). Called once only: one that ran this x the
# best measured so far (per image). TF's bfloat16 filter gradient of a 31x31
# 3->8 layer took 9 s a call where fft took 0.07 s (issue 59).
HOPELESS_FACTOR = 10.0
# ...where that call took this long: a shorter one may be one-time costs (a
# process's first calls of ours took 4-6 ms for 0.5 ms ones), and is cheap to repeat.
HOPELESS_ABOVE_S = 0.025
MIN_ROUNDS = 2
MAX_ROUNDS = 6
EXTRA_ROUNDS_BELOW_S = 0.1
# Rounds past MIN_ROUNDS time only the candidates within this factor of the
# quickest: a gap this wide after three or more calls each does not close with
# more (millisecond calls spread 10-20%), and the extra rounds were half of a
# first call's autotuning (a 7x7 16->16 layer: 24 calls per pass, 12 with this).
CLEAR_FACTOR = 1.25
# Before MIN_ROUNDS, after the first round (a warm-up call and one more each),
# candidates this far behind the quickest are out. Wider than CLEAR_FACTOR: a
# second call still carried up to 25% of one-time costs (a direct forward:
# 10.5, 4.3, 3.4 ms). On a 21x21 8->8 layer the two gradients' round 2, which
# only confirmed a 2.2x gap, was 14% of the layer's autotuning.
EARLY_CLEAR_FACTOR = 1.6
# The pass name of the two gradient passes timed together; a candidate there
# is a pair "dL/dinput's+dL/dfilter's" (autotune.TF_PAIR: TF's two kernels).
GRADIENTS = "gradients"

_lock = threading.Lock()
# The random operands of the last layer timed, kept for its other passes, its
# gradient pair and its re-timings: making them took 30-50 ms a time for a
# 4-image 64x64x64 input, about a fifth of a layer's first-call autotuning.
# Only operands up to OPERANDS_KEPT_BYTES are kept (they live until the next
# layer's, or autotune.clear_memory()).
OPERANDS_KEPT_BYTES = 64 << 20
_operands = {}        # {(shapes, dtype, device): (x, w, dy)}, at most one entry
# The candidates' traced graphs on those operands, for the layer's re-timings
# (confirmation, widening, another pass's probe): traced
# again, each paid its tracing and a new graph's first call (3-6 ms) anew.
_traced = {}          # {(pass, candidate, images, layer): tf.function}


def clear():
    """Forgets the kept operands and traced graphs."""
    with _lock:
        _operands.clear()
        _traced.clear()


@tf.autograph.experimental.do_not_convert
def measure(pass_, names, input_shape, filter_shape, attrs, dtype, device, order=None,
            workspace_limit=0, batch=None, budget_s=None, per_image_s=None, probe=()):
    """{candidate: seconds} for one pass, timed on random data of `batch` images
    (default TIMING_BATCH) and scaled to the real batch. With budget_s, no call starts once the calls have
    taken that long, and with per_image_s ({candidate: estimated seconds per
    image}) a candidate after the first is not started when its estimated call
    is over what is left; a candidate never called gets math.inf. A candidate in
    `probe` (one whose estimate is not trusted) first runs on one image; if its
    call on all of them would then overrun the budget, or be HOPELESS_FACTOR x
    the quickest so far, that probe is its time. A candidate whose first call
    took HOPELESS_FACTOR x the quickest so far (per image) is not called again.

    Each candidate runs as its own traced graph (_pass_fn) on `device`, outside
    any tf.function being traced.
    """
    full = input_shape[0]  # dimension 0 in NHWC and NCHW
    small = max(1, min(full, batch or TIMING_BATCH))
    shape = [small] + list(input_shape[1:])
    with host.eager_scope(), host.without_graph_optimizer(), tf.device(f"/{device}:0"):
        a = dict(attrs, algorithm="auto", workspace_limit_bytes=int(workspace_limit))
        y_shape = candidates.output_shape(shape, filter_shape, a)
        x, w, dy, kept = _timing_operands(shape, filter_shape, y_shape, dtype, device)
        # The shapes too: another thread's layer may have replaced the operands meanwhile.
        layer = (tuple(shape), tuple(filter_shape), str(dtype), device,
                 tuple(sorted((k, repr(v)) for k, v in a.items())))

        def traced(name, k):
            """`name`'s pass on the first k images, traced once per layer where the
            operands are kept."""
            key = (pass_, name, k, layer)
            with _lock:
                fn = _traced.get(key) if kept else None
            if fn is None:
                xk, dyk = (x[:k], dy[:k]) if k < small else (x, dy)
                fn = _pass_fn(pass_, name, xk, w, dyk, a, device)
                if kept:
                    with _lock:
                        _traced[key] = fn
            return fn

        order = list(order or names)
        count = {n: small for n in order}  # images per call: 1 for a probed one
        calls = {n: traced(n, small) for n in order}

        spent = [0.0]

        def timed(name, call=None):
            """Seconds of one call of `name` (or of `call`, e.g. its probe), counted as spent."""
            took = timer.call_seconds(call or calls[name])
            spent[0] += took
            return took

        def over(name=None):
            expected = (per_image_s or {}).get(name, 0.0) * count.get(name, 0)
            return budget_s is not None and spent[0] + expected >= budget_s

        best = {}  # name -> shortest call so far
        probed = set()  # judged on a one-image call: not called again
        # Speeds compare per image: a probed candidate ran one; costs
        # (REPEAT_BELOW_S, EXTRA_ROUNDS_BELOW_S) are the calls' own.
        per_batch = lambda n: best[n] * small / count[n]  # noqa: E731

        def hopeless(took, images):
            """Whether a call of `images` images that took `took` ran HOPELESS_FACTOR
            x the quickest so far."""
            return (bool(best) and took >= HOPELESS_ABOVE_S and took * small / images
                    >= HOPELESS_FACTOR * min(map(per_batch, best)))

        for name in order:  # warm-up, in the order of the estimates
            if best and over(name):
                continue
            if name in probe and small > 1 and budget_s is not None:
                took = timed(name, traced(name, 1))
                if spent[0] + took * small >= budget_s or hopeless(took, 1):
                    best[name], count[name] = took, 1
                    probed.add(name)
                    continue
            best[name] = timed(name)
        # Called once only: what ran HOPELESS_FACTOR x the quickest.
        probed |= {n for n in best if hopeless(best[n], count[n])}
        # A first run can carry one-time costs (TF's kernel setup added 8-20 ms
        # to 7-14 ms gradients on 4 images; a process's first calls of ours
        # 4-6 ms to 0.5 ms), so a cheap candidate is not abandoned on its
        # warm-up alone: it gets one more call first. Until no more does: a
        # second call that lowers the quickest can make others look slow.
        called_twice = set()
        while True:
            quickest = min(map(per_batch, best))
            again = [n for n in best if n not in called_twice | probed
                     and ABANDON_FACTOR * quickest <= per_batch(n) and best[n] < REPEAT_BELOW_S]
            if not again or over():
                break
            for name in again:
                best[name] = min(best[name], timed(name))
                called_twice.add(name)
        # Then interleaved rounds, one call of each candidate per round, so that a
        # burst of load on the machine hits all of them alike; the shortest call
        # counts. Candidates whose calls took REPEAT_BELOW_S, or ABANDON_FACTOR x
        # the best, are not repeated. Rounds go on past MIN_ROUNDS while they are
        # cheap (short calls are the noisy ones), up to MAX_ROUNDS, among the
        # candidates within CLEAR_FACTOR of the quickest while two are left.
        quickest = min(map(per_batch, best))
        again = [n for n in best if n not in probed
                 and best[n] < REPEAT_BELOW_S and per_batch(n) < ABANDON_FACTOR * quickest]
        rounds_spent = 0.0
        for r in range(MAX_ROUNDS if again else 0):
            # Each round drops the candidates that the last one showed to be
            # ABANDON_FACTOR x the quickest: warm-up calls carry one-time costs
            # (3-13 ms on 5-20 ms calls) that hide a gap the first round shows.
            quickest = min(map(per_batch, best))
            again = [n for n in again if per_batch(n) < ABANDON_FACTOR * quickest]
            if r >= 1:  # before MIN_ROUNDS, only what is clearly behind is out
                clear = CLEAR_FACTOR if r >= MIN_ROUNDS else EARLY_CLEAR_FACTOR
                again = [n for n in again if per_batch(n) < clear * quickest]
                if len(again) < 2 or (r >= MIN_ROUNDS and rounds_spent >= EXTRA_ROUNDS_BELOW_S):
                    break
            for name in again[r % len(again):] + again[:r % len(again)]:
                if over():
                    break
                t = timed(name)
                rounds_spent += t
                best[name] = min(best[name], t)
    return {name: per_batch(name) * full / small if name in best else math.inf
            for name in order}


def _timing_operands(shape, filter_shape, y_shape, dtype, device):
    """(x, w, dy, kept): random operands of these shapes and dtype on `device`,
    the same values each time; the last layer's are kept (OPERANDS_KEPT_BYTES),
    and with them its traced candidates (_traced)."""
    key = (tuple(shape), tuple(filter_shape), tuple(y_shape), str(dtype), device)
    with _lock:
        if key in _operands:
            return _operands[key] + (True,)
    rng = np.random.default_rng(0)
    # Uniform in [-1, 1): a quarter of the time of normal values to make.
    x, w, dy = (tf.cast(tf.constant(2 * rng.random(s, dtype=np.float32) - 1), dtype)
                for s in (shape, filter_shape, y_shape))
    size = sum(math.prod(s) for s in (shape, filter_shape, y_shape)) * x.dtype.size
    kept = size <= OPERANDS_KEPT_BYTES
    with _lock:
        _operands.clear()
        _traced.clear()
        if kept:
            _operands[key] = (x, w, dy)
    return x, w, dy, kept


def _pass_fn(pass_, name, x, w, dy, a, device):
    """One candidate's pass as a traced graph, as it runs under tf.function or
    Keras (for GRADIENTS, both gradient passes of the pair `name` in one graph).
    Timed eagerly instead, TF's kernels paid ~0.2 ms more Python per call
    than ours, which decided sub-millisecond passes (a 14x14 depthwise forward:
    fft won eagerly, ran at 1.7x TF's time in the user's graph)."""
    if pass_ == GRADIENTS:
        bpi, bpf = name.split("+")
        body = lambda: (candidates.run_pass("backprop_input", bpi, x, w, dy, a, device),  # noqa: E731
                        candidates.run_pass("backprop_filter", bpf, x, w, dy, a, device))
    else:
        body = lambda: candidates.run_pass(pass_, name, x, w, dy, a, device)  # noqa: E731
    fn = tf.function(body, autograph=False)
    fn.get_concrete_function()  # trace now: tracing is not timed
    return fn
