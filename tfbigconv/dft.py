"""2-D convolution by discrete Fourier transforms written as real matrix products:
what `tfbigconv.portable()` traces where the pure path would run its FFT.

An export must convert to every format Keras exports, and the pure path's FFT
converts to none but a SavedModel: LiteRT's builtin RFFT2D takes power-of-two
sizes only and LiteRT has no builtin inverse, Conj or complex product; tf2onnx
converts RFFT2D only when ComplexAbs reads it, and no inverse. A DFT along one
dimension is a product by a matrix of cosines and sines: here every transform
is a matrix product of real tensors (LiteRT's FULLY_CONNECTED and BATCH_MATMUL,
ONNX's MatMul), the spectra hold real and imaginary parts stacked along the
transformed dimension, and their product is real arithmetic (an einsum over
input channels). Exact (float32 rounding only), at the padded input's own sizes
(no power of two), without transforming padding zeros nor computing cropped or
strided-out outputs. Its work grows as the square of the image's sides, where
an FFT's grows as n log n, so `macs` tells the pure path when TensorFlow's
convolution is cheaper.
"""
import numpy as np
import tensorflow as tf

# Matrices of cosines and sines beyond this many elements (float32: 4 bytes each)
# are not built: TensorFlow's convolution runs instead (a long 1-D signal).
MAX_MATRIX_ELEMENTS = 16 << 20
# conv2d's rate in a SavedModel on a 2-core Zen 4 (benchmarks/bench_export.py):
# 25 GFLOP/s for the 31x31 depthwise case (many small products), about 75 for
# the 135x135 one. pure_tf sets 2 * macs / this against TF's convolution.
FLOPS_PER_SECOND = 25e9


def sizes(in_hw, pads):
    """The transform's sizes (the padded input's) and bins: (nh, nw, bins)."""
    (h, w), (pt, pb, pl, pr) = in_hw, pads
    nh, nw = h + pt + pb, w + pl + pr
    return nh, nw, nw // 2 + 1


def macs(n, in_hw, f_hw, cin, cout, groups, pads, out_hw):
    """Multiply-adds of `conv2d` for a batch of n, and the elements of its
    matrices. f_hw: the (dilated) filter's sizes."""
    (h, w), (kh, kw), (oh, ow) = in_hw, f_hw, out_hw
    nh, _, bins = sizes(in_hw, pads)
    cig = cin // groups
    per_image = (cin * (h * w * 2 * bins + 4 * nh * h * bins)  # forward: width, height
                 + cout * cig * 4 * nh * bins  # the product of spectra
                 + cout * (4 * oh * nh * bins + 2 * oh * bins * ow))  # inverse
    filters = cig * cout * (kh * kw * 2 * bins + 4 * nh * kh * bins)
    elements = 2 * bins * (w + kw + ow) + 4 * nh * (h + kh + oh)
    return n * per_image + filters, elements


def _angles(index, freq, n):
    """2 pi index * freq / n as an [len(index), len(freq)] array, reduced modulo n in
    integers so that large products lose nothing."""
    return 2 * np.pi * (np.outer(index, freq) % n) / n


def _forward_width(w, offset, nw, bins):
    """(cos, -sin) [w, bins]: x @ cos + i x @ -sin is the DFT along the last
    dimension of x whose first column sits at `offset` of nw."""
    a = _angles(np.arange(w) + offset, np.arange(bins), nw)
    return np.cos(a), -np.sin(a)


def _forward_height(h, offset, nh):
    """[2 nh, 2 h]: [re; im] of the DFT along the rows of (re + i im), stacked [re; im]."""
    a = _angles(np.arange(nh), np.arange(h) + offset, nh)
    c, s = np.cos(a), np.sin(a)
    return np.block([[c, s], [-s, c]])


def _inverse_height(rows, nh):
    """[2 len(rows), 2 nh]: the inverse DFT along the rows (scaled by 1/nh), at `rows` only."""
    a = _angles(rows, np.arange(nh), nh)
    c, s = np.cos(a) / nh, np.sin(a) / nh
    return np.block([[c, -s], [s, c]])


def _inverse_width(cols, nw, bins):
    """(for re, for im) [bins, len(cols)]: the real inverse of a half spectrum
    along the last dimension (tf.signal.irfft's, scaled by 1/nw), at `cols` only."""
    weight = np.full(bins, 2.0)
    weight[0] = 1.0
    if nw % 2 == 0:
        weight[-1] = 1.0  # the Nyquist bin stands once
    a = _angles(np.arange(bins), cols, nw)
    return weight[:, None] * np.cos(a) / nw, -weight[:, None] * np.sin(a) / nw


def _times(t, m):
    m = tf.constant(m, t.dtype)
    y = tf.matmul(tf.reshape(t, [-1, m.shape[0]]), m)
    y = tf.reshape(y, tf.concat([tf.shape(t)[:-1], [m.shape[1]]], 0))
    y.set_shape(t.shape[:-1].concatenate(m.shape[1:]))
    return y


def _times(t, m):
    """t @ m for a numpy matrix m, as one rank-2 MatMul over t's leading dimensions
    (TF 2.21's oneDNN BatchMatMulV2 crashes on a [2, 1, a, b] @ [b, c] broadcast)."""
    m = tf.constant(m, t.dtype)
    y = tf.matmul(tf.reshape(t, [-1, m.shape[0]]), m)
    y = tf.reshape(y, tf.concat([tf.shape(t)[:-1], [m.shape[1]]], 0))
    y.set_shape(t.shape[:-1].concatenate(m.shape[1:]))
    return y


def _spectra(t, width, height):
    """[..., h, w] real -> [..., 2 nh, bins] ([re; im] along the rows)."""
    cos, msin = width
    stacked = tf.concat([_times(t, cos), _times(t, msin)], axis=-2)
    return tf.matmul(tf.constant(height, t.dtype), stacked)


def conv2d(x, f, strides, pads, out_hw, groups):
    """Cross-correlation of NHWC x with the HWIO filter f (dilated already; groups
    = input channels / f's in-channels): `pads` (top, bottom, left, right) of
    zeros around x, then `strides`, giving out_hw. float16 and bfloat16 are
    computed in float32."""
    dtype = x.dtype
    compute = tf.float64 if dtype == tf.float64 else tf.float32
    x, f = tf.cast(x, compute), tf.cast(f, compute)
    (h, w), (kh, kw, cig, cout) = x.shape.as_list()[1:3], f.shape.as_list()
    (sh, sw), (pt, _, pl, _), (oh, ow) = strides, pads, out_hw
    nh, nw, bins = sizes((h, w), pads)
    cog = cout // groups
    # Correlation: the input's spectrum times the conjugate of the filter's.
    xs = _spectra(tf.transpose(x, [0, 3, 1, 2]), _forward_width(w, pl, nw, bins),
                  _forward_height(h, pt, nh))
    fs = _spectra(tf.transpose(f, [2, 3, 0, 1]), _forward_width(kw, 0, nw, bins),
                  _forward_height(kh, 0, nh))
    n = tf.shape(x)[0]
    xs = tf.reshape(xs, [n, groups, cig, 2 * nh, bins])
    fs = tf.reshape(fs, [cig, groups, cog, 2 * nh, bins])
    xr, xi = xs[..., :nh, :], xs[..., nh:, :]
    fr, fi = fs[..., :nh, :], fs[..., nh:, :]
    if cig == 1:  # no sum over input channels: a broadcast product
        fr, fi = fr[0], fi[0]  # [groups, cog, nh, bins] against x's [n, groups, 1, ...]
        yr, yi = xr * fr + xi * fi, xi * fr - xr * fi
    else:  # (xr + i xi)(fr - i fi), summed over the input channels c of each group
        mix = "ngcij,cgoij->ngoij"
        yr = tf.einsum(mix, tf.concat([xr, xi], 2), tf.concat([fr, fi], 0))
        yi = tf.einsum(mix, tf.concat([xi, xr], 2), tf.concat([fr, -fi], 0))
    ys = tf.reshape(tf.concat([yr, yi], axis=-2), [n, cout, 2 * nh, bins])
    # The inverse at the strided output rows, then columns: nothing cropped is computed.
    zs = tf.matmul(tf.constant(_inverse_height(np.arange(oh) * sh, nh), ys.dtype), ys)
    for_re, for_im = _inverse_width(np.arange(ow) * sw, nw, bins)
    y = _times(zs[..., :oh, :], for_re) + _times(zs[..., oh:, :], for_im)
    return tf.cast(tf.transpose(y, [0, 2, 3, 1]), dtype)
