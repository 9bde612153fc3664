"""Measured choices: where the planner's estimates cannot be trusted, time the candidates once.

The rules (which candidates are timed, on how many images, how often, how a
winner is chosen and confirmed, the gradient pair timed together, the cache
and its key) are stated once, in docs/planner.md section 5; the constants
below carry the measurements behind them. In short: candidates within
NEAR_FACTOR of the best estimate, and TF's kernel where its estimate is not
trusted, but none estimated at HOPELESS_FACTOR x the best or more, run as
traced graphs on a reduced batch, interleaved; the fastest
wins unless TF's kernel (then direct, then fft: PREFERENCE) is within
TF_MARGIN of it; the result is remembered in memory and in a JSON cache
(TFBIGCONV_AUTOTUNE_CACHE). TFBIGCONV_AUTOTUNE=0 turns it off.
"""
import functools
import hashlib
import json
import math
import os
import threading
import time
import warnings

import tensorflow as tf
from absl import logging

from tfbigconv import host, version
from tfbigconv.arguments import Algorithm
from tfbigconv.cost_model import profiles
from tfbigconv.planning import timing
from tfbigconv.planning.timing import (GRADIENTS, HOPELESS_FACTOR, MIN_ROUNDS, MIN_TIMED_S,
                                       TIMING_BATCH, measure)

ENV_AUTOTUNE = "TFBIGCONV_AUTOTUNE"
ENV_CACHE = "TFBIGCONV_AUTOTUNE_CACHE"
# 2: dilated depthwise gradients' TF kernel became DepthwiseConv2dNative
# (SpaceToBatchND); format 1 timed grouped Conv2D under the same key.
# 3: so did their forward pass from a dilated side of 15.
FORMAT = 3
# The calibrated CPU model's estimates are within 0.5-1.6x of the measured
# times (RESULTS.md, calibration fit), so two candidates whose estimates are
# within 3x of each other can be in either order.
NEAR_FACTOR = 3.0
# Our kernel replaces TF's only when measured this much faster: nearer than
# that, timings here do not tell them apart (millisecond calls spread 10-20%
# between runs), and TF's kernel is the baseline auto must not lose to by
# more than 10% (issue 11). A wrong call then costs at most this factor.
TF_MARGIN = 1.1
# On a near tie (within TF_MARGIN) the first of these wins: TF's kernel, the
# baseline; then direct, whose sums are exact where the true output is 0,
# while the FFT's rounding error, up to about 3e-7 x max|y| in float32,
# lands on every output (README, "Odd input"; a 2x2 filter once went to fft
# at 0.484 ms against direct's 0.487 ms).
PREFERENCE = ("tf", "direct", "fft")
# A pass whose timing is expected to take (or took) longer than this says so in
# one INFO line on absl's log (docs/planner.md, section 5).
ANNOUNCE_ABOVE_S = 1.0
# A pass's timing stops calling candidates once it has spent its budget:
# max(MIN_BUDGET_S, BUDGET_FACTOR x the best estimate on the timing batch x the
# candidates timed), or TFBIGCONV_AUTOTUNE_BUDGET seconds. A call under way is
# not interrupted, so a candidate whose estimated call alone is over what is
# left is not started (TF's depthwise input gradient with a 16384-tap 1-D
# filter, estimated at 1.9 s on one image, took 80 s); candidates not called
# count as not timed (infinitely slow).
ENV_BUDGET = "TFBIGCONV_AUTOTUNE_BUDGET"
MIN_BUDGET_S = 0.5
BUDGET_FACTOR = 3.0
# A measured win over TF's kernel by less than this is timed a second time.
CONFIRM_BELOW = 2.0
CANDIDATES = ("tf", "direct", "fft")
# A gradient pair "dL/dinput's+dL/dfilter's" (timing.GRADIENTS); TF_PAIR is TF's two kernels.
TF_PAIR = "tf+tf"

_lock = threading.Lock()
_memory = {}          # key -> {"chosen": ..., "seconds": {...}}
_loaded_path = None   # the cache file _memory was read from


def enabled(override=None):
    """Whether autotuning runs: `override` if given, else TFBIGCONV_AUTOTUNE (on unless "0")."""
    if override is not None:
        return bool(override)
    return os.environ.get(ENV_AUTOTUNE, "1").strip() not in ("0", "false", "False", "off")


def can_measure(device):
    """Whether `device` is here to time on: an op planned for the GPU (an
    explicit tf.device scope) on a machine without one runs on the CPU, whose
    timings must not stand for the GPU's (nor can every GPU candidate run there)."""
    return device != "GPU" or host.current().has_gpu()


def cache_path():
    return os.environ.get(ENV_CACHE) or os.path.join(
        os.path.dirname(profiles.user_path()), "autotune.json")


def _version():
    """What a cache entry must have been timed by: the package version and the
    compiled libraries (build_id), so that a rebuild of the kernels times again."""
    return f"{version.__version__}+{build_id()}"


@functools.lru_cache(maxsize=None)
def build_id():
    """A digest of the compiled libraries' bytes (the op library, whose kernels
    are timed, and _core, whose planner sized them), read once per process
    (17 MB: about 30 ms); "none" where they did not load (pure TensorFlow)."""
    digest = hashlib.blake2b(digest_size=8)
    found = False
    for path in library_paths():
        try:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            found = True
        except OSError:
            continue
    return digest.hexdigest() if found else "none"


def library_paths():
    """The files of the compiled libraries this process loaded."""
    from tfbigconv import _core, _native
    paths = [getattr(_native, "LIB_PATH", None), getattr(_core, "__file__", None)]
    return [p for p in paths if isinstance(p, str)]


def _load(path, warn=True):
    """The valid entries of a cache file ({} if missing); warns about what it ignores."""
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            doc = json.load(f)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"not an autotune cache of format {FORMAT}")
        entries = doc.get("entries")
        if not isinstance(entries, dict):
            raise ValueError("no entries")
    except (OSError, ValueError) as e:
        if warn:
            warnings.warn(f"tfbigconv: ignoring autotune cache {path}: {e}", stacklevel=2)
        return {}
    good, stale = {}, 0
    for key, e in entries.items():
        ok = (isinstance(e, dict) and e.get("version") == _version()
              and isinstance(e.get("seconds"), dict)
              and all(_valid_name(n) and isinstance(v, (int, float))
                      for n, v in e["seconds"].items())
              and e.get("chosen") in e["seconds"])
        if ok:
            good[key] = e
        else:
            stale += 1
    if stale and warn:
        warnings.warn(f"tfbigconv: ignoring {stale} stale or invalid entries of autotune cache {path}",
                      stacklevel=2)
    return good


def _valid_name(name):
    """A candidate ("tf", "direct", "fft") or a gradient pair of two ("direct+tf")."""
    parts = name.split("+") if isinstance(name, str) else []
    return len(parts) in (1, 2) and all(n in CANDIDATES for n in parts)


def _lookup(key):
    global _loaded_path, _memory
    with _lock:
        path = cache_path()
        if _loaded_path != path:
            _memory = _load(path)
            _loaded_path = path
        return _memory.get(key)


def _store(key, entry):
    """Remembers an entry and rewrites the cache file (atomically; failures only warn)."""
    with _lock:
        _memory[key] = entry
        path = cache_path()
        try:
            # Entries other processes added since; what _lookup warned about stays out.
            on_disk = _load(path, warn=False) if os.path.exists(path) else {}
            on_disk[key] = entry
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump({"format": FORMAT, "entries": on_disk}, f, indent=1)
            os.replace(tmp, path)
        except OSError as e:
            warnings.warn(f"tfbigconv: could not write autotune cache {path}: {e}", stacklevel=2)


def clear_memory():
    """Forgets the in-process entries (the next lookup re-reads the cache file)."""
    global _loaded_path
    with _lock:
        _memory.clear()
        _loaded_path = None
    timing.clear()


def _key(pass_, input_shape, filter_shape, attrs, dtype, device, workspace_limit):
    # TF's CPU kernels are other code with oneDNN on or off (TF_ENABLE_ONEDNN_OPTS).
    onednn = host.current().runs_onednn() if device != "GPU" else None
    return json.dumps([pass_, list(input_shape), list(filter_shape), attrs["strides"],
                       attrs["padding"], attrs["explicit_paddings"], attrs["data_format"],
                       attrs["dilations"], dtype, _device_name(device), host.current().threads(),
                       int(workspace_limit), onednn])


def _device_name(device):
    """The device kind in a key: "CPU", or the GPU's model name."""
    if device != "GPU":
        return "CPU"
    gpus = tf.config.list_physical_devices("GPU")
    details = tf.config.experimental.get_device_details(gpus[0]) if gpus else {}
    return "GPU:" + str(details.get("device_name", "unknown"))


def _eligible(p):
    """The candidates of a planned pass that may run for auto: available, fitting,
    and neither TF's kernel nor fft where it is excluded for precision
    (tf_rules' verdict "never"; the planner's precision rule, fft "for_auto")."""
    return [n for n in CANDIDATES if p.estimate(n).available and p.estimate(n).fits
            and (n != "tf" or p.tf_for_auto != "never") and p.estimate(n).for_auto]


def candidates_to_time(p):
    """The candidates worth timing for a planned pass (see the module docstring)."""
    ok = _eligible(p)
    trusted = [n for n in ok if n != "tf" or p.tf_trusted]
    if not trusted:
        return []
    est = {n: p.estimate(n).seconds for n in ok}
    best = min(est[n] for n in trusted)
    # Nothing estimated HOPELESS_FACTOR x the best is timed (issue 59: TF's
    # bfloat16 filter gradient, estimated 5x fft's, took 9 s a call to time).
    ok = [n for n in ok if hopeful(est[n], best)]
    # An untrusted TF estimate is timed however low it is.
    chosen = [n for n in ok if est[n] <= NEAR_FACTOR * best or (n == "tf" and n not in trusted)]
    ours = [n for n in ok if n != "tf"]
    if "tf" in ok and "tf" in trusted and ours:
        # TF's kernel and ours come from different models; across them an
        # estimate has been off by up to ~40x (calibrated profile, dense
        # Conv2D with few channels), so the two meet on the clock while both
        # are hopeful.
        mine = min(ours, key=est.get)
        chosen += [n for n in ("tf", mine) if n not in chosen]
    return chosen if len(chosen) > 1 else []


def hopeful(estimate_s, best_estimate_s):
    """Whether a candidate estimated at `estimate_s` may be timed beside the best
    estimate: under HOPELESS_FACTOR x it."""
    return estimate_s < HOPELESS_FACTOR * best_estimate_s


def widened(p, seconds):
    """The eligible candidates not in `seconds` ({name: measured seconds}) whose
    estimates are within NEAR_FACTOR of the measured best: the ones the
    estimates would have timed had the best's estimate been right; never a
    hopeless one (hopeful)."""
    best = min(seconds.values())
    est = {n: p.estimate(n).seconds for n in _eligible(p)}
    floor = min(est.values())
    return [n for n in est if n not in seconds and est[n] <= NEAR_FACTOR * best
            and hopeful(est[n], floor)]


@tf.autograph.experimental.do_not_convert
def refine(p, input_shape, filter_shape, attrs, dtype, device, workspace_limit, enabled=None):
    """Plan `p` with the measured fastest candidate chosen where timing is warranted."""
    if not globals()["enabled"](enabled) or not can_measure(device):
        return p  # the estimates decide (and cached measurements, see cached())
    names = candidates_to_time(p)
    if not names:
        return p
    key = _key(p.pass_, input_shape, filter_shape, attrs, dtype, device, workspace_limit)
    entry = _lookup(key)
    if not _covers(entry, names):
        est = {n: p.estimate(n).seconds for n in names}
        best_estimate = min(est[n] for n in names if n != "tf" or p.tf_trusted)
        batch = timing_batch(input_shape[0], best_estimate)

        budget = budget_seconds(best_estimate * batch / max(input_shape[0], 1), len(names))
        untrusted = not p.tf_trusted
        start = time.perf_counter()

        def timed(these):
            left = budget - (time.perf_counter() - start)
            if left <= 0:  # spent: what was timed decides
                return {}
            # In the order of the estimates, but an untrusted TF kernel last: it
            # may win only when timed fastest, so it must not spend the budget
            # before the others run (TF's float16 NCHW input gradient, estimated
            # lowest from a float16 slowdown measured in NHWC, took 1.4 s on one
            # image; fft and direct, never called, lost to it at 1.4 s a step).
            return measure(p.pass_, these, input_shape, filter_shape, attrs, dtype, device,
                           order=sorted(these, key=lambda n: (n == "tf" and untrusted,
                                                              p.estimate(n).seconds)),
                           workspace_limit=workspace_limit, batch=batch,
                           budget_s=left,
                           per_image_s={n: p.estimate(n).seconds / max(input_shape[0], 1)
                                        for n in these},
                           probe={"tf"} if untrusted else ())

        expected = expected_seconds(p, names, input_shape[0], batch)
        if expected > ANNOUNCE_ABOVE_S:
            _announce(p, names, device, batch, f"about {expected:.1f} s", budget)
        seconds = confirmed(timed(names), timed)
        more = widened(p, seconds)
        if more:  # timed beside the winner so far, in one session
            seconds = confirmed(retimed(seconds, timed([fastest(seconds)] + more)), timed)
        entry = {"chosen": fastest(seconds), "seconds": seconds,
                 "version": _version()}
        _store(key, entry)
        took = time.perf_counter() - start
        if took > ANNOUNCE_ABOVE_S and expected <= ANNOUNCE_ABOVE_S:
            _announce(p, names, device, batch, f"took {took:.1f} s", budget)
    return _apply(p, entry)


def expected_seconds(p, names, full_batch, batch):
    """What timing `names` should cost, from their estimates: the warm-up and
    MIN_ROUNDS more calls of each, on `batch` images."""
    return (1 + MIN_ROUNDS) * sum(p.estimate(n).seconds * batch / max(full_batch, 1)
                                  for n in names)


def budget_seconds(best_on_batch_s, count):
    """A pass's timing budget: TFBIGCONV_AUTOTUNE_BUDGET seconds if set (a positive
    number), else max(MIN_BUDGET_S, BUDGET_FACTOR x the best estimate on the timing
    batch x the `count` candidates timed)."""
    value = os.environ.get(ENV_BUDGET, "").strip()
    if value:
        try:
            budget = float(value)
            if budget > 0 and math.isfinite(budget):
                return budget
        except ValueError:
            pass
        warnings.warn(f"tfbigconv: ignoring {ENV_BUDGET}={value!r} (not a positive number "
                      "of seconds)", stacklevel=2)
    return max(MIN_BUDGET_S, BUDGET_FACTOR * best_on_batch_s * count)


def _announce(p, names, device, batch, cost, budget):
    """The one INFO line of a pass whose autotuning takes over ANNOUNCE_ABOVE_S."""
    why = ("TF's kernel's estimate is not trusted" if "tf" in names and not p.tf_trusted
           else f"their estimates are within {NEAR_FACTOR:g}x")
    logging.info("tfbigconv: autotuning %s on %s: timing %s on %d images (%s, budget %.1f s: "
                 "%s), because %s; the result is cached in %s (TFBIGCONV_AUTOTUNE=0 turns "
                 "autotuning off)", p.pass_, device, ", ".join(names), batch, cost, budget,
                 ENV_BUDGET, why, cache_path())


def cached(p, input_shape, filter_shape, attrs, dtype, device, workspace_limit):
    """Like refine(), from the cache alone: never times anything."""
    names = candidates_to_time(p)
    if not names:
        return p
    entry = _lookup(_key(p.pass_, input_shape, filter_shape, attrs, dtype, device,
                         workspace_limit))
    return _apply(p, entry) if _covers(entry, names) else p


def _covers(entry, names):
    """Whether a cache entry (or None) timed every one of `names`."""
    return entry is not None and set(names) <= set(entry["seconds"])


def _apply(p, entry):
    """Plan `p` as a cache entry's timings decide it."""
    names = [n for n in _eligible(p) if n in entry["seconds"]]  # widened() ones too
    seconds = {n: entry["seconds"][n] for n in names}
    chosen = Algorithm(fastest(seconds))
    best = min(seconds, key=seconds.get)
    verdict = ("measured fastest" if chosen == best else
               f"kept: {best} measured less than {TF_MARGIN:g}x faster")
    return p.replace(measured=dict(entry["seconds"]), chosen=chosen,
                     reason=(f"auto: {chosen} {verdict} ("
                             + ", ".join(f"{n} {_ms(entry['seconds'][n])}" for n in names)
                             + f"); estimates: {p.reason}"))


def _ms(seconds):
    return f"{seconds * 1e3:.3g} ms" if math.isfinite(seconds) else "not timed (budget spent)"


def fastest(seconds, preference=PREFERENCE):
    """The measured winner of {candidate: seconds}: the fastest, except that the
    first of `preference` (for gradient pairs: (TF_PAIR,)) within TF_MARGIN of
    it wins the near tie."""
    best = min(seconds, key=seconds.get)
    for name in preference:
        if name in seconds and seconds[name] <= TF_MARGIN * seconds[best]:
            return name
    return best


def confirmed(seconds, timed):
    """`seconds` once every narrow win over TF's kernel has held a second time.

    While fastest(seconds) is one of ours that beat "tf" by less than
    CONFIRM_BELOW x, timed(["tf", winner]) times the two again and its numbers
    replace theirs, so that fastest() on the result is the decision: the win
    stands only if it holds again. Each candidate is confirmed at most once."""
    done = set()
    while True:
        winner = fastest(seconds)
        if (winner == "tf" or "tf" not in seconds or winner in done
                or seconds["tf"] >= CONFIRM_BELOW * seconds[winner]):
            return seconds
        seconds = retimed(seconds, timed(["tf", winner]))
        done.add(winner)


def retimed(seconds, again):
    """`seconds` with the candidates that a second timing called replaced by its
    numbers. One it did not call (math.inf: the budget was spent) keeps its first
    time: a win over TF's kernel by 1.5x was lost when its confirmation, left 3 ms
    of budget, called TF's kernel first and never the winner."""
    return dict(seconds, **{n: t for n, t in again.items() if math.isfinite(t)})


def pairs_to_time(bpi, bpf):
    """[TF_PAIR, the chosen pair] when the gradient passes' choices (planned
    passes, after refine) are to be timed together (see the module
    docstring), else []."""
    chosen = (bpi.chosen, bpf.chosen)
    measured = (bpi.measured or {}, bpf.measured or {})
    if chosen == ("tf", "tf") or not all("tf" in m and c in m for m, c in zip(measured, chosen)):
        return []
    if not all("tf" in _eligible(p) for p in (bpi, bpf)):
        return []  # TF's pair could not run for auto (a cache from before may hold its times)
    theirs = sum(m["tf"] for m in measured)
    ours = sum(m[c] for m, c in zip(measured, chosen))
    return [TF_PAIR, "+".join(chosen)] if theirs < CONFIRM_BELOW * ours else []


@tf.autograph.experimental.do_not_convert
def refine_gradients(bpi, bpf, input_shape, filter_shape, attrs, dtype, device, workspace_limit,
                     enabled=None):
    """After refine() on both gradient passes: the chosen pair stands only if
    it beats TF's two kernels timed together (pairs_to_time), else both passes
    go to TF's kernels. Returns the two plans."""
    if not globals()["enabled"](enabled) or not can_measure(device):
        return bpi, bpf
    names = pairs_to_time(bpi, bpf)
    if not names:
        return bpi, bpf
    key = _key(GRADIENTS, input_shape, filter_shape, attrs, dtype, device, workspace_limit)
    entry = _lookup(key)
    if not _covers(entry, names):
        ours = sum(p.measured[p.chosen] for p in (bpi, bpf))
        seconds = measure(GRADIENTS, names, input_shape, filter_shape, attrs, dtype, device,
                          workspace_limit=workspace_limit,
                          batch=timing_batch(input_shape[0], ours))
        entry = {"chosen": fastest(seconds, (TF_PAIR,)), "seconds": seconds, "version": _version()}
        _store(key, entry)
    return _apply_gradients(bpi, bpf, names, entry)


def cached_gradients(bpi, bpf, input_shape, filter_shape, attrs, dtype, device, workspace_limit):
    """Like refine_gradients(), from the cache alone: never times anything."""
    names = pairs_to_time(bpi, bpf)
    if not names:
        return bpi, bpf
    entry = _lookup(_key(GRADIENTS, input_shape, filter_shape, attrs, dtype, device,
                         workspace_limit))
    return _apply_gradients(bpi, bpf, names, entry) if _covers(entry, names) else (bpi, bpf)


def _apply_gradients(bpi, bpf, names, entry):
    """The two gradient plans as a cache entry's timings of the pairs decide them."""
    seconds = {n: entry["seconds"][n] for n in names}
    winner = fastest(seconds, (TF_PAIR,))
    together = "timed together: " + ", ".join(f"{n} {t * 1e3:.3g} ms" for n, t in seconds.items())
    out = []
    for p, name in zip((bpi, bpf), winner.split("+")):
        if p.chosen == name:
            reason = p.reason + f"; the gradient pair {winner} held when {together}"
        else:
            reason = (f"auto: {name}: the gradient pair {names[1]} won pass by pass but was "
                      f"not {TF_MARGIN:g}x faster than TF's kernels when {together}; "
                      f"pass alone: {p.reason}")
        out.append(p.replace(chosen=Algorithm(name), reason=reason, measured_together=seconds))
    return tuple(out)


def timing_batch(batch, best_estimate_s):
    """The images to time on (see the module docstring)."""
    if batch <= TIMING_BATCH:
        return max(batch, 1)
    per_image = max(best_estimate_s, 1e-9) / batch
    return int(min(batch, max(TIMING_BATCH, math.ceil(MIN_TIMED_S / per_image))))
