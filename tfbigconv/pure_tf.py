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

`plan` and `estimates` (small pure functions) choose between them. Gradients of every
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

# estimates(): seconds per unit of work, measured on a 2-core Xeon (AVX-512,
# AMX; benchmarks/RESULTS.md, "XLA"). TF's dense convolution under XLA and on
# TF's CPU kernels runs at about 230 GFLOP/s once the channels per group
# (in x out) reach DENSE_CHANNELS, slower with fewer (32 GFLOP/s for 1 -> 3);
# a depthwise one at 0.5-1.6 GFLOP/s under XLA (XLA's CPU depthwise
# convolution), about 15 outside it. Real FFTs run at about 6 GFLOP/s of
# 2.5 n log2 n, the channel mix at 12 GFLOP/s of complex multiply-adds.
CONV_FLOPS_PER_SECOND = 230e9
DENSE_CHANNELS = 96
DEPTHWISE_FLOPS_PER_SECOND = {True: 1e9, False: 15e9}  # {under XLA: rate}
FFT_FLOPS_PER_SECOND = 6e9
MIX_FLOPS_PER_SECOND = 12e9
# Spectra of one batch chunk beyond which a bigger chunk is slower: the
# transforms of a chunk that stays in the caches run 1.8x faster (seed
# forward under XLA, 16 images: chunks of 1-3 images 40 ms, of 4-16 images
# 70 ms; 2.5 MB of spectra per image). The CPU planner's kChunkTargetBytes.
CHUNK_TARGET_BYTES = 8 << 20
# The inverse transforms skip the rows past the crop where the output keeps at
# most this share of the transform's rows (seed forward under XLA: 187 of 324
# rows, 7% faster; with nearly all rows kept the extra transposes cost more).
PRUNE_BELOW = 0.75
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


def with_zero_image(x):
    """(x, whether one zero image was appended): outside XLA, a batch that is empty
    or not known when the graph is built gets one zero image more, which the caller
    drops from the result. oneDNN's Conv2D, DepthwiseConv2dNative and Conv3D forward
    return their input for an empty batch (TF 2.21), and TF's FFT kernels reject one.
    (A concat: grappler folds a tf.pad before Conv2D into the convolution's padding,
    batch padding included, and drops the image.)"""
    batch = tf.compat.dimension_value(x.shape[0]) if x.shape.rank else None
    if in_xla() or batch not in (None, 0):
        return x, False
    return tf.concat([x, tf.zeros(tf.concat([[1], tf.shape(x)[1:]], 0), x.dtype)], 0), True


def good_fft_size(n):
    """Smallest size >= n with no prime factor above 7 (csrc/core/fft_sizes.h's
    GoodFftSize, which tests/test_pure_tf.py holds this to)."""
    m = max(int(n), 1)
    while True:
        r = m
        for p in (2, 3, 5, 7):
            while r % p == 0:
                r //= p
        if r == 1:
            return m
        m += 1


def spatial_pairs(padding, explicit, dims):
    """The (before, after) padding of each of `dims` (indices in data_format
    order) from the flat explicit_paddings; (0, 0) unless padding is EXPLICIT."""
    return [(explicit[2 * d], explicit[2 * d + 1]) if padding == "EXPLICIT" else (0, 0)
            for d in dims]


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
    return before, after, output_size(size + before + after, eff, stride)


def estimates(n, h, w, cin, cout, kh, kw, groups, fft_h, fft_w, out_h, out_w, xla=True):
    """(TF's convolution, the FFT): estimated seconds of each."""
    cig, cog = cin // groups, cout // groups
    flops = 2.0 * n * out_h * out_w * cout * kh * kw * cig
    if cig == 1 and groups > 1:
        rate = DEPTHWISE_FLOPS_PER_SECOND[bool(xla)]
    else:
        rate = CONV_FLOPS_PER_SECOND * min(1.0, (cig * cog / DENSE_CHANNELS) ** 0.5)
    points = fft_h * fft_w
    transforms = (n * (cin + cout) + cout * cig) * 2.5 * points * math.log2(max(points, 2))
    mix = 8.0 * n * cout * cig * fft_h * (fft_w // 2 + 1)
    return flops / rate, transforms / FFT_FLOPS_PER_SECOND + mix / MIX_FLOPS_PER_SECOND


def plan(in_shape, f_shape, strides, padding, explicit, data_format, dilations, dtype, algorithm,
         workspace_limit, xla):
    """What the pure-TF path runs for a convolution whose spatial and channel
    dimensions are known (in_shape[0] may be None): a dict with "branch" ("fft"
    or "tf"), "fft" (the transform size), "per_image_bytes" (spectra of one
    image), "tf_seconds", "fft_seconds", "fits" and "reason". `xla`: whether
    XLA compiles it (outside XLA, TF's CPU kernels have no dilated gradient)."""
    hd, wd, cd = (1, 2, 3) if data_format == "NHWC" else (2, 3, 1)
    (kh, kw, cig, cout), cin = f_shape, in_shape[cd]
    pairs = spatial_pairs(padding, explicit, (hd, wd))
    pt, pb, out_h = pads_1d(in_shape[hd], kh, strides[hd], dilations[hd], padding, pairs[0])
    pl, pr, out_w = pads_1d(in_shape[wd], kw, strides[wd], dilations[wd], padding, pairs[1])
    fft = (good_fft_size(in_shape[hd] + pt + pb), good_fft_size(in_shape[wd] + pl + pr))
    n = in_shape[0] if in_shape[0] is not None else 32  # Keras' unknown batch, as the planner
    per_image = (cin + cout) * fft[0] * (fft[1] // 2 + 1) * 2 * (8 if dtype == "float64" else 4)
    fits = not workspace_limit or per_image <= workspace_limit
    tf_s, fft_s = estimates(n, in_shape[hd], in_shape[wd], cin, cout, kh, kw, cin // cig,
                            fft[0], fft[1], out_h, out_w, xla)
    dilated = dilations[hd] > 1 or dilations[wd] > 1
    if dilated and not xla:
        branch, reason = "fft", "TF's CPU kernels have no gradient of a dilated convolution"
    elif algorithm in ("direct", "tf", "im2col"):
        branch, reason = "tf", f"algorithm {algorithm!r}: TensorFlow's convolution"
    elif algorithm == "fft":
        branch, reason = "fft", "requested"
    elif not fits:
        branch, reason = "tf", "the FFT's spectra of one image exceed workspace_limit"
    else:
        branch = "fft" if fft_s < tf_s else "tf"
        reason = "estimated faster"
    return dict(branch=branch, fft=fft, per_image_bytes=per_image, tf_seconds=tf_s,
                fft_seconds=fft_s, fits=fits, reason=reason,
                pads=(pt, pb, pl, pr), out=(out_h, out_w))


def output_size(padded, eff, stride):
    """tf.nn.conv2d's output size (GetWindowedOutputSize, rounded toward zero),
    negative where the dilated filter is larger than the padded input."""
    diff = padded - eff
    return diff // stride + 1 if diff >= 0 else -((-diff - stride) // stride) \
        if -diff >= stride else 0


def check_geometry(in_shape, f_shape, strides, padding, explicit, data_format, dilations):
    """Raises ValueError, naming the argument, where tf.nn.conv2d would not build,
    in the compiled library's words (its conv_geometry does this when it is there)."""
    hd, wd, cd = (1, 2, 3) if data_format == "NHWC" else (2, 3, 1)
    cin, (kh, kw, cig, cout) = in_shape[cd], f_shape
    if cig <= 0 or cin % cig:
        raise ValueError(f"input depth {cin} must be a multiple of the filter's in_depth {cig} "
                         f"(groups = input depth / filter in_depth); input shape "
                         f"{list(in_shape)}, filter shape {list(f_shape)}")
    if cout % (cin // cig):
        raise ValueError(f"filter out_depth {cout} must be a multiple of groups {cin // cig} "
                         f"(input depth {cin} / filter in_depth {cig})")
    for d, k, pair, name in zip((hd, wd), (kh, kw), spatial_pairs(padding, explicit, (hd, wd)),
                                ("height", "width")):
        if pads_1d(in_shape[d], k, strides[d], dilations[d], padding, pair)[2] < 0:
            raise ValueError(f"filter is larger than the padded input along {name}: effective "
                             f"filter size {(k - 1) * dilations[d] + 1} > padded input size "
                             f"{in_shape[d] + sum(pair)}")


def _runtime_checks(x, f, strides, padding, explicit, data_format, dilations):
    """The checks of check_geometry as graph assertions, for shapes known only
    when the graph runs (TF's own Conv2D crashes on some of them: a rank-3
    input fails a CHECK in TF 2.21)."""
    hd, wd, cd = (1, 2, 3) if data_format == "NHWC" else (2, 3, 1)
    checks = [tf.debugging.assert_rank(x, 4, message="input must be rank 4"),
              tf.debugging.assert_rank(f, 4, message="filter must be rank 4")]
    with tf.control_dependencies(checks):
        xs, fs = tf.shape(x, out_type=tf.int64), tf.shape(f, out_type=tf.int64)
    cin, cig, cout = xs[cd], fs[2], fs[3]
    checks += [
        tf.debugging.assert_equal(tf.math.floormod(cin, tf.maximum(cig, 1)), tf.constant(0, tf.int64),
                                  message="input depth must be a multiple of the filter's in_depth"),
        tf.debugging.assert_equal(tf.math.floormod(cout, tf.maximum(cin // tf.maximum(cig, 1), 1)),
                                  tf.constant(0, tf.int64),
                                  message="filter out_depth must be a multiple of groups")]
    if padding != "SAME":
        for d, k, pair in zip((hd, wd), (0, 1), spatial_pairs(padding, explicit, (hd, wd))):
            pad = sum(pair)
            eff = (fs[k] - 1) * dilations[d] + 1
            checks.append(tf.debugging.assert_greater_equal(
                xs[d] + pad + strides[d] - 1, eff,
                message="filter is larger than the padded input"))
    return checks


def conv2d(x, f, strides, padding, explicit, data_format, dilations, algorithm="auto",
           workspace_limit=0, why=""):
    """tf.nn.conv2d of x and f (arguments as bigconv2d parsed them: strides and
    dilations of 4, padding "SAME"/"VALID"/"EXPLICIT" with the flat 8
    explicit_paddings) from TensorFlow ops. algorithm "fft" forces the FFT,
    "direct" and "tf" TensorFlow's convolution, "auto" chooses (plan).
    `why`: the reason the pure-TF path runs, for the log."""
    if not in_xla() and not (x.shape.is_fully_defined() and f.shape.is_fully_defined()):
        with tf.control_dependencies(_runtime_checks(x, f, strides, padding, explicit,
                                                     data_format, dilations)):
            x = tf.identity(x)
    x, extra = with_zero_image(x)
    y, branch = _conv2d(x, f, strides, padding, explicit, data_format, dilations, algorithm,
                        workspace_limit)
    if extra:
        y = y[:-1]
    logging.vlog(1, "bigconv2d forward as pure TensorFlow (%s): %s", why, branch)
    return y


def _conv2d(x, f, strides, padding, explicit, data_format, dilations, algorithm, workspace_limit):
    nhwc = data_format == "NHWC"
    hd, wd = (1, 2) if nhwc else (2, 3)
    pairs = spatial_pairs(padding, explicit, (hd, wd))
    known = (x.shape.rank == 4 and f.shape.rank == 4 and x.shape[1:].is_fully_defined() and
             f.shape.is_fully_defined())
    if not known:
        return _tf_conv(x, f, strides, padding, pairs, data_format, dilations), "TF's convolution"
    p = plan(x.shape.as_list(), f.shape.as_list(), strides, padding, explicit, data_format,
             dilations, x.dtype.name, algorithm, workspace_limit, in_xla())
    if p["branch"] == "tf":
        return _tf_conv(x, f, strides, padding, pairs, data_format, dilations), "TF's convolution"
    if not p["fits"]:
        raise tf.errors.ResourceExhaustedError(
            None, None, f"the FFT needs at least {p['per_image_bytes']} bytes of workspace (the "
            f"spectra of one image), over workspace_limit={workspace_limit}")
    if not nhwc:
        x = tf.transpose(x, [0, 2, 3, 1])
    y = _fft_conv_nhwc(x, f, (strides[hd], strides[wd]), p["pads"], (dilations[hd], dilations[wd]),
                       x.shape.as_list()[3] // f.shape.as_list()[2], p["fft"], p["out"],
                       p["per_image_bytes"],
                       workspace_limit)
    return (y if nhwc else tf.transpose(y, [0, 3, 1, 2])), f"fft {p['fft'][0]}x{p['fft'][1]}"


def _tf_conv(x, f, strides, padding, pairs, data_format, dilations):
    """TensorFlow's convolution in NHWC (TF's CPU kernels take no NCHW):
    tf.nn.depthwise_conv2d for depthwise filters where it takes the strides and
    dilations (XLA and TF's CPU kernels both run it well), else tf.nn.conv2d."""
    if data_format == "NCHW":
        x = tf.transpose(x, [0, 2, 3, 1])
        strides = [strides[0], strides[2], strides[3], strides[1]]
        dilations = [dilations[0], dilations[2], dilations[3], dilations[1]]
    cin = tf.compat.dimension_value(x.shape[3]) if x.shape.rank == 4 else None
    kh, kw, cig, cout = f.shape.as_list() if f.shape.rank == 4 else [None] * 4
    pad = [[0, 0], list(pairs[0]), list(pairs[1]), [0, 0]] if padding == "EXPLICIT" else padding
    stride2, rate2 = tuple(strides[1:3]), tuple(dilations[1:3])
    depthwise = (cig == 1 and cin is not None and cin > 1 and cout is not None and
                 cout % cin == 0 and None not in (kh, kw))
    # tf.nn.depthwise_conv2d takes equal strides, and strides or dilations, not both.
    if (depthwise and stride2[0] == stride2[1] and (stride2 == (1, 1) or rate2 == (1, 1)) and
            padding != "EXPLICIT"):
        fd = tf.reshape(f, [kh, kw, cin, cout // cin])
        y = tf.nn.depthwise_conv2d(x, fd, [1, stride2[0], stride2[1], 1], padding,
                                   dilations=rate2)
    else:
        y = tf.nn.conv2d(x, f, strides, pad, dilations=dilations)
    return tf.transpose(y, [0, 3, 1, 2]) if data_format == "NCHW" else y


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


def _fft_conv_nhwc(x, f, strides, pads, dilations, groups, fft_size, out_size, per_image,
                   workspace_limit):
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
        if cig == 1:  # no sum over input channels: a broadcast product, which XLA fuses
            ys = xs * fs
        else:
            ys = tf.einsum("ngcij,cgoij->ngoij", xs, fs)
        ys = tf.reshape(ys, [n, cout, fft_h, fft_w // 2 + 1])
        if -(-rows // sh) <= PRUNE_BELOW * fft_h:
            # The inverse by columns, then only the output rows by rows: rows
            # past the crop are never transformed (fewer for larger filters).
            t = tf.signal.ifft(tf.transpose(ys, [0, 1, 3, 2]))[..., :rows:sh]
            y = tf.signal.irfft(tf.transpose(t, [0, 1, 3, 2]), fft_length=[fft_w])
            y = y[..., :cols:sw]
        else:
            y = tf.signal.irfft2d(ys, fft_length=length)[:, :, :rows:sh, :cols:sw]
        return tf.transpose(y, [0, 2, 3, 1])

    n = tf.compat.dimension_value(x.shape[0])
    budget = min(workspace_limit or _default_budget(), CHUNK_TARGET_BYTES)
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
