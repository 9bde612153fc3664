"""Convolution of any rank by discrete Fourier transforms written as real matrix
products: what `tfbigconv.portable()` traces where the pure path would run its FFT.

An export must convert to every format Keras exports, and the pure path's FFT
converts to none but a SavedModel: LiteRT's builtin RFFT2D takes power-of-two
sizes only and LiteRT has no builtin inverse, Conj or complex product; tf2onnx
converts RFFT2D only when ComplexAbs reads it, and no inverse. A DFT along one
dimension is a product by a matrix of cosines and sines: here every transform
is a matrix product of real tensors (LiteRT's FULLY_CONNECTED and BATCH_MATMUL,
ONNX's MatMul), the spectra hold real and imaginary parts stacked along the
transformed dimension, and their product is real arithmetic (an einsum over
input channels). The last spatial dimension is a real transform to half a
spectrum; each dimension before it, last first, a complex one, with the
dimensions already transformed merged into one so that every operand keeps the
rank of the 2-D case. Exact (float32 rounding only), at the padded input's own
sizes (no power of two), without transforming padding zeros nor computing
cropped or strided-out outputs. Its work grows as the square of the sides, where
an FFT's grows as n log n, so `macs` tells the pure path when TensorFlow's
convolution is cheaper.
"""
import math

import numpy as np
import tensorflow as tf

# Matrices of cosines and sines beyond this many elements (float32: 4 bytes each)
# are not built: TensorFlow's convolution runs instead (a long 1-D signal).
MAX_MATRIX_ELEMENTS = 16 << 20
# convolution's rate in a SavedModel on a 2-core Zen 4 (benchmarks/bench_export.py,
# 2-D): 25 GFLOP/s for the 31x31 depthwise case (many small products), about 75
# for the 135x135 one. pure_tf sets 2 * macs / this against TF's convolution.
FLOPS_PER_SECOND = 25e9


def sizes(in_sizes, pads):
    """The transform's sizes: the padded input's, per spatial dimension (`pads`:
    flat (before, after) per spatial dimension)."""
    return tuple(s + pads[2 * i] + pads[2 * i + 1] for i, s in enumerate(in_sizes))


def macs(n, in_sizes, f_sizes, cin, cout, groups, pads, out_sizes):
    """Multiply-adds of `convolution` for a batch of n, and the elements of its
    matrices. f_sizes: the (dilated) filter's sizes; all sizes per spatial dimension."""
    padded = sizes(in_sizes, pads)
    bins = padded[-1] // 2 + 1
    cig = cin // groups

    def forward(sides):
        """Of one channel of `sides`: the last dimension to bins (by cos and sin),
        then each before it, last first, as [2 padded, 2 side] @ [2 side, rest]."""
        work, rest = math.prod(sides) * 2 * bins, bins
        for a in reversed(range(len(sides) - 1)):
            work += math.prod(sides[:a]) * 4 * padded[a] * sides[a] * rest
            rest *= padded[a]
        return work

    # The inverse, first dimension first, at the outputs only; then the last's.
    inverse = sum(math.prod(out_sizes[:a]) * 4 * out_sizes[a] * padded[a] *
                  math.prod(padded[a + 1:-1]) * bins for a in range(len(padded) - 1))
    inverse += math.prod(out_sizes[:-1]) * 2 * bins * out_sizes[-1]
    per_image = (cin * forward(in_sizes)
                 + cout * cig * 4 * math.prod(padded[:-1]) * bins  # the product of spectra
                 + cout * inverse)
    filters = cig * cout * forward(f_sizes)
    elements = 2 * bins * (in_sizes[-1] + f_sizes[-1] + out_sizes[-1]) + sum(
        4 * p * (s + k + o) for p, s, k, o in zip(padded[:-1], in_sizes, f_sizes, out_sizes))
    return n * per_image + filters, elements


def _angles(index, freq, n):
    """2 pi index * freq / n as an [len(index), len(freq)] array, reduced modulo n in
    integers so that large products lose nothing."""
    return 2 * np.pi * (np.outer(index, freq) % n) / n


def _forward_last(w, offset, nw, bins):
    """(cos, -sin) [w, bins]: x @ cos + i x @ -sin is the DFT along the last
    dimension of x whose first column sits at `offset` of nw."""
    a = _angles(np.arange(w) + offset, np.arange(bins), nw)
    return np.cos(a), -np.sin(a)


def _forward_complex(h, offset, nh):
    """[2 nh, 2 h]: [re; im] of the DFT along the rows of (re + i im), stacked [re; im]."""
    a = _angles(np.arange(nh), np.arange(h) + offset, nh)
    c, s = np.cos(a), np.sin(a)
    return np.block([[c, s], [-s, c]])


def _inverse_complex(rows, nh):
    """[2 len(rows), 2 nh]: the inverse DFT along the rows (scaled by 1/nh), at `rows` only."""
    a = _angles(rows, np.arange(nh), nh)
    c, s = np.cos(a) / nh, np.sin(a) / nh
    return np.block([[c, -s], [s, c]])


def _inverse_last(cols, nw, bins):
    """(for re, for im) [bins, len(cols)]: the real inverse of a half spectrum
    along the last dimension (tf.signal.irfft's, scaled by 1/nw), at `cols` only."""
    weight = np.full(bins, 2.0)
    weight[0] = 1.0
    if nw % 2 == 0:
        weight[-1] = 1.0  # the Nyquist bin stands once
    a = _angles(np.arange(bins), cols, nw)
    return weight[:, None] * np.cos(a) / nw, -weight[:, None] * np.sin(a) / nw


def _times(t, m):
    """t @ m for a numpy matrix m, as one rank-2 MatMul over t's leading dimensions
    (TF 2.21's oneDNN BatchMatMulV2 crashes on a [2, 1, a, b] @ [b, c] broadcast)."""
    m = tf.constant(m, t.dtype)
    y = tf.matmul(tf.reshape(t, [-1, m.shape[0]]), m)
    y = tf.reshape(y, tf.concat([tf.shape(t)[:-1], [m.shape[1]]], 0))
    y.set_shape(t.shape[:-1].concatenate(m.shape[1:]))
    return y


def _merge_last_two(t):
    """t with its last two dimensions as one (only the first may be unknown)."""
    return tf.reshape(t, [-1, *t.shape[1:-2], t.shape[-2] * t.shape[-1]])


def _spectra(t, offsets, padded):
    """[B, C, *sides] real, placed at `offsets` of `padded` -> [B, C, 2 padded[0],
    rest] ([re; im] along the first spatial dimension; the others merged in `rest`)."""
    rank = len(padded)
    cos, msin = _forward_last(t.shape[-1], offsets[-1], padded[-1], padded[-1] // 2 + 1)
    re, im = _times(t, cos), _times(t, msin)
    for a in reversed(range(rank - 1)):
        if a < rank - 2:  # the dimensions transformed so far as one
            re, im = _merge_last_two(re), _merge_last_two(im)
        side = re.shape[-2]
        stacked = tf.matmul(tf.constant(_forward_complex(side, offsets[a], padded[a]), t.dtype),
                            tf.concat([re, im], axis=-2))
        if a:
            re, im = stacked[..., :padded[a], :], stacked[..., padded[a]:, :]
    return stacked


def _inverse(ys, padded, out_sizes, strides):
    """[N, C, 2 padded[0], rest] ([re; im], as `_spectra`) -> [N, C, *out_sizes]:
    the inverse at the strided outputs, first dimension first, then the last's."""
    zs = ys
    for a in range(len(padded) - 1):
        if a:  # [..., 2 out, padded[a] * rest] -> [..., out, 2 padded[a], rest]
            o = out_sizes[a - 1]
            re, im = (tf.reshape(v, [-1, *v.shape[1:-1], padded[a], v.shape[-1] // padded[a]])
                      for v in (zs[..., :o, :], zs[..., o:, :]))
            zs = tf.concat([re, im], axis=-2)
        inverse = _inverse_complex(np.arange(out_sizes[a]) * strides[a], padded[a])
        zs = tf.matmul(tf.constant(inverse, zs.dtype), zs)
    o = out_sizes[-2]
    for_re, for_im = _inverse_last(np.arange(out_sizes[-1]) * strides[-1], padded[-1],
                                   padded[-1] // 2 + 1)
    return _times(zs[..., :o, :], for_re) + _times(zs[..., o:, :], for_im)


def convolution(x, f, strides, pads, out_sizes, groups):
    """Cross-correlation of channels-last x [N, *spatial, C] (2 or 3 spatial
    dimensions) with the filter f [*spatial, C / groups, O] (dilated already):
    `pads` (flat (before, after) per spatial dimension) of zeros around x, then
    `strides`, giving out_sizes. float16 and bfloat16 are computed in float32."""
    dtype = x.dtype
    compute = tf.float64 if dtype == tf.float64 else tf.float32
    x, f = tf.cast(x, compute), tf.cast(f, compute)
    rank = len(strides)
    cig, cout = f.shape.as_list()[rank:]
    padded = sizes(x.shape.as_list()[1:-1], pads)
    cog, nh = cout // groups, padded[0]
    # Correlation: the input's spectrum times the conjugate of the filter's.
    xs = _spectra(tf.transpose(x, [0, rank + 1, *range(1, rank + 1)]), pads[0::2], padded)
    fs = _spectra(tf.transpose(f, [rank, rank + 1, *range(rank)]), (0,) * rank, padded)
    n, rest = tf.shape(x)[0], xs.shape[-1]
    xs = tf.reshape(xs, [n, groups, cig, 2 * nh, rest])
    fs = tf.reshape(fs, [cig, groups, cog, 2 * nh, rest])
    xr, xi = xs[..., :nh, :], xs[..., nh:, :]
    fr, fi = fs[..., :nh, :], fs[..., nh:, :]
    if cig == 1:  # no sum over input channels: a broadcast product
        fr, fi = fr[0], fi[0]  # [groups, cog, nh, rest] against x's [n, groups, 1, ...]
        yr, yi = xr * fr + xi * fi, xi * fr - xr * fi
    else:  # (xr + i xi)(fr - i fi), summed over the input channels c of each group
        mix = "ngcij,cgoij->ngoij"
        yr = tf.einsum(mix, tf.concat([xr, xi], 2), tf.concat([fr, fi], 0))
        yi = tf.einsum(mix, tf.concat([xi, xr], 2), tf.concat([fr, -fi], 0))
    ys = tf.reshape(tf.concat([yr, yi], axis=-2), [n, cout, 2 * nh, rest])
    y = _inverse(ys, padded, out_sizes, strides)
    return tf.cast(tf.transpose(y, [0, *range(2, rank + 2), 1]), dtype)
