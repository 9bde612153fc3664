"""memory_report's predicted peak against the measured peak of a training step (CPU).

For each model, batch size and variant (tf: Keras' own layers, i.e.
tf.nn.conv2d; bigconv: after convert_model(model, min_kernel_size=1)), a fresh
subprocess builds the model, compiles it (Adam, MSE), runs one
train_on_batch to trace the step and create the optimizer's slots, then resets
its high-water mark (/proc/self/clear_refs "5") and reads VmRSS as the
baseline. A second train_on_batch on the same batch is the measured step: its
peak is VmHWM - baseline. The baseline holds TensorFlow's runtime, the
weights, the optimizer slots and the batch, so the comparison is with the
report's step_peak_bytes (peak_bytes less weights, slots and batch).
MALLOC_MMAP_THRESHOLD_=65536 makes glibc return every freed block of 64 KiB or
more to the system at once, so that RSS follows the live tensors.
TF_ENABLE_ONEDNN_OPTS=0, for the same reason: with oneDNN, TF keeps freed CPU
memory pooled, so the measured step reused the first step's memory (resnet tf,
batch 4: 0.7 MiB measured with oneDNN, 16.3 MiB without; the baseline was 17 MiB
higher with it). The report models TF's own kernels' workspace either way.

  .venv/bin/python benchmarks/bench_memory_report.py            # all models
  .venv/bin/python benchmarks/bench_memory_report.py unet conv135
  .venv/bin/python benchmarks/bench_memory_report.py --max-batch # the max-batch check
"""
import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"  # RSS must follow the live tensors (above)


# --- the models ----------------------------------------------------------

def unet(keras):
    """U-Net-like encoder/decoder on 9-channel frames (3x3 convs, 3 levels)."""
    L = keras.layers
    inp = keras.Input((128, 128, 9))
    skips, h = [], inp
    for f in (16, 32, 64):
        h = L.Conv2D(f, 3, padding="same", activation="relu")(h)
        h = L.Conv2D(f, 3, padding="same", activation="relu")(h)
        skips.append(h)
        h = L.MaxPooling2D()(h)
    h = L.Conv2D(128, 3, padding="same", activation="relu")(h)
    for f, skip in zip((64, 32, 16), reversed(skips)):
        h = L.UpSampling2D()(h)
        h = L.Concatenate()([h, skip])
        h = L.Conv2D(f, 3, padding="same", activation="relu")(h)
        h = L.Conv2D(f, 3, padding="same", activation="relu")(h)
    return keras.Model(inp, L.Conv2D(9, 1)(h), name="unet")


def resnet(keras):
    """ResNet-style: 7x7 stem, BatchNorm, residual 3x3 blocks, pooling, dense head."""
    L = keras.layers
    inp = keras.Input((128, 128, 3))
    h = L.Conv2D(32, 7, strides=2, padding="same")(inp)
    h = L.ReLU()(L.BatchNormalization()(h))
    h = L.MaxPooling2D(3, strides=2, padding="same")(h)
    for f, stride in ((32, 1), (32, 1), (64, 2), (64, 1)):
        shortcut = h
        y = L.Conv2D(f, 3, strides=stride, padding="same")(h)
        y = L.ReLU()(L.BatchNormalization()(y))
        y = L.BatchNormalization()(L.Conv2D(f, 3, padding="same")(y))
        if stride != 1 or shortcut.shape[-1] != f:
            shortcut = L.BatchNormalization()(L.Conv2D(f, 1, strides=stride)(shortcut))
        h = L.ReLU()(L.Add()([y, shortcut]))
    h = L.GlobalAveragePooling2D()(h)
    return keras.Model(inp, L.Dense(10)(h), name="resnet")


def replknet(keras):
    """RepLKNet-style: 1x1 conv, 31x31 depthwise conv, 1x1 conv, residual, BatchNorm."""
    L = keras.layers
    inp = keras.Input((56, 56, 32))
    h = inp
    for _ in range(2):
        y = L.BatchNormalization()(h)
        y = L.Conv2D(32, 1, activation="relu")(y)
        y = L.DepthwiseConv2D(31, padding="same")(y)
        y = L.Conv2D(32, 1)(L.ReLU()(L.BatchNormalization()(y)))
        h = L.Add()([h, y])
    return keras.Model(inp, h, name="replknet")


def subtracted(keras):
    """The pointwise + depthwise + dense-KxK "subtracted conv" block."""
    L = keras.layers
    inp = keras.Input((128, 128, 8))
    p = L.Conv2D(16, 1)(inp)
    d = L.DepthwiseConv2D(15, padding="same")(p)
    low = L.Conv2D(16, 15, padding="same")(inp)
    h = L.Concatenate()([L.Subtract()([d, low]), inp])
    return keras.Model(inp, L.Conv2D(8, 1)(h), name="subtracted")


def conv135(keras):
    """A single 135x135 convolution on (N, 321, 481, 1) (VALID, 3 filters)."""
    inp = keras.Input((321, 481, 1))
    return keras.Model(inp, keras.layers.Conv2D(3, 135)(inp), name="conv135")


MODELS = {"unet": (unet, (2, 4)), "resnet": (resnet, (4, 8)), "replknet": (replknet, (2, 4)),
          "subtracted": (subtracted, (2, 4)), "conv135": (conv135, (1, 2))}
VARIANTS = ("tf", "bigconv")


def build(name, variant):
    import keras
    import tfbigconv
    keras.utils.set_random_seed(0)
    model = MODELS[name][0](keras)
    if variant == "bigconv":
        model = tfbigconv.convert_model(model, min_kernel_size=1)
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse", jit_compile=False)
    return model


# --- measurement, in a fresh process -------------------------------------

def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024


def measure_here(name, variant, batch):
    import numpy as np
    import tensorflow as tf
    model = build(name, variant)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((batch,) + tuple(model.input.shape[1:]), np.float32))
    t = tf.constant(rng.standard_normal((batch,) + tuple(model.output.shape[1:]), np.float32))
    model.train_on_batch(x, t)  # traces the step, creates the optimizer's slots
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = _status("VmRSS")
    model.train_on_batch(x, t)
    print(json.dumps({"measured": _status("VmHWM") - before, "baseline": before}))


def measure(name, variant, batch):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", MALLOC_MMAP_THRESHOLD_="65536",
               TFBIGCONV_AUTOTUNE="0")
    r = subprocess.run([sys.executable, __file__, "--measure", name, variant, str(batch)],
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def predict(name, variant, batch):
    import tfbigconv
    report = tfbigconv.memory_report(build(name, variant), batch, device="CPU", advice=False)
    return report


def mib(n):
    return f"{n / 2**20:.1f}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="*", default=list(MODELS))
    parser.add_argument("--measure", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--max-batch", action="store_true",
                        help="check max_batch_size: a budget, its suggested batch, and +25%%")
    args = parser.parse_args()
    if args.measure:
        name, variant, batch = args.measure
        measure_here(name, variant, int(batch))
        return
    os.environ["TFBIGCONV_AUTOTUNE"] = "0"
    if args.max_batch:
        return check_max_batch(args.models)
    print("| model | variant | batch | predicted step peak MiB | measured MiB | error | "
          "predicted total MiB | peak at |")
    print("|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for name in args.models:
        for variant in VARIANTS:
            for batch in MODELS[name][1]:
                report = predict(name, variant, batch)
                m = measure(name, variant, batch)
                if "error" in m:
                    print(f"| {name} | {variant} | {batch} | {mib(report.step_peak_bytes)} | "
                          f"failed: {m['error'][:80]} | | | |")
                    continue
                err = report.step_peak_bytes / m["measured"] - 1
                worst = max(worst, abs(err))
                s = report.peak_step
                print(f"| {name} | {variant} | {batch} | {mib(report.step_peak_bytes)} | "
                      f"{mib(m['measured'])} | {100 * err:+.0f}% | {mib(report.peak_bytes)} | "
                      f"{s.phase} {s.layer} |", flush=True)
    print(f"worst |error|: {100 * worst:.0f}%")


def check_max_batch(names):
    """For each model (tf variant): a budget of 1.2x the predicted peak at
    twice the larger benchmark batch; max_batch_size's answer n (which keeps
    20% in reserve) must run under it (measured step + weights, slots and
    batch) and ceil(1.25 n) over it, or the report must say why not (a peak
    mostly independent of the batch)."""
    print("| model | budget MiB | suggested n | measured total at n MiB | 1.25 n | "
          "measured total at 1.25 n MiB | n fits | 1.25 n exceeds | per example (predicted) | "
          "report says 1.25 n is predicted within the budget |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        report = predict(name, "tf", 2 * MODELS[name][1][-1])
        budget = int(1.2 * report.peak_bytes)
        n = report.max_batch_size(budget)
        fixed, each = report.per_example_bytes(n)
        over = -(-5 * n // 4)
        totals = []
        for b in (n, over):
            m = measure(name, "tf", b)
            totals.append(None if "error" in m else m["measured"] + report.persistent_bytes(b))
        cells = [mib(t) if t is not None else "failed" for t in totals]
        fits = totals[0] is not None and totals[0] <= budget
        exceeds = totals[1] is not None and totals[1] > budget
        print(f"| {name} | {mib(budget)} | {n} | {cells[0]} | {over} | {cells[1]} | "
              f"{'yes' if fits else 'NO'} | {'yes' if exceeds else 'NO'} | "
              f"{mib(fixed)} + {mib(each)} per example | "
              f"{'yes' if report.peak_at(over) <= budget else 'no'} |", flush=True)


if __name__ == "__main__":
    main()
