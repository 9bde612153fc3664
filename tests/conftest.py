"""Shared test helpers: the float64 reference, tolerances and random data."""
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Relative L2 error allowed against the float64 reference, per dtype. 16-bit
# inputs are rounded to the dtype before the reference sees them, so what is
# left is accumulation error plus the final rounding of the output.
TOLERANCE = {
    "float64": 1e-12,
    "float32": 1e-5,
    "float16": 2e-3,
    "bfloat16": 1.5e-2,
}


def pytest_collection_modifyitems(config, items):
    if os.environ.get("TFBIGCONV_SLOW") == "1" or "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with TFBIGCONV_SLOW=1 or -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def random_case(shape, seed, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def hw_pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def to4(v, data_format):
    """(h, w) -> 4 entries in data_format order."""
    h, w = hw_pair(v)
    return [1, h, w, 1] if data_format == "NHWC" else [1, 1, h, w]


def explicit_pairs(pads, data_format):
    """((top, bottom), (left, right)) -> tf.nn.conv2d's explicit padding list."""
    (t, b), (l, r) = pads
    if data_format == "NHWC":
        return [[0, 0], [t, b], [l, r], [0, 0]]
    return [[0, 0], [0, 0], [t, b], [l, r]]


def flat_explicit(pads, data_format):
    return [x for p in explicit_pairs(pads, data_format) for x in p]
