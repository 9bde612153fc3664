"""bigconv2d and bigconv3d composed of TensorFlow ops only: under XLA, and without
the compiled library.

XLA cannot compile a custom op, and a pip-installed library cannot register an
XLA lowering (TF#60489). So inside `tf.function(jit_compile=True)` (also a
Keras model compiled with `jit_compile=True`), and where tfbigconv's compiled
library is missing or TFBIGCONV_PURE_TF=1, and inside `portable()` (an export that
must load without the library; see `active`), bigconv2d (`conv2d`) and bigconv3d
(`conv3d`) build their convolution from ops XLA compiles:

- large filters: FFT convolution over the whole padded input (one overlap-save
  tile) at static good sizes: in 2-D `tf.signal.rfft2d`/`irfft2d`, in 3-D
  rfft2d over height x width and a complex `tf.signal.fft` over depth (TF has
  no gradient of RFFT3D); the channels mixed per frequency bin by one einsum,
  chunked over the batch so that the spectra stay within the workspace budget;
  float16 and bfloat16 are computed in float32;
- small filters: TensorFlow's own convolution. Under XLA, whose convolution
  has groups, dilations and their gradients, tf.nn.conv2d/conv3d (and
  tf.nn.depthwise_conv2d for depthwise 2-D filters where it takes the strides
  and dilations; 3-D dilations as outside XLA). Outside XLA, ops whose
  gradients TF's CPU kernels have on every host (`_composed_conv`).

Inside `portable()` the FFT gives way to the DFT as real matrix products
(tfbigconv/dft.py), which LiteRT and ONNX convert, or TensorFlow's convolution.

`plan` and `estimates` (small pure functions) choose between them. Gradients of every
order are TensorFlow's own, through the composition. Shapes must be static
except the batch; with other unknown dimensions TensorFlow's convolution runs.
"""
import contextlib
import contextvars
import math
import os

import tensorflow as tf
from absl import logging

from tfbigconv import dft

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


# Why `portable()` asks for the pure path here ("" outside it): a context
# variable, so that other threads and asyncio tasks keep our ops.
_portable = contextvars.ContextVar("tfbigconv_portable", default="")


@contextlib.contextmanager
def portable():
    """Within it, our ops trace as stock TensorFlow ops: export without the library.

        with tfbigconv.portable():
            model.export(path, format="tf_saved_model")

    Every bigconv1d/2d/3d built inside it (the Keras layers' included) takes the
    pure-TF path (`active` says "tfbigconv.portable()"), as under XLA or without
    the compiled library, so a SavedModel exported inside it holds no BigConv*
    ops and loads where tfbigconv is not installed (TF Serving's stock server).
    Outside it the export keeps our ops, which are faster.

    It acts while functions are traced: Keras' `model.export` and
    `tf.saved_model.save` of a tf.Module trace inside it. A `tf.function`
    already traced before entering it keeps that trace (our ops) for the same
    input signature, also in an export: make its first call or
    `get_concrete_function` inside, or use a new `tf.function`. Local to the
    thread (and asyncio task), re-entrant, and restored on exit, also when the
    body raises. Where the pure path would run its FFT, which converts to neither
    LiteRT nor ONNX, it runs the DFT as real matrix products (tfbigconv/dft.py)
    or TensorFlow's convolution, so that every format Keras exports converts
    (`_portable_conv2d`; 3-D: TensorFlow's convolution; docs/export.md).
    """
    token = _portable.set("tfbigconv.portable()")
    try:
        yield
    finally:
        _portable.reset(token)


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
    if _portable.get():
        return _portable.get()
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
    """(TF's convolution, the FFT): estimated seconds of each, 2-D."""
    return _estimates(n, cin, cout, kh * kw, groups, (fft_h, fft_w), out_h * out_w, xla)


def _estimates(n, cin, cout, taps, groups, fft, outputs, xla):
    """estimates for any rank: `taps` filter taps per channel pair, `fft` the
    transform sizes, `outputs` output points per image and channel. (The rates
    were measured in 2-D; a 3-D FFT is rfft2d planes plus 1-D transforms, of the
    same n log n count.)"""
    cig, cog = cin // groups, cout // groups
    flops = 2.0 * n * outputs * cout * taps * cig
    if cig == 1 and groups > 1:
        rate = DEPTHWISE_FLOPS_PER_SECOND[bool(xla)]
    else:
        rate = CONV_FLOPS_PER_SECOND * min(1.0, (cig * cog / DENSE_CHANNELS) ** 0.5)
    points = math.prod(fft)
    transforms = (n * (cin + cout) + cout * cig) * 2.5 * points * math.log2(max(points, 2))
    mix = 8.0 * n * cout * cig * (points // fft[-1]) * (fft[-1] // 2 + 1)
    return flops / rate, transforms / FFT_FLOPS_PER_SECOND + mix / MIX_FLOPS_PER_SECOND


def plan(in_shape, f_shape, strides, padding, explicit, data_format, dilations, dtype, algorithm,
         workspace_limit, xla):
    """What the pure-TF path runs for a 2-D or 3-D convolution (in_shape of rank 4
    or 5, data_format to match) whose spatial and channel dimensions are known
    (in_shape[0] may be None): a dict with "branch" ("fft" or "tf"), "fft" (the
    transform sizes), "per_image_bytes" (spectra of one image), "tf_seconds",
    "fft_seconds", "fits", "reason", "pads" (flat (before, after) per spatial
    dimension) and "out" (output sizes). `xla`: whether XLA compiles it (its
    depthwise convolution is slower than TF's CPU kernel)."""
    rank = len(in_shape) - 2
    last = data_format.endswith("C")
    dims = tuple(range(1, rank + 1)) if last else tuple(range(2, rank + 2))
    cin, ks, (cig, cout) = in_shape[-1 if last else 1], f_shape[:rank], f_shape[rank:]
    geo = [pads_1d(in_shape[d], k, strides[d], dilations[d], padding, pair)
           for d, k, pair in zip(dims, ks, spatial_pairs(padding, explicit, dims))]
    fft = tuple(good_fft_size(in_shape[d] + b + a) for d, (b, a, _) in zip(dims, geo))
    n = in_shape[0] if in_shape[0] is not None else 32  # Keras' unknown batch, as the planner
    bins = math.prod(fft[:-1]) * (fft[-1] // 2 + 1)
    per_image = (cin + cout) * bins * 2 * (8 if dtype == "float64" else 4)
    fits = not workspace_limit or per_image <= workspace_limit
    out = tuple(o for _, _, o in geo)
    tf_s, fft_s = _estimates(n, cin, cout, math.prod(ks), cin // cig, fft,
                             math.prod(max(o, 0) for o in out), xla)
    if algorithm in ("direct", "tf", "im2col"):
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
                pads=tuple(v for b, a, _ in geo for v in (b, a)), out=out)


def output_size(padded, eff, stride):
    """tf.nn.conv2d's output size (GetWindowedOutputSize, rounded toward zero),
    negative where the dilated filter is larger than the padded input."""
    diff = padded - eff
    return diff // stride + 1 if diff >= 0 else -((-diff - stride) // stride) \
        if -diff >= stride else 0


def check_geometry(in_shape, f_shape, strides, padding, explicit, data_format, dilations):
    """Raises ValueError, naming the argument, where tf.nn.conv2d (tf.nn.conv3d for
    rank 5) would not build, in the compiled library's words (its conv_geometry does
    this when it is there)."""
    rank = len(in_shape) - 2
    last = data_format.endswith("C")
    dims = tuple(range(1, rank + 1)) if last else tuple(range(2, rank + 2))
    cin, ks, (cig, cout) = in_shape[-1 if last else 1], f_shape[:rank], f_shape[rank:]
    if cig <= 0 or cin % cig:
        raise ValueError(f"input depth {cin} must be a multiple of the filter's in_depth {cig} "
                         f"(groups = input depth / filter in_depth); input shape "
                         f"{list(in_shape)}, filter shape {list(f_shape)}")
    if cout % (cin // cig):
        raise ValueError(f"filter out_depth {cout} must be a multiple of groups {cin // cig} "
                         f"(input depth {cin} / filter in_depth {cig})")
    names = ("depth", "height", "width")[3 - rank:]
    for d, k, pair, name in zip(dims, ks, spatial_pairs(padding, explicit, dims), names):
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
    if _portable.get():
        return _portable_conv2d(x, f, strides, padding, pairs, data_format, dilations, p)
    if not nhwc:
        x = tf.transpose(x, [0, 2, 3, 1])
    y = _fft_conv_nhwc(x, f, (strides[hd], strides[wd]), p["pads"], (dilations[hd], dilations[wd]),
                       x.shape.as_list()[3] // f.shape.as_list()[2], p["fft"], p["out"],
                       p["per_image_bytes"],
                       workspace_limit)
    return (y if nhwc else tf.transpose(y, [0, 3, 1, 2])), f"fft {p['fft'][0]}x{p['fft'][1]}"


def _portable_conv2d(x, f, strides, padding, pairs, data_format, dilations, p):
    """Under portable(), where `plan` chose the FFT (whose ops LiteRT and tf2onnx
    lack): the DFT as real matrix products (tfbigconv/dft.py), or TensorFlow's
    convolution where that is estimated faster or the DFT's matrices are too large."""
    hd, wd, cd = (1, 2, 3) if data_format == "NHWC" else (2, 3, 1)
    shape, (kh, kw, cig, cout) = x.shape.as_list(), f.shape.as_list()
    in_hw = (shape[hd], shape[wd])
    eff = ((kh - 1) * dilations[hd] + 1, (kw - 1) * dilations[wd] + 1)
    groups = shape[cd] // cig
    work, elements = dft.macs(shape[0] or 32, in_hw, eff, shape[cd], cout, groups, p["pads"],
                              p["out"])
    if elements > dft.MAX_MATRIX_ELEMENTS or (
            p["reason"] != "requested" and 2 * work / dft.FLOPS_PER_SECOND >= p["tf_seconds"]):
        return _tf_conv(x, f, strides, padding, pairs, data_format, dilations), "TF's convolution"
    if data_format == "NCHW":
        x = tf.transpose(x, [0, 2, 3, 1])
    y = dft.conv2d(x, _dilate_filter(f, (dilations[hd], dilations[wd])),
                   (strides[hd], strides[wd]), p["pads"], p["out"], groups)
    y = tf.transpose(y, [0, 3, 1, 2]) if data_format == "NCHW" else y
    return y, "dft {}x{} as matrix products".format(*dft.sizes(in_hw, p["pads"])[:2])


def _tf_conv(x, f, strides, padding, pairs, data_format, dilations):
    """TensorFlow's convolution in NHWC (TF's CPU kernels take no NCHW). Under
    XLA: tf.nn.depthwise_conv2d for depthwise filters where it takes the strides
    and dilations (XLA runs it well), else tf.nn.conv2d, grouped where the filter
    is. Outside XLA: `_composed_conv`."""
    if data_format == "NCHW":
        x = tf.transpose(x, [0, 2, 3, 1])
        strides = [strides[0], strides[2], strides[3], strides[1]]
        dilations = [dilations[0], dilations[2], dilations[3], dilations[1]]
    if not in_xla():
        y = _composed_conv(x, f, strides[1:3], padding, pairs, dilations[1:3])
        return tf.transpose(y, [0, 3, 1, 2]) if data_format == "NCHW" else y
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


def _composed_conv(x, f, strides, padding, pairs, dilations):
    """tf.nn.conv2d (conv3d) of channels-last x with 2 (3) spatial dimensions,
    from ops with CPU gradients on every host: TF's own CPU kernels have no
    grouped gradient, no dilated gradient and no dilated Conv3D, and oneDNN's
    grouped gradient fails with explicit padding; and TF 2.21's shape function
    of a dilated Conv3D in a graph is wrong (it shifts the dilations by one
    dimension), which breaks its gradient under XLA too. So, unless the filter
    is neither grouped nor dilated (then TF's op with its padding): the padding
    as tf.pad; a dilation by strided slicing (where the stride is a multiple of it)
    or by space-to-batch (tf.nn.with_space_to_batch, as tf.nn.depthwise_conv2d
    does: the undilated convolution of each phase, so the dilated convolution's
    work and memory, where a zero-dilated filter would multiply both by the
    product of the dilations); `_grouped_conv`. `strides`, `dilations`, `pairs`:
    spatial only. float16 and bfloat16 are computed in float32, as the FFT and
    our kernels do (TF's CPU kernels may accumulate in half precision)."""
    if x.dtype in (tf.float16, tf.bfloat16):
        y = _composed_conv(tf.cast(x, tf.float32), tf.cast(f, tf.float32), strides, padding,
                           pairs, dilations)
        return tf.cast(y, x.dtype)
    rank = len(strides)
    if _groups(x, f, rank) == 1 and set(dilations) == {1} and (rank == 2 or padding != "EXPLICIT"):
        # TF's own op with its padding: tf.nn.conv2d's (conv3d's) numbers, to the bit
        pad = [[0, 0], *map(list, pairs), [0, 0]] if padding == "EXPLICIT" else padding
        return (tf.nn.conv2d if rank == 2 else tf.nn.conv3d)(x, f, [1, *strides, 1], pad)
    x = _pad_spatial(x, f, strides, padding, pairs, dilations)
    strides, dilations = list(strides), list(dilations)
    for i, (s, d) in enumerate(zip(strides, dilations)):
        if d > 1 and s % d == 0:  # the taps and the strides fall on every d-th row only
            x = x[(slice(None),) * (i + 1) + (slice(None, None, d),)]
            strides[i], dilations[i] = s // d, 1
    if all(d == 1 for d in dilations):
        return _grouped_conv(x, f, strides)
    inner = [s if d == 1 else 1 for s, d in zip(strides, dilations)]
    y = tf.nn.with_space_to_batch(x, dilations, "VALID",
                                  lambda xb, _rank, _padding: _grouped_conv(xb, f, inner))
    if any(s > 1 and d > 1 for s, d in zip(strides, dilations)):  # then every s-th output
        y = y[(slice(None),) + tuple(slice(None, None, s if d > 1 else 1)
                                     for s, d in zip(strides, dilations))]
    return y


def _pad_spatial(x, f, strides, padding, pairs, dilations):
    """x with SAME's (or the explicit pairs') zeros around its spatial dimensions,
    so that a VALID convolution follows. Sizes unknown when the graph is built
    are padded as TensorFlow's SAME pads them, by graph arithmetic."""
    if padding == "VALID":
        return x
    rank = len(strides)
    pads = [list(p) for p in pairs] if padding == "EXPLICIT" else []
    for i in range(rank if padding == "SAME" else 0):
        size = tf.compat.dimension_value(x.shape[i + 1]) if x.shape.rank else None
        k = tf.compat.dimension_value(f.shape[i]) if f.shape.rank else None
        if size is not None and k is not None:
            pads.append(list(pads_1d(size, k, strides[i], dilations[i], "SAME", None)[:2]))
            continue
        size = tf.shape(x)[i + 1] if size is None else size
        k = tf.shape(f)[i] if k is None else k
        out = (size + strides[i] - 1) // strides[i]
        total = tf.maximum((out - 1) * strides[i] + (k - 1) * dilations[i] + 1 - size, 0)
        pads.append([total // 2, total - total // 2])
    if all(isinstance(v, int) and v == 0 for pair in pads for v in pair):
        return x
    return tf.pad(x, [[0, 0], *pads, [0, 0]])


def _grouped_conv(x, f, strides):
    """VALID, undilated tf.nn.conv2d (conv3d) of channels-last x. Grouped filters:
    one op under XLA, whose convolution has groups; outside it one per group, or
    tf.nn.depthwise_conv2d for a depthwise 2-D filter (one op, equal strides:
    their gcd, then a slice)."""
    rank = len(strides)
    conv = tf.nn.conv2d if rank == 2 else tf.nn.conv3d
    groups, full = _groups(x, f, rank), [1, *strides, 1]
    if groups == 1 or in_xla():
        return conv(x, f, full, "VALID")
    if rank == 2 and f.shape[2] == 1 and f.shape.is_fully_defined():
        g, cin, cout = math.gcd(*strides), x.shape[-1], f.shape[-1]
        fd = tf.reshape(f, [*f.shape.as_list()[:2], cin, cout // cin])
        y = tf.nn.depthwise_conv2d(x, fd, [1, g, g, 1], "VALID")
        return y if strides == [g, g] else y[:, ::strides[0] // g, ::strides[1] // g]
    xs, fs = tf.split(x, groups, axis=-1), tf.split(f, groups, axis=-1)
    return tf.concat([conv(a, b, full, "VALID") for a, b in zip(xs, fs)], axis=-1)


def _groups(x, f, rank):
    """Groups of channels-last x and filter f (1 where the channels are not known)."""
    cin = tf.compat.dimension_value(x.shape[-1]) if x.shape.rank else None
    cig = tf.compat.dimension_value(f.shape[rank]) if f.shape.rank == rank + 2 else None
    return cin // cig if cin and cig else 1


def _dilate_filter(f, dilations):
    """The filter (spatial dimensions first) with d - 1 zero rows between its taps
    along each spatial dimension of dilation d."""
    for axis, d in enumerate(dilations):
        if d > 1:
            shape = f.shape.as_list()
            k, shape[axis] = shape[axis], shape[axis] * d
            pad = [[0, 0]] * (len(shape) + 1)
            pad[axis + 1] = [0, d - 1]
            f = tf.reshape(tf.pad(tf.expand_dims(f, axis + 1), pad), shape)
            f = f[(slice(None),) * axis + (slice(0, (k - 1) * d + 1),)]
    return f


def _fft_conv_nhwc(x, f, strides, pads, dilations, groups, fft_size, out_size, per_image,
                   workspace_limit):
    """Cross-correlation of NHWC x with HWIO f by whole-image real FFTs."""
    dtype = x.dtype
    compute = tf.float64 if dtype == tf.float64 else tf.float32
    x, f = tf.cast(x, compute), tf.cast(f, compute)
    (sh, sw), (pt, pb, pl, pr), (fft_h, fft_w), (out_h, out_w) = strides, pads, fft_size, out_size
    f = _dilate_filter(f, dilations)
    eh, ew, cig, cout = f.shape.as_list()
    cog = cout // groups
    if any(pads):
        x = tf.pad(x, [[0, 0], [pt, pb], [pl, pr], [0, 0]])
    length = [fft_h, fft_w]
    # Filter spectra per (group, in, out): correlation multiplies by their conjugate.
    fs = tf.signal.rfft2d(tf.transpose(f, [2, 3, 0, 1]), fft_length=length)
    fs = tf.math.conj(tf.reshape(fs, [cig, groups, cog, fft_h, fft_w // 2 + 1]))
    # Valid stride-1 rows and columns, then the strides.
    rows, cols = max((out_h - 1) * sh + 1, 0), max((out_w - 1) * sw + 1, 0)

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

    return tf.cast(_in_chunks(x, chunk, per_image, workspace_limit), dtype)


def _in_chunks(x, chunk, per_image, workspace_limit):
    """chunk(x) over a static batch in chunks whose spectra fit the budget (at
    most CHUNK_TARGET_BYTES), one after another; at once where the batch is unknown."""
    n = tf.compat.dimension_value(x.shape[0])
    budget = min(workspace_limit or _default_budget(), CHUNK_TARGET_BYTES)
    step = max(1, budget // max(per_image, 1))
    if n is None or n <= step:
        return chunk(x)
    return tf.concat([chunk(x[i:i + step]) for i in range(0, n, step)], axis=0)


def conv3d(x, f, strides, padding, explicit, data_format, dilations, algorithm="auto",
           workspace_limit=0, why=""):
    """tf.nn.conv3d of x and f (arguments as bigconv3d parsed them: strides and
    dilations of 5 in data_format order, padding "SAME"/"VALID"/"EXPLICIT" with
    the flat 10 explicit_paddings; groups = input channels / filter in_channels)
    from TensorFlow ops, as `conv2d` in 2-D: algorithm "fft" forces the FFT,
    "direct" and "tf" TensorFlow's convolution, "auto" chooses (plan). NCDHW is
    transposed (TF's CPU Conv3D runs NDHWC only). `why`: for the log."""
    if data_format == "NCDHW":
        x = tf.transpose(x, [0, 2, 3, 4, 1])
        strides = [strides[0], *strides[2:], strides[1]]
        dilations = [dilations[0], *dilations[2:], dilations[1]]
        explicit = explicit[:2] + explicit[4:] + explicit[2:4] if explicit else explicit
    x, extra = with_zero_image(x)
    pairs = spatial_pairs(padding, explicit, (1, 2, 3))
    known = (x.shape.rank == 5 and f.shape.rank == 5 and x.shape[1:].is_fully_defined() and
             f.shape.is_fully_defined())
    p = plan(x.shape.as_list(), f.shape.as_list(), strides, padding, explicit, "NDHWC", dilations,
             x.dtype.name, algorithm, workspace_limit, in_xla()) if known else None
    # portable(): the 3-D FFT's complex ops convert to neither LiteRT nor ONNX
    if p is None or p["branch"] == "tf" or _portable.get():
        y, branch = _tf_conv3d(x, f, strides, padding, pairs, dilations), "TF's convolution"
    elif not p["fits"]:
        raise tf.errors.ResourceExhaustedError(
            None, None, f"the FFT needs at least {p['per_image_bytes']} bytes of workspace (the "
            f"spectra of one image), over workspace_limit={workspace_limit}")
    else:
        y = _fft_conv_ndhwc(x, f, strides[1:4], p["pads"], dilations[1:4],
                            x.shape[4] // f.shape[3], p["fft"], p["out"], p["per_image_bytes"],
                            workspace_limit)
        branch = "fft " + "x".join(map(str, p["fft"]))
    if extra:
        y = y[:-1]
    logging.vlog(1, "bigconv3d forward as pure TensorFlow (%s): %s", why, branch)
    return tf.transpose(y, [0, 4, 1, 2, 3]) if data_format == "NCDHW" else y


def _tf_conv3d(x, f, strides, padding, pairs, dilations):
    """TensorFlow's convolution of NDHWC x, `_composed_conv` (also under XLA: a
    dilated Conv3D's shape function is wrong)."""
    return _composed_conv(x, f, strides[1:4], padding, pairs, dilations[1:4])


def _fft_conv_ndhwc(x, f, strides, pads, dilations, groups, fft_size, out_size, per_image,
                    workspace_limit):
    """Cross-correlation of NDHWC x with DHWIO f by whole-volume FFTs: rfft2d over
    height x width, then a complex FFT over depth, whose gradients TensorFlow has
    (RFFT3D has none); the inverse over depth keeps only the output's depths."""
    dtype = x.dtype
    compute = tf.float64 if dtype == tf.float64 else tf.float32
    x, f = tf.cast(x, compute), tf.cast(f, compute)
    f = _dilate_filter(f, dilations)  # no larger than the transform, which holds the input
    cig, cout = f.shape.as_list()[3:]
    cog = cout // groups
    if any(pads):
        x = tf.pad(x, [[0, 0], *(pads[i:i + 2] for i in range(0, 6, 2)), [0, 0]])
    fd, fh, fw = fft_size
    bins = fw // 2 + 1
    # Valid stride-1 extents per dimension, then the strides.
    keep = [max((o - 1) * s + 1, 0) for o, s in zip(out_size, strides)]

    def spectra(a):
        """[..., D, H, W] real -> [..., fh, bins, fd] complex."""
        t = tf.signal.rfft2d(a, fft_length=[fh, fw])
        r = t.shape.rank
        t = tf.transpose(t, [*range(r - 3), r - 2, r - 1, r - 3])
        t = tf.pad(t, [[0, 0]] * (r - 1) + [[0, fd - a.shape[-3]]])  # depth zeros, as the input's
        return tf.signal.fft(t)

    # Filter spectra per (group, in, out): correlation multiplies by their conjugate.
    fs = spectra(tf.transpose(f, [3, 4, 0, 1, 2]))
    fs = tf.math.conj(tf.reshape(fs, [cig, groups, cog, fh, bins, fd]))

    def chunk(xc):
        n = tf.shape(xc)[0]
        xs = tf.reshape(spectra(tf.transpose(xc, [0, 4, 1, 2, 3])), [n, groups, cig, fh, bins, fd])
        if cig == 1:  # no sum over input channels: a broadcast product, which XLA fuses
            ys = xs * fs
        else:
            ys = tf.einsum("ngcijk,cgoijk->ngoijk", xs, fs)
        t = tf.signal.ifft(tf.reshape(ys, [n, cout, fh, bins, fd]))[..., :keep[0]:strides[0]]
        y = tf.signal.irfft2d(tf.transpose(t, [0, 1, 4, 2, 3]), fft_length=[fh, fw])
        return tf.transpose(y[..., :keep[1]:strides[1], :keep[2]:strides[2]], [0, 2, 3, 4, 1])

    return tf.cast(_in_chunks(x, chunk, per_image, workspace_limit), dtype)


def _default_budget():
    try:
        from tfbigconv import _core
        return int(_core.default_workspace_budget())
    except Exception:  # no compiled library: a fixed budget
        return DEFAULT_BUDGET_BYTES
