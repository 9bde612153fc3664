"""Shared test helpers: the float64 reference, tolerances and random data,
the host facts the planner reads (tfbigconv.host), and helpers for graphs,
subprocesses and a fake GPU. Tests in the subfolders import them with
`from conftest import ...`: pytest puts this folder on sys.path when it loads
this file, before it collects them."""
import os
import subprocess
import sys
import tempfile
import textwrap

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
# Nor on a developer's autotune cache (tfbigconv/planning/autotune.py), nor on timings
# taken during the run: a choice made by timing depends on the machine's load,
# so the suite plans on the estimates alone unless a test turns autotuning on
# (the `autotuning` fixture), each such test with its own cache file.
os.environ["TFBIGCONV_AUTOTUNE_CACHE"] = os.path.join(os.environ["XDG_CACHE_HOME"],
                                                      "autotune-session.json")
os.environ["TFBIGCONV_AUTOTUNE"] = "0"
# Nor on the shipped profile scaled to this host by timings
# (tfbigconv/cost_model/probe.py): tests/cost_model/test_probe.py turns it on.
os.environ["TFBIGCONV_PROBE"] = "0"
os.environ.pop("TFBIGCONV_PURE_TF", None)  # set by --pure-tf only


# ---- --pure-tf: the conformance tests on bigconv2d's pure-TensorFlow path ------

def pytest_addoption(parser):
    parser.addoption("--pure-tf", action="store_true",
                     help="run with TFBIGCONV_PURE_TF=1 (bigconv2d as pure TensorFlow, as under "
                          "XLA or without the compiled library); tests marked `native` skip")


def pytest_configure(config):
    config.addinivalue_line("markers", "native: checks our compiled kernels or the planner's "
                                       "choice among them; skipped under --pure-tf")
    if config.getoption("--pure-tf"):
        os.environ["TFBIGCONV_PURE_TF"] = "1"


def pytest_collection_modifyitems(config, items):
    if config.getoption("--pure-tf"):
        skip = pytest.mark.skip(reason="our kernels or plans (--pure-tf runs pure TensorFlow)")
        for item in items:
            if "native" in item.keywords:
                item.add_marker(skip)


def pure_tf_mode():
    """True under --pure-tf: bigconv2d is pure TensorFlow, with the FFT's error."""
    return os.environ.get("TFBIGCONV_PURE_TF") == "1"

# Relative L2 error allowed against the float64 reference, per dtype. 16-bit
# inputs are rounded to the dtype before the reference sees them, so what is
# left is accumulation error plus the final rounding of the output.
TOLERANCE = {
    "float64": 1e-12,
    "float32": 1e-5,
    "float16": 2e-3,
    "bfloat16": 1.5e-2,
}


# The geometry matrix shared by the kernel tests (core/test_cpu_kernels.py):
# padding modes, with explicit padding wider than the filter (the gradients
# then crop), strides and dilations.
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
    out = np.full(geo.output_shape, np.nan, dtype=x.dtype)  # unwritten elements show
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
def eigen_tf():
    """TF's CPU kernels as without oneDNN (its own Eigen kernels: NHWC only, no
    grouped or dilated gradients, half types accumulated in half), whatever
    this host runs: the planner's host facts say TF runs no oneDNN, so its
    oneDNN check (planning.tf_rules.tf_cpu_onednn) answers no. Yields the Host."""
    from tfbigconv import host
    with host.use(host.Host(onednn=False)) as facts:
        yield facts


def onednn_host(answer=True, asked=None):
    """host.use() of a Host on which TF runs oneDNN and its oneDNN check
    (onednn_runs) answers `answer` without running anything, appending each
    question (kernel, dtype, explicit_padding, data_format) to `asked` if given."""
    from tfbigconv import host

    def runs(*question):
        if asked is not None:
            asked.append(question)
        return answer
    return host.use(host.Host(onednn=True, onednn_runs=runs))


@pytest.fixture
def onednn_tf():
    """TF's CPU kernels as where TF runs them all through oneDNN: its oneDNN
    check answers yes (nothing is run to ask it). Yields the list of the
    questions asked, (kernel, dtype, explicit_padding, data_format) each."""
    asked = []
    with onednn_host(True, asked):
        yield asked


@pytest.fixture
def gpu_host():
    """The planner's host facts as on a machine with a GPU (also where there is
    none: planning and the emitted kernels follow it; nothing runs there)."""
    from tfbigconv import host
    with host.use(host.Host(gpu=True)) as facts:
        yield facts


@pytest.fixture
def autotuning(tmp_path, monkeypatch):
    """Autotuning on (as by default outside the tests), with a fresh cache file
    (its path is returned) and nothing remembered in this process."""
    from tfbigconv.planning import autotune
    path = tmp_path / "autotune.json"
    monkeypatch.setenv("TFBIGCONV_AUTOTUNE", "1")
    monkeypatch.setenv("TFBIGCONV_AUTOTUNE_CACHE", str(path))
    autotune.clear_memory()
    yield path
    autotune.clear_memory()


# ---- graphs, subprocesses, a fake GPU ----------------------------------------

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS_DIR)
CPU = "/CPU:0"  # the CPU's rules and model, also where a GPU is visible


def rand(shape, seed):
    """A float32 tensor of standard normal values."""
    import tensorflow as tf
    return tf.constant(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def graph_ops(fn, *args):
    import tensorflow as tf
    return [op for op in tf.function(fn).get_concrete_function(*args).graph.get_operations()]


def op_types(fn, *args):
    return {op.type for op in graph_ops(fn, *args)}


def cpu_bigconv2d(*args, **kwargs):
    """bigconv2d under tf.device("/CPU:0"): explain()'s default device, also
    where a GPU is visible."""
    import tensorflow as tf
    import tfbigconv
    with tf.device(CPU):
        return tfbigconv.bigconv2d(*args, **kwargs)


def grads_vs_reference(fn, x, w, strides=1, padding="SAME", fmt="NHWC", dil=1):
    """fn's output and gradients (dy random) against the float64 reference:
    the three relative L2 errors."""
    import tensorflow as tf
    from reference import conv2d_reference_backprop_filter, conv2d_reference_backprop_input
    s = (strides, strides) if isinstance(strides, int) else tuple(strides)
    d = (dil, dil) if isinstance(dil, int) else tuple(dil)
    x64 = tf.cast(x, tf.float64).numpy()
    w64 = tf.cast(w, tf.float64).numpy()
    y_ref = conv2d_reference(x64, w64, s, padding, d, fmt)
    dy = tf.cast(random_case(y_ref.shape, 99, np.float64), x.dtype)
    dy64 = tf.cast(dy, tf.float64).numpy()
    with tf.device(CPU):
        with tf.GradientTape() as t:
            t.watch([x, w])
            y = fn(x, w)
        dx, dw = t.gradient(y, [x, w], output_gradients=dy)
    refs = (y_ref, conv2d_reference_backprop_input(dy64, w64, x64.shape, s, padding, d, fmt),
            conv2d_reference_backprop_filter(x64, dy64, w64.shape, s, padding, d, fmt))
    return [rel_l2(tf.cast(g, tf.float64).numpy(), r) for g, r in zip((y, dx, dw), refs)]


def second_order_grads(conv, x, w):
    """Gradients with respect to x and w of a function of conv's first gradients (a
    penalty on them, as in gradient-penalty training): second order through conv."""
    import tensorflow as tf
    with tf.GradientTape(persistent=True) as outer:
        outer.watch([x, w])
        with tf.GradientTape() as inner:
            inner.watch([x, w])
            loss = tf.reduce_sum(conv(x, w) ** 2)
        gx, gw = inner.gradient(loss, [x, w])
        s = tf.reduce_sum(gx * gx) + tf.reduce_sum(gw * tf.sin(gw))
    return outer.gradient(s, [x, w])


def tape_types(fn, x_shape, w_shape, dtype=None):
    """The op types of a traced training step (fn's output and both gradients, on the CPU)."""
    import tensorflow as tf
    dtype = dtype or tf.float32

    def step(x, w):
        with tf.device(CPU), tf.GradientTape() as t:
            t.watch([x, w])
            loss = tf.reduce_sum(fn(x, w) ** 2)
        return t.gradient(loss, [x, w])
    return op_types(step, tf.TensorSpec(x_shape, dtype), tf.TensorSpec(w_shape, dtype))


def run_cli(cmd, **env):
    """`python <cmd>` (e.g. ["-m", "tfbigconv", "explain", ...]) in a subprocess,
    run from this folder so that the installed package is imported."""
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **env)
    return subprocess.run([sys.executable] + cmd, env=full_env, capture_output=True, text=True,
                          cwd=TESTS_DIR)


def run_python(code, cwd, env=None):
    """Runs `code` in a fresh interpreter (inheriting PYTHONPATH), outside the source tree."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd,
                            env={**os.environ, **(env or {})}, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr[-5000:]}"
    return result.stdout


class FakeGpu:
    """tf.config as it looks with one GPU: its configured memory_limit (MiB or
    None), the allocator's bytes in use (None: no statistics) and the driver's
    total memory (0: no driver). For tests about a machine without a GPU."""

    def __init__(self, monkeypatch, memory_limit_mib=None, in_use=None, total=0):
        import tensorflow as tf
        from tfbigconv import host
        gpu = tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")
        monkeypatch.setattr(tf.config, "list_physical_devices",
                            lambda kind=None: [gpu] if kind == "GPU" else [])
        config = ([tf.config.LogicalDeviceConfiguration(memory_limit=memory_limit_mib)]
                  if memory_limit_mib else None)
        monkeypatch.setattr(tf.config, "get_logical_device_configuration", lambda d: config)

        def memory_info(name):
            if in_use is None:
                raise ValueError("no statistics")
            assert name == "GPU:0"
            return {"current": in_use, "peak": in_use}
        monkeypatch.setattr(tf.config.experimental, "get_memory_info", memory_info)
        monkeypatch.setattr(host, "cuda_total_memory", lambda ordinal: total)
