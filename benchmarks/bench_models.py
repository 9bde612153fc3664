"""End to end on real large-kernel architectures: stock Keras/TensorFlow against tfbigconv.

The models (large_kernel_models.py) are written as their authors write them: custom
block layers with the convolutions as sublayers, Sequentials inside them, raw
tf.nn / tf.signal calls in call(). For each model and point:

- RepLKNet-31B (kernels 31/29/27/13): training step of the stock model against
  `tfbigconv.convert_model(model)` (in place on a copy with the same weights);
  inference of the merged (reparameterized) model, whose LargeConv calls
  tf.nn.depthwise_conv2d itself, stock against traced under
  `tfbigconv.route(min_kernel_size=...)` (without `route` in the package: the
  converted model's unmerged inference).
- Hyena block: the long causal convolution by tf.signal FFTs (as Hyena's
  reference code does with torch.fft) against tfbigconv.bigconv1d (CAUSAL).
- 3D UX-Net block: depthwise k^3 as Keras' grouped Conv3D (which Keras runs
  through XLA on the CPU) against convert_model's BigConv3D.

Timing: one fresh process per (model, point) builds both variants with the same
weights, checks they compute the same function (relative L2 of the outputs), runs
a warm-up step of each (traces, plans, autotunes with a cache of its own), then
alternates stock, tfbigconv, stock, ... for `--rounds` rounds; each round times
at least one step and steps until `--min-time` seconds. Training is
train_on_batch (Adam), inference a tf.function of model(x, training=False).
The table gives the median and the minimum per step.

Memory: in two more fresh processes per point (one per variant), as
bench_memory_report.py measures: one train_on_batch, then the high-water mark is
reset (/proc/self/clear_refs) and the next step's peak RSS increase read
(VmHWM), with MALLOC_MMAP_THRESHOLD_=65536 and oneDNN off so that RSS follows the
live tensors, autotuning off; `--memory-onednn` measures with oneDNN on, where
the peak is TF's allocator's (bench_memory_report.py's docstring says why).
Against it: `tfbigconv.memory_report(model, batch).step_peak_bytes` from the
same process (the step's peak less weights, optimizer slots and batch, which the
baseline holds).

  .venv/bin/python benchmarks/bench_models.py --quick            # tiny points, minutes
  .venv/bin/python benchmarks/bench_models.py replknet --points r224-b2 r224-b4
  .venv/bin/python benchmarks/bench_models.py hyena --rounds 5 --no-memory
  .venv/bin/python benchmarks/bench_models.py --list             # points and estimates

Points: replknet r<image>-b<batch> (prefix "tiny-" for a tiny RepLKNet with the
same kernels); hyena L<length>-d<channels>-b<batch>; uxnet
s<size>-k<kernel>-c<channels>-b<batch>. Results: a markdown table on stdout and
JSON in benchmarks/out/ (--json to choose the file).
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time

import _harness

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20

FULL_POINTS = {
    "replknet": ["r224-b2", "r224-b4", "r224-b8", "r512-b1"],
    "hyena": ["L2048-d256-b4", "L4096-d512-b2", "L8192-d768-b1", "L16384-d864-b1"],
    "uxnet": ["s48-k13-c32-b1", "s64-k17-c24-b1", "s96-k21-c16-b1"],
}
QUICK_POINTS = {
    "replknet": ["tiny-r64-b2"],
    "hyena": ["L1024-d64-b2"],
    "uxnet": ["s24-k13-c8-b1"],
}
# convert_model's min_kernel_size per model: the package default for RepLKNet (its
# 13x13 stage-4 kernels on 7x7 maps stay stock), the model's own kernel for UX-Net.
MIN_KERNEL_SIZE = {"replknet": 15, "uxnet": 13}
# Seconds one worker may run; the memory workers' RSS cap leaves the host some room.
WORKER_TIMEOUT_S = 3600


# --- points and models ----------------------------------------------------

def parse_point(model, label):
    """{"tiny": bool, key: int, ...} of a point label ("r224-b4", "L2048-d256-b1", ...)."""
    keys = {"replknet": ("r", "b"), "hyena": ("L", "d", "b"), "uxnet": ("s", "k", "c", "b")}[model]
    tiny = label.startswith("tiny-")
    parts = dict(re.findall(r"([A-Za-z])(\d+)", label[5:] if tiny else label))
    if sorted(parts) != sorted(keys) or (tiny and model != "replknet"):
        raise ValueError(f"bad point {label!r} for {model}: expected "
                         + "-".join(f"{k}<int>" for k in keys))
    return dict(tiny=tiny, **{k: int(v) for k, v in parts.items()})


def build(keras, model, point, variant, uxnet_stock="split"):
    """The model at `point`, `variant` "stock" or "tfbigconv" (for hyena, the FFT or
    bigconv1d long convolution; the others are converted by the caller; UX-Net's
    stock depthwise convolution is `uxnet_stock`, its tfbigconv one the grouped
    Conv3D converted)."""
    import large_kernel_models as lkm
    keras.utils.set_random_seed(0)
    p = parse_point(model, point)
    if model == "replknet":
        return lkm.replknet(keras, p["r"], lkm.REPLKNET_TINY if p["tiny"] else lkm.REPLKNET_31B)
    if model == "hyena":
        return lkm.hyena(keras, p["L"], p["d"], "bigconv" if variant == "tfbigconv" else "fft")
    return lkm.uxnet(keras, p["s"], p["k"], p["c"],
                     depthwise=uxnet_stock if variant == "stock" else "grouped")


def batch_of(model, point):
    return parse_point(model, point)["b"]


def convert(model_name, model, min_kernel_size):
    """(converted model, {"converted": n, "not_converted": [...]}): convert_model
    in place (the caller passes a copy) where the package has it."""
    import inspect
    import tfbigconv
    size = min_kernel_size or MIN_KERNEL_SIZE[model_name]
    params = inspect.signature(tfbigconv.convert_model).parameters
    if "report" in params:
        converted, report = tfbigconv.convert_model(model, size, in_place=True, report=True)
        return converted, {"converted": len(report.converted),
                           "not_converted": [str(c) for c in report.not_converted]}
    converted = tfbigconv.convert_model(model, size)
    count = sum(type(layer).__module__.startswith("tfbigconv")
                for layer in converted._flatten_layers(include_self=False, recursive=True))
    return converted, {"converted": count, "not_converted": []}


def one_variant(keras, model_name, point, variant, spec):
    """(model, conversion facts) of one variant: "stock", or "tfbigconv" (Hyena with
    bigconv1d; the others the stock model converted in place)."""
    net = build(keras, model_name, point, variant, spec.get("uxnet_stock", "split"))
    if variant == "stock":
        return net, {}
    if model_name == "hyena":
        blocks = [layer for layer in net._flatten_layers(include_self=False, recursive=True)
                  if type(layer).__name__ == "HyenaOperator"]
        return net, {"converted": len(blocks), "not_converted": [],
                     "how": "bigconv1d in HyenaOperator.call"}
    net, facts = convert(model_name, net, spec.get("min_kernel_size"))
    return net, dict(facts, how="convert_model")


def variants(keras, model_name, point, spec):
    """(stock model, tfbigconv model, conversion facts), both with the same weights."""
    stock, _ = one_variant(keras, model_name, point, "stock", spec)
    ours, facts = one_variant(keras, model_name, point, "tfbigconv", spec)
    ours.set_weights(stock.get_weights())
    return stock, ours, facts


def data(model, point, net):
    """(x, y) constants: a random batch and targets (class labels for RepLKNet)."""
    import numpy as np
    import tensorflow as tf
    rng = np.random.default_rng(0)
    b = batch_of(model, point)
    x = tf.constant(rng.standard_normal((b,) + tuple(net.input.shape[1:]), np.float32))
    if model == "replknet":
        return x, tf.constant(rng.integers(0, net.output.shape[-1], b))
    return x, tf.constant(rng.standard_normal((b,) + tuple(net.output.shape[1:]), np.float32))


def compile_model(keras, model_name, net):
    loss = (keras.losses.SparseCategoricalCrossentropy(from_logits=True)
            if model_name == "replknet" else "mse")
    net.compile(optimizer=keras.optimizers.Adam(1e-4), loss=loss, jit_compile=False)


# --- the workers (fresh processes) -------------------------------------------

def timed_rounds(calls, rounds, min_time_s):
    """{name: [seconds per step]}: calls alternated name by name, round by round."""
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            spent = 0.0
            while spent == 0.0 or spent < min_time_s:
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
                spent += times[name][-1]
    return times


def routed_inference(tfbigconv, stock, min_kernel_size):
    """The merged stock model traced under tfbigconv.route: (call, how) or None."""
    import tensorflow as tf
    if not hasattr(tfbigconv, "route"):
        return None
    size = min_kernel_size or MIN_KERNEL_SIZE["replknet"]
    fn = tf.function(lambda x: stock(x, training=False))
    routed = []

    def call(x):
        with tfbigconv.route(min_kernel_size=size) as scope:
            result = fn(x)
        routed.append(len(scope.routed))  # calls routed while tracing (the first call)
        return result
    return call, routed, f"merged model under tfbigconv.route(min_kernel_size={size})"


def time_worker(spec):
    """Training and inference times of both variants, alternated, in this process."""
    import numpy as np
    import tensorflow as tf
    import keras
    import large_kernel_models as lkm
    import tfbigconv
    from tfbigconv import host
    model_name, point, mks = spec["model"], spec["point"], spec.get("min_kernel_size")
    with _harness.fresh_autotune_env():
        stock, ours, facts = variants(keras, model_name, point, spec)
        x, y = data(model_name, point, stock)
        # Same function: outputs in inference mode, before any step changes weights.
        # Hyena's and UX-Net's outputs are x + the block's: compare the block's part.
        skip = 0 if model_name == "replknet" else x.numpy()
        ref = stock(x, training=False).numpy() - skip
        check = _harness.rel_l2(ours(x, training=False).numpy() - skip, ref)
        for net in (stock, ours):
            compile_model(keras, model_name, net)
        train = {"stock": lambda: stock.train_on_batch(x, y),
                 "tfbigconv": lambda: ours.train_on_batch(x, y)}
        for call in train.values():
            call()  # warm-up: traces, plans, autotunes
        train_times = timed_rounds(train, spec["rounds"], spec["min_time_s"])

        infer_how = {"stock": "tf.function(model(x, training=False))",
                     "tfbigconv": "the converted model"}
        stock_fn = tf.function(lambda x: stock(x, training=False))
        ours_fn = tf.function(lambda x: ours(x, training=False))
        infer = {"stock": lambda: stock_fn(x).numpy(), "tfbigconv": lambda: ours_fn(x).numpy()}
        merged_check = None
        if model_name == "replknet":
            before = stock_fn(x).numpy()
            merged = lkm.reparameterize(stock)
            stock_fn = tf.function(lambda x: stock(x, training=False))  # trace the merged path
            merged_check = _harness.rel_l2(stock_fn(x).numpy(), before)
            infer_how["stock"] = f"merged model ({merged} LargeConv), tf.nn.depthwise_conv2d"
            routed = routed_inference(tfbigconv, stock, mks)
            if routed is not None:
                routed_call, routed_counts, how = routed
                infer["tfbigconv"] = lambda: routed_call(x).numpy()
                merged_check = max(merged_check,
                                   _harness.rel_l2(routed_call(x).numpy(), before))
                infer_how["tfbigconv"] = f"{how}: {routed_counts[0]} calls routed"
            else:
                infer_how["tfbigconv"] += " (unmerged: tfbigconv has no route)"
        for call in infer.values():
            call()
        infer_times = timed_rounds(infer, spec["rounds"], spec["min_time_s"])
    print(json.dumps({"train": train_times, "infer": infer_times, "rel_l2": check,
                      "merged_rel_l2": merged_check, "conversion": facts,
                      "infer_how": infer_how, "onednn": host.tf_onednn(),
                      "params": int(sum(np.prod(w.shape) for w in stock.weights))}))


def memory_worker(spec):
    """The measured step peak of one variant (bench_memory_report's measure), then
    memory_report's prediction, each as a JSON line on stdout."""
    import keras
    import tfbigconv
    import bench_memory_report as bmr
    model_name, point = spec["model"], spec["point"]
    net, _ = one_variant(keras, model_name, point, spec["variant"], spec)
    x, y = data(model_name, point, net)
    compile_model(keras, model_name, net)
    bmr._measure_second_step(lambda: net.train_on_batch(x, y), spec["onednn"])
    report = tfbigconv.memory_report(net, batch_of(model_name, point), device="CPU",
                                     advice=False)
    print(json.dumps({"step_peak_bytes": report.step_peak_bytes,
                      "peak_bytes": report.peak_bytes,
                      "peak_at": f"{report.peak_step.phase} {report.peak_step.layer}"}))


def estimate_worker(spec):
    """Parameters and memory_report's predicted peak of both variants, no step run."""
    import keras
    import numpy as np
    import tfbigconv
    out = {}
    for variant in ("stock", "tfbigconv"):
        net, _ = one_variant(keras, spec["model"], spec["point"], variant, spec)
        compile_model(keras, spec["model"], net)
        report = tfbigconv.memory_report(net, batch_of(spec["model"], spec["point"]),
                                         device="CPU", advice=False)
        out[variant] = {"peak_bytes": report.peak_bytes, "step_peak_bytes": report.step_peak_bytes}
        out["params"] = int(sum(np.prod(w.shape) for w in net.weights))
    print(json.dumps(out))


def worker(spec):
    sys.path.insert(0, HERE)
    {"time": time_worker, "memory": memory_worker, "estimate": estimate_worker}[spec["task"]](spec)


def list_points(args, points):
    """Each point's parameters and predicted peaks (memory_report, Adam): will it fit?"""
    print("| model | point | parameters | predicted peak, stock | predicted peak, tfbigconv |")
    print("|---|---|---|---|---|")
    for model, labels in points.items():
        for point in labels:
            r = _harness.run_worker(__file__, {"task": "estimate", "model": model, "point": point,
                                               "min_kernel_size": args.min_kernel_size,
            "uxnet_stock": args.uxnet_stock},
                                    timeout=args.timeout)
            if "error" in r:
                print(f"| {model} | {point} | failed: {r['error'][:120]} | | |", flush=True)
                continue
            print(f"| {model} | {point} | {r['params'] / 1e6:.1f} M | "
                  f"{r['stock']['peak_bytes'] / MIB:.0f} MiB | "
                  f"{r['tfbigconv']['peak_bytes'] / MIB:.0f} MiB |", flush=True)


# --- the main process --------------------------------------------------------

def run_time(args, model, point):
    spec = {"task": "time", "model": model, "point": point, "rounds": args.rounds,
            "min_time_s": args.min_time, "min_kernel_size": args.min_kernel_size,
            "uxnet_stock": args.uxnet_stock}
    return _harness.run_worker(__file__, spec, timeout=args.timeout)


def run_memory(args, model, point, variant):
    """bench_memory_report.measure's subprocess, for this script's worker."""
    import bench_memory_report as bmr
    spec = {"task": "memory", "model": model, "point": point, "variant": variant,
            "onednn": args.memory_onednn, "min_kernel_size": args.min_kernel_size,
            "uxnet_stock": args.uxnet_stock}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", MALLOC_MMAP_THRESHOLD_="65536",
               TFBIGCONV_AUTOTUNE="0", TF_ENABLE_ONEDNN_OPTS="1" if args.memory_onednn else "0")
    if args.memory_onednn:  # TF's allocator log (bench_memory_report.py)
        env.update(TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="log_memory=2")
    try:
        r = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], env=env,
                           cwd=HERE, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout ({args.timeout} s)"}
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode != 0 or len(lines) < 2:
        return {"error": (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]}
    measured, predicted = json.loads(lines[-2]), json.loads(lines[-1])
    if args.memory_onednn:  # a Keras model is held to the allocator's peak (as there)
        measured["logged"] = bmr.logged_peak(r.stderr)
        measured["measured"] = measured["allocator"]
    return dict(measured, **predicted)


def summary(times):
    return {"median_s": statistics.median(times), "min_s": min(times), "steps": len(times)}


def ms(s):
    return f"{1e3 * s:.0f}" if s >= 1 else f"{1e3 * s:.1f}"


def rows(model, point, res):
    """Markdown rows of one point's results."""
    out = []
    t = res.get("time", {})
    if not t:  # --no-time: the memory alone
        for v, m in res.get("memory", {}).items():
            cell = (f"failed: {m['error'][:100]}" if "error" in m else
                    f"{m['measured'] / MIB:.0f} MiB (predicted {m['step_peak_bytes'] / MIB:.0f}, "
                    f"{100 * (m['step_peak_bytes'] / m['measured'] - 1):+.0f}%)")
            out.append(f"| {model} | {point} | train ({v}) | | | | {cell} | | |")
        return out
    if "error" in t:
        out.append(f"| {model} | {point} | all | failed: {t['error'][:120]} | | | | | |")
        return out
    for phase in ("train", "infer"):
        s, o = summary(t[phase]["stock"]), summary(t[phase]["tfbigconv"])
        speedup = s["median_s"] / o["median_s"]
        mem = ""
        if phase == "train" and "memory" in res:
            cells = []
            for v in ("stock", "tfbigconv"):
                m = res["memory"][v]
                if "error" in m:
                    cells.append(f"{v} failed: {m['error'][:60]}")
                    continue
                err = m["step_peak_bytes"] / m["measured"] - 1
                cells.append(f"{m['measured'] / MIB:.0f} MiB (predicted "
                             f"{m['step_peak_bytes'] / MIB:.0f}, {100 * err:+.0f}%)")
            mem = " | ".join(cells)
        else:
            mem = " | "
        out.append(f"| {model} | {point} | {phase} | {ms(s['median_s'])} / {ms(s['min_s'])} | "
                   f"{ms(o['median_s'])} / {ms(o['min_s'])} | {speedup:.2f}x | {mem} | "
                   f"{t['rel_l2']:.1e} |")
    return out


HEADER = ["| model | point | step | stock ms (median / min) | tfbigconv ms (median / min) | "
          "speed-up | stock step peak (memory_report) | tfbigconv step peak (memory_report) | "
          "rel L2 |",
          "|---|---|---|---|---|---|---|---|---|"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=list(FULL_POINTS), metavar="MODEL",
                        help="replknet, hyena, uxnet (default: all)")
    parser.add_argument("--points", nargs="+", help="point labels (default: the full sizes)")
    parser.add_argument("--quick", action="store_true", help="tiny points, 2 rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-time", type=float, default=1.0,
                        help="seconds of steps per variant and round (at least one step)")
    parser.add_argument("--min-kernel-size", type=int,
                        help="convert_model's / route's (default: 15 RepLKNet, 13 UX-Net)")
    parser.add_argument("--uxnet-stock", choices=("split", "grouped"), default="split",
                        help="UX-Net's stock depthwise Conv3D: one tf.nn.conv3d per channel "
                        "(default), or Keras' grouped Conv3D as authors write it (XLA on the "
                        "CPU: about 50x slower; minutes per step at the full sizes)")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory processes")
    parser.add_argument("--no-time", action="store_true",
                        help="skip the timing process (memory only)")
    parser.add_argument("--memory-onednn", action="store_true",
                        help="measure memory with oneDNN on (TF's allocator's peak)")
    parser.add_argument("--timeout", type=float, default=WORKER_TIMEOUT_S,
                        help="seconds per worker process")
    parser.add_argument("--list", action="store_true",
                        help="list the points with memory_report's predicted peaks; run nothing")
    parser.add_argument("--json", help="output file (default benchmarks/out/bench_models-DATE.json)")
    args = _harness.parse_args_or_work(parser, worker)
    for m in args.models:
        if m not in FULL_POINTS:
            parser.error(f"unknown model {m!r}: choose from {', '.join(FULL_POINTS)}")
    if args.quick and args.rounds == 3:
        args.rounds = 2
    points = {m: args.points or (QUICK_POINTS if args.quick else FULL_POINTS)[m]
              for m in args.models}
    for m, labels in points.items():
        for label in labels:
            parse_point(m, label)  # bad labels fail before anything runs

    if args.list:
        return list_points(args, points)
    import tensorflow as tf
    _, date, header = _harness.run_header(tf.__version__)
    print(header, flush=True)
    results = []
    for model, labels in points.items():
        for point in labels:
            res = {"model": model, "point": point}
            if not args.no_memory:
                res["memory"] = {v: run_memory(args, model, point, v)
                                 for v in ("stock", "tfbigconv")}
            if not args.no_time:
                start = time.monotonic()
                res["time"] = run_time(args, model, point)
                res["time_worker_s"] = time.monotonic() - start
            results.append(res)
            print(f"  {model} {point}: done", file=sys.stderr, flush=True)
    body = "\n".join(HEADER + [r for res in results
                               for r in rows(res["model"], res["point"], res)])
    print()
    print(body)
    for res in results:
        t = res.get("time", {})
        if "conversion" in t:
            c = t["conversion"]
            print(f"{res['model']} {res['point']}: {c['converted']} converted ({c['how']}); "
                  f"inference: stock {t['infer_how']['stock']}, tfbigconv "
                  f"{t['infer_how']['tfbigconv']}; oneDNN {'on' if t['onednn'] else 'off'}"
                  + (f"; merged rel L2 {t['merged_rel_l2']:.1e}" if t["merged_rel_l2"] else ""))
    path = args.json or os.path.join(
        HERE, "out", f"bench_models-{datetime.datetime.now():%Y%m%d-%H%M%S}.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    _harness.write_json(path, {"header": header, "date": date, "rounds": args.rounds,
                               "memory_onednn": args.memory_onednn, "results": results})
    print(f"JSON: {path}")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
