"""explain() (tfbigconv/planning/explain.py): the planner's table for a
convolution, every candidate of every pass with its estimate, workspace and
note, the choice and why, and where the cost model's constants came from.
(explain on the GPU: gpu/test_gpu_planning.py; measured choices:
test_autotune.py; its tables before and after the restructure:
test_explain_golden.py.)"""
import pytest
import tensorflow as tf

import tfbigconv
from tfbigconv.cost_model import profiles
from tfbigconv import arguments
from tfbigconv.planning import tf_rules

SEED16 = ((4, 321, 481, 1), (135, 135, 1, 3), "VALID")


def test_explain_table():
    e = tfbigconv.explain(*SEED16[:2], padding="VALID", budget=256 << 20)
    assert len(e.rows) == 9 and e.budget == 256 << 20
    for p in ("forward", "backprop_input", "backprop_filter"):
        rows = [r for r in e.rows if r.pass_ == p]
        assert [r.algorithm for r in rows] == ["tf.Conv2D", "direct", "fft"]
        assert sum(r.chosen for r in rows) == 1
        chosen = next(r for r in rows if r.chosen)
        assert chosen.fits and chosen.workspace_bytes <= e.budget
        assert e.reasons[p].startswith("auto: " + chosen.algorithm)
    # One image's patch matrix of a 135x135 filter is 4.4 GiB, over the budget: TF's
    # own (Eigen) gradient kernels build it, where TF runs no oneDNN (asked of TF).
    conv2d = next(r for r in e.rows if r.algorithm == "tf.Conv2D"
                  and r.pass_ == "backprop_filter")
    valid = arguments.parse_attrs(2, 1, "VALID", "NHWC", 1)
    if tf_rules.tf_runs_onednn("Conv2D", valid, "float32", "CPU"):
        assert conv2d.workspace_bytes == 0 and conv2d.fits
    else:
        assert conv2d.workspace_bytes == 187 * 347 * 135 * 135 * 4 and not conv2d.fits
    assert e.device == "CPU" and e.how == dict.fromkeys(e.chosen, "estimated")
    assert all(r.measured_seconds is None for r in e.rows)
    text = str(e)
    assert text.count("<==") == 3 and "forward: estimated; auto: fft" in text
    assert e.geometry.output_shape == [4, 187, 347, 3]


def test_explain_errors():
    with pytest.raises(tf.errors.InvalidArgumentError, match="device"):
        tfbigconv.explain((1, 8, 8, 1), (3, 3, 1, 1), device="TPU")
    with pytest.raises(tf.errors.InvalidArgumentError, match="budget"):
        tfbigconv.explain((1, 8, 8, 1), (3, 3, 1, 1), budget=-1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="filter"):
        tfbigconv.explain((1, 8, 8, 1), (3, 3, 2, 1))
    with pytest.raises(tf.errors.ResourceExhaustedError, match="at least"):
        tfbigconv.explain(*SEED16[:2], algorithm="fft", budget=1024)


def test_explain_warns_when_the_profile_is_from_another_machine(monkeypatch):
    here = {"cpu": profiles.this_cpu(), "tensorflow": tf.__version__}
    warn = "may be off several-fold"
    monkeypatch.setattr(profiles, "active_meta", here)
    e = tfbigconv.explain((2, 20, 20, 3), (5, 5, 3, 4), padding="SAME")
    assert e.cost_model_warning == "" and warn not in e.table()
    monkeypatch.setattr(profiles, "active_meta", dict(here, cpu=dict(here["cpu"], cpus=999)))
    e = tfbigconv.explain((2, 20, 20, 3), (5, 5, 3, 4), padding="SAME")
    assert "999 CPUs" in e.cost_model_warning and warn in e.table()
    # The GPU's constants are the H100 grids' fit wherever explain runs.
    e = tfbigconv.explain((2, 20, 20, 3), (5, 5, 3, 4), padding="SAME", device="GPU")
    assert e.cost_model_warning == "" and warn not in e.table()


@pytest.mark.native
def test_explain_shows_the_fused_backward_where_it_serves():
    """A long 1-D depthwise layer whose gradients are fft on the CPU: one op for
    both (its plan and a line in the table); a 2-D layer: none."""
    e = tfbigconv.explain([2, 300, 16], [200, 1, 16], padding="CAUSAL", algorithm="fft",
                          device="CPU")
    assert e.fused_backward and e.fused_backward.fft_w >= 300 + 199
    assert "both gradients in one op (BigConv2DBackprop)" in e.table()
    assert tfbigconv.explain([2, 300, 7], [200, 1, 7], padding="CAUSAL", algorithm="fft",
                             device="CPU").fused_backward is None  # fewer than 8 channels
    e2 = tfbigconv.explain([2, 40, 40, 16], [9, 9, 1, 16], padding="SAME", algorithm="fft",
                           device="CPU")
    assert e2.fused_backward is None and "BigConv2DBackprop" not in e2.table()
