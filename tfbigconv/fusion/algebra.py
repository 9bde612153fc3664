"""Kernel algebra: fuse chains and branches of linear 2-D convolutions into one.

Everything here works on channels-last (NHWC) tensors and grouped HWIO kernels
[kh, kw, in_channels / groups, out_channels] (tf.nn.conv2d's layout; a
depthwise kernel with multiplier M is [kh, kw, 1, channels * M] with
groups = channels). The functions are plain TensorFlow ops, so gradients flow
from a fused kernel back to the kernels it was made of.

A `LinearMap` is an affine map from a subgraph's input x (zero outside its
H x W) to one of its tensors, written as one strided convolution:

    out[o] = sum_k kernel[k] . x[o * strides + k - origin] + bias

for every output position o in [0, out_size). `compose_program` builds it
step by step (tfbigconv.fusion.program): `pad`, `convolve` (sequential composition), `add` (sum or
difference, kernels aligned by their origins), `concat` (channels), `affine`
(a folded BatchNormalization, before or after a conv).

Borders. A fused kernel reproduces the original at every position only if
every zero padding of an intermediate tensor is also zero in the fused map.
`pad` checks that: the padded rows' footprints in x must lie wholly outside x
(true for the subgraph input, for 1x1 stride-1 convs of it, for VALID chains
and for "pad once then VALID"); otherwise it raises `NotFusable` with the
reason (e.g. a SAME conv after a 3x3 SAME conv), or, with patch=True and
stride 1 throughout, marks the map `patched`: `apply_fused` then takes the
outputs whose footprint reaches past the input's edge from the unfused
program run on strips of K + 1 input rows and columns (`border_strips` says
why that is exact). Biases are handled apart:
the affine part of a linear subgraph is its output on a zero input, so when a
bias meets a zero padding (`LinearMap.bias_padded`) the exact bias is the
output map `bias_map` computes by running the subgraph once on zeros.
"""
import dataclasses
import math
from typing import Optional, Tuple

import tensorflow as tf

from tfbigconv import _core
from tfbigconv.ops.conv2d import bigconv2d

__all__ = [
    "NotFusable", "LinearMap", "identity", "pad", "convolve", "add", "concat", "affine",
    "batchnorm_affine", "regroup", "dilate_kernel", "compose_kernels", "same_pads",
    "composition_macs", "fused_padding", "border_strips",
]


class NotFusable(Exception):
    """The subgraph cannot be fused exactly; str(error) says why."""


@dataclasses.dataclass(frozen=True)
class LinearMap:
    """out[o] = sum_k kernel[k] . x[o * strides + k - origin] + bias (see the module doc).

    kernel: [kh, kw, in_channels / groups, out_channels].
    bias: [out_channels] or None (no bias anywhere upstream). When
      bias_padded, it is only the interior value: some bias was zero-padded on
      the way, so near the borders the affine part differs (see bias_map).
    in_size, out_size: (height, width) of x and of this tensor.
    patched: some zero padding is not reproduced by the kernel (allowed by
      pad(..., patch=True)); the kernel is then exact only away from the borders,
      and apply_fused takes the border rows and columns from the unfused
      program run on strips of the input (border_strips).
    compose_macs: multiply-adds compose_program spent on the kernel (composition_macs,
      an estimate): the per-step cost of composing it from trainable weights.
    """
    kernel: tf.Tensor
    groups: int
    strides: Tuple[int, int]
    origin: Tuple[int, int]
    in_size: Tuple[int, int]
    out_size: Tuple[int, int]
    bias: Optional[tf.Tensor] = None
    bias_padded: bool = False
    patched: bool = False
    compose_macs: int = 0

    @property
    def kernel_size(self):
        return tuple(int(d) for d in self.kernel.shape[:2])

    @property
    def out_channels(self):
        return int(self.kernel.shape[3])


def same_pads(size, kernel_size, strides, dilations=(1, 1)):
    """TensorFlow's SAME padding (top, bottom, left, right) for an input of (height,
    width), from the geometry (_core.conv_geometry: the rule lives there)."""
    g = _core.conv_geometry([1, int(size[0]), int(size[1]), 1],
                            [int(kernel_size[0]), int(kernel_size[1]), 1, 1],
                            [1, int(strides[0]), int(strides[1]), 1], "SAME", [], "NHWC",
                            [1, int(dilations[0]), int(dilations[1]), 1])
    return tuple(getattr(g, k) for k in ("pad_top", "pad_bottom", "pad_left", "pad_right"))


def dilate_kernel(kernel, dilations):
    """The kernel with dilations - 1 zeros between taps: a dilated conv as a plain one."""
    dh, dw = dilations
    if (dh, dw) == (1, 1):
        return kernel
    kh, kw, ci, co = kernel.shape
    k = tf.reshape(kernel, (kh, 1, kw, 1, ci, co))
    k = tf.pad(k, [[0, 0], [0, dh - 1], [0, 0], [0, dw - 1], [0, 0], [0, 0]])
    k = tf.reshape(k, (kh * dh, kw * dw, ci, co))
    return k[:(kh - 1) * dh + 1, :(kw - 1) * dw + 1]


def regroup(kernel, groups, new_groups):
    """A grouped kernel as one with fewer groups (new_groups divides groups), zeros
    filling the connections the coarser grouping adds; new_groups=1 gives the dense kernel."""
    if groups == new_groups:
        return kernel
    if groups % new_groups:
        raise ValueError(f"regroup: {new_groups} groups do not divide {groups}")
    r = groups // new_groups
    kh, kw, ci, co = kernel.shape
    k = tf.reshape(kernel, (kh, kw, ci, new_groups, r, co // groups))
    k = tf.einsum("klizto,st->klsizto", k, tf.eye(r, dtype=kernel.dtype))
    return tf.reshape(k, (kh, kw, r * ci, co))


def _channel_product(a, ga, b, gb):
    """Channel composition of grouped kernels a [.., cin/ga, cmid] then b [.., cmid/gb, cout],
    where at most one of them has leading spatial dims (the other is 2-D): returns
    (kernel [.., cin/g, cout], g) with g = gcd(ga, gb)."""
    g = math.gcd(ga, gb)
    if ga != g and gb != g:  # neither divides the other: coarsen a first
        a = regroup(a, ga, g) if a.shape.rank == 4 else regroup(a[None, None], ga, g)[0, 0]
        ga = g
    sa = "kl" if a.shape.rank == 4 else ""
    sb = "kl" if b.shape.rank == 4 else ""
    so = sa or sb
    lead_a, lead_b = list(a.shape[:-2]), list(b.shape[:-2])
    lead = lead_a or lead_b
    ci, cmid = int(a.shape[-2]), int(a.shape[-1])
    cout = int(b.shape[-1])
    if gb % ga == 0:  # a's groups contain b's: result keeps ga groups
        a = tf.reshape(a, lead_a + [ci, gb, cmid // gb])
        b = tf.reshape(b, lead_b + [cmid // gb, gb, cout // gb])
        out = tf.einsum(f"{sa}iam,{sb}mao->{so}iao", a, b)
        return tf.reshape(out, lead + [ci, cout]), ga
    r, n = ga // gb, cmid // ga  # b's groups contain a's: result has gb groups
    a = tf.reshape(a, lead_a + [ci, gb, r, n])
    b = tf.reshape(b, lead_b + [r, n, gb, cout // gb])
    out = tf.einsum(f"{sa}iatn,{sb}tnao->{so}tiao", a, b)
    return tf.reshape(out, lead + [r * ci, cout]), gb


def compose_kernels(k1, g1, s1, k2, g2):
    """The kernel of conv2(conv1(x)), both VALID with dilations already expanded
    (dilate_kernel): conv1 has kernel k1, g1 groups, strides s1; conv2 kernel k2,
    g2 groups. Returns (kernel, groups): size (K1 - 1) + s1 (K2 - 1) + 1 per
    dimension, gcd(g1, g2) groups (dense where the groupings do not align).

        fused[k] = sum over i + s1 * j = k of k1[i] (channels) k2[j]
    """
    (k1h, k1w), (k2h, k2w) = k1.shape[:2], k2.shape[:2]
    if (k1h, k1w) == (1, 1):  # 1x1 first: channel product, conv2's taps spread by s1
        out, g = _channel_product(k1[0, 0], g1, k2, g2)
        return dilate_kernel(out, s1), g
    if (k2h, k2w) == (1, 1):
        return _channel_product(k1, g1, k2[0, 0], g2)
    # General case: a full grouped convolution of k1 (its in-channels as the
    # batch) with k2 flipped and dilated by s1.
    g = math.gcd(g1, g2)
    a = tf.transpose(regroup(k1, g1, g), (2, 0, 1, 3))  # [cin/g, K1h, K1w, cmid]
    f = tf.reverse(regroup(k2, g2, g), axis=[0, 1])
    ph, pw = s1[0] * (k2h - 1), s1[1] * (k2w - 1)
    out = bigconv2d(a, f, strides=1, padding=[[0, 0], [ph, ph], [pw, pw], [0, 0]],
                    dilations=list(s1))
    return tf.transpose(out, (1, 2, 0, 3)), g


def composition_macs(k1_shape, g1, s1, k2_shape, g2):
    """Multiply-adds of compose_kernels for kernels of these shapes (an estimate: it
    leaves out regrouping and the zeros its convolutions multiply)."""
    (k1h, k1w, ci, cmid), (k2h, k2w, _, cout) = k1_shape, k2_shape
    if (k1h, k1w) == (1, 1) or (k2h, k2w) == (1, 1):  # a channel product
        return k1h * k1w * k2h * k2w * ci * cmid * cout // g2
    g = math.gcd(g1, g2)  # a grouped convolution of the kernels
    out = (k1h + s1[0] * (k2h - 1)) * (k1w + s1[1] * (k2w - 1))
    return (ci * g1 // g) * out * cout * k2h * k2w * (cmid // g)


def identity(channels, in_size, dtype=tf.float32):
    """The subgraph input itself: a 1x1 depthwise kernel of ones."""
    return LinearMap(kernel=tf.ones((1, 1, 1, channels), dtype), groups=channels,
                     strides=(1, 1), origin=(0, 0), in_size=tuple(in_size),
                     out_size=tuple(in_size))


def pad(m, pads, patch=False):
    """m zero-padded by pads = (top, bottom, left, right); raises NotFusable where a
    padded row or column is not zero in the fused map, i.e. where its footprint in
    the subgraph input touches the input, unless patch (then the map is marked
    `patched`)."""
    top, bottom, left, right = pads
    if not any(pads):
        return m
    (kh, kw), (sh, sw), (ph, pw) = m.kernel_size, m.strides, m.origin
    (h, w), (oh, ow) = m.in_size, m.out_size
    # Row -1 reads x rows [-sh - ph, -sh - ph + kh - 1]; row oh starts at oh*sh - ph.
    for side, amount, touches in (("top", top, kh - sh - ph > 0),
                                  ("bottom", bottom, oh * sh - ph < h),
                                  ("left", left, kw - sw - pw > 0),
                                  ("right", right, ow * sw - pw < w)):
        if amount and touches:
            if patch:
                m = dataclasses.replace(m, patched=True)
                continue
            raise NotFusable(
                f"zero padding ({side}) of an intermediate tensor whose border values are not "
                f"zero in the fused map (it is a {kh}x{kw} stride-{sh}x{sw} map of the input): "
                "one kernel cannot reproduce that border")
    return dataclasses.replace(
        m, origin=(ph + sh * top, pw + sw * left), out_size=(oh + top + bottom, ow + left + right),
        bias_padded=m.bias_padded or m.bias is not None)


def convolve(m, kernel, groups=1, strides=(1, 1), dilations=(1, 1), bias=None):
    """A VALID conv (grouped HWIO kernel, strides, dilations, bias [out] or None) after m.
    Pad m first (`pad`) for SAME or explicit padding."""
    k2 = dilate_kernel(tf.cast(kernel, m.kernel.dtype), dilations)
    kernel, g = compose_kernels(m.kernel, m.groups, m.strides, k2, groups)
    (k2h, k2w), (s1h, s1w), (s2h, s2w) = k2.shape[:2], m.strides, strides
    out_size = tuple((n - k) // s + 1 for n, k, s in zip(m.out_size, (k2h, k2w), strides))
    if min(out_size) < 1:
        raise NotFusable(f"conv of a {k2h}x{k2w} kernel on a {m.out_size} tensor: empty output")
    new_bias = None
    if m.bias is not None:  # b2 + sum over conv2's taps of k2 applied to b1
        new_bias, _ = _channel_product(m.bias[None, :], 1, tf.reduce_sum(k2, (0, 1)), groups)
        new_bias = new_bias[0]
    if bias is not None:
        bias = tf.cast(bias, kernel.dtype)
        new_bias = bias if new_bias is None else new_bias + bias
    return dataclasses.replace(m, kernel=kernel, groups=g, strides=(s1h * s2h, s1w * s2w),
                               out_size=out_size, bias=new_bias)


def _aligned(maps):
    """The maps' kernels on a common origin and size, in their gcd grouping."""
    first = maps[0]
    for m in maps[1:]:
        if m.strides != first.strides or m.out_size != first.out_size:
            raise NotFusable(f"branches with different strides or sizes ({first.strides} "
                             f"{first.out_size} and {m.strides} {m.out_size}) do not align")
    oh = max(m.origin[0] for m in maps)
    ow = max(m.origin[1] for m in maps)
    kh = max(oh - m.origin[0] + m.kernel_size[0] for m in maps)
    kw = max(ow - m.origin[1] + m.kernel_size[1] for m in maps)
    g = math.gcd(*[m.groups for m in maps])
    kernels = []
    for m in maps:
        top, left = oh - m.origin[0], ow - m.origin[1]
        k = regroup(m.kernel, m.groups, g)
        kernels.append(tf.pad(k, [[top, kh - top - m.kernel_size[0]],
                                  [left, kw - left - m.kernel_size[1]], [0, 0], [0, 0]]))
    return kernels, g, (oh, ow)


def add(maps, signs=None):
    """Sum of maps (Add), or with signs=(1, -1) their difference (Subtract); the smaller
    kernels are zero-padded around to line up with the larger (centred for SAME)."""
    signs = signs or [1] * len(maps)
    kernels, g, origin = _aligned(maps)
    kernel = tf.add_n([s * k for s, k in zip(signs, kernels)])
    biases = [s * m.bias for s, m in zip(signs, maps) if m.bias is not None]
    return dataclasses.replace(maps[0], kernel=kernel, groups=g, origin=origin,
                               bias=tf.add_n(biases) if biases else None,
                               bias_padded=any(m.bias_padded for m in maps),
                               patched=any(m.patched for m in maps))


def concat(maps):
    """Channel concatenation (dense kernel: the channel order breaks any grouping)."""
    kernels, g, origin = _aligned(maps)
    kernel = tf.concat([regroup(k, g, 1) for k in kernels], axis=3)
    if any(m.bias is not None for m in maps):
        bias = tf.concat([m.bias if m.bias is not None else tf.zeros((m.out_channels,),
                                                                         kernel.dtype)
                          for m in maps], axis=0)
    else:
        bias = None
    return dataclasses.replace(maps[0], kernel=kernel, groups=1, origin=origin, bias=bias,
                               bias_padded=any(m.bias_padded for m in maps),
                               patched=any(m.patched for m in maps))


def affine(m, scale, shift):
    """Per-channel x * scale + shift after m (a BatchNormalization in inference)."""
    scale = tf.cast(scale, m.kernel.dtype)
    shift = tf.cast(shift, m.kernel.dtype)
    bias = shift if m.bias is None else m.bias * scale + shift
    return dataclasses.replace(m, kernel=m.kernel * scale, bias=bias)


def batchnorm_affine(gamma, beta, moving_mean, moving_variance, epsilon):
    """BatchNormalization in inference as (scale, shift); gamma/beta may be None."""
    inv = tf.math.rsqrt(tf.convert_to_tensor(moving_variance) + epsilon)
    scale = inv if gamma is None else gamma * inv
    shift = -moving_mean * scale
    if beta is not None:
        shift = shift + beta
    return scale, shift


def fused_padding(m):
    """(top, bottom, left, right) to pad the subgraph input with before the fused
    kernel runs VALID; a negative value means rows/columns it never reads (crop them)."""
    (kh, kw), (sh, sw), (ph, pw) = m.kernel_size, m.strides, m.origin
    (h, w), (oh, ow) = m.in_size, m.out_size
    return (ph, (oh - 1) * sh + kh - ph - h, pw, (ow - 1) * sw + kw - pw - w)


def border_strips(m):
    """For a patched map (stride 1): ((top rows, first bottom row, input rows per strip),
    (the same for columns)). Output rows below `top rows` and from `first bottom row`
    on read zero padding in the fused conv; every other output's footprint lies in
    the input, so every value it depends on is a real (unpadded) one and the fused
    kernel is exact there. A top strip of K - 1 input rows holds the whole footprint
    of each top row, and the unfused program on it reproduces those rows (with
    stride 1 the paddings do not depend on the input size); likewise at the bottom."""
    dims = []
    for k, p, n, out in zip(m.kernel_size, m.origin, m.in_size, m.out_size):
        dims.append((min(p, out), max(min(n - k + p + 1, out), 0), k + 1))
    return tuple(dims)
