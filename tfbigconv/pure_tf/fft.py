"""The pure-TF path's FFT convolution, one for every rank: channels-last operands,
one tile (the whole padded input) at the plan's good sizes. The last two spatial
dimensions go through `tf.signal.rfft2d`, each dimension before them (depth)
through a complex `tf.signal.fft` (TF has no gradient of RFFT3D); the channels are
mixed per frequency bin by one einsum (a broadcast product for depthwise filters),
in batch chunks whose spectra stay within the workspace budget. float16 and
bfloat16 are computed in float32."""
import tensorflow as tf

# Spectra of one batch chunk beyond which a bigger chunk is slower: the
# transforms of a chunk that stays in the caches run 1.8x faster (seed
# forward under XLA, 16 images: chunks of 1-3 images 40 ms, of 4-16 images
# 70 ms; 2.5 MB of spectra per image). The CPU planner's kChunkTargetBytes.
CHUNK_TARGET_BYTES = 8 << 20
# The inverse transforms skip the rows past the crop where the output keeps at
# most this share of the transform's rows (seed forward under XLA: 187 of 324
# rows, 7% faster; with nearly all rows kept the extra transposes cost more).
# Measured in 2-D only: with a depth dimension the plane's inverse is irfft2d
# (3-D under XLA on a loaded 2-core host, pruned against not: no clear verdict).
PRUNE_BELOW = 0.75
# Spectra of one batch chunk when no workspace_limit is given and the host's
# budget is not known (no compiled library).
DEFAULT_BUDGET_BYTES = 1 << 30
# Index letters of the spectral dimensions in the channel mix's einsum.
_SPECTRAL = "ijk"


def convolution(x, f, strides, pads, dilations, groups, fft_size, out_size, per_image,
                workspace_limit):
    """Cross-correlation of channels-last x [N, *spatial, C] with f [*spatial, C /
    groups, O] (undilated) by whole-input FFTs of `fft_size`: `pads` (flat (before,
    after) per spatial dimension) of zeros around x, then `strides`, giving
    `out_size`. `per_image`: the spectra of one image (plan), for the chunks."""
    dtype = x.dtype
    compute = tf.float64 if dtype == tf.float64 else tf.float32
    x, f = tf.cast(x, compute), tf.cast(f, compute)
    rank = len(strides)
    f = dilate_filter(f, dilations)  # no larger than the transform, which holds the input
    cig, cout = f.shape.as_list()[rank:]
    cog = cout // groups
    if any(pads):
        x = tf.pad(x, [[0, 0], *(pads[i:i + 2] for i in range(0, 2 * rank, 2)), [0, 0]])
    spectral = (fft_size[-2], fft_size[-1] // 2 + 1, *fft_size[:-2])  # _spectra's layout
    s = _SPECTRAL[:rank]
    # Valid stride-1 extents per dimension, then the strides.
    keep = [max((o - 1) * st + 1, 0) for o, st in zip(out_size, strides)]
    # Filter spectra per (group, in, out): correlation multiplies by their conjugate.
    fs = _spectra(tf.transpose(f, [rank, rank + 1, *range(rank)]), fft_size)
    fs = tf.math.conj(tf.reshape(fs, [cig, groups, cog, *spectral]))

    def chunk(xc):
        n = tf.shape(xc)[0]
        xs = _spectra(tf.transpose(xc, [0, rank + 1, *range(1, rank + 1)]), fft_size)
        xs = tf.reshape(xs, [n, groups, cig, *spectral])
        if cig == 1:  # no sum over input channels: a broadcast product, which XLA fuses
            ys = xs * fs
        else:
            ys = tf.einsum(f"ngc{s},cgo{s}->ngo{s}", xs, fs)
        y = _inverse(tf.reshape(ys, [n, cout, *spectral]), fft_size, keep, strides)
        return tf.transpose(y, [0, *range(2, rank + 2), 1])

    return tf.cast(in_chunks(x, chunk, per_image, workspace_limit), dtype)


def _spectra(a, fft_size):
    """[..., *spatial] real -> [..., fft_h, bins, *fft_size[:-2]] complex: rfft2d
    over the last two dimensions, then a complex FFT over each one before them,
    moved last and zero-padded to its size."""
    t = tf.signal.rfft2d(a, fft_length=fft_size[-2:])
    for size in fft_size[:-2]:
        r = t.shape.rank
        axis = r - len(fft_size)  # the next dimension to transform moves here each time
        t = tf.transpose(t, [*range(axis), *range(axis + 1, r), axis])
        t = tf.pad(t, [[0, 0]] * (r - 1) + [[0, size - t.shape[-1]]])
        t = tf.signal.fft(t)
    return t


def _inverse(ys, fft_size, keep, strides):
    """[N, C, fft_h, bins, *fft_size[:-2]] complex -> [N, C, *output] real: the
    inverse over each leading dimension, keeping only the output's positions, then
    over the last two: in 2-D where few rows are kept by columns and then only the
    output rows (rows past the crop are never transformed; PRUNE_BELOW), else by
    irfft2d."""
    for i in reversed(range(len(fft_size) - 2)):
        t = tf.signal.ifft(ys)[..., :keep[i]:strides[i]]
        r = t.shape.rank
        ys = tf.transpose(t, [0, 1, r - 1, *range(2, r - 1)])
    (fft_h, fft_w), (rows, cols), (sh, sw) = fft_size[-2:], keep[-2:], strides[-2:]
    if len(fft_size) == 2 and -(-rows // sh) <= PRUNE_BELOW * fft_h:
        t = tf.signal.ifft(_swap_last_two(ys))[..., :rows:sh]
        y = tf.signal.irfft(_swap_last_two(t), fft_length=[fft_w])
        return y[..., :cols:sw]
    return tf.signal.irfft2d(ys, fft_length=[fft_h, fft_w])[..., :rows:sh, :cols:sw]


def _swap_last_two(t):
    r = t.shape.rank
    return tf.transpose(t, [*range(r - 2), r - 1, r - 2])


def dilate_filter(f, dilations):
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


def in_chunks(x, chunk, per_image, workspace_limit):
    """chunk(x) over a static batch in chunks whose spectra fit the budget (at
    most CHUNK_TARGET_BYTES), one after another; at once where the batch is unknown."""
    n = tf.compat.dimension_value(x.shape[0])
    budget = min(workspace_limit or _default_budget(), CHUNK_TARGET_BYTES)
    step = max(1, budget // max(per_image, 1))
    if n is None or n <= step:
        return chunk(x)
    return tf.concat([chunk(x[i:i + step]) for i in range(0, n, step)], axis=0)


def _default_budget():
    try:
        from tfbigconv import _core
        return int(_core.default_workspace_budget())
    except Exception:  # no compiled library: a fixed budget
        return DEFAULT_BUDGET_BYTES
