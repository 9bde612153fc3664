"""bigconv2d composed of TensorFlow ops only: under XLA, and without the compiled library.

XLA cannot compile a custom op, and a pip-installed library cannot register an
XLA lowering (TF#60489). So inside `tf.function(jit_compile=True)` (also a
Keras model compiled with `jit_compile=True`), and where tfbigconv's compiled
library is missing or TFBIGCONV_PURE_TF=1 (see `active`), bigconv2d builds its
convolution from ops XLA compiles:

- large filters: FFT convolution over the whole padded image (one overlap-save
  tile) with `tf.signal.rfft2d`/`irfft2d` at static good sizes, the channels
  mixed per frequency bin by one einsum, chunked over the batch so that the
  spectra stay within the workspace budget; float16 and bfloat16 are computed
  in float32;
- small filters: TensorFlow's own convolution (tf.nn.depthwise_conv2d for
  depthwise filters where it takes the strides and dilations, else
  tf.nn.conv2d, grouped where the filter is).

`use_fft` (a small pure function) chooses between them. Gradients of every
order are TensorFlow's own, through the composition. Shapes must be static
except the batch; with other unknown dimensions TensorFlow's convolution runs.
"""
import math
import os

import tensorflow as tf
from absl import logging

PURE_TF_ENV = "TFBIGCONV_PURE_TF"
# The compiled library's load error, set by tfbigconv/__init__.py when it failed.
missing_library = None

# use_fft: FFT when its estimated cost is under TF's convolution's. The
# constants are seconds per unit of work on a 2-core Xeon under XLA
# (benchmarks/bench_xla.py); only their ratio matters.
SECONDS_PER_CONV_FLOP = 1 / 60e9
SECONDS_PER_FFT_FLOP = 1 / 6e9
SECONDS_PER_MIX_FLOP = 1 / 12e9
# Spectra of one batch chunk when no workspace_limit is given and the host's
# budget is not known (no compiled library).
DEFAULT_BUDGET_BYTES = 1 << 30


def forced():
    """True where TFBIGCONV_PURE_TF=1 asks for the pure-TF path everywhere."""
    return os.environ.get(PURE_TF_ENV, "") not in ("", "0")


def in_xla():
    """True while a function XLA compiles is traced (tf.function(jit_compile=True),
    a Keras model compiled with jit_compile=True)."""
    from tensorflow.python.ops import control_flow_util  # TF's own check for XLA contexts
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def active():
    """Whether bigconv2d builds the pure-TF composition here, and why ("" if not)."""
    if missing_library is not None:
        return "the compiled library did not load"
    if forced():
        return f"{PURE_TF_ENV}=1"
    if in_xla():
        return "XLA compiles this function"
    return ""


def good_fft_size(n):
    """Smallest size >= n with no prime factor above 7 (csrc/core/fft_sizes.h's
    GoodFftSize, which tests/ops/test_pure_tf.py holds this to)."""
    m = max(int(n), 1)
    while True:
        r = m
        for p in (2, 3, 5, 7):
            while r % p == 0:
                r //= p
        if r == 1:
            return m
        m += 1


def pads_1d(size, k, stride, dilation, padding, explicit):
    """(before, after, output size) of one spatial dimension, as tf.nn.conv2d pads."""
    eff = (k - 1) * dilation + 1
    if padding == "VALID":
        before = after = 0
    elif padding == "SAME":
        out = -(-size // stride)
        total = max((out - 1) * stride + eff - size, 0)
        before, after = total // 2, total - total // 2
    else:
        before, after = explicit
    return before, after, (size + before + after - eff) // stride + 1


def use_fft(n, h, w, cin, cout, kh, kw, groups, fft_h, fft_w, out_h, out_w):
    """FFT (True) or TensorFlow's convolution (False): estimated seconds of each."""
    cig = cin // groups
    conv = 2.0 * n * out_h * out_w * cout * kh * kw * cig * SECONDS_PER_CONV_FLOP
    points = fft_h * fft_w
    transforms = (n * (cin + cout) + cout * cig) * 2.5 * points * math.log2(max(points, 2))
    mix = 8.0 * n * cout * cig * fft_h * (fft_w // 2 + 1)
    fft = transforms * SECONDS_PER_FFT_FLOP + mix * SECONDS_PER_MIX_FLOP
    return fft < conv


def check_geometry(in_shape, f_shape, strides, padding, explicit, data_format, dilations):
    """Raises ValueError, naming the argument, where tf.nn.conv2d would not build
    (the compiled library's conv_geometry does this when it is there)."""
    hd, wd, cd = (1, 2, 3) if data_format == "NHWC" else (2, 3, 1)
    cin, (kh, kw, cig, cout) = in_shape[cd], f_shape
    if cig <= 0 or cin % cig:
        raise ValueError(f"input depth {cin} must be a multiple of the filter's in_depth {cig}")
    if cout % (cin // cig):
        raise ValueError(f"filter out_depth {cout} must be a multiple of the groups "
                         f"{cin // cig} (input depth / filter in_depth)")
    for d, k, name in ((hd, kh, "height"), (wd, kw, "width")):
        pair = (explicit[2 * d], explicit[2 * d + 1]) if padding == "EXPLICIT" else (0, 0)
        if pads_1d(in_shape[d], k, strides[d], dilations[d], padding, pair)[2] <= 0:
            raise ValueError(f"the dilated filter's {name} exceeds the padded input's: "
                             f"input {list(in_shape)}, filters {list(f_shape)}")


def conv2d(x, f, strides, padding, explicit, data_format, dilations, algorithm="auto",
           workspace_limit=0, why=""):
    """tf.nn.conv2d of x and f (arguments as bigconv2d parsed them: strides and
    dilations of 4, padding "SAME"/"VALID"/"EXPLICIT" with the flat 8
    explicit_paddings) from TensorFlow ops. algorithm "fft" forces the FFT,
    "direct" and "tf" TensorFlow's convolution, "auto" chooses (use_fft).
    `why`: the reason the pure-TF path runs, for the log."""
    y, branch = _conv2d(x, f, strides, padding, explicit, data_format, dilations, algorithm,
                        workspace_limit)
    logging.vlog(1, "bigconv2d forward as pure TensorFlow (%s): %s", why, branch)
    return y


def _conv2d(x, f, strides, padding, explicit, data_format, dilations, algorithm, workspace_limit):
    nhwc = data_format == "NHWC"
    hd, wd, cd = (1, 2, 3) if nhwc else (2, 3, 1)
    sh, sw = strides[hd], strides[wd]
    dh, dw = dilations[hd], dilations[wd]
    pairs = [(explicit[2 * hd], explicit[2 * hd + 1]), (explicit[2 * wd], explicit[2 * wd + 1])] \
        if padding == "EXPLICIT" else [(0, 0), (0, 0)]
    shape = x.shape.as_list()
    kh, kw, cig, cout = f.shape.as_list()
    h, w, cin = shape[hd], shape[wd], shape[cd]
    if None in (h, w, cin, kh, kw, cig, cout) or algorithm in ("direct", "tf", "im2col"):
        return _tf_conv(x, f, strides, padding, pairs, data_format, dilations), "TF's convolution"
    groups = cin // cig
    pt, pb, out_h = pads_1d(h, kh, sh, dh, padding, pairs[0])
    pl, pr, out_w = pads_1d(w, kw, sw, dw, padding, pairs[1])
    hp, wp = h + pt + pb, w + pl + pr
    fft_h, fft_w = good_fft_size(hp), good_fft_size(wp)
    n = shape[0] if shape[0] is not None else 32  # Keras' unknown batch, as the planner takes it
    if algorithm == "auto" and not use_fft(n, h, w, cin, cout, kh, kw, groups, fft_h, fft_w,
                                           out_h, out_w):
        return _tf_conv(x, f, strides, padding, pairs, data_format, dilations), "TF's convolution"
    if not nhwc:
        x = tf.transpose(x, [0, 2, 3, 1])
    y = _fft_conv_nhwc(x, f, (sh, sw), (pt, pb, pl, pr), (dh, dw), groups, (fft_h, fft_w),
                       (out_h, out_w), workspace_limit)
    return (y if nhwc else tf.transpose(y, [0, 3, 1, 2])), f"fft {fft_h}x{fft_w}"


def _tf_conv(x, f, strides, padding, pairs, data_format, dilations):
    """TensorFlow's convolution: depthwise where tf.nn.depthwise_conv2d takes the
    case (XLA and TF's CPU kernels both run it well), else tf.nn.conv2d."""
    nhwc = data_format == "NHWC"
    hd, wd, cd = (1, 2, 3) if nhwc else (2, 3, 1)
    cin = x.shape[cd]
    kh, kw, cig, cout = f.shape.as_list()
    pad = [[0, 0], [0, 0], list(pairs[0]), list(pairs[1])] if not nhwc else \
        [[0, 0], list(pairs[0]), list(pairs[1]), [0, 0]]
    pad = pad if padding == "EXPLICIT" else padding
    stride2, rate2 = (strides[hd], strides[wd]), (dilations[hd], dilations[wd])
    depthwise = cig == 1 and cin is not None and cin > 1 and cout is not None and cout % cin == 0
    if depthwise and (stride2 == (1, 1) or rate2 == (1, 1)) and padding != "EXPLICIT":
        fd = tf.reshape(f, [kh, kw, cin, cout // cin])
        return tf.nn.depthwise_conv2d(x, fd, [1, stride2[0], stride2[1], 1], padding,
                                      data_format=data_format, dilations=rate2)
    return tf.nn.conv2d(x, f, strides, pad, data_format=data_format, dilations=dilations)


def _dilate_filter(f, dh, dw):
    """The filter with dh - 1 (dw - 1) zero rows (columns) between its taps."""
    kh, kw, cig, cout = f.shape.as_list()
    if dh > 1:
        f = tf.pad(f[:, None], [[0, 0], [0, dh - 1], [0, 0], [0, 0], [0, 0]])
        f = tf.reshape(f, [kh * dh, kw, cig, cout])[:(kh - 1) * dh + 1]
    if dw > 1:
        kh2 = f.shape[0]
        f = tf.pad(f[:, :, None], [[0, 0], [0, 0], [0, dw - 1], [0, 0], [0, 0]])
        f = tf.reshape(f, [kh2, kw * dw, cig, cout])[:, :(kw - 1) * dw + 1]
    return f


def _fft_conv_nhwc(x, f, strides, pads, dilations, groups, fft_size, out_size, workspace_limit):
    """Cross-correlation of NHWC x with HWIO f by whole-image real FFTs."""
    dtype = x.dtype
    compute = tf.float64 if dtype == tf.float64 else tf.float32
    x, f = tf.cast(x, compute), tf.cast(f, compute)
    (sh, sw), (pt, pb, pl, pr), (fft_h, fft_w), (out_h, out_w) = strides, pads, fft_size, out_size
    f = _dilate_filter(f, *dilations)
    eh, ew, cig, cout = f.shape.as_list()
    cog = cout // groups
    if any(pads):
        x = tf.pad(x, [[0, 0], [pt, pb], [pl, pr], [0, 0]])
    length = [fft_h, fft_w]
    # Filter spectra per (group, in, out): correlation multiplies by their conjugate.
    fs = tf.signal.rfft2d(tf.transpose(f, [2, 3, 0, 1]), fft_length=length)
    fs = tf.math.conj(tf.reshape(fs, [cig, groups, cog, fft_h, fft_w // 2 + 1]))
    # Valid stride-1 rows and columns, then the strides.
    rows, cols = (out_h - 1) * sh + 1, (out_w - 1) * sw + 1

    def chunk(xc):
        n = tf.shape(xc)[0]
        xs = tf.signal.rfft2d(tf.transpose(xc, [0, 3, 1, 2]), fft_length=length)
        xs = tf.reshape(xs, [n, groups, cig, fft_h, fft_w // 2 + 1])
        ys = tf.einsum("ngcij,cgoij->ngoij", xs, fs)
        y = tf.signal.irfft2d(tf.reshape(ys, [n, cout, fft_h, fft_w // 2 + 1]), fft_length=length)
        y = y[:, :, :rows:sh, :cols:sw]
        return tf.transpose(y, [0, 2, 3, 1])

    n = x.shape[0]
    per_image = (x.shape[3] + cout) * fft_h * (fft_w // 2 + 1) * 2 * compute.size
    budget = workspace_limit or _default_budget()
    step = max(1, budget // max(per_image, 1))
    if n is None or n <= step:
        y = chunk(x)
    else:  # static batch: chunks of `step` images, one after another
        y = tf.concat([chunk(x[i:i + step]) for i in range(0, n, step)], axis=0)
    return tf.cast(y, dtype)


def _default_budget():
    try:
        from tfbigconv import _core
        return int(_core.default_workspace_budget())
    except Exception:  # no compiled library: a fixed budget
        return DEFAULT_BUDGET_BYTES
