"""Exports made inside tfbigconv.portable() against Keras' own layers exported the same
way: the run time and peak RSS of a process that loads and runs the file, at batch 1.

Cases (float32, NHWC):
    dw31     x (1, 56, 56, 128), a 31x31 depthwise layer, SAME (bench_depthwise.py's,
             at batch 1): BigDepthwiseConv2D against keras.layers.DepthwiseConv2D
    seed135  x (1, 321, 481, 1), filter 135x135x1x3, VALID (bench_seed.py's):
             BigConv2D against keras.layers.Conv2D
Both layers of a case share one kernel and bias. Each is exported with `model.export`
in every format Keras 3 exports whose converter is installed (tf_saved_model; litert
with Keras' default op sets; onnx), the Big layer inside `tfbigconv.portable()`.
Each file runs in a fresh subprocess that cannot import tfbigconv and imports only
its runtime (TensorFlow, ai_edge_litert's interpreter with as many threads as cores,
onnxruntime on the CPU): load, one first call, then up to --reps calls within
--budget seconds, whose median is the run time; the files run round-robin for
--rounds rounds, and each keeps its fastest round. Peak RSS is the process's own
(VmHWM: the runtime, the model and its run); "runtime" is its RSS after
importing the runtime, before loading the file. The output is checked against the
Keras model's (relative L2). A worker over --timeout seconds or --max-rss is killed
and reported as such (Keras' Conv2D at 135x135 may be slow).

Usage:
    python benchmarks/bench_export.py [--cases dw31 seed135] [--formats tf_saved_model
        litert onnx] [--reps 5] [--rounds 2] [--budget 20] [--timeout 120] [--max-rss-gib 12]
        [--out F.md] [--json F.json]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import _harness

CASES = {  # name: (input shape without the batch, Big layer, Keras layer, kwargs)
    "dw31": ((56, 56, 128), "BigDepthwiseConv2D", "DepthwiseConv2D",
             dict(kernel_size=31, padding="same")),
    "seed135": ((321, 481, 1), "BigConv2D", "Conv2D",
                dict(filters=3, kernel_size=135, padding="valid")),
}
FORMATS = ("tf_saved_model", "litert", "onnx")
SUFFIX = {"tf_saved_model": "", "litert": ".tflite", "onnx": ".onnx"}


def worker(spec):
    """Runs in the fresh subprocess: loads spec["path"] with its format's runtime only."""
    sys.modules["tfbigconv"] = None  # `import tfbigconv` raises ImportError
    import numpy as np
    fmt, path = spec["format"], spec["path"]
    x = np.load(spec["input"])
    if fmt == "tf_saved_model":
        import tensorflow as tf
        runtime = _status_bytes("VmRSS")
        t = time.perf_counter()
        loaded = tf.saved_model.load(path)
        xt = tf.constant(x)

        def call():
            return loaded.serve(xt).numpy()
    elif fmt == "litert":
        from ai_edge_litert.interpreter import Interpreter
        runtime = _status_bytes("VmRSS")
        t = time.perf_counter()
        it = Interpreter(model_path=path, num_threads=os.cpu_count())
        it.allocate_tensors()
        inp, out = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]

        def call():
            it.set_tensor(inp, x)
            it.invoke()
            return it.get_tensor(out)
    else:
        import onnxruntime as ort
        runtime = _status_bytes("VmRSS")
        t = time.perf_counter()
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name: x}

        def call():
            return session.run(None, feed)[0]
    y = call()
    first = time.perf_counter() - t
    times, start = [], time.perf_counter()
    while len(times) < spec["reps"] and time.perf_counter() - start < spec["budget"]:
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    np.save(spec["output"], y)
    print(json.dumps(dict(median_s=statistics.median(times), runs=len(times),
                          load_and_first_s=first, peak_rss=_status_bytes("VmHWM"),
                          runtime_rss=runtime)))


def _status_bytes(field):
    """A field of /proc/self/status in bytes. VmHWM, not ru_maxrss: that one keeps
    the peak of the process before exec, the parent's."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def build(case):
    """(input, {impl: Keras model}) of a case, both layers with the same weights."""
    import numpy as np
    import keras
    from tfbigconv import keras as layers
    shape, big, stock, kwargs = CASES[case]
    keras.utils.set_random_seed(0)
    models = {}
    for impl, cls in (("portable", getattr(layers, big)), ("keras", getattr(keras.layers, stock))):
        inp = keras.Input(shape)
        models[impl] = keras.Model(inp, cls(**kwargs)(inp))
    weights = [np.random.default_rng(i).standard_normal(w.shape).astype(np.float32) * 0.05
               for i, w in enumerate(models["keras"].get_weights())]
    for m in models.values():
        m.set_weights(weights)
    x = np.random.default_rng(9).standard_normal((1, *shape)).astype(np.float32)
    return x, models


def export(model, path, fmt, portable):
    import contextlib
    import tfbigconv
    with tfbigconv.portable() if portable else contextlib.nullcontext():
        model.export(path, format=fmt, verbose=False)


def available(fmt):
    import importlib.util
    need = {"tf_saved_model": [], "litert": ["ai_edge_litert"], "onnx": ["tf2onnx", "onnxruntime"]}
    return all(importlib.util.find_spec(m) for m in need[fmt])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2, help="keep each file's fastest round")
    parser.add_argument("--budget", type=float, default=20.0, help="seconds of timed runs")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per worker")
    parser.add_argument("--max-rss-gib", type=float, default=12.0)
    parser.add_argument("--out", help="append the table to this markdown file")
    parser.add_argument("--json", help="write the results here")
    args = _harness.parse_args_or_work(parser, worker)
    import numpy as np
    import tensorflow as tf
    formats = [f for f in args.formats if available(f)]
    skipped = sorted(set(args.formats) - set(formats))
    load = os.getloadavg()[0]  # the host's: other work slows every row alike
    jobs = []  # (case, impl, format, spec, Keras' output)
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases:
            x, models = build(case)
            np.save(os.path.join(tmp, f"{case}_x.npy"), x)
            for impl, model in models.items():
                want = np.asarray(model(x), np.float64)
                for fmt in formats:
                    path = os.path.join(tmp, f"{case}_{impl}{SUFFIX[fmt]}")
                    export(model, path, fmt, impl == "portable")
                    spec = dict(format=fmt, path=path, input=os.path.join(tmp, f"{case}_x.npy"),
                                output=os.path.join(tmp, "y.npy"), reps=args.reps,
                                budget=args.budget)
                    jobs.append((case, impl, fmt, spec, want))
        best = {}
        for _ in range(args.rounds):  # round-robin; each job keeps its fastest round
            for case, impl, fmt, spec, want in jobs:
                res = _harness.run_worker(__file__, spec, timeout=args.timeout,
                                          max_rss=int(args.max_rss_gib * (1 << 30)))
                if "error" not in res:
                    res["rel_l2"] = _harness.rel_l2(np.load(spec["output"]).astype(np.float64),
                                                    want)
                res.update(case=case, impl=impl, format=fmt)
                key = (case, impl, fmt)
                if key not in best or "error" in best[key] or (
                        "error" not in res and res["median_s"] < best[key]["median_s"]):
                    best[key] = res
                print(row(res), flush=True)
    data = list(best.values())
    rows = [row(r) for r in data]
    extra = (f", TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset')}, "
             f"load average {load:.1f} at the start")
    if skipped:
        extra += f"; skipped (converter not installed): {', '.join(skipped)}"
    header = _harness.run_header(tf.__version__, extra)[2]
    body = "\n".join(["| case | layer | format | run (median) | runs | load + first call | "
                      "peak RSS | runtime's RSS | rel L2 vs Keras |",
                      "|---|---|---|---|---|---|---|---|---|", *rows])
    _harness.publish(args, "Exports at batch 1 (bench_export.py)", header, body,
                     dict(header=header, results=data))


def row(r):
    layer = {"portable": "Big, portable()", "keras": "Keras"}[r["impl"]]
    head = f"| {r['case']} | {layer} | {r['format']} |"
    if "error" in r:
        peak = r.get("observed_peak_rss_bytes", 0) / _harness.MIB
        return f"{head} {r['error']} | | | >= {peak:.0f} MiB seen | | |"
    return (f"{head} {r['median_s'] * 1e3:.1f} ms | {r['runs']} | {r['load_and_first_s']:.2f} s | "
            f"{r['peak_rss'] / _harness.MIB:.0f} MiB | {r['runtime_rss'] / _harness.MIB:.0f} MiB | "
            f"{r['rel_l2']:.1e} |")


if __name__ == "__main__":
    main()
