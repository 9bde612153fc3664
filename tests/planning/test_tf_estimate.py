"""TF's own kernels as the planner estimates them (csrc/core/tf_estimate.cc, asked
through planning/planner.py), per pass and host kind: the workspace TF really
allocates, and the half types' filter-gradient slow path. explain() and
memory_report agree, and the estimates follow what TF runs in this process."""
import json
import os
import subprocess
import sys

import keras
import pytest

import tfbigconv
from tfbigconv import _core
from tfbigconv.cost_model import profiles
from tfbigconv.planning import autotune, planner

PASSES = planner.PASSES
VALID = dict(strides=[1, 1, 1, 1], padding="VALID", explicit_paddings=[], data_format="NHWC",
             dilations=[1, 1, 1, 1])
SAME = dict(VALID, padding="SAME")
# README's case: one 321x481 frame, the 135x135x1x3 filter. One image's patch
# matrix is 187 x 347 x 135 x 135 float32: 4.4 GiB. Measured RSS growth of one
# call (benchmarks/tf_workspace_rss.py, Zen 4): oneDNN off +7.4 MiB forward,
# +4.41 GiB in each gradient; oneDNN on +0-3.7 MiB in all three.
SEED = ([1, 321, 481, 1], [135, 135, 1, 3])
PATCH = 187 * 347 * 135 * 135 * 4


def tf_estimates(attrs=VALID, shapes=SEED, dtype="float32"):
    return {p: planner.plan(p, *shapes, attrs, dtype, "tf", 0).tf for p in PASSES}


def test_eigen_gradients_build_the_patch_matrix_and_its_forward_none(eigen_tf):
    e = tf_estimates()
    assert [e[p].workspace_bytes for p in PASSES] == [0, PATCH, PATCH]
    assert "Eigen" in e["forward"].note and "col_buffer" in e["backprop_filter"].note


def test_onednn_builds_no_patch_matrix(onednn_tf):
    e = tf_estimates()
    assert [e[p].workspace_bytes for p in PASSES] == [0, 0, 0]
    assert all("oneDNN" in e[p].note for p in PASSES)
    assert ("Conv2D", "float32", False, "NCHW") in onednn_tf  # asked, not assumed


def test_explicit_padding_runs_eigen_where_onednn_does_not_take_it():
    """TF falls back to its Eigen kernels where its oneDNN check says no (EXPLICIT
    padding did on a host here): the col_buffer again."""
    from conftest import onednn_host
    explicit = dict(VALID, padding="EXPLICIT", explicit_paddings=[0] * 8)
    with onednn_host(answer=False):
        e = tf_estimates(explicit)
    assert [e[p].workspace_bytes for p in PASSES] == [0, PATCH, PATCH]


@pytest.mark.parametrize("kernels", ["eigen_tf", "onednn_tf"])
def test_explain_and_memory_report_agree(kernels, request):
    """explain()'s tf.Conv2D rows and memory_report's TF workspaces of the same
    layer are one estimate (issue 59: explain said 4.4 GiB in every pass on a
    oneDNN host where memory_report said 0 B)."""
    request.getfixturevalue(kernels)
    e = tfbigconv.explain(*SEED, padding="VALID")
    ws = {r.pass_: r.workspace_bytes for r in e.rows if r.algorithm == "tf.Conv2D"}
    # A layer before it, so that its input gradient runs too.
    model = keras.Sequential([keras.Input(SEED[0][1:]), keras.layers.Conv2D(1, 1, name="pre"),
                              keras.layers.Conv2D(3, 135, use_bias=False, name="big")])
    r = tfbigconv.memory_report(model, 1, device="CPU", advice=False)
    row = next(row for row in r.rows if row.layer == "big" and row.op == "Conv2D")
    assert row.tf_workspace == (ws["forward"], ws["backprop_input"] + ws["backprop_filter"])


ASK_TF = """
import json
from tfbigconv.planning import planner, tf_rules
attrs = dict(strides=[1, 1, 1, 1], padding="VALID", explicit_paddings=[], data_format="NHWC",
             dilations=[1, 1, 1, 1])
from tfbigconv.arguments import ConvSpec
print(json.dumps({"onednn": tf_rules.tf_runs_onednn("Conv2D", ConvSpec.of(attrs), "float32",
                                                    "CPU"),
                  "workspace": [planner.plan(p, [1, 321, 481, 1], [135, 135, 1, 3], attrs,
                                             "float32", "tf", 0).tf.workspace_bytes
                                for p in planner.PASSES]}))
"""


@pytest.mark.parametrize("setting", ["0", "1"])
def test_the_estimate_follows_what_tf_runs_in_the_process(setting):
    """With TF_ENABLE_ONEDNN_OPTS=0 and =1: the process asks TF whether it runs
    oneDNN (tf_rules.tf_runs_onednn runs its check), and the estimate follows."""
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=setting, TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run([sys.executable, "-c", ASK_TF], env=env, capture_output=True, text=True,
                       cwd=os.path.dirname(__file__))
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if setting == "0":
        assert not got["onednn"]
    assert got["workspace"] == ([0, 0, 0] if got["onednn"] else [0, PATCH, PATCH])


def set_field(name, value):
    values = _core.get_cost_model()
    values[_core.cost_model_fields().index(name)] = value
    _core.set_cost_model(values)


# Issue 59's first step: BigConv2D(8, 31) on eight 96x96x3 images.
WIDE = ([8, 96, 96, 3], [31, 31, 3, 8])


@pytest.mark.parametrize("dtype", profiles.HALF_TYPES)
def test_a_half_filter_gradient_takes_float32s_slow_path_from_its_side(model, onednn_tf, dtype):
    """From im2col_half_slow_path_side the half type's filter gradient is
    estimated as float32's (oneDNN's bfloat16 on Zen 4: 4.7 s a 96x96x3->8
    image at side 31, float32 4.3 s); below it at its own fast rate."""
    field = profiles.HALF_SLOW_PATH + dtype
    # float32's slow path, as on a oneDNN host, whatever profile this host has
    # (the Zen 3 one, oneDNN off, has none).
    for side in (15, 31):
        model(f"im2col_flops_per_second.backprop_filter.side{side}", 0.02)
    f32 = tf_estimates(SAME, WIDE)["backprop_filter"]
    set_field(field, 15.0)
    slow = tf_estimates(SAME, WIDE, dtype)["backprop_filter"]
    assert slow.seconds == pytest.approx(f32.seconds, rel=1e-9)
    set_field(field, 32.0)  # past the filter: its fast path
    fast = tf_estimates(SAME, WIDE, dtype)["backprop_filter"]
    assert fast.seconds < f32.seconds / 10
    # Other passes and dtypes do not change with it.
    for p in PASSES[:2]:
        set_field(field, 15.0)
        a = tf_estimates(SAME, WIDE, dtype)[p].seconds
        set_field(field, 32.0)
        assert tf_estimates(SAME, WIDE, dtype)[p].seconds == a


def test_the_issue_59_first_step_does_not_time_tfs_bfloat16_filter_gradient(model, onednn_tf):
    """Its estimate on the slow path is HOPELESS_FACTOR x fft's or more: not timed."""
    set_field(profiles.HALF_SLOW_PATH + "bfloat16", 15.0)
    p = planner.plan("backprop_filter", *WIDE, SAME, "bfloat16", "auto", 0)
    assert p.tf.seconds >= autotune.HOPELESS_FACTOR * min(p.direct.seconds, p.fft.seconds)
    assert "tf" not in autotune.candidates_to_time(p)
