"""TF's own Conv2D workspace per pass, as a new user would see it: the growth of
the process's peak RSS over one call of each pass, in a fresh subprocess per
pass and oneDNN setting (TF_ENABLE_ONEDNN_OPTS=0/1), minus the pass's output.

    python benchmarks/tf_workspace_rss.py [--shape 1,321,481,1 --filter 135,135,1,3]

Prints one line per (oneDNN, pass) with the measured bytes and tfbigconv's
estimate of TF's workspace for that pass (explain's tf.Conv2D row), and a
JSON list of both on the last line. The default case is README's opening one:
one 321x481 frame and the 135x135x1x3 filter, VALID.
"""
import argparse
import json
import os
import subprocess
import sys

PASSES = ("forward", "backprop_input", "backprop_filter")

# One pass in this subprocess: argv = pass, input shape, filter shape, padding.
CHILD = r"""
import json, resource, sys
import numpy as np, tensorflow as tf
pass_, x_shape, f_shape, padding = sys.argv[1], *(json.loads(a) for a in sys.argv[2:4]), sys.argv[4]
x = tf.constant(np.random.default_rng(0).random(x_shape, np.float32))
w = tf.constant(np.random.default_rng(1).random(f_shape, np.float32))
a = dict(strides=[1, 1, 1, 1], padding=padding)
y_shape = tf.raw_ops.Conv2D(input=x[:, :f_shape[0], :f_shape[1]], filter=w, **a).shape  # warms TF up
y_shape = [x_shape[0]] + [(n - k + 1 if padding == "VALID" else n) for n, k in zip(x_shape[1:3], f_shape[:2])] + [f_shape[3]]
dy = tf.constant(np.random.default_rng(2).random(y_shape, np.float32))
call = {"forward": lambda: tf.raw_ops.Conv2D(input=x, filter=w, **a),
        "backprop_input": lambda: tf.raw_ops.Conv2DBackpropInput(
            input_sizes=x_shape, filter=w, out_backprop=dy, **a),
        "backprop_filter": lambda: tf.raw_ops.Conv2DBackpropFilter(
            input=x, filter_sizes=f_shape, out_backprop=dy, **a)}[pass_]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
out = call().numpy()
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"growth": after - before, "output": out.nbytes}))
"""

ESTIMATE = r"""
import json, sys
import tfbigconv
x_shape, f_shape, padding = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
e = tfbigconv.explain(x_shape, f_shape, padding=padding, autotune=False)
print(json.dumps({r.pass_: r.workspace_bytes for r in e.rows if r.algorithm.startswith("tf.")}))
"""


def run(code, args, onednn):
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=str(int(onednn)), TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run([sys.executable, "-c", code] + args, env=env, capture_output=True,
                       text=True)
    if r.returncode:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1,321,481,1")
    parser.add_argument("--filter", default="135,135,1,3")
    parser.add_argument("--padding", default="VALID")
    parser.add_argument("--no-estimate", action="store_true",
                        help="measure only (no tfbigconv import)")
    args = parser.parse_args()
    x_shape = json.dumps([int(v) for v in args.shape.split(",")])
    f_shape = json.dumps([int(v) for v in args.filter.split(",")])
    results = []
    for onednn in (False, True):
        estimate = {} if args.no_estimate else run(ESTIMATE, [x_shape, f_shape, args.padding],
                                                   onednn)
        for pass_ in PASSES:
            m = run(CHILD, [pass_, x_shape, f_shape, args.padding], onednn)
            workspace = max(0, m["growth"] - m["output"])
            results.append(dict(onednn=onednn, pass_=pass_, measured=workspace,
                                estimate=estimate.get(pass_)))
            est = estimate.get(pass_)
            print(f"oneDNN {'on ' if onednn else 'off'} {pass_:15s} measured {workspace / 2**20:9.1f} MiB"
                  f"  estimate {'-' if est is None else f'{est / 2**20:9.1f} MiB'}", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
