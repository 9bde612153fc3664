"""The seed's subtracted-conv block, unfused against fused by tfbigconv.fuse_linear (CPU).

The block replaces a ResNet50 3x3 conv (C -> C) by
    p = 1x1 conv (C -> C/2); d = depthwise KxK(p) - p; l = KxK conv (C/2 -> C/2) of p;
    y = concat(d, l)
all SAME, with biases, at the four ResNet50 stage shapes (56x56x64, 28x28x128,
14x14x256, 7x7x512), K = 7 and 31.

Modes, each (case, variant) in a fresh subprocess:
  train   one training step in a tf.function: loss = mean(y^2), gradients for all
          weights, SGD update. "unfused" is the Keras block; "fused", "recompute" and
          "auto" are fuse_linear(block, trainable=True, mode=...) (FusedLinearConv,
          see tfbigconv.fuse_train: "fused" composes the kernel from the branch
          weights in the step and runs one conv; "recompute" runs the branches and
          keeps only x for backprop; "auto" picks one from the planner's estimates,
          and the table says which). --train-variants picks others; the first is
          the baseline the last is compared with; "unfused-big" is the Keras block
          with every conv converted to BigConv2D (convert_model): recompute's
          kernels, with p kept. "fused" is skipped where its kernel alone
          would exceed 256 MiB (stage 4, K = 31: 1 GiB).
  infer   the forward pass; "fused" is fuse_linear(block) (BigConv2D + bias map).
Each worker runs 2 warm-up steps, resets the peak RSS (/proc/self/clear_refs), and
takes the peak RSS increase (VmHWM - VmRSS before) over the next step as the step's
memory (glibc's mmap threshold is fixed at 128 KiB so that freed blocks leave the
RSS); the time is the median of --reps further steps. "p MiB" is the tensor the
fused versions no longer keep for backprop (batch x H x W x C/2 floats).

--blocks N chains N blocks with a ReLU between them (default 1): then N tensors p
are kept by the unfused model until the backward pass reaches them, as in a
ResNet50 stage ("p MiB" counts all N). With one block the peak comes in its own
backward pass, where recompute mode holds its recomputed p as the unfused block
holds its kept one.

--rounds R runs every (case, variant) R times, rounds interleaved (round 1 of
every case, then round 2, ...), so that load from other processes spreads over
the variants; the table gives the median over rounds. "target" says whether the
last variant (auto by default) meets the issue's training targets against the
first (unfused by default): step time at most 1.1x, and peak lower by at least p.

Run time: each worker starts TensorFlow (~5-10 s); with the defaults (batch 8, 5
reps, 1 round) about 20-30 min on 2 idle cores, most of it in the K = 31 rows.

Usage: python benchmarks/bench_fuse.py [--batch 8] [--reps 5] [--rounds 1] [--ks 7,31]
       [--stages 1,2,3,4] [--modes train,infer] [--blocks 1] [--train-variants ...]
"""
import argparse
import json
import statistics
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
    mode, variant, hw, c, k, batch, reps, blocks = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:9])
    L = keras.layers
    x_in = y = keras.Input((hw, hw, c))
    for i in range(blocks):  # ReLU between blocks, as between ResNet50's convs
        if i:
            y = L.ReLU()(y)
        p = L.Conv2D(c // 2, 1, name=f"p{i}")(y)
        d = L.Subtract()([L.DepthwiseConv2D(k, padding="same", name=f"dw{i}")(p), p])
        l = L.Conv2D(c // 2, k, padding="same", name=f"low{i}")(p)
        y = L.Concatenate()([d, l])
    block = keras.Model(x_in, y)
    rng = np.random.default_rng(0)
    for w in block.weights:
        w.assign(rng.standard_normal(w.shape).astype(np.float32) * 0.05)
    model, chosen = block, ""
    if variant == "unfused-big":  # the same layers, every conv through bigconv2d
        model = tfbigconv.convert_model(block, min_kernel_size=1)
    elif variant != "unfused":
        train_mode = "fused" if variant == "fused" else variant
        model, reports = tfbigconv.fuse_linear(block, trainable=(mode == "train"),
                                               mode=train_mode)
        assert all(r.status == "fused" for r in reports), [str(r) for r in reports]
        layer = [l for l in model.layers if isinstance(l, tfbigconv.keras.FusedLinearConv)]
        chosen = layer[0].choose_mode(batch).mode if layer else ""
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
    print(json.dumps({"peak": peak, "time": float(np.median(times)), "chosen": chosen}))
""")


def run(mode, variant, hw, c, k, batch, reps, blocks):
    # A fixed mmap threshold: large blocks go back to the OS when freed (glibc
    # otherwise raises the threshold and keeps them), so the RSS after the
    # warm-up steps is the live memory and the measured step's peak is its own.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", MALLOC_MMAP_THRESHOLD_="131072")
    args = [mode, variant] + [str(v) for v in (hw, c, k, batch, reps, blocks)]
    # Not from the source tree, whose tfbigconv/ has no compiled module.
    proc = subprocess.run([sys.executable, "-c", WORKER] + args, env=env, capture_output=True,
                          text=True, cwd=tempfile.gettempdir())
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


TRAIN_VARIANTS = "unfused,fused,recompute,auto"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--ks", default="7,31")
    ap.add_argument("--stages", default="1,2,3,4")
    ap.add_argument("--modes", default="train,infer")
    ap.add_argument("--blocks", type=int, default=1)
    ap.add_argument("--train-variants", default=TRAIN_VARIANTS,
                    help="comma-separated, the first is the baseline; also unfused-big (the Keras block with every "
                         "conv converted to BigConv2D: the kernels recompute runs, keeping p)")
    args = ap.parse_args()
    variants = {"train": tuple(args.train_variants.split(",")), "infer": ("unfused", "fused")}
    cases = [(stage, k, mode) for stage in map(int, args.stages.split(","))
             for k in map(int, args.ks.split(",")) for mode in args.modes.split(",")]
    results = {}  # (stage, k, mode, variant) -> [result per round]
    for r in range(args.rounds):
        for stage, k, mode in cases:
            hw, c = STAGES[stage]
            for variant in variants[mode]:
                if variant == "fused" and mode == "train" and k * k * c * c * 4 > 256 << 20:
                    res = {"error": "skipped: fused kernel over 256 MiB"}
                else:
                    res = run(mode, variant, hw, c, k, args.batch, args.reps, args.blocks)
                print(f"round {r + 1}: stage {stage} K={k} {mode} {variant}: {json.dumps(res)}",
                      file=sys.stderr, flush=True)
                results.setdefault((stage, k, mode, variant), []).append(res)

    mib = 1 << 20

    def summary(key):
        ok = [res for res in results[key] if "error" not in res]
        if not ok:
            return None
        return {"time": statistics.median(res["time"] for res in ok),
                "peak": statistics.median(res["peak"] for res in ok),
                "chosen": "/".join(sorted({res["chosen"] for res in ok}))}

    def cell(s, field):
        if s is None:
            return "-"
        return f"{s['time'] * 1e3:.1f}" if field == "time" else f"{s['peak'] / mib:.1f}"

    names = " / ".join(variants["train"])
    base, last_name = variants["train"][0], variants["train"][-1]
    print(f"| stage (HxWxC) | K | mode | ms: {names} (auto: chosen) | "
          f"{last_name} / {base} time | peak MiB: {names} | "
          f"{last_name} peak saved MiB | p MiB | target |")
    print("|---|---|---|---|---|---|---|---|---|")
    for stage, k, mode in cases:
        hw, c = STAGES[stage]
        p_bytes = args.blocks * args.batch * hw * hw * (c // 2) * 4
        s = {v: summary((stage, k, mode, v)) for v in variants[mode]}
        last = s[variants[mode][-1]]
        times = " / ".join(cell(s[v], "time") for v in variants[mode])
        peaks = " / ".join(cell(s[v], "peak") for v in variants[mode])
        if mode == "train" and s.get("auto") is not None:
            times += f" ({s['auto']['chosen']})"
        first = s[variants[mode][0]]
        if first is None or last is None:
            print(f"| {stage} ({hw}x{hw}x{c}) | {k} | {mode} | {times} | - | {peaks} | - | "
                  f"{p_bytes / mib:.1f} | - |")
            continue
        ratio = last["time"] / first["time"]
        saved = first["peak"] - last["peak"]
        target = "-"
        if mode == "train":
            target = "met" if ratio <= 1.1 and saved >= p_bytes else (
                "missed: " + ", ".join(what for what, bad in (("time", ratio > 1.1),
                                                              ("peak", saved < p_bytes)) if bad))
        print(f"| {stage} ({hw}x{hw}x{c}) | {k} | {mode} | {times} | {ratio:.2f} | {peaks} | "
              f"{saved / mib:.1f} | {p_bytes / mib:.1f} | {target} |", flush=True)


if __name__ == "__main__":
    main()
