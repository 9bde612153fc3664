"""Shared test helpers: the float64 reference, tolerances and random data."""
import os
import tempfile

import numpy as np
import pytest

from reference import conv2d_reference, rel_l2

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The planner's decisions must not depend on a developer's own calibration
# (`python -m tfbigconv calibrate`) or debugging overrides: tests run on the
# cost model shipped with the package.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="tfbigconv-test-cache-")
for _name in ("TFBIGCONV_ALGORITHM", "TFBIGCONV_COST_MODEL"):
    os.environ.pop(_name, None)
# Nor on a developer's autotune cache (tfbigconv/autotune.py), nor on timings
# taken during the run: a choice made by timing depends on the machine's load,
# so the suite plans on the estimates alone unless a test turns autotuning on
# (the `autotuning` fixture), each such test with its own cache file.
os.environ["TFBIGCONV_AUTOTUNE_CACHE"] = os.path.join(os.environ["XDG_CACHE_HOME"],
                                                      "autotune-session.json")
os.environ["TFBIGCONV_AUTOTUNE"] = "0"

# Relative L2 error allowed against the float64 reference, per dtype. 16-bit
# inputs are rounded to the dtype before the reference sees them, so what is
# left is accumulation error plus the final rounding of the output.
TOLERANCE = {
    "float64": 1e-12,
    "float32": 1e-5,
    "float16": 2e-3,
    "bfloat16": 1.5e-2,
}


# The geometry matrix shared by the kernel tests (tests/test_*_cpu.py and
# test_gradients.py): padding modes, with explicit padding wider than the
# filter (the gradients then crop), strides and dilations.
PADDINGS = [
    ("SAME", ((0, 0), (0, 0))),
    ("VALID", ((0, 0), (0, 0))),
    ("EXPLICIT", ((0, 3), (2, 1))),
    ("EXPLICIT", ((6, 0), (0, 7))),
]
STRIDES = [1, 2, 3, 4, (1, 3), (4, 2)]
DILATIONS = [1, 2, 3, (1, 2)]
# (input shape, filter shape): big, non-square, and as large as the input.
LARGE_FILTERS = [
    ((1, 70, 67, 1), (63, 63, 1, 3)),
    ((2, 140, 137, 1), (135, 135, 1, 3)),
    ((1, 20, 30, 2), (1, 29, 2, 3)),
    ((1, 30, 20, 2), (29, 1, 2, 3)),
    ((2, 17, 13, 3), (17, 13, 3, 5)),
]


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


def run_core(kind, x, w, strides=1, padding="VALID", dil=1, fmt="NHWC", pads=((0, 0), (0, 0)),
             **kwargs):
    """Runs _core.<kind>_forward on numpy arrays into a NaN-poisoned output."""
    from tfbigconv import _core
    explicit = flat_explicit(pads, fmt) if padding == "EXPLICIT" else []
    geo = _core.conv_geometry(list(x.shape), list(w.shape), to4(strides, fmt), padding, explicit,
                              fmt, to4(dil, fmt))
    out = np.full(geo["output_shape"], np.nan, dtype=x.dtype)  # unwritten elements show
    _core.run_pass(kind, "forward", x, w, [], to4(strides, fmt), padding, explicit, fmt,
                   to4(dil, fmt), out=out, **kwargs)
    return out


def check_core(kind, x, w, strides=1, padding="VALID", dil=1, fmt="NHWC", pads=((0, 0), (0, 0)),
               tol=None, **kwargs):
    """run_core, compared with the float64 reference by relative L2 error."""
    got = run_core(kind, x, w, strides, padding, dil, fmt, pads, **kwargs)
    ref = conv2d_reference(x, w, hw_pair(strides), padding, hw_pair(dil), fmt, pads)
    err = rel_l2(got, ref)
    assert err <= (tol or TOLERANCE[x.dtype.name]), f"rel L2 {err}"
    return got


def run_core_pass(kind, pass_, a, b, sizes, strides=1, padding="VALID", dil=1, fmt="NHWC",
                  pads=((0, 0), (0, 0)), **kwargs):
    """_core.run_pass for a gradient pass, into a NaN-poisoned output of shape `sizes`."""
    from tfbigconv import _core
    explicit = flat_explicit(pads, fmt) if padding == "EXPLICIT" else []
    out = np.full(tuple(sizes), np.nan, dtype=a.dtype)
    _core.run_pass(kind, pass_, a, b, list(sizes), to4(strides, fmt), padding, explicit, fmt,
                   to4(dil, fmt), out=out, **kwargs)
    return out


@pytest.fixture
def model():
    """Lets a test scale fields of _core's cost model (the trace-time
    planner's): model(prefix, factor) scales every field whose name starts
    with prefix. Restores the model afterwards."""
    from tfbigconv import _core
    saved = _core.get_cost_model()
    fields = _core.cost_model_fields()

    def scale(prefix, factor):
        values = _core.get_cost_model()
        hit = [i for i, name in enumerate(fields) if name.startswith(prefix)]
        assert hit, f"no cost model field starts with {prefix!r}"
        for i in hit:
            values[i] *= factor
        _core.set_cost_model(values)

    yield scale
    _core.set_cost_model(saved)


@pytest.fixture
def eigen_tf(monkeypatch):
    """TF's CPU kernels as without oneDNN (its own Eigen kernels: NHWC only, no
    grouped or dilated gradients, half types accumulated in half), whatever
    this host runs: the dispatcher's oneDNN check answers no."""
    from tfbigconv import dispatch
    monkeypatch.setattr(dispatch, "tf_cpu_onednn", lambda *args: False)


@pytest.fixture
def autotuning(tmp_path, monkeypatch):
    """Autotuning on (as by default outside the tests), with a fresh cache file
    (its path is returned) and nothing remembered in this process."""
    from tfbigconv import autotune
    path = tmp_path / "autotune.json"
    monkeypatch.setenv("TFBIGCONV_AUTOTUNE", "1")
    monkeypatch.setenv("TFBIGCONV_AUTOTUNE_CACHE", str(path))
    autotune.clear_memory()
    yield path
    autotune.clear_memory()
