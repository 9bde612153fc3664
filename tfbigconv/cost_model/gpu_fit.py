"""Fits the GPU section of the cost model to measured kernel times.

Input: grid CSV files with the columns of scripts/gpu_check.sh --calibrate
(the H100 grids in benchmarks/gpu/ have them): N,H,W,Cin,Cout,K,groups,stride
(input NHWC, K x K filter, SAME padding, dilation 1), dtype, pass, algo
(cudnn, direct, fft; other rows are ignored), kernel_ms.

Model (cost_model.h): log(seconds) = log(work) + coefficients . features,
with work and features from _core.gpu_terms, per candidate (cudnn is the
"tf" candidate), pass and dtype class (float32; float16 and bfloat16). The
coefficients are fitted by ridge regression in log space (relative error),
so that one grid's 30-odd geometries do not make the model swing. Each
group's shortest measured call is its floor: no estimate goes below it.

    python -m tfbigconv fit-gpu GRID.csv [...] --output PROFILE.json
"""
import csv
import math

import numpy as np

from tfbigconv import _core
from tfbigconv.arguments import PASSES

CANDIDATES = {"cudnn": "tf", "direct": "direct", "fft": "fft"}
DTYPE_CLASSES = {"float32": "float32", "float64": "float32", "float16": "half",
                 "bfloat16": "half"}
FEATURES = ("intercept", "log_side", "log_channels", "depthwise", "log_elements", "log_pixels",
            "log_side_squared", "log_side_x_log_pixels", "cudnn_depthwise_class")
# Fitted in the half class only (0 in float32's): cuDNN's dedicated depthwise
# kernels are half-precision ones (TF sends only float16 depthwise to them),
# and in float32 the class's filter gradient spread 0.03-4 TFLOP/s on the
# H100 grids, which the feature made a 3x mispick there (RESULTS.md).
HALF_ONLY_FEATURES = ("cudnn_depthwise_class",)
# Ridge weight on every coefficient but the intercept: large enough that no
# feature's coefficient swings on a few geometries (chosen by leave-one-out
# on the H100 grids), small against the data's spread.
RIDGE = 0.1


def read_grid(paths):
    """Rows {geometry: (N,H,W,Cin,Cout,K,groups,stride), dtype, pass, algo, seconds}."""
    rows = []
    for path in paths:
        with open(path) as f:
            for r in csv.DictReader(f):
                if r["algo"] not in CANDIDATES or r["pass"] not in PASSES:
                    continue
                try:
                    ms = float(r["kernel_ms"])
                except ValueError:
                    continue
                if not math.isfinite(ms) or ms <= 0:
                    continue
                geometry = tuple(int(r[c]) for c in
                                 ("N", "H", "W", "Cin", "Cout", "K", "groups", "stride"))
                rows.append(dict(geometry=geometry, dtype=r["dtype"], pass_=r["pass"],
                                 algo=r["algo"], seconds=ms / 1e3))
    return rows


def shapes(geometry):
    """(input NHWC, filter HWIO, strides) of a grid geometry."""
    n, h, w, cin, cout, k, groups, stride = geometry
    return [n, h, w, cin], [k, k, cin // groups, cout], [1, stride, stride, 1]


def terms(geometry, pass_, candidate):
    x, f, strides = shapes(geometry)
    work, features = _core.gpu_terms(x, f, strides, "SAME", [], "NHWC", [1, 1, 1, 1], pass_,
                                     candidate)
    return work, features


def fit(rows, ridge=RIDGE):
    """{profile field name: coefficient} for every candidate, pass and dtype class in rows."""
    groups = {}
    for r in rows:
        key = (CANDIDATES[r["algo"]], r["pass_"], DTYPE_CLASSES[r["dtype"]])
        groups.setdefault(key, []).append(r)
    values = {}
    for (candidate, pass_, cls), rs in sorted(groups.items()):
        X, y = [], []
        for r in rs:
            work, features = terms(r["geometry"], pass_, candidate)
            X.append(features)
            y.append(math.log(r["seconds"]) - math.log(work))
        X, y = np.asarray(X), np.asarray(y)
        if cls != "half":
            X[:, [FEATURES.index(n) for n in HALF_ONLY_FEATURES]] = 0  # its coefficient: 0
        penalty = ridge * np.eye(X.shape[1])
        penalty[0, 0] = 0  # the intercept is the rate itself: unpenalised
        coef = np.linalg.solve(X.T @ X + penalty, X.T @ y)
        for name, c in zip(FEATURES, coef):
            values[f"gpu.{candidate}.{pass_}.{cls}.{name}"] = float(c)
        values[f"gpu.{candidate}.{pass_}.{cls}.floor_seconds"] = min(r["seconds"] for r in rs)
    return values


def predict(values, geometry, pass_, candidate, dtype):
    """The model's seconds for one grid geometry (as the C++ planner computes them)."""
    work, features = terms(geometry, pass_, candidate)
    prefix = f"gpu.{candidate}.{pass_}.{DTYPE_CLASSES[dtype]}."
    seconds = work * math.exp(sum(values[prefix + n] * x for n, x in zip(FEATURES, features)))
    return max(seconds, values[prefix + "floor_seconds"])
