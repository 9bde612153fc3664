"""Peak memory, measured as subprocess RSS: the direct kernel allocates only
its small per-thread scratch beyond the output, and the FFT kernel stays
within output + workspace limit."""
import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    import tfbigconv
    fmt, algorithm, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
    shape, fshape = json.loads(sys.argv[4]), json.loads(sys.argv[5])
    if fmt == "NCHW":
        shape = (shape[0], shape[3], shape[1], shape[2])
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal(shape, dtype=np.float32))
    w = tf.constant(rng.standard_normal(fshape, dtype=np.float32))
    conv = lambda x: tfbigconv.bigconv2d(x, w, 1, "VALID", data_format=fmt, algorithm=algorithm,
                                         workspace_limit=limit)
    conv(x[:1]).numpy()  # warm up the runtime on one image
    def status(field):  # kB fields of /proc/self/status
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the peak (VmHWM) to the current RSS
    before = status("VmRSS")
    y = conv(x)
    peak = status("VmHWM")
    print(json.dumps({"increase": peak - before, "out_bytes": int(y.numpy().nbytes),
                      "in_bytes": int(x.numpy().nbytes)}))
""")


def measure(fmt, algorithm="direct", limit=0, shape=(64, 321, 481, 1), fshape=(15, 15, 1, 3)):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    args = [fmt, algorithm, str(limit), json.dumps(list(shape)), json.dumps(list(fshape))]
    out = subprocess.run([sys.executable, "-c", SCRIPT] + args, env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_direct_forward_peak_rss_is_output_plus_scratch():
    for fmt in ("NHWC", "NCHW"):
        r = measure(fmt)
        # The output itself is new memory; beyond it only per-thread scratch
        # (about 1 MiB a worker) and allocator slack: under 5% of the tensors.
        budget = r["out_bytes"] + 0.05 * (r["in_bytes"] + r["out_bytes"])
        assert r["increase"] <= budget, (fmt, r)


def test_fft_forward_peak_rss_within_workspace_limit():
    """The seed geometry at N=64 (135x135 filter) with a 24 MiB workspace limit."""
    limit = 24 << 20
    for fmt in ("NHWC", "NCHW"):
        r = measure(fmt, "fft", limit, fshape=(135, 135, 1, 3))
        budget = r["out_bytes"] + limit + 0.02 * (r["in_bytes"] + r["out_bytes"])
        assert r["increase"] <= budget, (fmt, r)


def test_auto_forward_chunks_to_stay_within_a_small_budget():
    """auto under an 8 MiB budget on the seed geometry at N=64: the planner
    picks fft, chunked a few images at a time, and the peak RSS stays
    within output + budget."""
    import tfbigconv
    limit = 8 << 20
    e = tfbigconv.explain((64, 321, 481, 1), (135, 135, 1, 3), padding="VALID", budget=limit)
    assert e.chosen["forward"] == "fft"
    fft = next(r for r in e.rows if r.pass_ == "forward" and r.algorithm == "fft")
    assert fft.workspace_bytes <= limit
    r = measure("NHWC", "auto", limit, fshape=(135, 135, 1, 3))
    assert r["increase"] <= r["out_bytes"] + limit + 0.02 * (r["in_bytes"] + r["out_bytes"]), r


GRAD_SCRIPT = textwrap.dedent("""
    import json
    import numpy as np
    import tensorflow as tf
    import tfbigconv
    limit = 512 << 20
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((2, 256, 256, 16), dtype=np.float32))
    w = tf.constant(rng.standard_normal((31, 31, 16, 16), dtype=np.float32))
    def step(x):
        with tf.GradientTape() as t:
            t.watch([x, w])
            y = tfbigconv.bigconv2d(x, w, 1, "SAME", workspace_limit=limit)
            loss = tf.reduce_sum(y * y)
        return [g.numpy() for g in t.gradient(loss, [x, w])]
    step(x[:1, :64, :64])  # warm up the runtime
    def status(field):
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status("VmRSS")
    dx, dw = step(x)
    peak = status("VmHWM")
    print(json.dumps({"increase": peak - before, "tensor_bytes": 3 * int(x.numpy().nbytes)
                      + int(dw.nbytes), "limit": limit}))
""")


def test_gradient_where_tf_needs_gigabytes_fits_512_mib():
    """TF's CPU backprop would allocate an im2col buffer of 256*256*31*31*16
    floats (about 4 GB) per image here; bigconv2d's forward and backward run
    within a 512 MiB workspace limit. Live tensors: y, dL/dy, dL/dx (each the
    size of x) and dL/dw."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, "-c", GRAD_SCRIPT], env=env, check=True,
                         capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    assert r["increase"] <= r["tensor_bytes"] + r["limit"] * 1.1, r
