"""CUDA kernel tests without TensorFlow: the launchers (tfbigconv_gpu_harness)
on device buffers from CuPy or torch, against the float64 NumPy reference of
tests/reference.py; then timings against torch (cuDNN and torch.fft); and
with --calibrate DIR, the timing grid that the GPU cost model is fitted to.

Run through scripts/gpu_check.sh, which builds the module and sets PYTHONPATH.
Kernel times of ours come from CUDA events around back-to-back calls with
the workspace allocated once (H.time); torch's from CUDA events likewise.
"""
import argparse
import csv
import itertools
import os
import sys

import numpy as np

import tfbigconv_gpu_harness as H
from reference import (conv2d_reference, conv2d_reference_backprop_filter,
                       conv2d_reference_backprop_input, conv3d_reference, conv3d_reference_grads,
                       rel_l2)

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
# float64 stays float64: rounding it through float32 would hand the kernel
# other inputs than the reference.
def encode(x, dtype):
    if dtype == "float64":
        return np.asarray(x, np.float64)
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
    """(input NHWC-logical shape, filter HWIO, strides, dilations, padding, pairs, format),
    or in 3-D (NDHWC-logical, DHWIO, (d, h, w) strides and dilations, padding, three
    pairs, NDHWC or NCDHW)."""
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
    # 1-D: bigconv1d's problems, height 1 (a long causal depthwise filter, dense
    # with a stride, dilated causal in NCHW)
    yield ((2, 1, 300, 8), (1, 64, 1, 8), (1, 1), (1, 1), "EXPLICIT", ((0, 0), (63, 0)), "NHWC")
    yield ((1, 1, 260, 3), (1, 129, 3, 4), (1, 2), (1, 1), "SAME", ((0, 0), (0, 0)), "NHWC")
    yield ((2, 1, 200, 5), (1, 31, 1, 10), (1, 1), (1, 3), "EXPLICIT", ((0, 0), (90, 0)), "NCHW")
    # rows longer than the FFT kernels' segments (2048 columns; the crop's 256)
    # and more output channels than the crop's block of 64
    yield ((1, 1, 2300, 66), (1, 1500, 1, 66), (1, 1), (1, 1), "EXPLICIT", ((0, 0), (1499, 0)),
           "NHWC")
    yield ((1, 1, 2100, 3), (1, 50, 3, 70), (1, 1), (1, 1), "SAME", ((0, 0), (0, 0)), "NHWC")
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
    # the direct reduction kernel (backprop_filter): several channel blocks
    # (10 per group), a channel multiplier, depthwise over more than a warp
    # of channels, stride 2 with an odd tail
    for x, w, s in [((2, 19, 23, 4), (3, 5, 2, 20), 1), ((3, 30, 26, 6), (5, 5, 1, 12), 1),
                    ((2, 33, 29, 40), (7, 7, 1, 40), 1), ((2, 41, 37, 36), (15, 15, 1, 36), 2),
                    ((3, 20, 22, 35), (3, 3, 1, 35), 2)]:
        yield (x, w, (s, s), (1, 1), "SAME", ((0, 0), (0, 0)), "NHWC")
    # the depthwise kernel (forward, backprop_input): channel vectors of 8, 4,
    # 2 and 1 (groups 24, 12, 10, 9), a column tail, strides, dilations,
    # cropping and padding; NCHW and fewer than 8 groups take the other kernels
    dw = [((2, 23, 19, 24), (5, 3, 1, 24), (2, 1), (1, 2), "EXPLICIT", ((3, 0), (1, 4)), "NHWC"),
          ((1, 17, 22, 12), (4, 6, 1, 12), (1, 3), (2, 1), "EXPLICIT", ((0, 2), (2, 0)), "NHWC"),
          ((3, 9, 13, 10), (3, 3, 1, 10), (1, 1), (1, 1), "SAME", ((0, 0), (0, 0)), "NHWC"),
          ((2, 15, 11, 9), (5, 5, 1, 9), (2, 2), (1, 1), "SAME", ((0, 0), (0, 0)), "NHWC"),
          ((2, 21, 17, 16), (3, 3, 1, 16), (1, 1), (1, 1), "SAME", ((0, 0), (0, 0)), "NCHW"),
          ((2, 12, 14, 6), (3, 3, 1, 6), (1, 1), (1, 1), "SAME", ((0, 0), (0, 0)), "NHWC")]
    yield from dw
    yield from cases_3d()


def cases_3d():
    """3-D cases: each (image, output depth) pair is an image of the direct
    kernels and depth taps are reduction rows, skipped where they read padding
    or (backprop_input of a depth stride) the zeros between input planes."""
    z = ((0, 0), (0, 0), (0, 0))
    one = (1, 1, 1)
    # dense, odd and prime sizes; groups (NCDHW); depth-only and depth-1 filters
    yield ((2, 7, 11, 13, 3), (3, 5, 4, 3, 5), one, one, "VALID", z, "NDHWC")
    yield ((2, 5, 13, 11, 4), (2, 3, 3, 2, 6), (1, 2, 1), (2, 1, 1), "SAME", z, "NCDHW")
    yield ((1, 19, 7, 8, 3), (7, 1, 1, 3, 4), (2, 3, 3), (2, 1, 1), "VALID", z, "NDHWC")
    yield ((3, 5, 7, 9, 2), (1, 3, 3, 2, 3), one, one, "SAME", z, "NCDHW")
    # a filter deeper than the input (SAME pads more than the input's depth),
    # and a depth stride over the filter's depth (backprop_input skips planes)
    yield ((1, 3, 9, 10, 2), (5, 3, 3, 2, 2), one, one, "SAME", z, "NDHWC")
    yield ((2, 10, 8, 9, 2), (2, 3, 3, 2, 3), (3, 3, 3), one, "VALID", z, "NCDHW")
    # strides of 3 in rows and columns take the untiled kernel; explicit padding
    yield ((1, 9, 37, 41, 4), (3, 3, 3, 4, 6), (2, 3, 3), one, "SAME", z, "NDHWC")
    yield ((2, 11, 23, 19, 2), (3, 3, 2, 2, 4), (2, 3, 3), (2, 1, 2), "EXPLICIT",
           ((1, 2), (0, 3), (2, 1)), "NDHWC")
    yield ((1, 8, 20, 17, 3), (3, 4, 2, 1, 6), (1, 3, 4), (3, 1, 1), "EXPLICIT",
           ((4, 0), (1, 1), (0, 2)), "NCDHW")
    # a wide dilation: the tiles of forward and backprop_input do not fit
    # (untiled), the latter with input dilation in depth
    yield ((1, 7, 30, 29, 2), (2, 4, 4, 2, 3), (3, 1, 1), (1, 25, 25), "SAME", z, "NDHWC")
    # the reduction kernel (backprop_filter): a long (ci, kd, kh) reduction
    yield ((4, 9, 8, 7, 3), (3, 3, 3, 3, 8), one, one, "SAME", z, "NDHWC")
    # the depthwise kernel (NDHWC, 8 or more groups): vectors of 8 and 4, a
    # depth stride, dilation and cropping; NCDHW takes the other kernels
    yield ((2, 6, 15, 13, 16), (3, 3, 3, 1, 16), (2, 1, 1), one, "SAME", z, "NDHWC")
    yield ((1, 7, 11, 9, 12), (2, 3, 3, 1, 12), (1, 2, 2), (2, 1, 1), "EXPLICIT",
           ((1, 0), (0, 2), (1, 1)), "NDHWC")
    yield ((2, 5, 9, 8, 10), (3, 3, 3, 1, 10), one, one, "SAME", z, "NCDHW")
    # ... and its split rows (backprop_filter, few outputs)
    yield ((4, 9, 5, 5, 8), (3, 3, 3, 1, 8), one, one, "VALID", z, "NDHWC")


def channels_last(fmt):
    return fmt in ("NHWC", "NDHWC")


def has_depth(case):
    """A 3-D case (its input has a depth dimension)."""
    return len(case[0]) == 5


def flat_pads(pairs, fmt, padding):
    """explicit_paddings in data_format order: (before, after) per dimension."""
    if padding != "EXPLICIT":
        return []
    spatial = [v for pair in pairs for v in pair]
    return [0, 0] + spatial + [0, 0] if channels_last(fmt) else [0, 0, 0, 0] + spatial


def reference(pass_, a, b, xs, w_shape, case):
    """The float64 reference of one pass: a, b as operands() makes them."""
    _, _, s, d, padding, pairs, fmt = case
    kw = dict(strides=s, padding=padding, dilations=d, data_format=fmt, explicit=pairs)
    if has_depth(case):
        if pass_ == "forward":
            return conv3d_reference(a, b, **kw)
        if pass_ == "backprop_input":
            return conv3d_reference_grads(np.zeros(xs), b, a, **kw)[0]
        return conv3d_reference_grads(a, np.zeros(w_shape), b, **kw)[1]
    if pass_ == "forward":
        return conv2d_reference(a, b, **kw)
    if pass_ == "backprop_input":
        return conv2d_reference_backprop_input(a, b, xs, **kw)
    return conv2d_reference_backprop_filter(a, b, w_shape, **kw)


def operands(rng, case, dtype, pass_, poison=None):
    """(a, b, reference, output shape, harness args) for one pass of a case,
    inputs rounded to the dtype so the reference sees what the kernel sees;
    poison(a, b) -> (a, b) alters them first (non-finite cases)."""
    x_shape, w_shape, s, d, padding, pairs, fmt = case
    xs = x_shape if channels_last(fmt) else (x_shape[0], x_shape[-1]) + tuple(x_shape[1:-1])
    pads = flat_pads(pairs, fmt, padding)
    y_shape = tuple(H.output_shape(list(xs), list(w_shape), list(s), list(d), padding, pads, fmt))
    rnd = lambda shape: decode(encode(rng.standard_normal(shape), dtype).view(np.uint8), dtype, shape)
    if pass_ == "forward":
        a, b, out_shape = rnd(xs), rnd(w_shape), y_shape
    elif pass_ == "backprop_input":
        a, b, out_shape = rnd(y_shape), rnd(w_shape), xs
    else:
        a, b, out_shape = rnd(xs), rnd(y_shape), w_shape
    if poison is not None:
        a, b = poison(a, b)  # the reference sees the poisoned operands
    ref = lambda: reference(pass_, a, b, xs, w_shape, case)
    args = (list(xs), list(w_shape), list(s), list(d), padding, pads, fmt, dtype)
    return a, b, ref, out_shape, args


# ---- NaN, Inf and huge values through the FFT (issue 15) ------------------
# The fft algorithm must give what the direct kernels and tf.nn.conv2d give:
# NaN and Inf where the float64 reference has them, the rest within tolerance.

def _poison(kind, seed):
    rng = np.random.default_rng(seed)

    def apply(a, b):
        a, b = a.copy(), b.copy()
        if kind == "nan_input":
            for _ in range(3):
                a[tuple(rng.integers(n) for n in a.shape)] = np.nan
        elif kind == "inf_input":
            a[tuple(rng.integers(n) for n in a.shape)] = np.inf
            a[tuple(rng.integers(n) for n in a.shape)] = -np.inf
        elif kind == "nan_filter":
            b[tuple(rng.integers(n) for n in b.shape)] = np.nan
        elif kind == "huge":  # exact results near 1e36: the transforms would overflow float32
            a, b = a * 1e30, b * 1e5
        return a, b
    return apply


NON_FINITE_KINDS = ("nan_input", "inf_input", "nan_filter", "huge")


def non_finite_cases():
    """(case, dtype, kind): a few geometries, every kind; huge only in float32.
    The caller skips nan_filter outside the forward pass: there the kernels'
    products with the zeros of input dilation are NaN where the reference's
    scatter has no product at all."""
    geos = [((2, 23, 29, 3), (5, 4, 3, 4), (1, 1), (1, 1), "SAME", ((0, 0), (0, 0)), "NHWC"),
            ((1, 40, 37, 4), (7, 7, 2, 6), (2, 2), (1, 1), "SAME", ((0, 0), (0, 0)), "NHWC"),
            ((1, 30, 33, 2), (9, 5, 2, 3), (1, 1), (2, 1), "VALID", ((0, 0), (0, 0)), "NCHW"),
            # 3-D without depth padding: the direct kernels (the fft's fallback)
            # skip a depth tap over padding, as the CPU's do, where the
            # reference multiplies a NaN filter tap by the padding's zeros
            ((2, 6, 11, 13, 3), (3, 3, 3, 3, 4), (2, 1, 1), (1, 1, 1), "EXPLICIT",
             ((0, 0), (1, 1), (2, 1)), "NDHWC")]
    for case, kind in itertools.product(geos, NON_FINITE_KINDS):
        for dtype in (("float32",) if kind == "huge" else ("float32", "float16")):
            yield case, dtype, kind


def non_finite_error(got, ref):
    """rel L2 on the finite part, or inf unless NaN/+Inf/-Inf sit exactly where ref has them."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    for test in (np.isnan, np.isposinf, np.isneginf):
        if not np.array_equal(test(got), test(ref)):
            return np.inf
    finite = np.isfinite(ref)
    return rel_l2(got[finite], ref[finite]) if finite.any() else 0.0


def error_of(got, ref):
    return rel_l2(got, ref) if ref.size and np.any(ref) else (0.0 if np.all(got == 0) else np.inf)


class Tally:
    """Passed and failed counts of one family of host tests."""

    def __init__(self):
        self.ok = self.failed = 0

    def add(self, err, tol, failure, measure, used):
        """Counts err <= tol as passed, else as failed, printing
        "<failure>: <measure>=<err> (<used>)"."""
        good = err <= tol
        self.ok += good
        self.failed += not good
        if not good:
            print(f"{failure}: {measure}={err:.3g} ({used})")


def run_fft_on_host(pass_, a, b, out, dtype, args, tile, chunk, ci_block):
    """H.run_fft_on_host on a, b encoded for dtype, with tile x (tile + 2) tiles
    (tile // 2 x tile x (tile + 2) in 3-D: depth tiles with edges)."""
    return H.run_fft_on_host(pass_, encode(a, dtype).view(np.uint8),
                             encode(b, dtype).view(np.uint8), out, *args, tile_h=tile,
                             tile_w=tile + 2, chunk=chunk, ci_block=ci_block, tile_d=tile // 2)


def run_host_matrix(dtypes=("float32", "float64", "float16")):
    """The direct kernels' bodies on the CPU (H.run_direct_on_host): every
    case and pass whose plan is not the tiled kernel, with and without
    workspace. Needs no GPU."""
    direct, skipped = Tally(), 0
    rng = np.random.default_rng(4321)
    for case, pass_, dtype, limit in itertools.product(cases(), PASSES, dtypes, [4 << 30, 0]):
        a, b, ref, out_shape, args = operands(rng, case, dtype, pass_)
        out = np.full(int(np.prod(out_shape)) * ITEM[dtype], 0xFF, np.uint8)
        try:
            used = H.run_direct_on_host(pass_, encode(a, dtype).view(np.uint8),
                                        encode(b, dtype).view(np.uint8), out, *args,
                                        workspace_limit=limit)
        except RuntimeError as e:
            if "not emulated" in str(e):
                skipped += 1
                continue
            raise
        direct.add(error_of(decode(out, dtype, out_shape), ref()), TOLERANCE[dtype],
                   f"FAIL host {pass_} {dtype} limit={limit} {case}", "rel_l2", used)
    print(f"host kernel tests (direct): {direct.ok} passed, {direct.failed} failed, "
          f"{skipped} skipped (tiled)")
    fft = Tally()
    # The FFT steps with numpy's FFT for cuFFT: whole-output tiles, and small
    # tiles with chunks and channel blocks smaller than the work.
    for case, pass_, dtype, (tile, chunk, ci_block) in itertools.product(
            cases(), PASSES, dtypes, [(10**6, 10**6, 10**6), (7, 3, 1)]):
        if dtype == "float16" and tile < 10**6:
            continue
        a, b, ref, out_shape, args = operands(rng, case, dtype, pass_)
        out = np.full(int(np.prod(out_shape)) * ITEM[dtype], 0xFF, np.uint8)
        try:
            used = run_fft_on_host(pass_, a, b, out, dtype, args, tile, chunk, ci_block)
        except RuntimeError as e:
            if "empty" in str(e):
                continue
            raise
        fft.add(error_of(decode(out, dtype, out_shape), ref()),
                max(TOLERANCE[dtype], FFT_TOLERANCE.get(dtype, 0)),
                f"FAIL host fft {pass_} {dtype} tile={tile} {case}", "rel_l2", used)
    print(f"host kernel tests (fft): {fft.ok} passed, {fft.failed} failed")
    nf = Tally()
    for (case, dtype, kind), pass_, (tile, chunk, ci_block) in itertools.product(
            non_finite_cases(), PASSES, [(10**6, 10**6, 10**6), (7, 3, 1)]):
        if (dtype == "float16" and tile < 10**6) or (kind == "nan_filter" and pass_ != "forward"):
            continue
        a, b, ref, out_shape, args = operands(rng, case, dtype, pass_, _poison(kind, nf.ok))
        out = np.full(int(np.prod(out_shape)) * ITEM[dtype], 0xFF, np.uint8)
        used = run_fft_on_host(pass_, a, b, out, dtype, args, tile, chunk, ci_block)
        nf.add(non_finite_error(decode(out, dtype, out_shape), ref()),
               max(TOLERANCE[dtype], FFT_TOLERANCE.get(dtype, 0)),
               f"FAIL host fft {kind} {pass_} {dtype} tile={tile} {case}", "error", used)
    print(f"host kernel tests (fft, non-finite): {nf.ok} passed, {nf.failed} failed")
    return direct.failed == 0 and fft.failed == 0 and nf.failed == 0


def check_case(be, rng, case, dtype, algorithm, pass_, workspace_limit=4 << 30, poison=None):
    a, b, ref, out_shape, args = operands(rng, case, dtype, pass_, poison)
    da, db = be.to_device(encode(a, dtype)), be.to_device(encode(b, dtype))
    dout = be.empty_nan(int(np.prod(out_shape)) * ITEM[dtype])
    used = H.run(pass_, be.ptr(da), be.ptr(db), be.ptr(dout), *args, algorithm,
                 workspace_limit=workspace_limit, stream=be.stream())
    got = decode(be.to_host(dout), dtype, out_shape)
    err = non_finite_error(got, ref()) if poison is not None else error_of(got, ref())
    tol = TOLERANCE[dtype]
    if algorithm == "fft":
        tol = max(tol, FFT_TOLERANCE.get(dtype, tol))
    return err, tol, used


def is_depthwise(case):
    """A matrix case whose filter has in-depth 1 over several channels."""
    x_shape, w_shape = case[0], case[1]
    return w_shape[-2] == 1 and x_shape[-1] > 1


def run_matrix(be, quick, subset=False, depthwise_only=False):
    tally = {"ok": 0, "failed": 0}
    skipped = 0
    have_fft, why = H.cufft_status()
    if not have_fft:
        print(f"cuFFT unavailable, fft cases skipped: {why}")
    rng = np.random.default_rng(1234)

    def check(label, case, dtype, algorithm, pass_, **kw):
        try:
            err, tol, used = check_case(be, rng, case, dtype, algorithm, pass_, **kw)
            good = err <= tol
        except Exception as e:  # a launcher error is a failure, not a crash
            err, tol, used, good = float("nan"), 0, repr(e), False
        tally["ok" if good else "failed"] += 1
        if not good:
            print(f"FAIL {label}{pass_} {algorithm} {dtype} {case}: error={err:.3g} tol={tol:g} "
                  f"({used})")

    all_cases = [c for c in cases() if is_depthwise(c) or not depthwise_only]
    for ci, case in enumerate(all_cases):
        if subset and ci % 4 != 0:
            continue
        for pass_, algorithm, dtype in itertools.product(PASSES, ["direct", "fft"], DTYPES):
            if quick and dtype in ("float64", "bfloat16") and case[1][0] > 40:
                continue
            if subset and dtype not in ("float32", "float16"):
                continue
            if algorithm == "fft" and not have_fft:
                skipped += 1
                continue
            check("", case, dtype, algorithm, pass_)
    # Without workspace the direct kernels run unsplit (the reduction kernel
    # writes the output itself): the last 2-D cases (the depthwise kernel's)
    # and the last 3-D ones.
    flat, deep = ([c for c in all_cases if has_depth(c) == d] for d in (False, True))
    for case in flat[-5:] + deep[-5:]:
        for pass_ in PASSES:
            check("workspace 0 ", case, "float32", "direct", pass_, workspace_limit=0)
    # NaN, Inf and huge values: fft must place them as the direct kernel and TF do.
    for (case, dtype, kind), pass_ in itertools.product(non_finite_cases(), PASSES):
        if depthwise_only and not is_depthwise(case):
            continue
        if kind == "nan_filter" and pass_ != "forward":
            continue
        if not have_fft:
            skipped += 1
            continue
        for algorithm in ("direct", "fft"):
            check(f"{kind} ", case, dtype, algorithm, pass_, poison=_poison(kind, tally["ok"]))
    ok, failed = tally["ok"], tally["failed"]
    print(f"kernel tests: {ok} passed, {failed} failed, {skipped} skipped")
    return failed == 0


# ---- timings --------------------------------------------------------------

def torch_ms(torch, fn, reps=3):
    """Median GPU time of fn() in ms from CUDA events, after one warm-up call;
    one timed call when the warm-up took over 0.2 s."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    fn()
    e1.record()
    torch.cuda.synchronize()
    if e0.elapsed_time(e1) > 200:
        reps = 1
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    ev[0].record()
    for i in range(reps):
        fn()
        ev[i + 1].record()
    torch.cuda.synchronize()
    return float(np.median([ev[i].elapsed_time(ev[i + 1]) for i in range(reps)]))


class Ours:
    """Calls of the harness on one geometry, timed with H.time."""

    def __init__(self, torch, x_shape, w_shape, stride=(1, 1), padding="VALID", dtype="float32",
                 explicit_paddings=()):
        """x_shape NHWC (4-D) or NDHWC (5-D); explicit_paddings as TF's attribute."""
        self.torch, self.dtype = torch, dtype
        self.xs, self.ws, self.s, self.padding = list(x_shape), list(w_shape), list(stride), padding
        self.fmt = "NHWC" if len(self.xs) == 4 else "NDHWC"
        self.d, self.pads = [1] * len(self.s), list(explicit_paddings)
        self.ys = H.output_shape(self.xs, self.ws, self.s, self.d, padding, self.pads, self.fmt)
        tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
               "float64": torch.float64}[dtype]
        self.x = torch.randn(self.xs, device="cuda").to(tdt)
        self.w = torch.randn(self.ws, device="cuda").to(tdt)
        self.dy = torch.randn(self.ys, device="cuda").to(tdt)
        self.out = {"forward": torch.empty(self.ys, device="cuda", dtype=tdt),
                    "backprop_input": torch.empty(self.xs, device="cuda", dtype=tdt),
                    "backprop_filter": torch.empty(self.ws, device="cuda", dtype=tdt)}

    def operands(self, pass_):
        return {"forward": (self.x, self.w), "backprop_input": (self.dy, self.w),
                "backprop_filter": (self.x, self.dy)}[pass_]

    def args(self, pass_, algorithm):
        a, b = self.operands(pass_)
        return (pass_, a.data_ptr(), b.data_ptr(), self.out[pass_].data_ptr(), self.xs, self.ws,
                self.s, self.d, self.padding, self.pads, self.fmt, self.dtype, algorithm)

    def time(self, pass_, algorithm, reps=5, workspace_limit=4 << 30):
        return H.time(*self.args(pass_, algorithm), stream=self.torch.cuda.current_stream().cuda_stream,
                      reps=reps, workspace_limit=workspace_limit)

    def plan(self, pass_, algorithm):
        return H.plan(*self.args(pass_, algorithm))


def timings(be, batch):
    if be.name != "torch":
        print("timings need torch (cuDNN and torch.fft as the baselines); skipped")
        return
    torch = be.torch
    F = torch.nn.functional

    def torch_fft(x, w):  # x NHWC (C=1), w HWIO (I=1): correlation via rfft2
        n, h, wd, _ = x.shape
        kh, kw = w.shape[:2]

        def step():
            X = torch.fft.rfft2(x[..., 0], s=(h, wd))
            Wf = torch.fft.rfft2(torch.flip(w[:, :, 0, :], (0, 1)).permute(2, 0, 1), s=(h, wd))
            return torch.fft.irfft2(X[:, None] * Wf[None], s=(h, wd))[:, :, kh - 1:, kw - 1:]
        return step

    print(f"\nseed case: input ({batch},321,481,1) float32, filter 135x135x1x3, VALID, forward")
    print("  kernel ms from CUDA events; ours: workspace allocated once; wall: plan+launch+sync")
    o = Ours(torch, (batch, 321, 481, 1), (135, 135, 1, 3))
    xc = o.x.permute(0, 3, 1, 2).contiguous()
    wc = o.w.permute(3, 2, 0, 1).contiguous()
    fft = o.time("forward", "fft")
    direct = o.time("forward", "direct", reps=1)
    t_cudnn = torch_ms(torch, lambda: F.conv2d(xc, wc))
    t_tfft = torch_ms(torch, torch_fft(o.x, o.w))
    rows = [("tfbigconv direct", direct["kernel_ms"], direct["wall_ms"]),
            ("tfbigconv fft", fft["kernel_ms"], fft["wall_ms"]),
            ("torch conv2d (cuDNN)", t_cudnn, float("nan")),
            ("torch.fft pipeline", t_tfft, float("nan"))]
    for name, t, wall in rows:
        print(f"  {name:22s} {t:10.3f} ms (wall {wall:8.3f})  {t_cudnn / t:8.2f}x vs cuDNN"
              f"  {t_tfft / t:6.2f}x vs torch.fft")

    print("\nK sweep: input (16,321,481,1) float32, filter KxKx1x3, VALID, forward (kernel ms)")
    print(f"  {'K':>4} {'direct':>10} {'fft':>10} {'cuDNN':>10} {'torch.fft':>10}")
    for k in (15, 31, 63, 95, 135):
        o = Ours(torch, (16, 321, 481, 1), (k, k, 1, 3))
        xc, wc = o.x.permute(0, 3, 1, 2).contiguous(), o.w.permute(3, 2, 0, 1).contiguous()
        t = [o.time("forward", "direct", reps=1)["kernel_ms"], o.time("forward", "fft")["kernel_ms"],
             torch_ms(torch, lambda: F.conv2d(xc, wc)), torch_ms(torch, torch_fft(o.x, o.w))]
        print(f"  {k:>4} " + " ".join(f"{v:10.3f}" for v in t))

    print("\nfwd + both gradients, SAME (kernel ms, sum of the three passes)")
    print(f"  {'case':44s} {'direct':>9} {'fft':>9} {'cuDNN':>9}")
    for dtype, (x_shape, w_shape, groups) in itertools.product(
            ["float32", "float16"],
            [((8, 56, 56, 128), (31, 31, 1, 128), 128), ((4, 128, 128, 32), (31, 31, 32, 32), 1)]):
        o = Ours(torch, x_shape, w_shape, padding="SAME", dtype=dtype)
        t = {alg: sum(o.time(p, alg)["kernel_ms"] for p in PASSES) for alg in ("direct", "fft")}
        t["cudnn"] = sum(cudnn_pass_ms(torch, x_shape, w_shape[3], w_shape[0], groups, 1, dtype))
        print(f"  {dtype} {str(x_shape) + 'x' + str(w_shape):36s} {t['direct']:9.3f} {t['fft']:9.3f}"
              f" {t['cudnn']:9.3f}")


def _sum_passes(o, algorithm, reps):
    """Kernel ms of forward + both gradients, or NaN with the error printed."""
    try:
        return sum(o.time(p, algorithm, reps=reps)["kernel_ms"] for p in PASSES)
    except Exception as e:  # a row, not a crash
        print(f"  {algorithm}: {e}")
        return float("nan")


def timings_ranks(be, dtypes=("float32", "float16")):
    """Issue 41's 1-D and 3-D cases, forward + both gradients (kernel ms):
    a long causal depthwise 1-D convolution against the torch.fft pipeline
    (safari's fftconv_ref: pad to 2L, rfft, multiply, irfft, crop; autograd
    for the gradients), and a depthwise 21^3 one against cuDNN's grouped
    conv3d through torch (channels_last_3d, as TF feeds cuDNN)."""
    if be.name != "torch":
        print("timings need torch; skipped")
        return
    for time_case in (_time_long_1d, _time_depthwise_3d):
        for dtype in dtypes:
            try:
                time_case(be.torch, dtype)
            except Exception as e:  # e.g. torch's half-precision FFT refusing: a line, not a crash
                print(f"  {time_case.__name__} {dtype}: {type(e).__name__}: {e}")
            be.torch.cuda.empty_cache()


def _time_long_1d(torch, dtype, b=8, c=256, length=16384):
    tdt = getattr(torch, dtype)
    print(f"\n1-D causal depthwise: input (B, C, L) = ({b}, {c}, {length}) {dtype}, "
          f"{length}-tap filter per channel, fwd + both gradients (kernel ms)")
    o = Ours(torch, (b, 1, length, c), (1, length, 1, c), padding="EXPLICIT", dtype=dtype,
             explicit_paddings=[0, 0, 0, 0, length - 1, 0, 0, 0])
    ours = {alg: _sum_passes(o, alg, 3) for alg in ("fft", "auto")}
    u = torch.randn(b, c, length, device="cuda", dtype=tdt, requires_grad=True)
    k = torch.randn(c, length, device="cuda", dtype=tdt, requires_grad=True)
    dy = torch.randn(b, c, length, device="cuda", dtype=tdt)

    def fftconv():  # torch.fft runs half types only at powers of two: 2L is one
        n = 2 * length
        y = torch.fft.irfft(torch.fft.rfft(u, n=n) * torch.fft.rfft(k, n=n), n=n)[..., :length]
        torch.autograd.grad(y, (u, k), dy)
    t_tfft = torch_ms(torch, fftconv)
    print(f"  tfbigconv fft {ours['fft']:9.3f}   auto {ours['auto']:9.3f}   "
          f"torch.fft pipeline {t_tfft:9.3f}   ({t_tfft / ours['fft']:.2f}x)")


def _time_depthwise_3d(torch, dtype, n=2, c=64, s=48, kk=21):
    F = torch.nn.functional
    tdt = getattr(torch, dtype)
    print(f"\n3-D depthwise: input NDHWC ({n}, {s}, {s}, {s}, {c}) {dtype}, filter "
          f"{kk}^3, SAME, fwd + both gradients (kernel ms)")
    o = Ours(torch, (n, s, s, s, c), (kk, kk, kk, 1, c), stride=(1, 1, 1), padding="SAME",
             dtype=dtype)
    ours = {"fft": _sum_passes(o, "fft", 3), "direct": _sum_passes(o, "direct", 1)}
    torch.backends.cudnn.benchmark = False  # its autotuning of a 21^3 filter takes minutes
    cl = torch.channels_last_3d
    x = torch.randn(n, c, s, s, s, device="cuda", dtype=tdt).to(memory_format=cl)
    w = torch.randn(c, 1, kk, kk, kk, device="cuda", dtype=tdt).to(memory_format=cl)
    pad = kk // 2
    dy = torch.randn_like(F.conv3d(x, w, padding=pad, groups=c)).to(memory_format=cl)
    t = [torch_ms(torch, lambda: F.conv3d(x, w, padding=pad, groups=c), reps=1),
         torch_ms(torch, lambda: torch.nn.grad.conv3d_input(x.shape, w, dy, padding=pad,
                                                            groups=c), reps=1),
         torch_ms(torch, lambda: torch.nn.grad.conv3d_weight(x, w.shape, dy, padding=pad,
                                                             groups=c), reps=1)]
    print(f"  tfbigconv fft {ours['fft']:9.3f}   direct {ours['direct']:9.3f}   cuDNN "
          f"{sum(t):9.3f} (fwd {t[0]:.3f}, dx {t[1]:.3f}, dw {t[2]:.3f})   "
          f"({sum(t) / np.nanmin(list(ours.values())):.2f}x)")


# ---- the calibration grid --------------------------------------------------

# (N, H, W, Cin, Cout, K, groups, stride): input NHWC, K x K filter, SAME
# padding, dilation 1 (the geometries of ../shared/gpu/h100_grid_*.csv, re-measured with
# the current kernels in benchmarks/gpu/gpu_grid_*.csv).
GRID = [
    (16, 321, 481, 1, 3, 135, 1, 1), (16, 321, 481, 1, 3, 63, 1, 1),
    (4, 128, 128, 32, 32, 31, 1, 1), (16, 56, 56, 64, 64, 3, 1, 1),
    (32, 56, 56, 256, 256, 13, 256, 1), (8, 64, 64, 128, 128, 51, 128, 1),
    (32, 224, 224, 32, 32, 51, 4, 2), (1, 128, 128, 32, 32, 9, 4, 1),
    (2, 321, 481, 128, 128, 15, 128, 2), (32, 64, 64, 64, 64, 15, 1, 1),
    (8, 64, 64, 32, 32, 3, 4, 1), (32, 128, 128, 3, 16, 51, 1, 2),
    (1, 56, 56, 32, 32, 7, 4, 1), (2, 128, 128, 32, 32, 31, 4, 2),
    (32, 128, 128, 32, 32, 51, 4, 1), (8, 32, 32, 128, 128, 31, 128, 2),
    (1, 56, 56, 64, 64, 31, 64, 1), (1, 128, 128, 1, 3, 63, 1, 1),
    (2, 224, 224, 32, 32, 31, 4, 1), (8, 224, 224, 128, 128, 7, 128, 1),
    (2, 128, 128, 384, 384, 21, 384, 1), (32, 32, 32, 64, 64, 5, 64, 1),
    (1, 128, 128, 64, 64, 15, 1, 2), (2, 224, 224, 128, 128, 63, 128, 1),
    (1, 224, 224, 128, 128, 9, 128, 2), (2, 32, 32, 384, 384, 31, 384, 2),
    (32, 128, 128, 16, 16, 11, 1, 2), (2, 128, 128, 3, 16, 11, 1, 1),
    (8, 128, 128, 64, 64, 7, 1, 2), (2, 64, 64, 384, 384, 5, 384, 1),
    (1, 321, 481, 384, 384, 7, 384, 1), (2, 64, 64, 16, 16, 51, 1, 1),
]


def random_grid(seed, count):
    """`count` geometries drawn like user layers (dense, depthwise, grouped;
    K 3-63; batch 1-32; stride 1-2), for checking the planner off the GRID.
    Draws that would take minutes (dense work over 2 TFLOP per pass) or
    over 1.5e9 input elements are skipped."""
    rng = np.random.default_rng(seed)
    sizes = [(14, 14), (28, 28), (32, 32), (56, 56), (64, 64), (96, 128), (112, 112),
             (128, 128), (224, 224), (321, 481)]
    ks = [3, 5, 7, 9, 11, 13, 15, 17, 21, 25, 31, 41, 51, 63]
    out = []
    while len(out) < count:
        n = int(rng.choice([1, 2, 4, 8, 16, 32]))
        h, w = sizes[rng.integers(len(sizes))]
        k = int(rng.choice(ks))
        stride = int(rng.choice([1, 1, 1, 2]))
        kind = rng.choice(["dense", "dense", "depthwise", "depthwise", "grouped"])
        if kind == "dense":
            cin, cout, groups = int(rng.choice([1, 3, 8, 16, 32, 64, 128, 256])), \
                int(rng.choice([3, 16, 32, 64, 128, 256])), 1
        elif kind == "depthwise":
            cin = cout = groups = int(rng.choice([32, 64, 128, 256, 384, 512]))
        else:
            groups = int(rng.choice([2, 4, 8]))
            cin = cout = int(rng.choice([32, 64, 128, 256]))
        geo = (n, h, w, cin, cout, k, groups, stride)
        if pass_flops(geo, "forward") > 2e12 or n * h * w * cin > 1.5e9 or geo in out:
            continue
        out.append(geo)
    return out


GRID_COLUMNS = ["N", "H", "W", "Cin", "Cout", "K", "groups", "stride", "dtype", "pass", "algo",
                "kernel_ms", "note"]
DIRECT_MAX_FLOPS = 2e12  # a direct pass needing more is not run (minutes)
TORCH_DTYPE = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


def cudnn_pass_ms(torch, x_shape, cout, k, groups, stride, dtype):
    """cuDNN through torch in channels_last (NHWC, as TF feeds cuDNN): kernel
    ms of forward, backprop_input, backprop_filter. Autotuned below K = 51
    (its autotuning of huge filters takes minutes); TF32 allowed for float32."""
    F = torch.nn.functional
    tdt = getattr(torch, TORCH_DTYPE[dtype])
    torch.backends.cudnn.benchmark = k < 51
    n, h, w, cin = x_shape
    cl = torch.channels_last
    x = torch.randn(n, cin, h, w, device="cuda", dtype=tdt).to(memory_format=cl)
    wt = torch.randn(cout, cin // groups, k, k, device="cuda", dtype=tdt).to(memory_format=cl)
    pad = k // 2
    y = F.conv2d(x, wt, stride=stride, padding=pad, groups=groups)
    dy = torch.randn_like(y).to(memory_format=cl)
    fwd = torch_ms(torch, lambda: F.conv2d(x, wt, stride=stride, padding=pad, groups=groups))
    bi = torch_ms(torch, lambda: torch.nn.grad.conv2d_input(x.shape, wt, dy, stride=stride,
                                                            padding=pad, groups=groups))
    bf = torch_ms(torch, lambda: torch.nn.grad.conv2d_weight(x, wt.shape, dy, stride=stride,
                                                             padding=pad, groups=groups))
    return fwd, bi, bf


def pass_flops(geo, pass_):
    n, h, w, cin, cout, k, groups, stride = geo
    ho, wo = -(-h // stride), -(-w // stride)
    return 2.0 * n * ho * wo * cout * k * k * (cin // groups)


def calibrate(be, out_dir, dtypes, k_max, passes, algos, grid=GRID, prefix="gpu_grid"):
    """Times every grid geometry x pass x algorithm and writes one CSV per
    dtype family (columns GRID_COLUMNS) into out_dir; returns the paths."""
    if be.name != "torch":
        sys.exit("--calibrate needs torch (cuDNN is a column of the grid)")
    torch = be.torch
    os.makedirs(out_dir, exist_ok=True)
    families = [("float32", ["float32"]), ("float16_bfloat16", ["float16", "bfloat16"])]
    paths = []
    for fam, fam_dtypes in families:
        fam_dtypes = [d for d in fam_dtypes if d in dtypes]
        if not fam_dtypes:
            continue
        path = os.path.join(out_dir, f"{prefix}_{fam}.csv")
        paths.append(path)
        with open(path, "w", newline="") as f:
            wr = csv.writer(f)
            wr.writerow(GRID_COLUMNS)
            for dtype, geo in itertools.product(fam_dtypes, grid):
                n, h, w, cin, cout, k, groups, stride = geo
                if k > k_max:
                    continue
                o = Ours(torch, (n, h, w, cin), (k, k, cin // groups, cout), (stride, stride),
                         "SAME", dtype)
                cudnn = dict(zip(PASSES, cudnn_pass_ms(torch, (n, h, w, cin), cout, k, groups,
                                                       stride, dtype))) if "cudnn" in algos else {}
                for pass_ in passes:
                    times = {}
                    for algo in algos:
                        note = ""
                        try:
                            if algo == "cudnn":
                                ms = cudnn[pass_]
                            elif algo == "auto":
                                chosen, note = o.plan(pass_, "auto")
                                note = f"{chosen}: {note}"
                                ms = times.get(chosen) or o.time(pass_, "auto", reps=3)["kernel_ms"]
                            elif algo == "direct" and pass_flops(geo, pass_) > DIRECT_MAX_FLOPS:
                                ms, note = float("nan"), "skipped: flops"
                            else:
                                r = o.time(pass_, algo, reps=3)
                                ms, note = r["kernel_ms"], f"{r['algorithm']}: {r['reason']}"
                        except Exception as e:  # e.g. no fft plan fits: a row, not a crash
                            ms, note = float("nan"), f"error: {e}"
                        times[algo] = ms
                        wr.writerow(list(geo) + [dtype, pass_, algo, f"{ms:.4f}", note])
                    f.flush()
                    print(f"  {dtype:8s} {str(geo):38s} {pass_:15s} " +
                          " ".join(f"{a} {times[a]:9.4f}" for a in algos), flush=True)
                del o
                torch.cuda.empty_cache()
    return paths


def load_shipped_cost_model():
    """The package's cost model (tfbigconv/cost_model/cost_model.json, read as JSON: no TF here),
    so that the harness's "auto" decides as the TF ops do after `import tfbigconv`."""
    import json
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tfbigconv",
                        "cost_model", "cost_model.json")
    with open(path) as f:
        values = json.load(f)["values"]
    H.set_cost_model([float(values[name]) for name in H.cost_model_fields()])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer float64/bfloat16 cases")
    ap.add_argument("--no-matrix", action="store_true", help="skip the kernel tests")
    ap.add_argument("--no-timings", action="store_true")
    ap.add_argument("--seed-batch", type=int, default=200)
    ap.add_argument("--subset", action="store_true",
                    help="kernel tests on a few geometries, float32 and float16 (for memcheck)")
    ap.add_argument("--calibrate", metavar="DIR", help="write the timing grid CSVs into DIR")
    ap.add_argument("--dtypes", default="float32,float16,bfloat16",
                    help="calibration dtypes (comma-separated)")
    ap.add_argument("--k-max", type=int, default=10**9, help="calibrate only geometries with K <= this")
    ap.add_argument("--passes", default=",".join(PASSES), help="calibration passes")
    ap.add_argument("--algos", default="direct,fft,auto,cudnn", help="calibration algorithms")
    ap.add_argument("--random-grid", metavar="SEED,COUNT",
                    help="calibrate on COUNT geometries drawn by random_grid(SEED) instead "
                         "of GRID (files gpu_random_SEED_*.csv): a check off the grid")
    ap.add_argument("--depthwise-only", action="store_true",
                    help="kernel tests on the depthwise cases only; calibrate only the "
                         "depthwise geometries (groups = Cin = Cout)")
    ap.add_argument("--ranks", action="store_true",
                    help="instead of the 2-D timings, issue 41's 1-D and 3-D ones")
    ap.add_argument("--host", action="store_true",
                    help="only the direct kernels' bodies on the CPU (no GPU needed)")
    args = ap.parse_args()
    load_shipped_cost_model()
    if args.host:
        sys.exit(0 if run_host_matrix() else 1)
    be = pick_backend()
    print(f"backend: {be.name}")
    ok = True
    if not args.no_matrix:
        ok = run_matrix(be, args.quick, args.subset, args.depthwise_only)
    if args.calibrate:
        grid, prefix = GRID, "gpu_grid"
        if args.random_grid:
            seed, count = (int(v) for v in args.random_grid.split(","))
            grid, prefix = random_grid(seed, count), f"gpu_random_{seed}"
        if args.depthwise_only:
            grid = [g for g in grid if g[6] > 1 and g[3] == g[4] == g[6]]
        paths = calibrate(be, args.calibrate, args.dtypes.split(","), args.k_max,
                          args.passes.split(","), args.algos.split(","), grid, prefix)
        print("calibration grid:", " ".join(paths))
    elif args.ranks:
        timings_ranks(be)
    elif not args.no_timings:
        timings(be, args.seed_batch)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
