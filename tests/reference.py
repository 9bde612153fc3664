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


def conv2d_reference(x, w, strides=(1, 1), padding="VALID", dilations=(1, 1),
                     data_format="NHWC", explicit=((0, 0), (0, 0))):
    """x: input in data_format; w: HWIO. strides/dilations/explicit are (h, w) pairs.

    Returns float64 output in data_format."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    if data_format == "NCHW":
        x = x.transpose(0, 2, 3, 1)
    n, h, wd, c = x.shape
    kh, kw, cig, co = w.shape
    groups = c // cig
    cog = co // groups
    oh, pt, pb = _out_and_pads(h, kh, strides[0], dilations[0], padding, explicit[0])
    ow, pl, pr = _out_and_pads(wd, kw, strides[1], dilations[1], padding, explicit[1])
    xp = np.zeros((n, h + pt + pb, wd + pl + pr, c))
    xp[:, pt:pt + h, pl:pl + wd, :] = x
    out = np.zeros((n, oh, ow, co))
    sh, sw = strides
    for i in range(kh):
        for j in range(kw):
            r0, c0 = i * dilations[0], j * dilations[1]
            patch = xp[:, r0:r0 + (oh - 1) * sh + 1:sh, c0:c0 + (ow - 1) * sw + 1:sw, :]
            for g in range(groups):
                out[..., g * cog:(g + 1) * cog] += patch[..., g * cig:(g + 1) * cig] @ w[i, j, :, g * cog:(g + 1) * cog]
    if data_format == "NCHW":
        out = out.transpose(0, 3, 1, 2)
    return out


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
