"""CUDA kernel tests without TensorFlow: the launchers (tfbigconv_gpu_harness)
on device buffers from CuPy or torch, against the float64 NumPy reference of
tests/reference.py; then timings against torch (cuDNN and torch.fft).

Run through scripts/gpu_check.sh, which builds the module and sets PYTHONPATH.
"""
import argparse
import itertools
import sys
import time

import numpy as np

import tfbigconv_gpu_harness as H
from reference import (conv2d_reference, conv2d_reference_backprop_filter,
                       conv2d_reference_backprop_input, rel_l2)

# Relative L2 error allowed, as in tests/conftest.py (kept in step by hand:
# conftest sets up TF-specific state); FFT adds transform error.
TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1.5e-2}
FFT_TOLERANCE = {"float64": 1e-10, "float32": 1e-4}
DTYPES = ["float32", "float64", "float16", "bfloat16"]
PASSES = ["forward", "backprop_input", "backprop_filter"]


# ---- device buffers: raw bytes through CuPy or torch ----------------------

class Backend:
    def __init__(self, name):
        self.name = name
        if name == "cupy":
            import cupy
            self.cp = cupy
        else:
            import torch
            self.torch = torch

    def to_device(self, host):
        raw = np.ascontiguousarray(host).view(np.uint8)
        if self.name == "cupy":
            return self.cp.asarray(raw)
        return self.torch.from_numpy(raw.copy()).cuda()

    def empty_nan(self, nbytes):
        if self.name == "cupy":
            return self.cp.full(nbytes, 0xFF, dtype=self.cp.uint8)
        return self.torch.full((nbytes,), 0xFF, dtype=self.torch.uint8, device="cuda")

    def ptr(self, buf):
        return buf.data.ptr if self.name == "cupy" else buf.data_ptr()

    def to_host(self, buf):
        return buf.get() if self.name == "cupy" else buf.cpu().numpy()

    def stream(self):
        if self.name == "cupy":
            return self.cp.cuda.get_current_stream().ptr
        return self.torch.cuda.current_stream().cuda_stream


def pick_backend():
    for name in ("torch", "cupy"):
        try:
            b = Backend(name)
            if name == "torch" and not b.torch.cuda.is_available():
                continue
            return b
        except ImportError:
            continue
    sys.exit("gpu_check: needs torch (with CUDA) or CuPy to allocate device memory")


# Storage encodings: bfloat16 as uint16 bit patterns (CuPy has no bfloat16).
def encode(x, dtype):
    x = np.asarray(x, np.float32)
    if dtype == "bfloat16":
        b = x.view(np.uint32).astype(np.uint64)
        b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        return b.astype(np.uint16)
    return x.astype(dtype)


def decode(raw, dtype, shape):
    if dtype == "bfloat16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return raw.view(np.dtype(dtype)).reshape(shape)


ITEM = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


# ---- the test matrix ------------------------------------------------------

def cases():
    """(name, input NHWC-logical shape, filter HWIO, strides, dilations, padding, pairs, format)."""
    base = [
        ((1, 70, 67, 1), (63, 63, 1, 3)), ((2, 140, 137, 1), (135, 135, 1, 3)),
        ((1, 20, 30, 2), (1, 29, 2, 3)), ((1, 30, 20, 2), (29, 1, 2, 3)),
        ((2, 17, 13, 3), (17, 13, 3, 5)),
        # tile edges of the direct kernel (32 x 64 outputs) and channel blocks
        ((1, 48, 80, 2), (17, 17, 2, 4)), ((1, 47, 95, 1), (16, 32, 1, 5)),
        ((1, 33, 65, 3), (2, 2, 3, 7)),
        # groups and depthwise (RepLKNet-style)
        ((2, 40, 40, 6), (13, 13, 2, 9)), ((2, 56, 56, 8), (31, 31, 1, 8)),
    ]
    for (x, w) in base:
        yield (x, w, (1, 1), (1, 1), "VALID", ((0, 0), (0, 0)), "NHWC")
    x, w = (2, 37, 41, 4), (9, 7, 2, 6)
    pads = [("SAME", ((0, 0), (0, 0))), ("EXPLICIT", ((0, 3), (2, 1))),
            ("EXPLICIT", ((6, 0), (0, 7)))]
    for (pad, pairs), s, d in itertools.product(pads, [1, 2, 3, (4, 2)], [1, 2, (1, 3)]):
        s2 = s if isinstance(s, tuple) else (s, s)
        d2 = d if isinstance(d, tuple) else (d, d)
        yield (x, w, s2, d2, pad, pairs, "NHWC")
    yield ((2, 37, 41, 4), (9, 7, 2, 6), (2, 1), (1, 2), "SAME", ((0, 0), (0, 0)), "NCHW")
    yield ((0, 20, 20, 2), (5, 5, 2, 3), (1, 1), (1, 1), "SAME", ((0, 0), (0, 0)), "NHWC")
    yield ((3, 11, 13, 2), (11, 13, 2, 3), (1, 1), (1, 1), "VALID", ((0, 0), (0, 0)), "NHWC")


def flat_pads(pairs, fmt, padding):
    if padding != "EXPLICIT":
        return []
    (t, b), (l, r) = pairs
    return [0, 0, t, b, l, r, 0, 0] if fmt == "NHWC" else [0, 0, 0, 0, t, b, l, r]


def to_fmt(a, fmt):
    return a.transpose(0, 3, 1, 2).copy() if fmt == "NCHW" else a


def check_case(be, rng, case, dtype, algorithm, pass_):
    x_shape, w_shape, s, d, padding, pairs, fmt = case
    xs = x_shape if fmt == "NHWC" else (x_shape[0], x_shape[3], x_shape[1], x_shape[2])
    pads = flat_pads(pairs, fmt, padding)
    y_shape = tuple(H.output_shape(list(xs), list(w_shape), list(s), list(d), padding, pads, fmt))
    # Round inputs to the dtype first, so the reference sees what the kernel sees.
    rnd = lambda shape: decode(encode(rng.standard_normal(shape), dtype).view(np.uint8), dtype, shape) \
        if dtype in ("float16", "bfloat16") else rng.standard_normal(shape).astype(dtype)
    kw = dict(strides=s, padding=padding, dilations=d, data_format=fmt, explicit=pairs)
    if pass_ == "forward":
        a, b = rnd(xs), rnd(w_shape)
        ref, out_shape = conv2d_reference(a, b, **kw), y_shape
    elif pass_ == "backprop_input":
        a, b = rnd(y_shape), rnd(w_shape)
        ref, out_shape = conv2d_reference_backprop_input(a, b, xs, **kw), xs
    else:
        a, b = rnd(xs), rnd(y_shape)
        ref, out_shape = conv2d_reference_backprop_filter(a, b, w_shape, **kw), w_shape
    da, db = be.to_device(encode(a, dtype)), be.to_device(encode(b, dtype))
    dout = be.empty_nan(int(np.prod(out_shape)) * ITEM[dtype])
    used = H.run(pass_, be.ptr(da), be.ptr(db), be.ptr(dout), list(xs), list(w_shape), list(s),
                 list(d), padding, pads, fmt, dtype, algorithm, stream=be.stream())
    got = decode(be.to_host(dout), dtype, out_shape)
    err = rel_l2(got, ref) if ref.size and np.any(ref) else (0.0 if np.all(got == 0) else np.inf)
    tol = TOLERANCE[dtype]
    if algorithm == "fft":
        tol = max(tol, FFT_TOLERANCE.get(dtype, tol))
    return err, tol, used


def run_matrix(be, quick):
    ok, failed, skipped = 0, 0, 0
    have_fft, why = H.cufft_status()
    if not have_fft:
        print(f"cuFFT unavailable, fft cases skipped: {why}")
    rng = np.random.default_rng(1234)
    for case in cases():
        for pass_, algorithm, dtype in itertools.product(PASSES, ["direct", "fft"], DTYPES):
            if quick and dtype in ("float64", "bfloat16") and case[1][0] > 40:
                continue
            if algorithm == "fft" and not have_fft:
                skipped += 1
                continue
            try:
                err, tol, used = check_case(be, rng, case, dtype, algorithm, pass_)
                good = err <= tol
            except Exception as e:  # a launcher error is a failure, not a crash
                err, tol, used, good = float("nan"), 0, repr(e), False
            ok += good
            failed += not good
            if not good:
                print(f"FAIL {pass_} {algorithm} {dtype} {case}: rel_l2={err:.3g} tol={tol:g} ({used})")
    print(f"kernel tests: {ok} passed, {failed} failed, {skipped} skipped")
    return failed == 0


# ---- timings --------------------------------------------------------------

def timed(fn, sync, reps=3):
    fn()
    sync()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def timings(be, batch):
    if be.name != "torch":
        print("timings need torch (cuDNN and torch.fft as the baselines); skipped")
        return
    torch = be.torch
    F = torch.nn.functional
    sync = torch.cuda.synchronize
    stream = be.stream()

    def ours(x, w, algorithm, pass_="forward", dy=None):
        xs, ws = list(x.shape), list(w.shape)
        ys = H.output_shape(xs, ws, [1, 1], [1, 1], "VALID", [], "NHWC")
        out = torch.empty(ys if pass_ == "forward" else ws, device="cuda", dtype=x.dtype)
        a, b = (x, w) if pass_ == "forward" else (x, dy)
        return lambda: H.run(pass_, a.data_ptr(), b.data_ptr(), out.data_ptr(), xs, ws, [1, 1],
                             [1, 1], "VALID", [], "NHWC", "float32", algorithm, stream=stream)

    def torch_fft(x, w):  # x NHWC (C=1), w HWIO (I=1): correlation via rfft2
        n, h, wd, _ = x.shape
        kh, kw = w.shape[:2]
        X = torch.fft.rfft2(x[..., 0], s=(h, wd))
        Wf = torch.fft.rfft2(torch.flip(w[:, :, 0, :], (0, 1)).permute(2, 0, 1), s=(h, wd))
        return lambda: torch.fft.irfft2(X[:, None] * Wf[None], s=(h, wd))[:, :, kh - 1:, kw - 1:]

    print(f"\nseed case: input ({batch},321,481,1) float32, filter 135x135x1x3, VALID, forward")
    x = torch.randn(batch, 321, 481, 1, device="cuda")
    w = torch.randn(135, 135, 1, 3, device="cuda")
    xc, wc = x.permute(0, 3, 1, 2).contiguous(), w.permute(3, 2, 0, 1).contiguous()
    rows = [("tfbigconv direct", timed(ours(x, w, "direct"), sync)),
            ("tfbigconv fft", timed(ours(x, w, "fft"), sync)),
            ("torch conv2d (cuDNN)", timed(lambda: F.conv2d(xc, wc), sync)),
            ("torch.fft", timed(torch_fft(x, w), sync))]
    for name, t in rows:
        print(f"  {name:24s} {t * 1e3:10.2f} ms   {rows[2][1] / t:6.2f}x vs cuDNN")

    print("\nK sweep: input (16,321,481,1) float32, filter KxKx1x3, VALID, forward (ms)")
    print(f"  {'K':>4} {'direct':>10} {'fft':>10} {'cuDNN':>10} {'torch.fft':>10}")
    x = torch.randn(16, 321, 481, 1, device="cuda")
    xc = x.permute(0, 3, 1, 2).contiguous()
    for k in (15, 31, 63, 95, 135):
        w = torch.randn(k, k, 1, 3, device="cuda")
        wc = w.permute(3, 2, 0, 1).contiguous()
        t = [timed(ours(x, w, "direct"), sync), timed(ours(x, w, "fft"), sync),
             timed(lambda: F.conv2d(xc, wc), sync), timed(torch_fft(x, w), sync)]
        print(f"  {k:>4} " + " ".join(f"{v * 1e3:10.2f}" for v in t))

    print("\ndepthwise 31x31, input (8,56,56,128) float32, forward + both gradients (ms)")
    x = torch.randn(8, 56, 56, 128, device="cuda")
    w = torch.randn(31, 31, 1, 128, device="cuda")
    dy = torch.randn(8, 56, 56, 128, device="cuda")
    dx = torch.empty_like(x)
    dw = torch.empty_like(w)
    y = torch.empty_like(dy)
    s, d = [1, 1], [1, 1]

    def ours_dw(algorithm):
        def step():
            args = ([8, 56, 56, 128], [31, 31, 1, 128], s, d, "SAME", [], "NHWC",
                    "float32", algorithm)
            H.run("forward", x.data_ptr(), w.data_ptr(), y.data_ptr(), *args, stream=stream)
            H.run("backprop_input", dy.data_ptr(), w.data_ptr(), dx.data_ptr(), *args, stream=stream)
            H.run("backprop_filter", x.data_ptr(), dy.data_ptr(), dw.data_ptr(), *args, stream=stream)
        return step

    xc = x.permute(0, 3, 1, 2).contiguous().requires_grad_()
    wc = w.permute(3, 2, 0, 1).contiguous().requires_grad_()
    dyc = dy.permute(0, 3, 1, 2).contiguous()

    def cudnn_step():
        out = F.conv2d(xc, wc, padding=15, groups=128)
        torch.autograd.grad(out, (xc, wc), dyc)

    t_cudnn = timed(cudnn_step, sync)
    for algorithm in ("direct", "fft"):
        t = timed(ours_dw(algorithm), sync)
        print(f"  tfbigconv {algorithm:8s} {t * 1e3:10.2f} ms   {t_cudnn / t:6.2f}x vs cuDNN")
    print(f"  torch cuDNN        {t_cudnn * 1e3:10.2f} ms")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer float64/bfloat16 cases")
    ap.add_argument("--no-timings", action="store_true")
    ap.add_argument("--seed-batch", type=int, default=200)
    args = ap.parse_args()
    be = pick_backend()
    print(f"backend: {be.name}")
    ok = run_matrix(be, args.quick)
    if not args.no_timings:
        timings(be, args.seed_batch)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
