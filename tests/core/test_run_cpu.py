"""RunConvCpu (csrc/core/run_cpu.h), the one CPU launch function: the TF op
and _core.run_pass both run every pass through it, and what it refuses is an
error, never a crash."""
import numpy as np
import pytest

from tfbigconv import _core
from tfbigconv._native import ops
from conftest import random_case, run_core, run_core_pass
from reference import rel_l2

X_SHAPE, W_SHAPE = (2, 17, 19, 3), (5, 4, 3, 6)
STRIDES = (2, 1)
TF_ATTRS = dict(strides=[1, 2, 1, 1], padding="SAME", data_format="NHWC",
                dilations=[1, 1, 1, 1])


def operands():
    x, w = random_case(X_SHAPE, 0), random_case(W_SHAPE, 1)
    y_shape = _core.conv_geometry(list(X_SHAPE), list(W_SHAPE), TF_ATTRS["strides"], "SAME", [],
                                  "NHWC", [1] * 4).output_shape
    return x, w, random_case(y_shape, 2)


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
def test_tf_op_and_core_run_the_same_launch(algorithm):
    x, w, dy = operands()
    a = dict(TF_ATTRS, algorithm=algorithm)
    by_tf = [ops.big_conv2d(input=x, filter=w, **a),
             ops.big_conv2d_backprop_input(input_sizes=list(X_SHAPE), filter=w, out_backprop=dy,
                                           **a),
             ops.big_conv2d_backprop_filter(input=x, filter_sizes=list(W_SHAPE),
                                            out_backprop=dy, **a)]
    by_core = [run_core(algorithm, x, w, STRIDES, "SAME"),
               run_core_pass(algorithm, "backprop_input", dy, w, X_SHAPE, STRIDES, "SAME"),
               run_core_pass(algorithm, "backprop_filter", x, dy, W_SHAPE, STRIDES, "SAME")]
    for t, c in zip(by_tf, by_core):
        assert np.isfinite(c).all()
        if algorithm == "direct":
            # The direct kernel's result does not depend on the thread split,
            # so the two callers of one launch agree bit for bit.
            np.testing.assert_array_equal(t.numpy(), c)
        else:  # the FFT plan may differ with the thread count
            assert rel_l2(t.numpy(), c) < 1e-6


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
def test_empty_sums_write_zeros(algorithm):
    """Batch 0: every filter-gradient entry is an empty sum; the launch writes
    zeros over the NaN-poisoned output without a plan or workspace."""
    x = np.zeros((0, 9, 8, 3), np.float32)
    dy = np.zeros((0, 5, 8, 6), np.float32)
    dw = run_core_pass(algorithm, "backprop_filter", x, dy, W_SHAPE, STRIDES, "SAME")
    np.testing.assert_array_equal(dw, np.zeros(W_SHAPE, np.float32))


def test_isa_this_cpu_cannot_run_is_an_error():
    missing = [i for i in ("baseline", "avx2", "avx512") if i not in _core.supported_isas()]
    if not missing:
        pytest.skip("this CPU and build run every ISA variant")
    x, w = random_case((1, 9, 9, 2), 0), random_case((3, 3, 2, 4), 1)
    for isa in missing:
        out = np.full((1, 7, 7, 4), np.nan, np.float32)
        with pytest.raises(ValueError, match=f"isa {isa} is not supported"):
            _core.run_pass("direct", "forward", x, w, [], [1] * 4, "VALID", [], "NHWC", [1] * 4,
                           out=out, isa=isa)
        assert np.isnan(out).all()  # nothing written
