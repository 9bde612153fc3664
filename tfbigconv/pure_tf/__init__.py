"""bigconv1d, bigconv2d and bigconv3d composed of TensorFlow ops only: under XLA,
and without the compiled library.

XLA cannot compile a custom op, and a pip-installed library cannot register an
XLA lowering (TF#60489). So inside `tf.function(jit_compile=True)` (also a
Keras model compiled with jit_compile=True), and where tfbigconv's compiled
library is missing or TFBIGCONV_PURE_TF=1, and inside `portable()` (an export that
must load without the library; see `active`), the ops build their convolution
from ops XLA compiles, one implementation for every rank (a 1-D convolution
arrives as a 2-D one of height 1): the operands go channels-last once, here, and

- large filters: FFT convolution over the whole padded input (`fft`: rfft2d over
  the last two spatial dimensions, complex FFTs over depth);
- small filters: TensorFlow's convolution (`composed`);
- inside `portable()`, where the FFT would run: the DFT as real matrix products
  (`dft`), which LiteRT and ONNX convert, or TensorFlow's convolution.

`plan` and `estimates` (`plan`: small pure functions) choose between them.
Gradients of every order are TensorFlow's own, through the composition. Shapes
must be static except the batch; with other unknown dimensions TensorFlow's
convolution runs. This module routes: whether the path runs (`active`), and
which of the three builds a convolution (`convolution`).
"""
import contextlib
import contextvars
import os

import tensorflow as tf
from absl import logging

from tfbigconv.pure_tf import dft, fft
from tfbigconv.pure_tf.composed import in_xla, tf_convolution
from tfbigconv.pure_tf.fft import CHUNK_TARGET_BYTES, DEFAULT_BUDGET_BYTES, PRUNE_BELOW  # noqa: F401
from tfbigconv.pure_tf.plans import (  # noqa: F401  (tfbigconv.pure_tf's public names)
    ASSUMED_BATCH, CONV_FLOPS_PER_SECOND, DENSE_CHANNELS, DEPTHWISE_FLOPS_PER_SECOND,
    FFT_FLOPS_PER_SECOND, MIX_FLOPS_PER_SECOND, Branch, PurePlan, check_geometry, estimates,
    good_fft_size, output_size, pads_1d, plan, spatial_dims, spatial_pairs)

PURE_TF_ENV = "TFBIGCONV_PURE_TF"
# The compiled library's load error, set by tfbigconv/__init__.py when it failed.
missing_library = None
# What ran, for the log, where TensorFlow's convolution runs.
TF_CONVOLUTION = "TF's convolution"


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
    LiteRT nor ONNX, it runs the DFT as real matrix products (tfbigconv/pure_tf/dft.py)
    or TensorFlow's convolution, in every rank, so that every format Keras exports
    converts (`_portable_convolution`; docs/export.md).
    """
    token = _portable.set("tfbigconv.portable()")
    try:
        yield
    finally:
        _portable.reset(token)


def active():
    """Whether our ops build the pure-TF composition here, and why ("" if not)."""
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


def convolution(x, f, strides, padding, explicit, data_format, dilations, algorithm="auto",
                workspace_limit=0, why=""):
    """tf.nn.conv2d (conv3d) of x and f from TensorFlow ops, arguments as the op
    parsed them: strides and dilations of rank + 2 in data_format order ("NHWC",
    "NCHW", "NDHWC" or "NCDHW"), padding "SAME"/"VALID"/"EXPLICIT" with the flat
    explicit_paddings; groups = input channels / filter in_channels. algorithm "fft"
    forces the FFT, "direct" and "tf" TensorFlow's convolution, "auto" chooses
    (plan). Channels-first operands are transposed once (TF's CPU kernels run
    channels-last only). `why`: the reason the pure-TF path runs, for the log."""
    rank = len(data_format) - 2
    dims = spatial_dims(data_format)
    pairs = spatial_pairs(padding, explicit, dims)
    if not in_xla() and not (x.shape.is_fully_defined() and f.shape.is_fully_defined()):
        with tf.control_dependencies(_runtime_checks(x, f, strides, padding, pairs, data_format,
                                                     dilations)):
            x = tf.identity(x)
    first = not data_format.endswith("C")
    if first:
        x = tf.transpose(x, [0, *range(2, rank + 2), 1])
    strides, dilations = [strides[d] for d in dims], [dilations[d] for d in dims]
    x, extra = with_zero_image(x)
    y, branch = _convolve(x, f, strides, padding, pairs, dilations, algorithm, workspace_limit)
    if extra:
        y = y[:-1]
    logging.vlog(1, "bigconv%dd forward as pure TensorFlow (%s): %s", rank, why, branch)
    return tf.transpose(y, [0, rank + 1, *range(1, rank + 1)]) if first else y


# ops/conv.py's names for `convolution`, by the op's rank.
conv2d = conv3d = convolution


def _convolve(x, f, strides, padding, pairs, dilations, algorithm, workspace_limit):
    """(y, what ran) of channels-last x; strides, pairs and dilations spatial only."""
    rank = len(strides)
    known = (x.shape.rank == rank + 2 and f.shape.rank == rank + 2 and
             x.shape[1:].is_fully_defined() and f.shape.is_fully_defined())
    if not known:
        return tf_convolution(x, f, strides, padding, pairs, dilations), TF_CONVOLUTION
    p = plan(x.shape.as_list(), f.shape.as_list(), [1, *strides, 1], padding,
             [0, 0, *(v for pair in pairs for v in pair), 0, 0] if padding == "EXPLICIT" else [],
             "N" + "DHW"[3 - rank:] + "C", [1, *dilations, 1], x.dtype.name, algorithm,
             workspace_limit, in_xla())
    if p.branch == Branch.TF:
        return tf_convolution(x, f, strides, padding, pairs, dilations), TF_CONVOLUTION
    if not p.fits:
        raise tf.errors.ResourceExhaustedError(
            None, None, f"the FFT needs at least {p.per_image_bytes} bytes of workspace (the "
            f"spectra of one image), over workspace_limit={workspace_limit}")
    if _portable.get():
        return _portable_convolution(x, f, strides, padding, pairs, dilations, p)
    y = fft.convolution(x, f, strides, p.pads, dilations, x.shape[-1] // f.shape[rank], p.fft,
                        p.out, p.per_image_bytes, workspace_limit)
    return y, "fft " + "x".join(map(str, p.fft))


def _portable_convolution(x, f, strides, padding, pairs, dilations, p):
    """Under portable(), where `plan` chose the FFT (whose ops LiteRT and tf2onnx
    lack): the DFT as real matrix products (dft.py), or TensorFlow's convolution
    where that is estimated faster or the DFT's matrices are too large."""
    rank = len(strides)
    shape, f_shape = x.shape.as_list(), f.shape.as_list()
    sides = shape[1:-1]
    eff = [(k - 1) * d + 1 for k, d in zip(f_shape[:rank], dilations)]
    groups = shape[-1] // f_shape[rank]
    work, elements = dft.macs(shape[0] or ASSUMED_BATCH, sides, eff, shape[-1], f_shape[-1],
                              groups, p.pads, p.out)
    if elements > dft.MAX_MATRIX_ELEMENTS or (
            p.reason != "requested" and 2 * work / dft.FLOPS_PER_SECOND >= p.tf_seconds):
        return tf_convolution(x, f, strides, padding, pairs, dilations), TF_CONVOLUTION
    y = dft.convolution(x, fft.dilate_filter(f, dilations), strides, p.pads, p.out, groups)
    return y, "dft {} as matrix products".format("x".join(map(str, dft.sizes(sides, p.pads))))


def _runtime_checks(x, f, strides, padding, pairs, data_format, dilations):
    """The checks of check_geometry as graph assertions, for shapes known only
    when the graph runs (TF's own Conv2D crashes on some of them: a rank-3
    input fails a CHECK in TF 2.21). x in data_format order; pairs: spatial."""
    rank = len(data_format) - 2
    dims = spatial_dims(data_format)
    cd = rank + 1 if data_format.endswith("C") else 1
    checks = [tf.debugging.assert_rank(x, rank + 2, message=f"input must be rank {rank + 2}"),
              tf.debugging.assert_rank(f, rank + 2, message=f"filter must be rank {rank + 2}")]
    with tf.control_dependencies(checks):
        xs, fs = tf.shape(x, out_type=tf.int64), tf.shape(f, out_type=tf.int64)
    cin, cig, cout = xs[cd], fs[rank], fs[rank + 1]
    zero = tf.constant(0, tf.int64)
    checks += [
        tf.debugging.assert_equal(tf.math.floormod(cin, tf.maximum(cig, 1)), zero,
                                  message="input depth must be a multiple of the filter's "
                                          "in_depth"),
        tf.debugging.assert_equal(tf.math.floormod(cout, tf.maximum(cin // tf.maximum(cig, 1), 1)),
                                  zero, message="filter out_depth must be a multiple of groups")]
    if padding != "SAME":
        for k, (d, pair) in enumerate(zip(dims, pairs)):
            eff = (fs[k] - 1) * dilations[d] + 1
            checks.append(tf.debugging.assert_greater_equal(
                xs[d] + sum(pair) + strides[d] - 1, eff,
                message="filter is larger than the padded input"))
    return checks
