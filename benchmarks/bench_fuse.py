"""The seed's subtracted-conv block, unfused against fused by tfbigconv.fuse_linear (CPU).

The block replaces a ResNet50 3x3 conv (C -> C) by
    p = 1x1 conv (C -> C/2); d = depthwise KxK(p) - p; l = KxK conv (C/2 -> C/2) of p;
    y = concat(d, l)
all SAME, with biases, at the four ResNet50 stage shapes (56x56x64, 28x28x128,
14x14x256, 7x7x512), K = 7 and 31.

Modes, each (case, variant) in a fresh subprocess:
  train   one training step in a tf.function: loss = mean(y^2), gradients for all
          weights, SGD update. "unfused" is the Keras block; "fused" is
          fuse_linear(block, trainable=True) (FusedLinearConv: the kernel is composed
          from the branch weights in the step, one conv runs).
  infer   the forward pass; "fused" is fuse_linear(block) (BigConv2D + bias map).
Each worker runs 2 warm-up steps, resets the peak RSS (/proc/self/clear_refs), and
takes the peak RSS increase (VmHWM - VmRSS before) over the next step as the step's
memory (glibc's mmap threshold is fixed at 128 KiB so that freed blocks leave the RSS); the time is the median of --reps further steps. "p bytes" is the tensor the
fused version no longer keeps for backprop (batch x H x W x C/2 floats).

Usage: python benchmarks/bench_fuse.py [--batch 8] [--reps 5] [--ks 7,31] [--stages 1,2,3,4]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

STAGES = {1: (56, 64), 2: (28, 128), 3: (14, 256), 4: (7, 512)}

WORKER = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import tensorflow as tf
    import keras
    import tfbigconv
    mode, variant, hw, c, k, batch, reps = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:8])
    L = keras.layers
    x_in = keras.Input((hw, hw, c))
    p = L.Conv2D(c // 2, 1, name="p")(x_in)
    d = L.Subtract()([L.DepthwiseConv2D(k, padding="same", name="dw")(p), p])
    l = L.Conv2D(c // 2, k, padding="same", name="low")(p)
    block = keras.Model(x_in, L.Concatenate()([d, l]))
    rng = np.random.default_rng(0)
    for w in block.weights:
        w.assign(rng.standard_normal(w.shape).astype(np.float32) * 0.05)
    model = block
    if variant == "fused":
        model, reports = tfbigconv.fuse_linear(block, trainable=(mode == "train"))
        assert reports[0].status == "fused", str(reports[0])
    x = tf.constant(rng.standard_normal((batch, hw, hw, c)).astype(np.float32))
    opt = keras.optimizers.SGD(1e-3)
    opt.build(model.trainable_weights)

    @tf.function
    def train():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x)))
        grads = tape.gradient(loss, model.trainable_weights)
        opt.apply_gradients(zip(grads, model.trainable_weights))
        return loss

    @tf.function
    def infer():
        return tf.reduce_sum(model(x))

    step = train if mode == "train" else infer
    def status(field):
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    for _ in range(2):
        step().numpy()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status("VmRSS")
    step().numpy()
    peak = status("VmHWM") - before
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step().numpy()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"peak": peak, "time": float(np.median(times))}))
""")


def run(mode, variant, hw, c, k, batch, reps):
    # A fixed mmap threshold: large blocks go back to the OS when freed (glibc
    # otherwise raises the threshold and keeps them), so the RSS after the
    # warm-up steps is the live memory and the measured step's peak is its own.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", MALLOC_MMAP_THRESHOLD_="131072")
    args = [mode, variant] + [str(v) for v in (hw, c, k, batch, reps)]
    # Not from the source tree, whose tfbigconv/ has no compiled module.
    proc = subprocess.run([sys.executable, "-c", WORKER] + args, env=env, capture_output=True,
                          text=True, cwd=tempfile.gettempdir())
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ks", default="7,31")
    ap.add_argument("--stages", default="1,2,3,4")
    args = ap.parse_args()
    mib = 1 << 20
    print("| stage (HxWxC) | K | mode | unfused ms | fused ms | time fused/unfused | "
          "unfused peak MiB | fused peak MiB | peak saved MiB | p MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for stage in map(int, args.stages.split(",")):
        hw, c = STAGES[stage]
        for k in map(int, args.ks.split(",")):
            p_bytes = args.batch * hw * hw * (c // 2) * 4
            for mode in ("train", "infer"):
                u = run(mode, "unfused", hw, c, k, args.batch, args.reps)
                f = run(mode, "fused", hw, c, k, args.batch, args.reps)
                if "error" in u or "error" in f:
                    print(f"| {stage} ({hw}x{hw}x{c}) | {k} | {mode} | error: "
                          f"{u.get('error', '')} {f.get('error', '')} |")
                    continue
                print(f"| {stage} ({hw}x{hw}x{c}) | {k} | {mode} | {u['time'] * 1e3:.1f} | "
                      f"{f['time'] * 1e3:.1f} | {f['time'] / u['time']:.2f} | "
                      f"{u['peak'] / mib:.1f} | {f['peak'] / mib:.1f} | "
                      f"{(u['peak'] - f['peak']) / mib:.1f} | {p_bytes / mib:.1f} |", flush=True)


if __name__ == "__main__":
    main()
