"""Forward + backward: bigconv2d's registered gradients against TensorFlow's own and against
an FFT convolution in pure TF differentiated by autodiff. float32, NHWC, stride 1.

One timed call is a training step's convolution work, materialised:

    with tf.GradientTape() as tape:
        tape.watch(x); tape.watch(w)
        loss = tf.reduce_sum(tf.square(conv(x, w)))
    dx, dw = tape.gradient(loss, [x, w]); dx.numpy(); dw.numpy()

Cases (--quick N in brackets; --cases picks some):

    seed       input (16, 321, 481, 1), filter (135, 135, 1, 3), VALID           [N=2]
               tf.nn.conv2d (both rows) runs at N=2 [1], its time scaled linearly to N=16.
    depthwise  input (8, 56, 56, 128), filter (31, 31, 1, 128), SAME             [N=2]
               bigconv2d grouped (groups = 128) against tf.nn.depthwise_conv2d with the
               same weights reshaped to (31, 31, 128, 1); the pure-TF FFT is per channel.
    dense      input (4, 128, 128, 32), filter (31, 31, 32, 32), SAME            [N=1]
    memory     input (2, 256, 256, 16), filter (31, 31, 16, 16), SAME            [N=1]
               bigconv2d auto with workspace_limit=512 MiB against tf.nn.conv2d, whose
               own CPU backprops (oneDNN off) build an im2col buffer of
               out_h*out_w*kh*kw*cin*4 bytes per image (about 3.75 GiB here).

Contenders, each (case, contender) in fresh subprocesses (machinery: _harness.py):

    auto          tfbigconv.bigconv2d(..., algorithm="auto"); the algorithm it picked for
                  each pass (forward, backprop input, backprop filter) is read from the
                  op's VLOG(1) line during the first full call and shown under the table
    fft, direct   tfbigconv.bigconv2d(..., algorithm="fft" / "direct")
    tf            tf.nn.conv2d (tf.nn.depthwise_conv2d for depthwise) and TF's gradients,
                  as installed (this TF build runs its CPU convolutions through oneDNN
                  unless TF_ENABLE_ONEDNN_OPTS=0; the JSON records which, as "onednn")
    tf_nodnn      the same with TF_ENABLE_ONEDNN_OPTS=0 in the worker: TF's own kernels,
                  whose backprops build the im2col buffer (time and memory differ a lot)
    tf_fft        bench_seed.tf_fft_conv2d (rfft2d, einsum, irfft2d, crop; SAME padded
                  explicitly), tf_fft_depthwise below for depthwise; TF autodiff

Each worker warms up on a tiny case of the same contender, resets the peak RSS, takes the
first full call's peak RSS increase as the contender's memory (outputs, gradients, tape
and workspace), then times --reps more calls (3 at most when a call takes over 2 s, and
no more than fit in 75% of --timeout; with none, the first call's time is reported and
marked "first call only"). Each (case, contender) runs in --rounds subprocesses,
interleaved with the other contenders; the smallest median counts; one that failed is
not run again. A subprocess that runs past --timeout or whose RSS goes over --max-rss-gib
(read every 0.1 s) is killed and reported as such with the largest RSS seen.

Columns: "peak RSS / (in+out+filter)" is the peak RSS increase over the bytes of input,
output and filter of that run; the autodiff step holds at least y, the loss's
output-sized temporaries, dx and dw, so even a workspace-free method is above 1.
"auto speedup" is the contender's time (scaled to the case's N) over bigconv2d auto's,
from the same run. "rel L2 dx / dw" is ||g - ref|| / ||ref|| of the contender's whole
gradients against a float64 numpy FFT reference of the same batch (reference_grads
below: y by FFT correlation, dx by FFT convolution of dL/dy = 2y with w, dw by FFT
correlation of x with dL/dy); a wrong contender shows as a large value. Before
measuring, a self-check compares reference_grads and the pure-TF FFT gradients with
TensorFlow's own on small odd shapes (dense VALID and SAME, depthwise SAME) and stops if
any is off by more than 1e-5.

Usage:
    python benchmarks/bench_grad.py [--quick] [--cases seed,depthwise,dense,memory]
        [--reps 5] [--rounds 2 (--quick: 1)] [--timeout 300] [--max-rss-gib 14]
        [--out benchmarks/RESULTS.md] [--json grad.json]
    python benchmarks/bench_grad.py --self-check
"""
import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

METHODS = {
    "auto": "bigconv2d auto",
    "fft": "bigconv2d fft",
    "direct": "bigconv2d direct",
    "tf": "tf.nn.conv2d",
    "tf_nodnn": "tf.nn.conv2d, oneDNN off",
    "tf_fft": "pure-TF FFT",
}
TF_METHODS = ("tf", "tf_nodnn")
MIB, GIB = _harness.MIB, 1 << 30
# name: (N, quick N, image (H, W, C), filter, padding, title)
CASES = {
    "seed": (16, 2, (321, 481, 1), (135, 135, 1, 3), "VALID", "seed geometry"),
    "depthwise": (8, 2, (56, 56, 128), (31, 31, 1, 128), "SAME", "depthwise 31x31"),
    "dense": (4, 1, (128, 128, 32), (31, 31, 32, 32), "SAME", "dense 31x31x32x32"),
    "memory": (2, 1, (256, 256, 16), (31, 31, 16, 16), "SAME", "memory"),
}
TF_SEED_N, QUICK_TF_SEED_N = 2, 1
MEMORY_WORKSPACE_LIMIT = 512 * MIB
MEMORY_METHODS = ("auto", "tf", "tf_nodnn")
SELF_CHECK_CASES = [  # (input shape, filter shape (grouped form), padding)
    ((2, 17, 23, 2), (5, 4, 2, 3), "VALID"),
    ((1, 16, 15, 3), (6, 7, 3, 2), "SAME"),
    ((2, 15, 13, 4), (5, 6, 1, 4), "SAME"),  # depthwise
]
VLOG_RE = re.compile(r"kernels_cpu\.cc:\d+\] (BigConv2D\w*): (fft|direct) \((.*)\)")
PASS_NAMES = {"BigConv2D": "forward", "BigConv2DBackpropInput": "backprop input",
              "BigConv2DBackpropFilter": "backprop filter"}


def is_depthwise(in_shape, f_shape):
    return f_shape[2] == 1 and f_shape[3] == in_shape[3] and in_shape[3] > 1


def tf_fft_depthwise(x, w, padding):
    """Per-channel FFT convolution in plain TF; w is (kh, kw, 1, C), no channel mixing."""
    import tensorflow as tf
    from bench_seed import tf_padded_rfft2d
    kh, kw = w.shape[0], w.shape[1]
    xf, h, wd = tf_padded_rfft2d(x, kh, kw, padding)                             # N, C, H, W/2+1
    wf = tf.signal.rfft2d(tf.transpose(w[::-1, ::-1, 0, :], [2, 0, 1]), [h, wd])  # C, H, W/2+1
    y = tf.signal.irfft2d(xf * wf, [h, wd])
    return tf.transpose(y[:, :, kh - 1:, kw - 1:], [0, 2, 3, 1])


def conv_fn(method, in_shape, f_shape, padding, workspace_limit=0):
    """conv(x, w) for method, with w in the grouped form (kh, kw, Cin / groups, Cout)."""
    import tensorflow as tf
    depthwise = is_depthwise(in_shape, f_shape)
    if method in TF_METHODS:
        if depthwise:
            return lambda x, w: tf.nn.depthwise_conv2d(
                x, tf.reshape(w, [w.shape[0], w.shape[1], w.shape[3], 1]), [1, 1, 1, 1],
                padding)
        return lambda x, w: tf.nn.conv2d(x, w, 1, padding)
    if method == "tf_fft":
        if depthwise:
            return lambda x, w: tf_fft_depthwise(x, w, padding)
        from bench_seed import tf_fft_conv2d
        return lambda x, w: tf_fft_conv2d(x, w, padding)
    import tfbigconv
    return lambda x, w: tfbigconv.bigconv2d(x, w, 1, padding, algorithm=method,
                                            workspace_limit=workspace_limit)


def grad_step(conv, x, w):
    """(dx, dw) as numpy arrays of loss = sum(conv(x, w) ** 2)."""
    import tensorflow as tf
    with tf.GradientTape() as tape:
        tape.watch(x)
        tape.watch(w)
        loss = tf.reduce_sum(tf.square(conv(x, w)))
    dx, dw = tape.gradient(loss, [x, w])
    return dx.numpy(), dw.numpy()


def reference_grads(x, w, padding):
    """float64 numpy FFT reference: (y, dx, dw) of loss = sum(y ** 2), y = conv2d(x, w)
    at stride 1, w in the grouped form (kh, kw, Cin / groups, Cout)."""
    import numpy as np
    from bench_seed import same_pads
    n, h, wd, cin = x.shape
    kh, kw, cg, cout = w.shape
    groups = cin // cg
    dg = cout // groups
    pads = same_pads(kh, kw) if padding == "SAME" else [[0, 0], [0, 0]]
    xp = np.pad(x.astype(np.float64), [(0, 0), *pads, (0, 0)])
    hp, wp = xp.shape[1], xp.shape[2]
    oh, ow = hp - kh + 1, wp - kw + 1
    fft = lambda a, axes: np.fft.rfft2(a, (hp, wp), axes=axes)  # noqa: E731
    ifft = lambda a, axes: np.fft.irfft2(a, (hp, wp), axes=axes)  # noqa: E731
    # Spectra with the channels split into groups and the frequencies as batch axes.
    xs = fft(xp, (1, 2)).reshape(n, hp, -1, groups, cg).transpose(1, 2, 3, 0, 4)  # f,G,n,cg
    ws = fft(w.astype(np.float64), (0, 1)).reshape(hp, -1, cg, groups, dg).transpose(
        0, 1, 3, 2, 4)                                                             # f,G,cg,dg
    def ungroup(a):  # f, G, n, c -> n, f, G * c
        return a.transpose(3, 0, 1, 2, 4).reshape(n, hp, -1, groups * a.shape[-1])
    # Correlation: Y = X conj(W); circular wrap stays out of the first oh x ow outputs.
    y = ifft(ungroup(xs @ ws.conj()), (1, 2))[:, :oh, :ow]
    dy = 2 * y
    dys = fft(dy, (1, 2)).reshape(n, hp, -1, groups, dg).transpose(1, 2, 3, 0, 4)  # f,G,n,dg
    # dx: full convolution of dy with w (size oh + kh - 1 = hp, no wrap), cropped.
    dxp = ifft(ungroup(dys @ ws.transpose(0, 1, 2, 4, 3)), (1, 2))
    dx = dxp[:, pads[0][0]:pads[0][0] + h, pads[1][0]:pads[1][0] + wd]
    # dw: correlation of xp with dy, summed over the batch; lags 0..kh-1 do not wrap.
    dws = (xs.transpose(0, 1, 2, 4, 3) @ dys.conj()).transpose(0, 1, 3, 2, 4)  # f,cg,G,dg
    dw = ifft(dws.reshape(hp, -1, cg, cout), (0, 1))[:kh, :kw]
    return y, dx, dw


rel_l2 = _harness.rel_l2


def self_check():
    """Relative L2 errors of reference_grads and the pure-TF FFT gradients against TF's."""
    import tensorflow as tf

    def case_errors(x, w, padding):
        xt, wt = tf.constant(x), tf.constant(w)
        ref_dx, ref_dw = grad_step(conv_fn("tf", x.shape, w.shape, padding), xt, wt)
        fft_dx, fft_dw = grad_step(conv_fn("tf_fft", x.shape, w.shape, padding), xt, wt)
        _, np_dx, np_dw = reference_grads(x, w, padding)
        return {"tf_fft dx": rel_l2(fft_dx, ref_dx), "tf_fft dw": rel_l2(fft_dw, ref_dw),
                "float64 reference dx": rel_l2(np_dx, ref_dx),
                "float64 reference dw": rel_l2(np_dw, ref_dw)}
    return _harness.self_check_cases(SELF_CHECK_CASES, case_errors)


@contextlib.contextmanager
def captured_stderr(sink):
    """Redirects file descriptor 2 (where TF's C++ logging writes) into sink[0] (a str)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            sink.append(f.read().decode(errors="replace"))


def worker(spec):
    """Runs one (case, contender) in this process and prints its result as one JSON line."""
    started = time.perf_counter()
    if spec["method"] == "self_check":
        print(json.dumps({"cases": self_check()}))
        return
    method = spec["method"]
    if method == "auto":
        # The op logs its per-pass choice at VLOG(1); read from the first full call.
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
        os.environ["TF_CPP_VMODULE"] = "kernels_cpu=1"
    if method == "tf_nodnn":
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
    import numpy as np
    import tensorflow as tf

    in_shape, f_shape, padding = spec["input_shape"], spec["filter_shape"], spec["padding"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(in_shape, dtype=np.float32)
    w = rng.standard_normal(f_shape, dtype=np.float32)
    xt, wt = tf.constant(x), tf.constant(w)
    conv = conv_fn(method, in_shape, f_shape, padding, spec.get("workspace_limit", 0))
    # Warm up on a tiny case, so that the first full call's peak RSS is the method's own.
    grad_step(conv, xt[:1, :8, :8], wt[:3, :3])

    logs, calls = [], [0]

    def call():
        calls[0] += 1
        if method == "auto" and calls[0] == 1:
            with captured_stderr(logs):
                return grad_step(conv, xt, wt)
        return grad_step(conv, xt, wt)

    budget = 0.75 * spec["timeout_s"] - (time.perf_counter() - started)
    m = _harness.measure_call(call, spec["reps"], keep=lambda g: g, budget_s=budget)
    dx, dw = m.pop("kept")
    y, ref_dx, ref_dw = reference_grads(x, w, padding)
    result = {
        "method": method, "input_shape": in_shape, "filter_shape": f_shape,
        "padding": padding, "output_shape": list(y.shape),
        "io_bytes": 4 * (x.size + w.size + y.size),
        "rel_l2_dx": rel_l2(dx, ref_dx), "rel_l2_dw": rel_l2(dw.reshape(w.shape), ref_dw),
        **m,
        "versions": {"tensorflow": tf.__version__, "numpy": np.__version__},
    }
    if "workspace_limit" in spec:
        result["workspace_limit"] = spec["workspace_limit"]
    if method in TF_METHODS:
        try:
            from tensorflow.python.util import _pywrap_util_port
            result["onednn"] = bool(_pywrap_util_port.IsMklEnabled())
        except (ImportError, AttributeError):
            result["onednn"] = None
    if method == "auto":
        result["auto_choices"] = [
            {"pass": PASS_NAMES.get(op, op), "algorithm": alg, "reason": reason}
            for op, alg, reason in VLOG_RE.findall("".join(logs))]
    print(json.dumps(result))


def measure(specs, rounds, label, timeout, max_rss):
    """{method: spec} -> {method: best round's result}; methods interleaved round by
    round; a method that failed (error, timeout, RSS cap) is not run again."""
    best = {}
    for rnd in range(rounds):
        for method, spec in specs.items():
            if method in best and "error" in best[method]:
                continue
            res = _harness.run_worker(__file__, spec, timeout=timeout, max_rss=max_rss)
            best[method] = _harness.better(best.get(method), res)
            if "error" in res:
                status = res["error"]
            else:
                status = f"{1e3 * res['median_s']:.1f} ms ({res['reps']} reps)"
            print(f"  {label} {method} round {rnd + 1}: {status}", file=sys.stderr)
    return best


def scaled_s(res, n):
    """The result's median time scaled linearly from its own batch to n images."""
    return res["median_s"] * n / res["input_shape"][0]


def table(case):
    n, results = case["n"], case["results"]
    auto = results.get("auto", {"error": "absent"})
    lines = [
        "| contender | N run | fwd+bwd median ms at N | per image ms | peak RSS +MiB "
        "(at N run) | peak RSS / (in+out+filter) | auto speedup | rel L2 dx | rel L2 dw |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for method, res in results.items():
        name = METHODS[method]
        if case["name"] == "depthwise":
            name = name.replace("tf.nn.conv2d", "tf.nn.depthwise_conv2d")
        if method == "tf" and res.get("onednn") is not None:
            name += ", oneDNN on" if res["onednn"] else ", oneDNN off"
        if res.get("workspace_limit"):
            name += f" (workspace_limit {res['workspace_limit'] // MIB} MiB)"
        if "error" in res:
            seen = res.get("observed_peak_rss_bytes")
            seen = f"largest RSS seen {seen / MIB:.0f} MiB" if seen else "-"
            lines.append(f"| {name} | - | {res['error']} | - | {seen} | - | - | - | - |")
            continue
        n_run = res["input_shape"][0]
        cells = [name, str(n_run) if n_run == n else f"{n_run} (time scaled)"]
        ms = f"{1e3 * scaled_s(res, n):.1f}" + (" (scaled)" if n_run != n else "")
        if res["reps"] == 0:
            ms += " (first call only)"
        cells += [ms, f"{1e3 * res['median_s'] / n_run:.1f}",
                  f"{res['rss_increase_bytes'] / MIB:.1f}",
                  f"{res['rss_increase_bytes'] / res['io_bytes']:.2f}"]
        if method == "auto" or "error" in auto:
            cells.append("-")
        else:
            cells.append(f"{scaled_s(res, n) / scaled_s(auto, n):.2f}x")
        cells += [f"{res['rel_l2_dx']:.1e}", f"{res['rel_l2_dw']:.1e}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def auto_note(case):
    choices = case["results"].get("auto", {}).get("auto_choices")
    if not choices:
        return ""
    return "bigconv2d auto picked: " + "; ".join(
        f"{c['pass']} {c['algorithm']} ({c['reason']})" for c in choices)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="small N for each case: " + ", ".join(
                       f"{name} N={c[1]}" for name, c in CASES.items()))
    p.add_argument("--cases", default=",".join(CASES),
                   help=f"comma-separated subset of {','.join(CASES)} (default: all)")
    p.add_argument("--reps", type=int, default=5, help="timed calls per point (default 5)")
    p.add_argument("--rounds", type=int,
                   help="subprocesses per (case, contender); the smallest median counts "
                        "(default 2; 1 with --quick)")
    p.add_argument("--timeout", type=float, default=300,
                   help="seconds per subprocess before it is killed (default 300)")
    p.add_argument("--max-rss-gib", type=float, default=14,
                   help="RSS in GiB at which a subprocess is killed (default 14)")
    p.add_argument("--out", help="append the tables, with the command and machine, to this file")
    p.add_argument("--json", help="write the raw results to this JSON file")
    p.add_argument("--self-check", action="store_true",
                   help="only check the float64 reference and the pure-TF FFT gradients "
                        "against TensorFlow's")
    args = _harness.parse_args_or_work(p, worker)
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = set(args.cases) - set(CASES)
    if unknown:
        p.error(f"unknown cases {sorted(unknown)}; choose from {list(CASES)}")
    return args


def main():
    args = parse_args()
    checks = _harness.run_self_check(__file__, "TensorFlow's gradients",
                                     then_exit=args.self_check)
    if args.rounds is None:
        args.rounds = 1 if args.quick else 2
    max_rss = int(args.max_rss_gib * GIB)

    cases = []
    for name in args.cases:
        full_n, quick_n, image, f_shape, padding, title = CASES[name]
        n = quick_n if args.quick else full_n
        methods = MEMORY_METHODS if name == "memory" else METHODS
        specs = {}
        for method in methods:
            n_run = n
            if name == "seed" and method in TF_METHODS:
                n_run = min(n, QUICK_TF_SEED_N if args.quick else TF_SEED_N)
            spec = {"method": method, "input_shape": [n_run, *image],
                    "filter_shape": list(f_shape), "padding": padding, "reps": args.reps,
                    "timeout_s": args.timeout}
            if name == "memory" and method == "auto":
                spec["workspace_limit"] = MEMORY_WORKSPACE_LIMIT
            specs[method] = spec
        label = f"{name} N={n}"
        results = measure(specs, args.rounds, label, args.timeout, max_rss)
        cases.append({"name": name, "title": title, "n": n, "input_shape": [n, *image],
                      "filter_shape": list(f_shape), "padding": padding,
                      "results": {m: results[m] for m in methods}})

    versions = {}
    for case in cases:
        for res in case["results"].values():
            versions.update(res.get("versions", {}))
    versions.setdefault("tensorflow", "unknown")
    command, date, header = _harness.run_header(
        versions["tensorflow"],
        f", numpy {versions.get('numpy')}; timeout {args.timeout:g} s, "
        f"RSS cap {args.max_rss_gib:g} GiB per subprocess")

    sections = []
    for case in cases:
        n = case["n"]
        title = (f"**{case['title'][0].upper()}{case['title'][1:]}: input "
                 f"({', '.join(map(str, case['input_shape']))}), filter "
                 f"({', '.join(map(str, case['filter_shape']))}), {case['padding']}**")
        notes = []
        tf_n = {res["input_shape"][0] for m, res in case["results"].items()
                if m in TF_METHODS and "input_shape" in res} - {n}
        if tf_n:
            notes.append(f"tf.nn.conv2d ran at N={min(tf_n)}; its time at N={n} is scaled "
                         "linearly (per image ms is what it measured).")
        if case["name"] == "depthwise":
            notes.append("The tf.nn.conv2d rows are tf.nn.depthwise_conv2d with the filter "
                         "reshaped to (31, 31, 128, 1); bigconv2d runs it as a grouped "
                         "convolution.")
        notes.append(f"Times: fwd+bwd, the best median of {args.rounds} round(s).")
        note = auto_note(case)
        sections.append("\n\n".join([title, " ".join(notes), table(case)]
                                    + ([note] if note else [])))
    body = "\n\n".join(sections)
    _harness.publish(args, "bench_grad", header, body, {
        "command": command, "date": date, "versions": versions,
        "cpu": _harness.cpu_model(), "cpu_count": os.cpu_count(),
        "timeout_s": args.timeout, "max_rss_gib": args.max_rss_gib,
        "self_check": checks, "cases": cases})


if __name__ == "__main__":
    main()
