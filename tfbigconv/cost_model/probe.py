"""Estimates that travel: the shipped CPU profile, scaled to this host.

A host without its own profile (`python -m tfbigconv calibrate`) plans with the
shipped one nearest to it (profiles.shipped_for), measured on another CPU. The
first CPU plan in such a process times a few fixed convolutions, about a
second, and scales the profile by measured over estimated: each group's level
from one float32 forward layer (LEVEL_PROBES: our direct kernel's constants,
the FFT's, TF's Conv2D rates and TF's depthwise rates), and each of TF's
half-precision slowdowns, per kernel and pass, from the slowdown measured on
a small layer (SLOWDOWN_PROBES). The scaled profile is written to the user's
cache (profiles.scaled_path) and loaded in later processes instead of the
shipped one while the CPU, TensorFlow, oneDNN setting and shipped profile are
the same.

The scaling keeps the profile's shape (how the rates vary with filter side,
channels and pass) and moves its level, which is what differed most between
hosts. A busy moment can time a probe twice too slow, and a cached profile
would keep that: the first PROBE_RUNS processes each probe, and each probe's
time is the fastest any of them measured. TFBIGCONV_PROBE=0 turns it off, the
cache included.
"""
import datetime
import threading
import time

import numpy as np
import tensorflow as tf
from absl import logging

from tfbigconv import _core, host, timer
from tfbigconv.arguments import PASSES
from tfbigconv.cost_model import calibrate, profiles

ATTRS = dict(strides=[1, 1, 1, 1], explicit_paddings=[], data_format="NHWC",
             dilations=[1, 1, 1, 1], padding="SAME")

# (group, input NHWC, filter HWIO): the level of each group, one float32
# forward convolution each, some milliseconds on a 2-core host; its ratio is
# measured / estimated. Our direct kernel has two: a depthwise layer (no
# compute-bound term: its ratio scales the load-bound rate and the per-element
# and per-call costs), then a dense one (what is left of its time scales the
# compute rate). One ratio for both was off 1.7x on depthwise layers here (the
# dense kernel ran 0.45-0.53x the shipped estimate, the depthwise one 0.7-0.9x).
LEVEL_PROBES = (
    ("direct_depthwise", (8, 56, 56, 128), (7, 7, 1, 128)),
    ("direct", (8, 64, 64, 32), (7, 7, 32, 32)),
    ("fft", (4, 96, 96, 16), (31, 31, 16, 16)),
    ("Conv2D", (8, 64, 64, 32), (5, 5, 32, 32)),
    ("DepthwiseConv2dNative", (8, 56, 56, 128), (7, 7, 1, 128)),
)
# (TF's kernel, input, filter): the half-precision slowdowns of TF's kernels,
# every pass in float32 and each half type; a ratio is the slowdown measured
# here over the profile's (<prefix><pass>.<dtype>). They moved most between
# CPUs: on the Xeon (AVX512-FP16, AMX) oneDNN's float16 depthwise forward ran
# 0.9x its float32 time where the EPYC profile has 13x, and its float16
# depthwise filter gradient 30-130x (the profile: 3-8x). Smaller layers than
# the levels': a slow gradient is timed a few times only (SLOW_CALL_S).
SLOWDOWN_PROBES = (
    ("Conv2D", (4, 32, 32, 32), (5, 5, 32, 32)),
    ("DepthwiseConv2dNative", (4, 28, 28, 128), (7, 7, 1, 128)),
)
HALF_TYPES = profiles.HALF_TYPES
# The profile's slowdown fields of each of TF's kernels: <prefix><pass>.<dtype>.
SLOWDOWN_PREFIX = dict(zip(("Conv2D", "DepthwiseConv2dNative"), profiles.DTYPE_SLOWDOWNS))
# A ratio is clamped to [1 / MAX_RATIO, MAX_RATIO]: a host under load can time
# one call many times too slow, and a bounded error is what the estimates can
# carry (autotuning times the near ties). oneDNN's float16 filter gradients
# ran 60-330x their float32 time here, 20-100x over the profile's slowdowns.
MAX_RATIO = 64.0
# Each probe's time: the fastest of CALLS calls after a warm-up call, all in a
# row. Interleaved with other probes (round-robin), our direct kernel ran up to
# 4x slower right after TF's kernels on 2 cores: the threads of the kernel
# before still spin for a while after it returns, and a warm-up absorbs that.
CALLS = 7
# A probe whose warm-up call took over this is timed once more only, and not
# at all (its warm-up is the measurement) once the probes have spent BUDGET_S;
# past it, the probes left are not run (their ratios are left out, their
# constants the profile's). oneDNN's float16 Conv2D filter gradient took 0.3 s
# a call here.
SLOW_CALL_S = 0.02
BUDGET_S = 1.8
# Processes that probe (the first ones on a host, while the cache holds fewer
# runs); a probe's time is the fastest of theirs. Our dense direct probe once
# timed 22.8 ms (the fastest of 7 calls) where four later runs took 11.1-11.9,
# which put every direct estimate 2.3x too slow in the cache.
PROBE_RUNS = 3

_lock = threading.Lock()
_tried = False


def needed():
    """Whether this process plans with a shipped profile measured on another kind
    of host, or with a scaled one from fewer than PROBE_RUNS processes' probes."""
    if profiles.active_source == "scaled":
        return _runs(profiles.active_meta) < PROBE_RUNS
    return profiles.active_source == "shipped" and bool(profiles.machine_mismatch())


def _runs(meta):
    return int(meta.get("probe_runs", 1))


def ensure():
    """Scales the active shipped profile to this host once per process where
    needed() and profiles.scaling_enabled(); a no-op otherwise. Never raises:
    a probe that fails leaves the shipped profile active and says why at INFO."""
    global _tried
    if _tried or not profiles.scaling_enabled():
        return
    with _lock:
        if _tried:
            return
        _tried = True
        if not needed():
            return
        before = (_core.get_cost_model(), profiles.active_source, profiles.active_path,
                  profiles.active_meta)
        try:
            fit()
        except Exception as e:  # noqa: BLE001 (the profile before still plans)
            try:
                from tfbigconv import _native
                profiles.apply(before[0], _native.LIB_PATH)
            except Exception:  # noqa: BLE001 (fit failed before changing the model)
                pass
            profiles.set_active(*before[1:])
            logging.info("tfbigconv: could not scale the cost model to this host (%s: %s); "
                         "planning with %s", type(e).__name__, e, profiles.active_path)


def _probes():
    """{key: (input, filter)} of every timing fit() takes, in order: the
    levels' keys (group, "forward", "float32"), then the slowdowns' (TF's
    kernel, pass, dtype, "slowdown")."""
    out = {(group, "forward", "float32"): (x, w) for group, x, w in LEVEL_PROBES}
    for kernel, x, w in SLOWDOWN_PROBES:
        for pass_ in PASSES:
            for dtype in ("float32",) + HALF_TYPES:
                out[kernel, pass_, dtype, "slowdown"] = (x, w)
    return out


def fit(path=None):
    """Times the probes, writes the scaled profile to `path`
    (profiles.scaled_path()) and makes it the active one. Returns {group: ratio}.
    Where the active profile is a scaled one (an earlier process's probes), it
    scales the shipped profile it came from by the faster of each probe's
    times, theirs or this process's."""
    t0 = time.perf_counter()
    fields = _core.cost_model_fields()
    gpu_grids = profiles.active_meta.get("gpu_grids")  # where the GPU values (kept) came from
    earlier = {}
    if profiles.active_source == "scaled":
        earlier = {k: v / 1e3 for k, v in profiles.active_meta.get("probe_ms", {}).items()}
        runs = _runs(profiles.active_meta) + 1
        shipped_path = profiles.shipped_for_host()
        shipped, shipped_meta = profiles.read_profile_and_meta(shipped_path,
                                                               profiles.shipped_values())
        from tfbigconv import _native
        profiles.apply(shipped, _native.LIB_PATH)  # the estimates the ratios divide
        profiles.set_active("shipped", shipped_path, shipped_meta)
    else:
        runs = 1
    base = dict(zip(fields, _core.get_cost_model()))
    probes = _probes()
    seconds = {}
    with host.eager_scope(), tf.device("/CPU:0"):
        for key, (x, w) in probes.items():
            if time.perf_counter() - t0 > BUDGET_S:  # the rest are left out
                logging.info("tfbigconv: probe spent %.1f s; %s and the rest not timed",
                             time.perf_counter() - t0, key[:3])
                break
            try:
                seconds[key] = _time(_call(key[0], key[1], x, w, key[2]),
                                     time.perf_counter() - t0)
            except (tf.errors.OpError, ValueError) as e:  # that ratio is left out
                logging.info("tfbigconv: probe %s failed: %s", key[:3], e)
    for key in probes:  # the faster of this process's time and the earlier ones'
        before = earlier.get(".".join(key))
        if before is not None:
            seconds[key] = min(seconds.get(key, before), before)
    ratios = {}
    for group, x, w in LEVEL_PROBES:  # in order: direct_depthwise before direct
        t = seconds.get((group, "forward", "float32"))
        if t is None:
            continue
        if group == "direct":  # the compute term, the rest as direct_depthwise scaled it
            terms = _estimate(group, x, w, "float32", terms=True)
            ratio = (t - ratios.get("direct_depthwise", 1.0) * sum(terms[1:])) / terms[0]
        else:
            ratio = t / _estimate(group, x, w, "float32")
        ratios[group] = _clip(ratio)
    for kernel, _, _ in SLOWDOWN_PROBES:
        for pass_ in PASSES:
            f32 = seconds.get((kernel, pass_, "float32", "slowdown"))
            for dtype in HALF_TYPES:
                t = seconds.get((kernel, pass_, dtype, "slowdown"))
                if t is not None and f32 is not None:
                    field = _slowdown_field(kernel, pass_, dtype)
                    ratios[f"{kernel}.{pass_}.{dtype}"] = _clip(t / f32 / base[field])
    values = scale(base, ratios)
    cpu = profiles.this_cpu()
    meta = dict(created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                machine=f"{cpu['name']}, {cpu['cpus']} CPUs", cpu=cpu,
                tensorflow=tf.__version__, tf_onednn=host.tf_onednn(),
                scaled_from=profiles.base_identity(profiles.active_path, profiles.active_meta),
                probe=ratios, probe_seconds=round(time.perf_counter() - t0, 3),
                probe_runs=runs,
                probe_ms={".".join(k): round(t * 1e3, 3) for k, t in seconds.items()})
    path = path or profiles.scaled_path()
    ordered = [values[name] for name in fields]
    from tfbigconv import _native  # the op library, loaded: planning ran
    profiles.apply(ordered, _native.LIB_PATH)
    try:
        profiles.write_profile(path, ordered, meta, cpu_only=True)  # GPU values: the main's
        where = f"cached in {path}"
    except OSError as e:
        path, where = None, f"not cached ({e})"
    if gpu_grids:
        meta.update(gpu_grids=gpu_grids)
    profiles.set_active("scaled", path, meta)
    logging.info("tfbigconv: %s, in %.1f s; %s", profiles.how_fitted(meta),
                 meta.get("probe_seconds"), where)
    return ratios


def scale(values, ratios):
    """The profile `values` ({field: value}) with each group's time scaled by
    its ratio (a ratio r makes the group's estimates r times longer)."""
    out = dict(values)
    for name, v in values.items():
        r = _ratio_of(name, ratios)
        if r is None:
            continue
        out[name] = v / r if profiles.is_rate(name) else v * r
    return out


def _ratio_of(name, ratios):
    """The ratio that scales field `name`, or None (GPU fields, TF's channel blocks)."""
    if name == "direct_flops_per_second":
        return ratios.get("direct")
    if name.startswith("direct_"):
        return ratios.get("direct_depthwise", ratios.get("direct"))
    if name.startswith("fft_"):
        return ratios.get("fft")
    if name.startswith("im2col_flops_per_second."):
        return ratios.get("Conv2D")
    if name.startswith((profiles.DEPTHWISE_TABLE, profiles.MULTIPLIER_TABLE)):
        return ratios.get("DepthwiseConv2dNative")
    for kernel, prefix in SLOWDOWN_PREFIX.items():
        if name.startswith(prefix):  # <prefix><pass>.<dtype>
            return ratios.get(f"{kernel}.{name[len(prefix):]}")
    return None


def _clip(ratio):
    return float(np.clip(ratio, 1 / MAX_RATIO, MAX_RATIO))


def _slowdown_field(kernel, pass_, dtype):
    return f"{SLOWDOWN_PREFIX[kernel]}{pass_}.{dtype}"


def _estimate(group, x, w, dtype, terms=False):
    """The active profile's estimate (seconds) of one probe's forward pass; with
    `terms`, our direct kernel's as its model's five parts (cost_model.h: the
    compute-bound, load-bound, per-output, per-packed and per-call seconds)."""
    algorithm = "direct" if group.startswith("direct") else group if group == "fft" else "tf"
    kernel = "" if algorithm != "tf" else group
    p = _core.plan_pass(list(x), list(w), padding=ATTRS["padding"], pass_="forward",
                        dtype=dtype, device="CPU", algorithm=algorithm, workspace_limit=0,
                        workers=host.current().threads(), tf_kernel=kernel,
                        strides=ATTRS["strides"], explicit_paddings=[],
                        data_format="NHWC", dilations=ATTRS["dilations"])
    if not terms:
        return getattr(p, algorithm).seconds
    values = dict(zip(_core.cost_model_fields(), _core.get_cost_model()))
    return [t * profiles.coefficient(name, values[name])
            for t, name in zip(p.direct.terms, profiles.DIRECT_TERMS)]


def _call(group, pass_, x_shape, w_shape, dtype):
    """A callable running one probe's pass on random operands: calibrate's,
    run eagerly (tracing each would take a fifth of the probe's time)."""
    if group.startswith("direct") or group == "fft":  # float32 only, as calibrate times them
        return calibrate.kernel_fn("fft" if group == "fft" else "direct", pass_, x_shape,
                                   w_shape, ATTRS["padding"], graph=False)
    if group == "DepthwiseConv2dNative":  # in TF's filter form [KH, KW, C, multiplier]
        return calibrate.depthwise_fn(pass_, x_shape, (w_shape[0], w_shape[1], w_shape[3], 1),
                                      ATTRS["padding"], tf.as_dtype(dtype), graph=False)
    return calibrate.im2col_fn(pass_, x_shape, w_shape, ATTRS["padding"], tf.as_dtype(dtype),
                               graph=False)


def _time(fn, spent_s=0.0):
    """The fastest of CALLS calls of fn after a warm-up call; of one more call
    if the warm-up took over SLOW_CALL_S; of none (the warm-up's time) once the
    probe has spent BUDGET_S (`spent_s` so far)."""
    first = timer.call_seconds(fn)  # warm-up: TF's kernels compile and cache their primitives
    if first > SLOW_CALL_S and spent_s + first > BUDGET_S:
        return first
    return min(timer.calls_seconds(fn, 1 if first > SLOW_CALL_S else CALLS, warm_up=False))
