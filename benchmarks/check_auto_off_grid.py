"""Default auto as a user calls it, on geometries outside bench_dispatch's grid.

Each case: fwd + both gradients under tf.function with the default auto
(autotuning on, a fresh cache), checked against a float64 run by relative L2
and timed (best of 3 after a warm-up) beside TensorFlow's own kernel
(tf.nn.depthwise_conv2d for depthwise, else tf.nn.conv2d; nan where TF's CPU
kernels cannot run the case) and, with --forced, beside algorithm="direct"
and "fft" ("regret": auto's time over the best of the three).

    python benchmarks/check_auto_off_grid.py [--forced]
"""
import os, sys, tempfile, time
os.environ["TFBIGCONV_AUTOTUNE_CACHE"] = tempfile.mktemp(suffix=".json")
import numpy as np, tensorflow as tf, tfbigconv
rng = np.random.default_rng(1)
def step(conv):
    @tf.function
    def f(x, w, g):
        with tf.GradientTape() as t:
            t.watch([x, w]); y = conv(x, w); l = tf.reduce_sum(tf.cast(y, tf.float32) * g)
        dx, dw = t.gradient(l, [x, w]); return y, dx, dw
    return f
def timeit(f, *a):
    f(*a); ts=[]
    for _ in range(3):
        t0=time.perf_counter(); [v.numpy() for v in f(*a)]; ts.append(time.perf_counter()-t0)
    return min(ts)
forced = "--forced" in sys.argv[1:]
cases = [  # (x, w, stride, padding, dtype, tf reference fn[, dilation])
    ((6, 40, 52, 48), (9, 9, 1, 48), 1, "SAME", "float32", "dw"),
    ((3, 37, 41, 24), (19, 19, 1, 48), 2, "SAME", "float32", "dw"),   # multiplier 2, stride 2
    ((4, 33, 47, 32), (11, 11, 8, 32), 1, "VALID", "float32", "grouped"),
    ((2, 45, 45, 12), (13, 13, 12, 12), 1, "SAME", "bfloat16", "dense"),
    ((5, 30, 34, 16), (5, 5, 1, 16), 1, "SAME", "float16", "dw"),
    ((2, 61, 59, 3), (27, 27, 3, 5), 1, "SAME", "float32", "dense"),
    # Dilated (atrous) layers, non-square and 1x1 filters, a batch of 64.
    ((2, 65, 65, 64), (3, 3, 64, 64), 1, "SAME", "float32", "dense", 12),
    ((4, 48, 48, 16), (3, 3, 16, 16), 1, "SAME", "bfloat16", "dense", 6),
    ((8, 64, 64, 64), (3, 3, 1, 64), 1, "SAME", "float32", "dw", 6),
    ((4, 65, 65, 128), (3, 3, 1, 128), 1, "SAME", "float32", "dw", 12),  # DeepLab's ASPP rates
    ((2, 129, 129, 64), (3, 3, 1, 64), 1, "SAME", "float32", "dw", 18),
    ((1, 97, 97, 8), (7, 7, 8, 8), 1, "VALID", "float32", "dense", 8),
    ((4, 64, 64, 32), (1, 31, 32, 32), 1, "SAME", "float32", "dense"),
    ((8, 56, 56, 64), (51, 1, 1, 64), 1, "SAME", "float32", "dw"),
    ((2, 96, 96, 16), (15, 41, 16, 8), 1, "SAME", "float32", "dense"),
    ((16, 56, 56, 64), (1, 1, 64, 128), 1, "SAME", "float32", "dense"),
    ((64, 28, 28, 32), (9, 9, 1, 32), 2, "SAME", "float32", "dw"),
]
for xs, ws, s, pad, dt, kind, *dil in cases:
    d = dil[0] if dil else 1
    dtype = tf.as_dtype(dt)
    x = tf.cast(rng.standard_normal(xs), dtype); w = tf.cast(rng.standard_normal(ws), dtype)
    ours = lambda **k: (lambda a, b: tfbigconv.bigconv2d(a, b, s, pad, dilations=d, **k))
    y64 = ours(algorithm="direct")(tf.cast(x, tf.float64), tf.cast(w, tf.float64))
    g = tf.constant(rng.standard_normal(y64.shape), tf.float32)
    ref = step(ours(algorithm="direct"))(tf.cast(x, tf.float64), tf.cast(w, tf.float64), g)
    auto = step(ours())
    t0 = time.perf_counter(); got = auto(x, w, g); first = time.perf_counter() - t0
    rel = [float(tf.norm(tf.cast(a, tf.float64) - r) / tf.norm(r)) for a, r in zip(got, ref)]
    if kind == "dw":
        m = ws[3] // xs[3]
        tfconv = lambda a, b: tf.nn.depthwise_conv2d(a, tf.reshape(b, [ws[0], ws[1], xs[3], m]),
                                                     [1, s, s, 1], pad, dilations=[d, d])
    else:
        tfconv = lambda a, b: tf.nn.conv2d(a, b, s, pad, dilations=d)
    try:
        t_tf = timeit(step(tfconv), x, w, g)
    except Exception:
        t_tf = float("nan")
    t_auto = timeit(auto, x, w, g)
    extra = ""
    if forced:
        t_ours = {a: timeit(step(ours(algorithm=a)), x, w, g) for a in ("direct", "fft")}
        best = min(v for v in [t_tf] + list(t_ours.values()) if v == v)
        extra = (f", direct {t_ours['direct']*1e3:.1f} ms, fft {t_ours['fft']*1e3:.1f} ms, "
                 f"regret {t_auto / best:.2f}")
    e = tfbigconv.explain(xs, ws, s, pad, dilations=d, dtype=dt)
    print(f"{xs}x{ws} s{s} d{d} {pad} {dt}: auto {t_auto*1e3:.1f} ms (first {first:.2f} s), "
          f"tf.nn {t_tf*1e3:.1f} ms{extra}, rel L2 y/dx/dw {rel[0]:.1e}/{rel[1]:.1e}/{rel[2]:.1e}, "
          f"chosen {e.chosen} {e.how}", flush=True)
