"""GPU kernels of the three ops (skipped without a GPU): results on the GPU
against the same op on the CPU and against tf.nn.conv2d on the GPU, forward
and gradients, every dtype and both algorithms."""
import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from conftest import TOLERANCE, random_case
from reference import rel_l2

GPUS = tf.config.list_physical_devices("GPU")
pytestmark = pytest.mark.skipif(not GPUS, reason="no GPU visible to TensorFlow")

ALGORITHMS = ["direct", "fft"]
DTYPES = ["float32", "float64", "float16", "bfloat16"]
# (input, filter, strides, padding, dilations, data_format); explicit pads
# are ((top, bottom), (left, right)).
CASES = [
    ((2, 70, 67, 1), (63, 63, 1, 3), 1, "VALID", 1, "NHWC"),
    ((2, 37, 41, 4), (9, 7, 2, 6), 2, "SAME", 1, "NHWC"),
    ((2, 37, 41, 4), (9, 7, 2, 6), 1, ((0, 3), (2, 1)), (2, 1), "NHWC"),
    ((2, 4, 30, 33), (7, 5, 4, 8), (2, 3), "SAME", 1, "NCHW"),
    ((2, 40, 40, 8), (31, 31, 1, 8), 1, "SAME", 1, "NHWC"),  # depthwise
]


def tol(dtype, algorithm):
    return max(TOLERANCE[dtype], 1e-4) if algorithm == "fft" and dtype == "float32" else TOLERANCE[dtype] * 2


def args(case):
    x_shape, w_shape, strides, padding, dil, fmt = case
    kw = dict(strides=strides, dilations=dil, data_format=fmt)
    if isinstance(padding, tuple):
        pads = [[0, 0], list(padding[0]), list(padding[1]), [0, 0]]
        if fmt == "NCHW":
            pads = [pads[0], pads[3], pads[1], pads[2]]
        kw["padding"] = pads
    else:
        kw["padding"] = padding
    return x_shape, w_shape, kw


def forward_and_grads(device, x, w, dy, conv):
    with tf.device(device):
        x, w, dy = tf.identity(x), tf.identity(w), tf.identity(dy)
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            y = conv(x, w)
        dx, dw = tape.gradient(y, [x, w], output_gradients=dy)
    return [t.numpy().astype(np.float64) for t in (y, dx, dw)]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_matches_cpu(case, algorithm, dtype):
    x_shape, w_shape, kw = args(case)
    x = tf.constant(random_case(x_shape, 1, np.float32), dtype=dtype)
    w = tf.constant(random_case(w_shape, 2, np.float32), dtype=dtype)
    conv = lambda a, b: tfbigconv.bigconv2d(a, b, algorithm=algorithm, **kw)
    with tf.device("/CPU:0"):
        y_shape = conv(x, w).shape
    dy = tf.constant(random_case(y_shape, 3, np.float32), dtype=dtype)
    cpu = forward_and_grads("/CPU:0", x, w, dy, conv)
    gpu = forward_and_grads("/GPU:0", x, w, dy, conv)
    for name, g, c in zip(("output", "dL/dinput", "dL/dfilter"), gpu, cpu):
        assert rel_l2(g, c) <= tol(dtype, algorithm), name


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_gpu_matches_tf_conv2d_on_gpu(case, algorithm):
    x_shape, w_shape, kw = args(case)
    x = tf.constant(random_case(x_shape, 1, np.float32))
    w = tf.constant(random_case(w_shape, 2, np.float32))
    if kw["data_format"] == "NCHW" and not tf.test.is_built_with_cuda():
        pytest.skip("NCHW tf.nn.conv2d needs the CUDA build of TensorFlow")
    ours = lambda a, b: tfbigconv.bigconv2d(a, b, algorithm=algorithm, **kw)
    theirs = lambda a, b: tf.nn.conv2d(a, b, **kw)
    with tf.device("/GPU:0"):
        y_shape = theirs(x, w).shape
    dy = tf.constant(random_case(y_shape, 3, np.float32))
    got = forward_and_grads("/GPU:0", x, w, dy, ours)
    want = forward_and_grads("/GPU:0", x, w, dy, theirs)
    for name, g, r in zip(("output", "dL/dinput", "dL/dfilter"), got, want):
        # tf.nn.conv2d on GPU may use TF32 on Ampere and later.
        assert rel_l2(g, r) <= 2e-3, name


def test_gpu_deterministic():
    x = tf.constant(random_case((8, 48, 48, 1), 1, np.float32))
    w = tf.constant(random_case((31, 31, 1, 2), 2, np.float32))
    dy = tf.constant(random_case((8, 18, 18, 2), 3, np.float32))
    conv = lambda a, b: tfbigconv.bigconv2d(a, b, 1, "VALID", algorithm="direct")
    first = forward_and_grads("/GPU:0", x, w, dy, conv)
    again = forward_and_grads("/GPU:0", x, w, dy, conv)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)


def test_gpu_workspace_limit_errors():
    x = tf.constant(random_case((1, 64, 64, 1), 1, np.float32))
    w = tf.constant(random_case((31, 31, 1, 1), 2, np.float32))
    with tf.device("/GPU:0"):
        with pytest.raises((tf.errors.ResourceExhaustedError, tf.errors.FailedPreconditionError),
                           match="workspace|cuFFT"):
            tfbigconv.bigconv2d(x, w, 1, "VALID", algorithm="fft", workspace_limit=1)
