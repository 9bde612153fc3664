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

--onednn measures with oneDNN on (TF's default on this CPU), where RSS cannot
follow the tensors: oneDNN's CPU allocator is a BFC pool that keeps freed
memory (the second step's VmHWM grew 8-55 MiB where its tensors peaked at
35-340 MiB). The measure is then the peak over the second step of the bytes
TF's allocator was asked for and had not been given back: its own log of
each tensor and raw allocation and deallocation (TF_CPP_VMODULE=log_memory=2,
requested bytes; logged_peak below), what the report counts. The allocator's
own peak of bytes in use (tf.config.experimental.get_memory_info("CPU:0"),
which only oneDNN's allocator answers) comes with it as "allocator": each
allocation there counts as the whole BFC chunk it got, and BFC does not
split a free chunk under twice the request, so which chunk a tensor gets
depends on what the pool holds from earlier steps, not on the step (its
region map, TF_CPP_VMODULE=bfc_allocator=4: fn_bigconv's 4.2 MiB workspace at
batch 2 got a free 8 MiB chunk, the allocator's peak 12.4 MiB where the logged
tensors peaked at 7.9). The report predicts oneDNN's kernels then
(memory_report.py: no patch matrices, MaxPool's workspace). The process's RSS
additionally holds the pool's growth (its regions double in size), which the
report does not model.

  .venv/bin/python benchmarks/bench_memory_report.py            # all models
  .venv/bin/python benchmarks/bench_memory_report.py unet conv135
  .venv/bin/python benchmarks/bench_memory_report.py unet_bn unet_bn_wide --onednn
  .venv/bin/python benchmarks/bench_memory_report.py --max-batch # the max-batch check
  .venv/bin/python benchmarks/bench_memory_report.py unet_small --variants tf --batches 4,16
  .venv/bin/python benchmarks/bench_memory_report.py --graphs [--onednn]  # tf.function, TF1

unet_bn21, unet_bn3 and unet_small (issue 52) have a 21x21 BigConv2D bottleneck;
tests/memory/test_measured_peak.py measures unet_small through measure().
"""
import argparse
import json
import os
import re
import subprocess
import sys

# RSS must follow the live tensors (above); --onednn measures TF's allocator
# instead. Set before TensorFlow loads, when run as a script (main); importing
# the module (tests/memory) sets nothing.
ONEDNN = "--onednn" in sys.argv


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


def _unet_bn(keras, shape, filters, big_kernel, outputs, name):
    """U-Net-style with BatchNorm (training mode), MaxPooling2D, a tfbigconv
    BigConv2D bottleneck, UpSampling2D and Concatenate skips (issue 36)."""
    import tfbigconv.keras
    L = keras.layers
    inp = keras.Input(shape)

    def conv_bn_relu(h, f):
        return L.ReLU()(L.BatchNormalization()(L.Conv2D(f, 3, padding="same")(h)))

    skips, h = [], inp
    for f in filters:
        h = conv_bn_relu(conv_bn_relu(h, f), f)
        skips.append(h)
        h = L.MaxPooling2D()(h)
    h = tfbigconv.keras.BigConv2D(2 * filters[-1], big_kernel, padding="same")(h)
    h = L.ReLU()(L.BatchNormalization()(h))
    for f, skip in zip(reversed(filters), reversed(skips)):
        h = L.Concatenate()([L.UpSampling2D()(h), skip])
        h = conv_bn_relu(h, f)
    return keras.Model(inp, L.Conv2D(outputs, 1)(h), name=name)


def unet_bn(keras):
    """(B,128,128,3), 2 levels of 16/32 filters, a 15x15 BigConv2D at 32x32x64."""
    return _unet_bn(keras, (128, 128, 3), (16, 32), 15, 3, "unet_bn")


def unet_bn_wide(keras):
    """(B,96,160,4) frames, 2 levels of 24/48 filters, a 31x31 BigConv2D at 24x40x96."""
    return _unet_bn(keras, (96, 160, 4), (24, 48), 31, 2, "unet_bn_wide")


def unet_small(keras):
    """(B,64,64,3), 2 levels of 8/16 filters, a 21x21 BigConv2D at 16x16x32:
    the one tests/memory measures."""
    return _unet_bn(keras, (64, 64, 3), (8, 16), 21, 3, "unet_small")


def unet_bn21(keras):
    """(B,96,96,3), 2 levels of 16/32 filters, a 21x21 BigConv2D at 24x24x64 (issue 52)."""
    return _unet_bn(keras, (96, 96, 3), (16, 32), 21, 3, "unet_bn21")


def unet_bn3(keras):
    """(B,128,128,3), 3 levels of 16/32/64 filters, a 21x21 BigConv2D at 16x16x128."""
    return _unet_bn(keras, (128, 128, 3), (16, 32, 64), 21, 3, "unet_bn3")


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
          "subtracted": (subtracted, (2, 4)), "conv135": (conv135, (1, 2)),
          "unet_bn": (unet_bn, (2, 16)), "unet_bn_wide": (unet_bn_wide, (2, 16)), "unet_bn21": (unet_bn21, (4, 16)),
          "unet_bn3": (unet_bn3, (2, 8)), "unet_small": (unet_small, (4, 16))}
VARIANTS = ("tf", "bigconv")


# --- graphs: tf.function training steps and a TF1 session's ----------------
# memory_report(step_fn, batch) and memory_report(graph, batch, fetches=...),
# measured as the Keras models are (a second step in a fresh process).

def tf1_unet():
    """A TF1 U-Net training step: tf.compat.v1 placeholders (batch unknown),
    conv + ReLU, max-pooling, nearest upsampling, skip concatenations, Adam's
    minimize; a Session runs it. Returns (graph, fetches, {placeholder: shape})."""
    import tensorflow as tf
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(0)
        x = v1.placeholder(tf.float32, [None, 64, 64, 3], name="x")
        y = v1.placeholder(tf.float32, [None, 64, 64, 3], name="y")

        def conv(h, f, name, k=3, relu=True):
            with v1.variable_scope(name):
                w = v1.get_variable("kernel", [k, k, h.shape[-1], f])
                b = v1.get_variable("bias", [f], initializer=v1.zeros_initializer())
                h = tf.nn.bias_add(tf.nn.conv2d(h, w, 1, "SAME"), b)
                return tf.nn.relu(h) if relu else h

        skips, h = [], x
        for i, f in enumerate((8, 16)):
            h = conv(conv(h, f, f"enc{i}a"), f, f"enc{i}b")
            skips.append(h)
            h = tf.nn.max_pool2d(h, 2, 2, "VALID")
        h = conv(h, 32, "bottleneck")
        for i, (f, skip) in enumerate(zip((16, 8), reversed(skips))):
            with v1.variable_scope(f"dec{i}"):
                h = v1.image.resize_nearest_neighbor(h, skip.shape[1:3])
                h = tf.concat([h, skip], -1)
            h = conv(conv(h, f, f"dec{i}a"), f, f"dec{i}b")
        out = conv(h, 3, "head", k=1, relu=False)
        loss = tf.reduce_mean(tf.square(out - y))
        train = v1.train.AdamOptimizer(1e-3).minimize(loss)
        init = v1.global_variables_initializer()
    return graph, [train, loss], {x: [64, 64, 3], y: [64, 64, 3]}, init


def _keras_step(model):
    """A tf.function training step for a Keras model: GradientTape, MSE, Adam
    (built beforehand), the batch's shapes from the model's."""
    import keras
    import tensorflow as tf
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    specs = [tf.TensorSpec([None] + list(model.inputs[0].shape[1:]), tf.float32),
             tf.TensorSpec([None] + list(model.outputs[0].shape[1:]), tf.float32)]

    @tf.function(input_signature=specs)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return step, specs


def fn_cnn():
    """A small CNN (conv, pool, conv, dense head) as a tf.function step."""
    import keras
    L = keras.layers
    keras.utils.set_random_seed(0)
    return _keras_step(keras.Sequential([
        keras.Input((64, 64, 3)), L.Conv2D(16, 3, padding="same", activation="relu"),
        L.MaxPooling2D(), L.Conv2D(32, 3, padding="same", activation="relu"),
        L.MaxPooling2D(), L.Flatten(), L.Dense(10)], name="cnn"))


def fn_bigconv():
    """A 1x1 conv, a 21x21 BigConv2D and a 1x1 conv as a tf.function step."""
    import keras
    import tfbigconv.keras
    L = keras.layers
    keras.utils.set_random_seed(0)
    return _keras_step(keras.Sequential([
        keras.Input((64, 64, 4)), L.Conv2D(16, 1, activation="relu"),
        tfbigconv.keras.BigConv2D(16, 21, padding="same"), L.ReLU(), L.Conv2D(4, 1)],
        name="bigconv"))


def fn_unet():
    """unet_small (BatchNorm, a 21x21 BigConv2D bottleneck) as a tf.function step."""
    import keras
    keras.utils.set_random_seed(0)
    return _keras_step(unet_small(keras))


GRAPH_MODELS = {"tf1_unet": (tf1_unet, (4, 16)), "fn_cnn": (fn_cnn, (4, 16)),
                "fn_bigconv": (fn_bigconv, (2, 8)), "fn_unet": (fn_unet, (4, 16))}


def graph_measure_here(name, batch, onednn=ONEDNN):
    """measure_here for a graph: the second of two steps."""
    import numpy as np
    import tensorflow as tf
    rng = np.random.default_rng(0)
    if name.startswith("tf1_"):
        graph, fetches, shapes, init = GRAPH_MODELS[name][0]()
        session = tf.compat.v1.Session(graph=graph)
        session.run(init)
        feed = {p: rng.standard_normal([batch] + s).astype(np.float32) for p, s in shapes.items()}
        run = lambda: session.run(fetches, feed)
    else:
        step, specs = GRAPH_MODELS[name][0]()
        args = [tf.constant(rng.standard_normal([batch] + s.shape.as_list()[1:]), tf.float32)
                for s in specs]
        run = lambda: step(*args)
    # The peak over three steps: which ready ops TF's executor runs at the same
    # time varies from step to step on a loaded host (fn_cnn's batch-16 step
    # measured 19.3 to 23.1 MiB in single steps).
    _measure_second_step(run, onednn, steps=GRAPH_STEPS)


GRAPH_STEPS = 3


# What the measured steps' allocator log lies between (stderr).
MARKS = ("=== measured steps ===", "=== end of measured steps ===")


def _measure_second_step(run, onednn, steps=1):
    """Runs `run` once, then `steps` times, and prints the peak over those
    steps as measure_here does (with oneDNN, the allocator's; measure() reads
    the logged tensors' peak from stderr between MARKS)."""
    import tensorflow as tf
    run()  # traces, creates slots, warms the allocator
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = _status("VmRSS")
    if onednn:
        tf.config.experimental.reset_memory_stats("CPU:0")
        in_use = tf.config.experimental.get_memory_info("CPU:0")["current"]
        print(MARKS[0], file=sys.stderr, flush=True)
    for _ in range(steps):
        run()
    rss = _status("VmHWM") - before
    if onednn:
        print(MARKS[1], file=sys.stderr, flush=True)
        peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - in_use
        print(json.dumps({"allocator": peak, "rss": rss, "baseline": before}))
        return
    print(json.dumps({"measured": rss, "baseline": before}))


_LOG_FIELD = re.compile(r"(allocation_id|requested_bytes|num_bytes): (\d+)")


def logged_peak(log):
    """The peak of bytes allocated and not yet freed in TF's allocator log
    (log_memory's MemoryLog{Tensor,Raw}{Allocation,Deallocation} lines, as
    requested) between MARKS; tensors allocated before the first mark count
    from 0 and their frees are ignored."""
    log = log.split(MARKS[0], 1)[1].split(MARKS[1], 1)[0]
    live, current, peak = {}, 0, 0
    for line in log.splitlines():
        if "__LOG_MEMORY__" not in line:
            continue
        fields = dict(_LOG_FIELD.findall(line))
        if "Allocation " in line and "allocation_id" in fields:
            n = int(fields.get("requested_bytes", fields.get("num_bytes", 0)))
            live[fields["allocation_id"]] = n
            current += n
            peak = max(peak, current)
        elif "Deallocation " in line:
            current -= live.pop(fields.get("allocation_id"), 0)
    return peak


def graph_predict(name, batch):
    """memory_report of the graph model at `batch` (CPU, no advice)."""
    import tfbigconv
    if name.startswith("tf1_"):
        graph, fetches, _, _ = GRAPH_MODELS[name][0]()
        return tfbigconv.memory_report(graph, batch, fetches=fetches, device="CPU", advice=False)
    step, _ = GRAPH_MODELS[name][0]()
    return tfbigconv.memory_report(step, batch, device="CPU", advice=False)


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


def measure_here(name, variant, batch, onednn=ONEDNN):
    import numpy as np
    import tensorflow as tf
    model = build(name, variant)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((batch,) + tuple(model.input.shape[1:]), np.float32))
    t = tf.constant(rng.standard_normal((batch,) + tuple(model.output.shape[1:]), np.float32))
    _measure_second_step(lambda: model.train_on_batch(x, t), onednn)


def measure(name, variant, batch, onednn=ONEDNN):
    """The measured step peak in a fresh process, with oneDNN on or off
    (TF_ENABLE_ONEDNN_OPTS): {"measured": bytes, ...} or {"error": line};
    with oneDNN, "logged" is the logged tensors' peak and "allocator" the
    allocator's own peak (above); measured is the first. variant: "tf" or
    "bigconv" for MODELS, "graph" for GRAPH_MODELS."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", MALLOC_MMAP_THRESHOLD_="65536",
               TFBIGCONV_AUTOTUNE="0", TF_ENABLE_ONEDNN_OPTS="1" if onednn else "0")
    if onednn:  # TF's allocator log (above)
        env.update(TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="log_memory=2")
    r = subprocess.run([sys.executable, __file__, "--measure", name, variant, str(batch)]
                       + (["--onednn"] if onednn else []),
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}
    result = json.loads(r.stdout.strip().splitlines()[-1])
    if onednn:
        # Keras models and graphs alike are held to the logged tensors: both
        # simulations model TF's buffer reuse (one simulation, memory/simulate.py).
        result["logged"] = result["measured"] = logged_peak(r.stderr)
    return result


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
    parser.add_argument("--onednn", action="store_true",
                        help="oneDNN on; measure the peak of the step's tensors in TF's "
                        "allocator log (above)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma-separated subset of " + ", ".join(VARIANTS))
    parser.add_argument("--batches", help="comma-separated batch sizes (default: per model)")
    parser.add_argument("--graphs", action="store_true",
                        help="the graph models (" + ", ".join(GRAPH_MODELS) + "): "
                        "memory_report of a tf.function or TF1 graph step")
    args = parser.parse_args()
    if args.measure:
        name, variant, batch = args.measure
        if variant == "graph":
            graph_measure_here(name, int(batch))
        else:
            measure_here(name, variant, int(batch))
        return
    os.environ["TFBIGCONV_AUTOTUNE"] = "0"
    if args.max_batch:
        return check_max_batch(args.models)
    if args.graphs:
        return check_graphs(args.models if args.models != list(MODELS) else list(GRAPH_MODELS),
                            args.batches)
    if ONEDNN:
        print("oneDNN on: measured = the peak of the step's tensors in TF's allocator log; "
              "allocator peak = its peak of BFC chunks in use")
    print("| model | variant | batch | predicted step peak MiB | measured MiB | error | "
          "predicted total MiB | peak at | allocator peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    slopes = []
    batches = [int(b) for b in args.batches.split(",")] if args.batches else None
    for name in args.models:
        for variant in args.variants.split(","):
            pairs = []
            for batch in batches or MODELS[name][1]:
                report = predict(name, variant, batch)
                m = measure(name, variant, batch)
                if "error" in m:
                    print(f"| {name} | {variant} | {batch} | {mib(report.step_peak_bytes)} | "
                          f"failed: {m['error'][:80]} | | | | |")
                    continue
                err = report.step_peak_bytes / m["measured"] - 1
                worst = max(worst, abs(err))
                s = report.peak_step
                pairs.append((batch, report.step_peak_bytes, m["measured"]))
                print(f"| {name} | {variant} | {batch} | {mib(report.step_peak_bytes)} | "
                      f"{mib(m['measured'])} | {100 * err:+.0f}% | {mib(report.peak_bytes)} | "
                      f"{s.phase} {s.layer} | "
                      f"{mib(m['allocator']) if 'allocator' in m else '-'} |", flush=True)
            if len(pairs) >= 2 and pairs[-1][2] != pairs[0][2]:
                (b0, p0, m0), (b1, p1, m1) = pairs[0], pairs[-1]
                slopes.append(f"{name} {variant}: batch {b0} -> {b1} adds {mib(p1 - p0)} MiB "
                              f"predicted, {mib(m1 - m0)} measured "
                              f"({(p1 - p0) / (m1 - m0):.2f} of it)")
    print(f"worst |error|: {100 * worst:.0f}%")
    for line in slopes:  # the batch-dependent part (issue 36 compared these)
        print(line)


def check_graphs(names, batches=None):
    """The graph models' predicted step peaks against the measured ones (with
    oneDNN, also the allocator's peak of chunks in use; see above)."""
    print("| model | batch | oneDNN | predicted step peak MiB | measured MiB | ratio | "
          "allocator peak MiB | peak at |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        for batch in ([int(b) for b in batches.split(",")] if batches
                      else GRAPH_MODELS[name][1]):
            report = graph_predict(name, batch)
            m = measure(name, "graph", batch)
            cells = f"| {name} | {batch} | {'on' if ONEDNN else 'off'} | " \
                    f"{mib(report.step_peak_bytes)} |"
            if "error" in m:
                print(f"{cells} failed: {m['error'][:80]} | | | |")
                continue
            s = report.peak_step
            print(f"{cells} {mib(m['measured'])} | {report.step_peak_bytes / m['measured']:.2f} | "
                  f"{mib(m['allocator']) if 'allocator' in m else '-'} | {s.phase} {s.layer} |",
                  flush=True)


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
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1" if ONEDNN else "0"
    main()
