"""Float64 NumPy reference convolution with tf.nn.conv2d's semantics.

Used only by tests and benchmarks; independent of the library's own shape code
(it recomputes padding itself) so that the two can disagree."""
import numpy as np


def _out_and_pads(n, k, s, d, padding, explicit):
    eff = (k - 1) * d + 1
    if padding == "VALID":
        before = after = 0
    elif padding == "SAME":
        out = -(-n // s)
        total = max((out - 1) * s + eff - n, 0)
        before, after = total // 2, total - total // 2
    else:
        before, after = explicit
    out = (n + before + after - eff) // s + 1
    return out, before, after


def _setup(x_shape, w_shape, strides, padding, dilations, explicit):
    """Padded input shape, output size and pads (NHWC shapes)."""
    n, h, wd, c = x_shape
    kh, kw, cig, co = w_shape
    oh, pt, pb = _out_and_pads(h, kh, strides[0], dilations[0], padding, explicit[0])
    ow, pl, pr = _out_and_pads(wd, kw, strides[1], dilations[1], padding, explicit[1])
    return (oh, ow), (pt, pb, pl, pr), c // cig, co // (c // cig)


def _taps(w_shape, out_hw, strides, dilations):
    """(i, j, row slice, column slice) of the padded input for every filter tap."""
    (oh, ow), (sh, sw) = out_hw, strides
    for i in range(w_shape[0]):
        for j in range(w_shape[1]):
            r0, c0 = i * dilations[0], j * dilations[1]
            yield i, j, slice(r0, r0 + (oh - 1) * sh + 1, sh), slice(c0, c0 + (ow - 1) * sw + 1, sw)


def _to_nhwc(a, data_format):
    return a.transpose(0, 2, 3, 1) if data_format == "NCHW" else a


def _from_nhwc(a, data_format):
    return a.transpose(0, 3, 1, 2) if data_format == "NCHW" else a


def conv2d_reference(x, w, strides=(1, 1), padding="VALID", dilations=(1, 1),
                     data_format="NHWC", explicit=((0, 0), (0, 0))):
    """x: input in data_format; w: HWIO. strides/dilations/explicit are (h, w) pairs.

    Returns float64 output in data_format."""
    x = _to_nhwc(np.asarray(x, dtype=np.float64), data_format)
    w = np.asarray(w, dtype=np.float64)
    out_hw, (pt, pb, pl, pr), groups, cog = _setup(x.shape, w.shape, strides, padding, dilations,
                                                   explicit)
    n, h, wd, c = x.shape
    cig = w.shape[2]
    xp = np.zeros((n, h + pt + pb, wd + pl + pr, c))
    xp[:, pt:pt + h, pl:pl + wd, :] = x
    out = np.zeros((n,) + out_hw + (w.shape[3],))
    for i, j, rs, cs in _taps(w.shape, out_hw, strides, dilations):
        patch = xp[:, rs, cs, :]
        for g in range(groups):
            out[..., g * cog:(g + 1) * cog] += patch[..., g * cig:(g + 1) * cig] @ w[i, j, :, g * cog:(g + 1) * cog]
    return _from_nhwc(out, data_format)


def conv2d_reference_backprop_input(dy, w, input_shape, strides=(1, 1), padding="VALID",
                                    dilations=(1, 1), data_format="NHWC",
                                    explicit=((0, 0), (0, 0))):
    """Gradient of conv2d_reference with respect to x (input_shape in data_format)."""
    dy = _to_nhwc(np.asarray(dy, dtype=np.float64), data_format)
    w = np.asarray(w, dtype=np.float64)
    shape = tuple(input_shape)
    if data_format == "NCHW":
        shape = (shape[0], shape[2], shape[3], shape[1])
    out_hw, (pt, pb, pl, pr), groups, cog = _setup(shape, w.shape, strides, padding, dilations,
                                                   explicit)
    n, h, wd, c = shape
    cig = w.shape[2]
    dxp = np.zeros((n, h + pt + pb, wd + pl + pr, c))
    for i, j, rs, cs in _taps(w.shape, out_hw, strides, dilations):
        for g in range(groups):
            dxp[:, rs, cs, g * cig:(g + 1) * cig] += dy[..., g * cog:(g + 1) * cog] @ w[i, j, :, g * cog:(g + 1) * cog].T
    return _from_nhwc(dxp[:, pt:pt + h, pl:pl + wd, :], data_format)


def conv2d_reference_backprop_filter(x, dy, filter_shape, strides=(1, 1), padding="VALID",
                                     dilations=(1, 1), data_format="NHWC",
                                     explicit=((0, 0), (0, 0))):
    """Gradient of conv2d_reference with respect to w (HWIO filter_shape)."""
    x = _to_nhwc(np.asarray(x, dtype=np.float64), data_format)
    dy = _to_nhwc(np.asarray(dy, dtype=np.float64), data_format)
    out_hw, (pt, pb, pl, pr), groups, cog = _setup(x.shape, filter_shape, strides, padding,
                                                   dilations, explicit)
    n, h, wd, c = x.shape
    cig = filter_shape[2]
    xp = np.zeros((n, h + pt + pb, wd + pl + pr, c))
    xp[:, pt:pt + h, pl:pl + wd, :] = x
    dw = np.zeros(tuple(filter_shape))
    for i, j, rs, cs in _taps(filter_shape, out_hw, strides, dilations):
        patch = xp[:, rs, cs, :]
        for g in range(groups):
            dw[i, j, :, g * cog:(g + 1) * cog] = np.einsum(
                "nhwc,nhwo->co", patch[..., g * cig:(g + 1) * cig], dy[..., g * cog:(g + 1) * cog])
    return dw


def rel_l2(got, ref):
    """Relative L2 error; NaN or inf anywhere gives inf so that it never passes."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        raise AssertionError(f"shape {got.shape} != reference {ref.shape}")
    if not np.all(np.isfinite(got)):
        return np.inf
    denom = np.linalg.norm(ref)
    num = np.linalg.norm(got - ref)
    if denom == 0:
        return num
    return num / denom


def _conv1d_as_2d(padding, k, dilation, explicit):
    """A 1-D padding (SAME, VALID, CAUSAL or EXPLICIT with an explicit pair) as
    conv2d_reference's padding and explicit (h, w) pairs, height 1."""
    if padding == "CAUSAL":
        return "EXPLICIT", ((0, 0), ((k - 1) * dilation, 0))
    return padding, ((0, 0), tuple(explicit))


def _nwc_to_2d(a, data_format):
    return a[:, None] if data_format == "NWC" else a[:, :, None]


def conv1d_reference(x, w, stride=1, padding="VALID", dilation=1, data_format="NWC",
                     explicit=(0, 0)):
    """tf.nn.conv1d (plus Keras' CAUSAL: (k - 1) * dilation zeros before) in float64;
    x in data_format ("NWC" or "NCW"), w [k, in / groups, out]."""
    pad, pairs = _conv1d_as_2d(padding, w.shape[0], dilation, explicit)
    fmt = "NHWC" if data_format == "NWC" else "NCHW"
    y = conv2d_reference(_nwc_to_2d(np.asarray(x), data_format), np.asarray(w)[None],
                         (1, stride), pad, (1, dilation), fmt, pairs)
    return y[:, 0] if data_format == "NWC" else y[:, :, 0]


def conv1d_reference_grads(x, w, dy, stride=1, padding="VALID", dilation=1, data_format="NWC",
                           explicit=(0, 0)):
    """(dL/dx, dL/dw) of conv1d_reference for the output gradient dy."""
    pad, pairs = _conv1d_as_2d(padding, w.shape[0], dilation, explicit)
    fmt = "NHWC" if data_format == "NWC" else "NCHW"
    x2, dy2, w2 = (_nwc_to_2d(np.asarray(x), data_format),
                   _nwc_to_2d(np.asarray(dy), data_format), np.asarray(w)[None])
    dx = conv2d_reference_backprop_input(dy2, w2, x2.shape, (1, stride), pad, (1, dilation),
                                         fmt, pairs)
    dw = conv2d_reference_backprop_filter(x2, dy2, w2.shape, (1, stride), pad, (1, dilation),
                                          fmt, pairs)
    return (dx[:, 0] if data_format == "NWC" else dx[:, :, 0]), dw[0]


def _setup3d(x_shape, w_shape, strides, padding, dilations, explicit):
    """Output size and (before, after) pads per spatial dimension (NDHWC shapes)."""
    sizes, pads = [], []
    for i in range(3):
        o, b, a = _out_and_pads(x_shape[1 + i], w_shape[i], strides[i], dilations[i], padding,
                                explicit[i])
        sizes.append(o)
        pads.append((b, a))
    return sizes, pads


def _taps3d(w_shape, out, strides, dilations):
    for k in np.ndindex(*w_shape[:3]):
        yield k, tuple(slice(k[i] * dilations[i], k[i] * dilations[i] + (out[i] - 1) * strides[i] + 1,
                             strides[i]) for i in range(3))


def _ndhwc(a, data_format):
    return a.transpose(0, 2, 3, 4, 1) if data_format == "NCDHW" else a


def _from_ndhwc(a, data_format):
    return a.transpose(0, 4, 1, 2, 3) if data_format == "NCDHW" else a


def conv3d_reference(x, w, strides=(1, 1, 1), padding="VALID", dilations=(1, 1, 1),
                     data_format="NDHWC", explicit=((0, 0), (0, 0), (0, 0))):
    """tf.nn.conv3d's semantics (and groups = in / filter in_depth) in float64; w DHWIO."""
    x = _ndhwc(np.asarray(x, dtype=np.float64), data_format)
    w = np.asarray(w, dtype=np.float64)
    out, pads = _setup3d(x.shape, w.shape, strides, padding, dilations, explicit)
    groups = x.shape[4] // w.shape[3]
    cig, cog = w.shape[3], w.shape[4] // groups
    xp = np.pad(x, [(0, 0)] + pads + [(0, 0)])
    y = np.zeros([x.shape[0]] + out + [w.shape[4]])
    for k, sl in _taps3d(w.shape, out, strides, dilations):
        patch = xp[(slice(None),) + sl]
        for g in range(groups):
            y[..., g * cog:(g + 1) * cog] += patch[..., g * cig:(g + 1) * cig] @ w[k][:, g * cog:(g + 1) * cog]
    return _from_ndhwc(y, data_format)


def conv3d_reference_grads(x, w, dy, strides=(1, 1, 1), padding="VALID", dilations=(1, 1, 1),
                           data_format="NDHWC", explicit=((0, 0), (0, 0), (0, 0))):
    """(dL/dx, dL/dw) of conv3d_reference for the output gradient dy."""
    x = _ndhwc(np.asarray(x, dtype=np.float64), data_format)
    dy = _ndhwc(np.asarray(dy, dtype=np.float64), data_format)
    w = np.asarray(w, dtype=np.float64)
    out, pads = _setup3d(x.shape, w.shape, strides, padding, dilations, explicit)
    groups = x.shape[4] // w.shape[3]
    cig, cog = w.shape[3], w.shape[4] // groups
    xp = np.pad(x, [(0, 0)] + pads + [(0, 0)])
    dxp, dw = np.zeros_like(xp), np.zeros_like(w)
    for k, sl in _taps3d(w.shape, out, strides, dilations):
        patch = xp[(slice(None),) + sl]
        for g in range(groups):
            gi, go = slice(g * cig, (g + 1) * cig), slice(g * cog, (g + 1) * cog)
            dxp[(slice(None),) + sl + (gi,)] += dy[..., go] @ w[k][:, go].T
            dw[k][:, go] = np.einsum("ndhwc,ndhwo->co", patch[..., gi], dy[..., go])
    crop = tuple(slice(b, b + n) for (b, _), n in zip(pads, x.shape[1:4]))
    return _from_ndhwc(dxp[(slice(None),) + crop], data_format), dw
