"""A subprocess that runs probes of tfbigconv for tests/test_robustness.py.

Reads one JSON probe per line from stdin and writes one JSON line per probe:
{"outcome": "ok", ...} or {"outcome": "<exception type name>", "message": ...}.
A probe that kills the process (SIGFPE, SIGSEGV, abort) shows to the caller as
a dead worker, so a crash fails a test instead of killing pytest.

Probe kinds:
  run       bigconv2d eagerly on random data (and tf.nn.conv2d on the same data)
  trace     bigconv2d traced in a tf.function on static shapes (no data: any size)
  grad      run, plus both gradients of sum(output * random)
  explain   tfbigconv.explain
  tf_shape  the shape eager tf.nn.conv2d returns, or its error: the shape oracle,
            asked of a worker started with TF_ENABLE_ONEDNN_OPTS=0 (see _compare)
"""
import json
import os
import sys
import traceback
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
warnings.simplefilter("ignore")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfbigconv  # noqa: E402

ACCEPTED = (tf.errors.InvalidArgumentError, tf.errors.ResourceExhaustedError)


def _data(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _tf_result(fn):
    try:
        return fn()
    except Exception:  # TF refuses some cases we run (and crashes on none we probe)
        return None


def _compare(ours, theirs, *shapes):
    """Shape, and values where TF ran; None if they agree, else what differs."""
    if theirs is None:
        return None
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    if any(0 in list(s) for s in shapes + (ours.shape, theirs.shape)):
        # TF 2.21 leaves some results of empty tensors uninitialised, and its
        # oneDNN Conv2D (on by default on Intel hosts) returns the input as the
        # "result" of an empty output: input (1, 1, 4, 1), filter (2, 2, 1, 1),
        # VALID gives (1, 1, 4, 1), where TF's own kernels give (1, 0, 3, 1).
        # The tests check empty shapes against TF's own kernels (kind tf_shape).
        return None
    if ours.shape != theirs.shape:
        return f"shape {ours.shape} != tf.nn.conv2d's {theirs.shape}"
    if ours.size and not np.allclose(ours, theirs, rtol=1e-4, atol=1e-4 * np.abs(theirs).max()):
        return f"values differ from tf.nn.conv2d's: max abs diff {np.abs(ours - theirs).max()}"
    return None


def run_probe(p):
    kind = p["kind"]
    kwargs = dict(strides=p["strides"], padding=p["padding"], data_format=p["data_format"],
                  dilations=p["dilations"])
    ours_kwargs = dict(kwargs, algorithm=p["algorithm"], workspace_limit=p["workspace_limit"])
    if kind == "tf_shape":
        x, w = tf.zeros(p["input"]), tf.zeros(p["filter"])
        return {"outcome": "ok", "shape": list(tf.nn.conv2d(x, w, **kwargs).shape)}
    if kind == "explain":
        e = tfbigconv.explain(p["input"], p["filter"], budget=p["budget"],
                              algorithm=p["algorithm"], **kwargs)
        str(e)
        return {"outcome": "ok"}
    if kind == "trace":
        reached = []

        def conv(x, w):
            reached.append(True)
            return tfbigconv.bigconv2d(x, w, **ours_kwargs)

        try:
            cf = tf.function(conv).get_concrete_function(tf.TensorSpec(p["input"]),
                                                         tf.TensorSpec(p["filter"]))
        except Exception:
            if reached:
                raise
            return {"outcome": "not_reached"}  # TensorFlow refused the shapes themselves
        return {"outcome": "ok", "shape": cf.output_shapes.as_list()}
    x, w = _data(p["input"], 0), _data(p["filter"], 1)
    y = tfbigconv.bigconv2d(x, w, **ours_kwargs)
    diff = _compare(y, _tf_result(lambda: tf.nn.conv2d(x, w, **kwargs)), p["input"], p["filter"])
    if kind == "grad":
        x, w = tf.constant(x), tf.constant(w)
        dy = tf.constant(_data(y.shape, 2))

        def grads(conv):
            with tf.GradientTape() as tape:
                tape.watch([x, w])
                loss = tf.reduce_sum(conv(x, w) * dy)
            return tape.gradient(loss, [x, w])

        dx, dw = grads(lambda x, w: tfbigconv.bigconv2d(x, w, **ours_kwargs))
        ref = _tf_result(lambda: grads(lambda x, w: tf.nn.conv2d(x, w, **kwargs)))
        for ours, theirs in zip((dx, dw), ref or (None, None)):
            diff = diff or _compare(ours, theirs, p["input"], p["filter"], y.shape)
    return {"outcome": "ok", "shape": list(y.shape), "differs": diff}


def _raised_by_bigconv2d(e):
    """Whether tfbigconv's argument checks raised `e` (tf.nn.conv2d's ValueError
    or TypeError), not a stray error from deeper down. Traced in a tf.function,
    the error TF re-raises quotes the frame it came from."""
    frames = traceback.extract_tb(e.__traceback__)
    # bigconv2d (ops/conv2d.py), the front end that validates for every rank
    # (ops/conv.py) and the parsing of its arguments (arguments.py)
    checks = (os.path.join("tfbigconv", "ops", "conv2d.py"),
              os.path.join("tfbigconv", "ops", "conv.py"),
              os.path.join("tfbigconv", "arguments.py"))
    return bool(frames) and frames[-1].filename.endswith(checks) or (
        "in user code" in str(e) and any(c in str(e).rsplit("File ", 1)[-1] for c in checks))


def main():
    for line in sys.stdin:
        p = json.loads(line)
        try:
            result = run_probe(p)
        except ACCEPTED as e:
            result = {"outcome": type(e).__name__, "message": e.message}
        except Exception as e:  # noqa: BLE001 - reported, and the test fails on it
            result = {"outcome": type(e).__name__, "message": str(e)[:500],
                      "from_bigconv2d": _raised_by_bigconv2d(e)}
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
