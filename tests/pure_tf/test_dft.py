"""portable()'s DFT as real matrix products (tfbigconv/pure_tf/dft.py), in 2-D and
3-D: against the float64 reference, and `macs`' counts against the graph it builds."""
import math

import numpy as np
import pytest
import tensorflow as tf

from conftest import random_case, rel_l2
from reference import conv3d_reference
from tfbigconv.pure_tf import dft, fft, plans

# (input NDHWC or NHWC, filter, strides, dilations, padding (per spatial dimension)):
# odd and even sides (the Nyquist bin), strides and dilations, groups and depthwise,
# explicit padding wider than the filter.
CASES = [
    ((2, 9, 10, 3), (4, 3, 3, 2), (1, 1), (1, 1), "SAME"),
    ((1, 11, 8, 4), (3, 5, 2, 6), (2, 3), (2, 1), ((4, 0), (1, 6))),        # 2 groups
    ((2, 1, 17, 3), (1, 6, 1, 6), (1, 2), (1, 3), "VALID"),                 # 1-D's shape
    ((2, 5, 7, 6, 2), (3, 2, 4, 2, 3), (1, 1, 1), (1, 1, 1), "SAME"),
    ((1, 6, 9, 8, 4), (2, 3, 3, 1, 8), (2, 1, 3), (1, 2, 1), ((1, 3), (0, 2), (5, 0))),
    ((1, 7, 5, 9, 4), (3, 3, 2, 2, 2), (3, 2, 1), (2, 1, 2), "VALID"),      # 2 groups
]


def _geometry(x_shape, f_shape, strides, dilations, padding):
    """(flat pads, output sizes) of the case, as plan computes them."""
    rank = len(strides)
    geo = [plans.pads_1d(x_shape[i + 1], f_shape[i], strides[i], dilations[i],
                        padding if isinstance(padding, str) else "EXPLICIT",
                        None if isinstance(padding, str) else padding[i]) for i in range(rank)]
    return tuple(v for b, a, _ in geo for v in (b, a)), tuple(o for _, _, o in geo)


def _build(case, dtype=tf.float64):
    """(x, f, y) of the case's DFT, and its arguments for macs."""
    x_shape, f_shape, strides, dilations, padding = case
    rank = len(strides)
    x = tf.constant(random_case(x_shape, 1, np.float64), dtype, name="x")
    f = tf.constant(random_case(f_shape, 2, np.float64), dtype, name="f")
    pads, out = _geometry(x_shape, f_shape, strides, dilations, padding)
    groups = x_shape[-1] // f_shape[rank]
    y = dft.convolution(x, fft.dilate_filter(f, dilations), strides, pads, out, groups)
    eff = [(k - 1) * d + 1 for k, d in zip(f_shape[:rank], dilations)]
    counts = (x_shape[0], x_shape[1:-1], eff, x_shape[-1], f_shape[-1], groups, pads, out)
    return x, f, y, counts


def _reference(case, x, f):
    x_shape, f_shape, strides, dilations, padding = case
    as3 = (lambda t: t) if len(strides) == 3 else (lambda t: t[:, None] if t.ndim == 4
                                                     else t[None])
    extra = 3 - len(strides)
    pads = (((0, 0),) * extra + tuple(padding)) if not isinstance(padding, str) else None
    y = conv3d_reference(as3(x), f.reshape((1,) * extra + f.shape), (1,) * extra + strides,
                         "EXPLICIT" if pads else padding, (1,) * extra + dilations, "NDHWC",
                         pads if pads else ((0, 0),) * 3)
    return y.reshape(y.shape[:1] + y.shape[1 + extra:])


@pytest.mark.parametrize("case", CASES, ids=[f"{len(c[2])}d-{i}" for i, c in enumerate(CASES)])
def test_dft_matches_the_reference(case):
    x, f, y, _ = _build(case)
    want = _reference(case, x.numpy(), f.numpy())
    assert y.shape == want.shape
    assert rel_l2(y.numpy(), want) <= 1e-12


@pytest.mark.parametrize("case", CASES, ids=[f"{len(c[2])}d-{i}" for i, c in enumerate(CASES)])
def test_macs_counts_the_graphs_matrices_and_products(case):
    """`elements`: the float constants' elements in the graph; the multiply-adds:
    those of its matrix products plus the product of spectra (4 per complex bin,
    input channel of the group and output channel)."""
    graph = tf.Graph()
    with graph.as_default():
        *_, counts = _build(case, tf.float32)
    work, elements = dft.macs(*counts)
    matrices = products = 0
    for op in graph.get_operations():
        if op.type == "Const" and op.outputs[0].dtype == tf.float32 and op.name not in ("x", "f"):
            matrices += op.outputs[0].shape.num_elements()
        if op.type in ("MatMul", "BatchMatMulV2"):
            a, b = (t.shape.as_list() for t in op.inputs)
            products += op.outputs[0].shape.num_elements() * a[-1]  # [..., m, k] @ [..., k, n]
    assert matrices == elements
    n, sides, _, cin, cout, groups, pads, _ = counts
    padded = dft.sizes(sides, pads)
    spectra = math.prod(padded[:-1]) * (padded[-1] // 2 + 1)
    assert work - products == n * cout * (cin // groups) * 4 * spectra
