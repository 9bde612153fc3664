"""Estimates that travel: the shipped CPU profile, scaled to this host.

A host without its own profile (`python -m tfbigconv calibrate`) plans with the
shipped one nearest to it (profiles.shipped_for), measured on another CPU. The
first CPU plan in such a process times a few fixed forward convolutions, one
per group of the model's CPU constants (PROBES), in about a second, divides
each by the shipped profile's estimate of it and scales that group by the
ratio: our direct kernel's constants, the FFT's, TF's Conv2D rates and TF's
depthwise rates; and the forward half-precision slowdowns of TF's kernels by
the measured ones over the profile's (they moved most between CPUs: the
shipped EPYC has no AVX512-FP16). The gradients' slowdowns stay the
profile's: they do not follow the forward's (oneDNN's float16 depthwise filter
gradient ran 130x its forward here, against 3-8x on the EPYC), and timing them
would take seconds. The scaled profile is written to the user's cache
(profiles.scaled_path) and loaded in later processes instead of the shipped one while
the CPU, TensorFlow, oneDNN setting and shipped profile are the same.

The scaling keeps the profile's shape (how the rates vary with filter side,
channels and pass) and moves its level, which is what differed most between
hosts. TFBIGCONV_PROBE=0 turns it off, the cache included.
"""
import datetime
import os
import threading
import time

import numpy as np
import tensorflow as tf
from absl import logging

from tfbigconv import _core, host, kernels
from tfbigconv.cost_model import profiles

ATTRS = dict(strides=[1, 1, 1, 1], explicit_paddings=[], data_format="NHWC",
             dilations=[1, 1, 1, 1], padding="SAME")

# (group, input NHWC, filter HWIO, dtype): one forward convolution per group,
# each some milliseconds on a 2-core host. A group's ratio is measured /
# estimated; the half-precision groups' is their slowdown over the float32 case
# of the same kernel, against the profile's. Our direct kernel has two: a
# depthwise layer (no compute-bound term: its ratio scales the load-bound rate
# and the per-element and per-call costs), then a dense one (what is left of
# its time scales the compute rate). One ratio for both was off 1.7x on
# depthwise layers here (the dense kernel ran 0.53x the shipped estimate, the
# depthwise one 0.88-1.0x).
PROBES = (
    ("direct_depthwise", (8, 56, 56, 128), (7, 7, 1, 128), "float32"),
    ("direct", (8, 64, 64, 32), (7, 7, 32, 32), "float32"),
    ("fft", (4, 96, 96, 16), (31, 31, 16, 16), "float32"),
    ("Conv2D", (8, 64, 64, 32), (5, 5, 32, 32), "float32"),
    ("DepthwiseConv2dNative", (8, 56, 56, 128), (7, 7, 1, 128), "float32"),
    ("Conv2D", (8, 64, 64, 32), (5, 5, 32, 32), "float16"),
    ("Conv2D", (8, 64, 64, 32), (5, 5, 32, 32), "bfloat16"),
    ("DepthwiseConv2dNative", (8, 56, 56, 128), (7, 7, 1, 128), "float16"),
    ("DepthwiseConv2dNative", (8, 56, 56, 128), (7, 7, 1, 128), "bfloat16"),
)
# A ratio is clamped to [1 / MAX_RATIO, MAX_RATIO]: a host under load can time
# one call many times too slow, and a bounded error is what the estimates can
# carry (autotuning times the near ties).
MAX_RATIO = 16.0
# Each probe's time: the fastest of CALLS calls in each of ROUNDS round-robin
# rounds, after a warm-up call. The first calls in a fresh process ran up to
# 30% off the steady state (TF's depthwise slower, our direct kernel faster).
ROUNDS = 3
CALLS = 3

_lock = threading.Lock()
_tried = False


def needed():
    """Whether this process plans with a shipped profile measured on another kind of host."""
    return profiles.active_source == "shipped" and bool(profiles.machine_mismatch())


def ensure():
    """Scales the active shipped profile to this host once per process where
    needed() (and profiles.scaling_enabled()); a no-op otherwise. Never raises: a probe that
    fails leaves the shipped profile active and says why at INFO."""
    global _tried
    if _tried or not profiles.scaling_enabled():
        return
    with _lock:
        if _tried:
            return
        _tried = True
        if not needed():
            return
        try:
            fit()
        except Exception as e:  # noqa: BLE001 (the shipped profile still plans)
            logging.info("tfbigconv: could not scale the cost model to this host (%s: %s); "
                         "planning with %s", type(e).__name__, e, profiles.active_path)


def fit(path=None):
    """Times PROBES, writes the scaled profile to `path` (scaled_path()) and
    makes it the active one. Returns {group: ratio}."""
    t0 = time.perf_counter()
    fields = _core.cost_model_fields()
    base = dict(zip(fields, _core.get_cost_model()))
    seconds = {}
    with host.eager_scope(), tf.device("/CPU:0"):
        calls = {}
        for group, x, w, dtype in PROBES:
            try:
                fn = _call(group, x, w, dtype)
                fn()  # warm-up: TF's kernels compile and cache their primitives
                calls[group, dtype] = fn
            except (tf.errors.OpError, ValueError) as e:  # that group stays unscaled
                logging.info("tfbigconv: probe %s %s failed: %s", group, dtype, e)
        for _ in range(ROUNDS):  # round-robin, so that a slow moment spreads over all
            for key, fn in calls.items():
                t = _fastest(fn)
                seconds[key] = min(t, seconds.get(key, t))
    ratios = {}
    for group, x, w, dtype in PROBES:  # in order: direct_depthwise before direct
        if (group, dtype) not in seconds or (group, "float32") not in seconds:
            continue
        t = seconds[group, dtype]
        if dtype != "float32":  # the slowdown measured here over the profile's
            key = f"{group}.{dtype}"
            ratio = t / seconds[group, "float32"] / base[_slowdown_field(group, dtype)]
        elif group == "direct":  # the compute term, the rest as direct_depthwise scaled it
            key, terms = group, _estimate(group, x, w, dtype, terms=True)
            rest = ratios.get("direct_depthwise", 1.0) * sum(terms[1:])
            ratio = (t - rest) / terms[0]
        else:
            key, ratio = group, t / _estimate(group, x, w, dtype)
        ratios[key] = float(np.clip(ratio, 1 / MAX_RATIO, MAX_RATIO))
    values = scale(base, ratios)
    cpu = profiles.this_cpu()
    meta = dict(created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                machine=f"{cpu['name']}, {cpu['cpus']} CPUs", cpu=cpu,
                tensorflow=tf.__version__, tf_onednn=host.tf_onednn(),
                scaled_from=profiles.base_identity(profiles.active_path, profiles.active_meta),
                probe=ratios, probe_seconds=round(time.perf_counter() - t0, 3),
                probe_ms={f"{g}.{d}": round(t * 1e3, 3) for (g, d), t in seconds.items()})
    for key in ("gpu_grids",):
        if key in profiles.active_meta:
            meta[key] = profiles.active_meta[key]
    path = path or profiles.scaled_path()
    ordered = [values[name] for name in fields]
    from tfbigconv import _native  # the op library, loaded: planning ran
    profiles.apply(ordered, _native.LIB_PATH)
    try:
        profiles.write_profile(path, ordered, meta)
        where = f"cached in {path}"
    except OSError as e:
        path, where = None, f"not cached ({e})"
    profiles.set_active("scaled", path, meta)
    logging.info("tfbigconv: %s, in %.1f s; %s", profiles.how_fitted(meta),
                 meta["probe_seconds"], where)
    return ratios


def scale(values, ratios):
    """The profile `values` ({field: value}) with each group's time scaled by
    its ratio (a ratio r makes the group's estimates r times longer)."""
    out = dict(values)
    for name, v in values.items():
        r = _ratio_of(name, ratios)
        if r is None:
            continue
        out[name] = v / r if "flops_per_second" in name else v * r
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
    for group, prefix in zip(("Conv2D", "DepthwiseConv2dNative"), profiles.DTYPE_SLOWDOWNS):
        if name.startswith(prefix + "forward."):  # the gradients' slowdowns are not probed
            return ratios.get(f"{group}.{name.rsplit('.', 1)[1]}")
    return None


def _slowdown_field(group, dtype):
    prefix = profiles.DTYPE_SLOWDOWNS[0 if group == "Conv2D" else 1]
    return f"{prefix}forward.{dtype}"


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
        return p[algorithm]["seconds"]
    values = dict(zip(_core.cost_model_fields(), _core.get_cost_model()))
    per_term = (1 / values["direct_flops_per_second"],
                1 / values["direct_load_bound_flops_per_second"],
                values["direct_seconds_per_output"], values["direct_seconds_per_packed"],
                values["direct_seconds_per_call"])
    return [t * c for t, c in zip(p["direct"]["terms"], per_term)]


def _call(group, x_shape, w_shape, dtype):
    """A callable running one probe's forward pass on random operands."""
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal(x_shape, np.float32), dtype)
    w = tf.constant(rng.standard_normal(w_shape, np.float32), dtype)
    if group.startswith("direct") or group == "fft":
        from tfbigconv._native import ops as native
        a = dict(ATTRS, algorithm="fft" if group == "fft" else "direct", workspace_limit_bytes=0)
        return lambda: native.big_conv2d(x, w, **a).numpy()
    depthwise = group == "DepthwiseConv2dNative"
    return lambda: kernels.tf_forward(x, w, ATTRS, depthwise=depthwise).numpy()


def _fastest(fn):
    times = []
    for _ in range(CALLS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)
