"""The one timer: seconds of calls that wait for their results. Autotuning's
measure (planning/timing.py), calibrate, the probe (cost_model/) and
fuse_linear's measure= (keras/fuse_model.py) all time with it. It sits at the
top level, below both planning/ and cost_model/ (planning imports cost_model)."""
import math
import time

import tensorflow as tf


def call_seconds(fn):
    """Seconds of one call of fn(), until its results (any nest of tensors) are on
    the host: a device runs asynchronously, and the call alone would time the launch."""
    start = time.perf_counter()
    for t in tf.nest.flatten(fn()):
        if hasattr(t, "numpy"):
            t.numpy()
    return time.perf_counter() - start


def calls_seconds(fn, calls, warm_up=True, alone_above_s=math.inf, enough_s=math.inf,
                  share_s=math.inf):
    """[seconds of each call] of fn() (call_seconds).

    First a warm-up call, not counted (one-time costs: TF's kernels compile and
    cache their primitives), unless not `warm_up`; a warm-up over
    `alone_above_s` is the only call, and its time the only one returned. Then
    up to `calls` calls, stopping once two or more have taken `enough_s` in
    all, or once one or more and the warm-up have taken `share_s`."""
    spent = call_seconds(fn) if warm_up else 0.0
    if spent > alone_above_s:
        return [spent]
    times = []
    while len(times) < calls and (sum(times) < enough_s or len(times) < 2):
        if times and spent + sum(times) >= share_s:
            break
        times.append(call_seconds(fn))
    return times
