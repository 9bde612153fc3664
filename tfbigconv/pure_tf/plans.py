"""The pure-TF path's plan: the geometry rules (Python copies of _core's, which must
run without the compiled library), the estimates of TensorFlow's convolution and of
the FFT, and `plan`, which chooses between them. Small pure functions of shapes;
nothing here builds a graph."""
import dataclasses
import enum
import math

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
# An unknown batch, as the planner reads it (Keras' batch).
ASSUMED_BATCH = 32


class Branch(enum.StrEnum):
    """What the pure-TF path runs: the FFT, or TensorFlow's convolution."""
    FFT = "fft"
    TF = "tf"


@dataclasses.dataclass(frozen=True)
class PurePlan:
    """`plan`'s answer for one convolution."""
    branch: Branch
    fft: tuple              # the transform sizes, per spatial dimension
    per_image_bytes: int    # the spectra of one image (input and output channels)
    tf_seconds: float       # estimates: TensorFlow's convolution
    fft_seconds: float      # estimates: the FFT
    fits: bool              # per_image_bytes within workspace_limit (or no limit)
    reason: str             # why `branch`
    pads: tuple             # flat (before, after) per spatial dimension
    out: tuple              # output sizes, per spatial dimension


def good_fft_size(n):
    """Smallest size >= n with no prime factor above 7 (csrc/core/fft_sizes.h's
    GoodFftSize, which tests/pure_tf/test_plans.py holds this to)."""
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


def spatial_dims(data_format):
    """The indices of the spatial dimensions in data_format order."""
    rank = len(data_format) - 2
    return tuple(range(1, rank + 1)) if data_format.endswith("C") else tuple(range(2, rank + 2))


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
    dims = spatial_dims(data_format)
    cin = in_shape[-1 if data_format.endswith("C") else 1]
    ks, (cig, cout) = f_shape[:rank], f_shape[rank:]
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


def estimates(n, h, w, cin, cout, kh, kw, groups, fft_h, fft_w, out_h, out_w, xla=True):
    """(TF's convolution, the FFT): estimated seconds of each, 2-D."""
    return estimates_nd(n, cin, cout, kh * kw, groups, (fft_h, fft_w), out_h * out_w, xla)


def estimates_nd(n, cin, cout, taps, groups, fft, outputs, xla):
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
    (in_shape[0] may be None): a PurePlan. `xla`: whether XLA compiles it (its
    depthwise convolution is slower than TF's CPU kernel)."""
    rank = len(in_shape) - 2
    dims = spatial_dims(data_format)
    cin = in_shape[-1 if data_format.endswith("C") else 1]
    ks, (cig, cout) = f_shape[:rank], f_shape[rank:]
    geo = [pads_1d(in_shape[d], k, strides[d], dilations[d], padding, pair)
           for d, k, pair in zip(dims, ks, spatial_pairs(padding, explicit, dims))]
    fft = tuple(good_fft_size(in_shape[d] + b + a) for d, (b, a, _) in zip(dims, geo))
    n = in_shape[0] if in_shape[0] is not None else ASSUMED_BATCH
    bins = math.prod(fft[:-1]) * (fft[-1] // 2 + 1)
    per_image = (cin + cout) * bins * 2 * (8 if dtype == "float64" else 4)
    fits = not workspace_limit or per_image <= workspace_limit
    out = tuple(o for _, _, o in geo)
    tf_s, fft_s = estimates_nd(n, cin, cout, math.prod(ks), cin // cig, fft,
                               math.prod(max(o, 0) for o in out), xla)
    if algorithm in ("direct", "tf", "im2col"):
        branch, reason = Branch.TF, f"algorithm {algorithm!r}: TensorFlow's convolution"
    elif algorithm == "fft":
        branch, reason = Branch.FFT, "requested"
    elif not fits:
        branch, reason = Branch.TF, "the FFT's spectra of one image exceed workspace_limit"
    else:
        branch = Branch.FFT if fft_s < tf_s else Branch.TF
        reason = "estimated faster"
    return PurePlan(branch, fft, per_image, tf_s, fft_s, fits, reason,
                    tuple(v for b, a, _ in geo for v in (b, a)), out)
