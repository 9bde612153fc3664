"""TensorFlow's kernel rules (tfbigconv/planning/tf_rules.py): which of TF's
kernels runs a pass on the device (Conv2D, DepthwiseConv2dNative), whether it
can, and whether auto may pick it: TF's CPU kernels without oneDNN (NHWC only,
no grouped or dilated gradients, half types accumulated in half), with it
(the oneDNN check, tf_cpu_onednn, and the host facts it reads), and TF's
known crashes and slow compiles. Each rule is seen through explain() and
through what bigconv2d runs."""
import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from tfbigconv import _core, arguments, host, kernels
from tfbigconv.planning import autotune, candidates, planner, tf_rules
from conftest import (TOLERANCE, cpu_bigconv2d, grads_vs_reference, onednn_host, op_types, rand,
                      random_case, tape_types)


def test_kernel_rules_table_is_well_formed():
    """Each row names one of TF's kernels (or none: TF cannot run the case) and
    a verdict; the last row applies to every case."""
    assert tf_rules.TF_KERNEL_RULES
    for rule in tf_rules.TF_KERNEL_RULES:
        assert rule.kernel in ("", "Conv2D", "DepthwiseConv2dNative", "Conv3D"), rule
        assert rule.verdict in ("trusted", "measured", "never"), rule
        assert rule.kernel or rule.verdict == "never", rule  # no kernel: never auto's
        assert isinstance(rule.note, str) and rule.source, rule
    assert tf_rules.TF_KERNEL_RULES[-1].applies(None)


def test_tf_is_never_chosen_where_tf_cannot_run_it(eigen_tf):
    # NCHW: TF's CPU Conv2D runs only NHWC (without oneDNN).
    e = tfbigconv.explain((2, 16, 32, 32), (3, 3, 16, 16), padding="SAME", data_format="NCHW")
    assert not any(a.startswith("tf") for a in e.chosen.values())
    tf_rows = [r for r in e.rows if r.algorithm.startswith("tf")]
    assert len(tf_rows) == 3 and all("NHWC" in r.note and not r.available for r in tf_rows)
    # Grouped and dilated: TF's CPU gradients reject them.
    for kwargs in ({}, {"dilations": 2}):
        w = (3, 3, 4, 16) if not kwargs else (3, 3, 16, 16)
        e = tfbigconv.explain((2, 32, 32, 16), w, padding="SAME", **kwargs)
        for p in ("backprop_input", "backprop_filter"):
            assert not e.chosen[p].startswith("tf")
            row = next(r for r in e.rows if r.pass_ == p and r.algorithm.startswith("tf"))
            assert not row.available and "reject" in row.note
    x, w = rand((2, 32, 32, 16), 8), rand((3, 3, 4, 16), 9)
    with tf.GradientTape() as t:
        t.watch([x, w])
        loss = tf.reduce_sum(tfbigconv.bigconv2d(x, w, 1, "SAME") ** 2)
    assert all(np.isfinite(g.numpy()).all() for g in t.gradient(loss, [x, w]))


@pytest.mark.parametrize("kwargs", [dict(data_format="NCHW"), dict(dilations=2),
                                    dict(strides=(1, 2))])
def test_depthwise_that_tf_depthwise_cannot_run(kwargs, eigen_tf):
    """TF's depthwise kernels need NHWC, equal strides and no dilations; such
    cases are grouped Conv2D for TF, which on the CPU (without oneDNN) runs
    only NHWC forward (dilated gradients: the test below)."""
    kwargs = dict(kwargs)
    strides = kwargs.pop("strides", 1)
    fmt = kwargs.get("data_format", "NHWC")
    shape = (2, 8, 12, 12) if fmt == "NCHW" else (2, 12, 12, 8)
    x, w = rand(shape, 26), rand((3, 3, 1, 8), 27)
    if fmt == "NCHW":
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="'tf' is not available: .*only NHWC"):
            cpu_bigconv2d(x, w, strides, "SAME", algorithm="tf", **kwargs)
    else:  # forced tf: TF's grouped Conv2D, exactly tf.nn.conv2d
        with tf.device("/CPU:0"):
            np.testing.assert_array_equal(
                cpu_bigconv2d(x, w, strides, "SAME", algorithm="tf", **kwargs),
                tf.nn.conv2d(x, w, strides, "SAME", dilations=kwargs.get("dilations")))
        e = tfbigconv.explain(shape, w.shape, strides, "SAME", dilations=kwargs.get("dilations", 1))
        assert {r.algorithm for r in e.rows if r.pass_ == "forward"} >= {"tf.Conv2D"}
    # auto runs it (on our kernels), correctly.
    errors = grads_vs_reference(
        lambda x, w: cpu_bigconv2d(x, w, strides, "SAME", **kwargs), x, w,
        strides=strides, fmt=fmt, dil=kwargs.get("dilations", 1))
    assert max(errors) < 1e-4, errors


@pytest.mark.parametrize("onednn", [True, False, None], ids=["onednn", "eigen", "this_host"])
@pytest.mark.parametrize("strides, data_format", [(2, "NHWC"), (1, "NCHW")])
def test_dilated_depthwise_that_tf_nn_depthwise_conv2d_cannot_run_stays_grouped(
        strides, data_format, onednn):
    """tf.nn.depthwise_conv2d takes dilations only at stride 1, and
    DepthwiseConv2dNative in NHWC: TF's kernel there is grouped Conv2D, on
    every host. Where oneDNN runs Conv2D, it runs every pass; where TF's Eigen
    kernels do, they run none in NCHW and no grouped gradient (no kernel)."""
    shape = (2, 8, 12, 12) if data_format == "NCHW" else (2, 12, 12, 8)
    facts = (onednn_host() if onednn else host.use(host.Host(onednn=False)) if onednn is False
             else host.use(host.current()))
    with facts:
        e = tfbigconv.explain(shape, (3, 3, 1, 8), strides, "SAME", dilations=2,
                              data_format=data_format)
        runs_onednn = tf_rules.tf_cpu_onednn("Conv2D", "float32", False)
    tf_rows = {r.pass_: r for r in e.rows if r.algorithm.startswith("tf")}
    assert len(tf_rows) == 3, e
    for p, r in tf_rows.items():
        eigen_runs = p == "forward" and data_format == "NHWC"
        if runs_onednn or eigen_runs:
            assert r.algorithm == "tf.Conv2D", r
        else:
            assert r.algorithm == "tf" and not r.available, r


def test_tfs_bfloat16_grouped_dilated_filter_gradient_is_never_run(onednn_tf):
    """TF 2.21's oneDNN bfloat16 grouped Conv2DBackpropFilter with dilations
    killed the process: auto neither picks nor times it, and nothing here
    builds it. Under a forced "tf", building that gradient raises, naming why
    (also with unknown spatial sizes, and through the emitter every route
    shares); the forward pass runs."""
    # onednn_tf: as where oneDNN runs it
    x_shape, w_shape = (2, 16, 16, 16), (3, 3, 4, 16)
    a = dict(strides=[1, 1, 1, 1], padding="SAME", explicit_paddings=[], data_format="NHWC",
             dilations=[1, 3, 3, 1])
    for p in planner.PASSES:
        plan = planner.plan(p, x_shape, w_shape, a, "bfloat16", "auto", 0, "CPU")
        refused = p == "backprop_filter"
        assert plan.tf.available != refused, p
        if refused:
            assert "segmentation fault" in plan.tf.note
            assert "tf" not in autotune.candidates_to_time(plan)
    for dtype, dil in (("float32", [1, 3, 3, 1]), ("bfloat16", [1, 1, 1, 1])):
        plan = planner.plan("backprop_filter", x_shape, w_shape, dict(a, dilations=dil), dtype,
                            "auto", 0, "CPU")
        assert plan.tf.available, (dtype, dil)

    def step(x, w):
        with tf.device("/CPU:0"), tf.GradientTape() as t:
            t.watch([x, w])
            y = tfbigconv.bigconv2d(x, w, 1, "SAME", dilations=3, algorithm="tf")
        return t.gradient(y, [x, w])

    static = [tf.TensorSpec(x_shape, tf.bfloat16), tf.TensorSpec(w_shape, tf.bfloat16)]
    unknown = [tf.TensorSpec([None, None, None, 16], tf.bfloat16), static[1]]
    for specs in (static, unknown):  # traced, not run
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="'tf' is not available: .*segmentation"):
            tf.function(step).get_concrete_function(*specs)
    forward = op_types(lambda x, w: tfbigconv.bigconv2d(x, w, 1, "SAME", dilations=3,
                                                        algorithm="tf"), *static)
    assert "Conv2D" in forward  # inference is not refused
    a = dict(strides=[1, 1, 1, 1], padding="SAME", explicit_paddings=[], data_format="NHWC",
             dilations=[1, 3, 3, 1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="segmentation"):
        tf.function(lambda x, w, dy: candidates.run_pass("backprop_filter", "tf", x, w, dy, a,
                                                         "CPU")
                    ).get_concrete_function(*static, static[0])

# ---- precision: float16 and bfloat16 gradients from auto -------------------

HALF_CASES = {
    "dense_1ch": ((3, 58, 63, 1), (9, 1, 1, 2), 1, "VALID"),   # the issue's bfloat16 case
    "dense": ((2, 17, 19, 16), (7, 7, 16, 16), 1, "SAME"),
    "dense_stride2": ((2, 20, 20, 8), (3, 3, 8, 8), 2, "SAME"),
    "grouped": ((2, 20, 20, 8), (3, 3, 2, 8), 1, "SAME"),
    "depthwise": ((2, 24, 24, 4), (7, 7, 1, 8), 1, "SAME"),
    "big_k": ((1, 48, 44, 1), (31, 31, 1, 2), 1, "SAME"),
}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", sorted(HALF_CASES))
@pytest.mark.parametrize("tuned", [False, True], ids=["estimated", "autotuned"])
def test_half_precision_gradients_from_auto_meet_tolerances(dtype, case, tuned, request,
                                                          eigen_tf):
    """TF's CPU gradients (and depthwise kernels) without oneDNN accumulate in
    half precision, 5-20x our error, over the tolerances: auto never picks
    them, whether it decides by estimates or by timing, and explain() says why."""
    if tuned:
        request.getfixturevalue("autotuning")
    x_shape, w_shape, strides, padding = HALF_CASES[case]
    tf_dtype = tf.as_dtype(dtype)
    x = tf.cast(random_case(x_shape, 30, np.float64), tf_dtype)
    w = tf.cast(random_case(w_shape, 31, np.float64), tf_dtype)
    fn = lambda x, w: cpu_bigconv2d(x, w, strides, padding)  # noqa: E731
    errors = grads_vs_reference(fn, x, w, strides, padding)
    assert max(errors) <= TOLERANCE[dtype], errors

    e = tfbigconv.explain(x_shape, w_shape, strides, padding, dtype=dtype)
    depthwise = w_shape[2] == 1 and x_shape[3] > 1
    for p in planner.PASSES:
        tf_row = next(r for r in e.rows if r.pass_ == p and r.algorithm.startswith("tf"))
        if p == "forward" and not depthwise:
            continue  # TF's forward rounds only its output: allowed
        # Runnable when forced (algorithm="tf"), never auto's choice.
        assert not e.chosen[p].startswith("tf"), (p, tf_row)
        if case != "grouped":  # grouped gradients are out for another reason
            assert "half precision" in tf_row.note, tf_row.note
    if tuned:
        assert set(e.how.values()) <= {"measured", "estimated"}


def test_half_precision_rule_is_the_cpus():
    """cuDNN accumulates half types in float32: on the GPU TF's kernels stay in."""
    for dtype in ("float16", "bfloat16"):
        e = tfbigconv.explain((2, 17, 19, 16), (7, 7, 16, 16), padding="SAME", dtype=dtype,
                              device="GPU")
        assert all(r.available for r in e.rows if r.algorithm.startswith("tf"))
        e = tfbigconv.explain((2, 17, 19, 16), (7, 7, 16, 16), padding="SAME", dtype="float32")
        assert all(r.available for r in e.rows if r.algorithm.startswith("tf"))


# ---- TF's CPU kernels through oneDNN ----------------------------------------

ONEDNN_CASES = {  # what TF's CPU kernels run only through oneDNN
    "nchw": ((2, 8, 15, 17), (3, 3, 8, 6), {"data_format": "NCHW"}),
    "grouped": ((2, 15, 17, 8), (3, 3, 2, 8), {}),
    "dilated": ((2, 15, 17, 8), (3, 3, 8, 6), {"dilations": 2}),
    "grouped_dilated_nchw": ((2, 8, 15, 17), (5, 3, 4, 6),
                             {"data_format": "NCHW", "dilations": (2, 1)}),
}


def test_where_tf_runs_onednn_auto_may_pick_its_kernels(onednn_tf):
    """With oneDNN, TF's CPU Conv2D runs NCHW, grouped and dilated gradients
    and accumulates bfloat16 in float32: auto may pick it there (grouped
    Conv2D still only when measured), and explain() says why. The check is
    asked about explicit padding apart (oneDNN did not run it)."""
    asked = onednn_tf  # the questions: (kernel, dtype, explicit_padding, data_format)
    for name, (x_shape, w_shape, kwargs) in ONEDNN_CASES.items():
        e = tfbigconv.explain(x_shape, w_shape, padding="SAME", **kwargs)
        for p in planner.PASSES:
            row = next(r for r in e.rows if r.pass_ == p and r.algorithm == "tf.Conv2D")
            assert row.available, (name, row)
            if p != "forward" or name == "nchw":
                assert "oneDNN" in row.note, (name, row.note)
            if name.startswith("grouped"):
                assert "measured fastest" in row.note, row.note
    assert {a[0] for a in asked} == {"Conv2D"} and not any(a[2] for a in asked)
    e = tfbigconv.explain((2, 17, 19, 16), (7, 7, 16, 16), padding="SAME", dtype="bfloat16")
    assert all(r.available and "half precision" not in r.note
               for r in e.rows if r.algorithm.startswith("tf"))
    asked.clear()
    tfbigconv.explain((2, 15, 17, 8), (3, 3, 8, 6), padding=[[0, 0], [1, 2], [0, 3], [0, 0]],
                      dilations=2)
    assert asked and all(a == ("Conv2D", "float32", True, "NCHW") for a in asked)


def _verdicts(x_shape, w_shape, dtype, data_format="NHWC"):
    a = dict(strides=[1, 1, 1, 1], padding="SAME", explicit_paddings=[],
             data_format=data_format, dilations=[1, 1, 1, 1])
    g = _core.conv_geometry(list(x_shape), list(w_shape), **a)
    return [tf_rules.tf_kernel(p, g, arguments.ConvSpec.of(a), dtype, "CPU")[1]
            for p in planner.PASSES]


def test_grouped_conv2d_is_trusted_from_8_channels_per_group_where_onednn_runs_it(onednn_tf):
    """oneDNN's grouped Conv2D ran 0.26-1.15x its estimate from 8 channels per
    group in float32 and bfloat16 (ONEDNN_GROUPED_TRUSTED_CHANNELS); with fewer,
    in float16 (its filter gradient 24-36x) or in NCHW, auto times it first."""
    per_group = tf_rules.ONEDNN_GROUPED_TRUSTED_CHANNELS
    for dtype in ("float32", "bfloat16"):
        assert _verdicts((2, 16, 16, 4 * per_group), (3, 3, per_group, 32), dtype) == \
            ["trusted"] * 3
        assert _verdicts((2, 16, 16, 4 * per_group), (3, 3, per_group // 2, 32), dtype) == \
            ["measured"] * 3
    assert _verdicts((2, 16, 16, 4 * per_group), (3, 3, per_group, 32), "float16") == \
        ["measured"] * 3
    assert _verdicts((2, 4 * per_group, 16, 16), (3, 3, per_group, 32), "bfloat16", "NCHW") == \
        ["measured"] * 3


def test_grouped_conv2d_without_onednn_is_timed_first(eigen_tf):
    assert _verdicts((2, 16, 16, 32), (3, 3, 8, 32), "float32") == ["measured", "never", "never"]


NCHW_DEPTHWISE = ((2, 8, 15, 17), (5, 5, 1, 8))


def test_half_types_in_nchw_run_tf_only_where_measured_fastest(onednn_tf, model):
    """oneDNN's bfloat16 kernels ran 3-30x slower in NCHW than in NHWC, where
    the model's rates are from: in half types and NCHW, TF's CPU kernels
    (dense and depthwise) are picked only when measured fastest, so never on
    estimates alone, even where the model makes them 1000x faster than ours;
    in float32 and in NHWC they are trusted as before."""
    model("im2col_flops_per_second", 1000)
    model("tf_depthwise_flops_per_second", 1000)
    # over planner.SMALL_PASS_MACS (1.76M and 1.84M), where TF's kernels may run for auto
    dense = ((4, 8, 30, 34), (3, 3, 8, 6))
    depthwise = ((4, 8, 45, 51), (5, 5, 1, 8))
    for (x_shape, w_shape), kernel in ((dense, "tf.Conv2D"),
                                       (depthwise, "tf.DepthwiseConv2dNative")):
        for dtype, fmt, trusted in (("bfloat16", "NCHW", False), ("float16", "NCHW", False),
                                    ("float32", "NCHW", True)):
            e = tfbigconv.explain(x_shape, w_shape, padding="SAME", dtype=dtype, data_format=fmt)
            rows = [r for r in e.rows if r.algorithm == kernel]
            assert len(rows) == 3 and all(r.available for r in rows), (kernel, dtype, rows)
            assert all(("measured fastest" in r.note) is not trusted for r in rows), rows
            picked = {p for p, name in e.chosen.items() if name == kernel}
            assert picked == (set(planner.PASSES) if trusted else set()), (kernel, dtype, e.chosen)
    e = tfbigconv.explain((4, 30, 34, 8), (3, 3, 8, 6), padding="SAME", dtype="bfloat16")
    assert not any("measured fastest" in r.note for r in e.rows)
    assert set(e.chosen.values()) == {"tf.Conv2D"}


def test_onednn_bfloat16_depthwise_forward_that_compiles_for_minutes_is_not_for_auto(
        onednn_tf, model):
    """oneDNN's bfloat16 depthwise forward with at most 16 channels and a 15x15
    or larger filter took over 10 minutes to compile on its first call: auto
    never picks it (nor times it), even where the model makes it 1000x faster;
    its gradients, and the cases next to the region, stay TF's."""
    model("tf_depthwise_flops_per_second", 1000)  # both rate tables: multiplier 1
    model("tf_depthwise_multiplier_flops_per_second", 1000)  # and over 1
    tf_dw = "tf.DepthwiseConv2dNative"
    e = tfbigconv.explain((2, 32, 32, 16), (15, 15, 1, 16), padding="SAME", dtype="bfloat16")
    forward = [r for r in e.rows if r.pass_ == "forward" and r.algorithm == tf_dw]
    assert len(forward) == 1 and "compile" in forward[0].note, forward
    assert e.chosen["forward"] != tf_dw
    assert e.chosen["backprop_input"] == e.chosen["backprop_filter"] == tf_dw
    plan = planner.plan("forward", (2, 32, 32, 16), (15, 15, 1, 16), dict(
        strides=[1, 1, 1, 1], padding="SAME", explicit_paddings=[], data_format="NHWC",
        dilations=[1, 1, 1, 1]), "bfloat16", "auto", 0, "CPU")
    assert "tf" not in autotune.candidates_to_time(plan)
    for x_shape, w_shape, stride, dtype in (((2, 32, 32, 24), (15, 15, 1, 24), 1, "bfloat16"),
                                            ((2, 32, 32, 16), (13, 13, 1, 16), 1, "bfloat16"),
                                            ((2, 32, 32, 16), (15, 15, 1, 16), 2, "bfloat16"),
                                            ((2, 32, 32, 16), (15, 15, 1, 32), 1, "bfloat16"),
                                            ((2, 32, 32, 16), (15, 15, 1, 16), 1, "float32")):
        e = tfbigconv.explain(x_shape, w_shape, stride, padding="SAME", dtype=dtype)
        assert e.chosen["forward"] == tf_dw, (x_shape, w_shape, stride, dtype, e.reasons)


def test_nchw_depthwise_runs_tf_depthwise_where_onednn_runs_it():
    """TF's CPU depthwise kernels run NCHW only through oneDNN: there the
    planner's row and the graph (forced "tf") are DepthwiseConv2dNative, with
    the check asked about NCHW; elsewhere on the CPU neither kernel runs it
    (TF's own kernels are NHWC only), and on the GPU it is grouped Conv2D."""
    forced = lambda x, w: cpu_bigconv2d(x, w, 1, "SAME", data_format="NCHW",  # noqa: E731
                                        algorithm="tf")
    for onednn, kernel in ((False, ""), (True, "DepthwiseConv2dNative")):
        asked = []
        with onednn_host(onednn, asked):
            e = tfbigconv.explain(*NCHW_DEPTHWISE, padding="SAME", data_format="NCHW")
            tf_rows = [r for r in e.rows if r.algorithm.startswith("tf")]
            if onednn:
                assert {r.algorithm for r in tf_rows} == {"tf." + kernel} and all(
                    r.available and "oneDNN" in r.note for r in tf_rows), tf_rows
            else:  # neither TF kernel runs NCHW
                assert not any(r.available for r in tf_rows) and "NHWC" in tf_rows[0].note
            assert ("DepthwiseConv2dNative", "float32", False, "NCHW") in asked
            e = tfbigconv.explain(*NCHW_DEPTHWISE, padding="SAME", data_format="NCHW",
                                  device="GPU")
            assert {r.algorithm for r in e.rows if r.algorithm.startswith("tf")} == {"tf.Conv2D"}
    with onednn_host(True):
        types = tape_types(forced, *NCHW_DEPTHWISE)  # with oneDNN (the last answer)
    assert {kernel, kernel + "BackpropInput", kernel + "BackpropFilter"} <= types, types
    assert not types & {"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"}, types


def test_tf_kernels_that_onednn_runs_here_are_correct(autotuning):
    """On this host, as it is: where the oneDNN check says yes, TF's kernel
    (forced) and auto meet the tolerances on the cases only oneDNN runs;
    where it says no, auto never picks TF's kernel for them."""
    for dtype in ("float32", "bfloat16", "float16"):
        onednn = tf_rules.tf_cpu_onednn("Conv2D", dtype, False)
        for name, (x_shape, w_shape, kwargs) in ONEDNN_CASES.items():
            if dtype != "float32" and name != "grouped_dilated_nchw":
                continue
            fmt = kwargs.get("data_format", "NHWC")
            x = tf.cast(random_case(x_shape, 50, np.float64), dtype)
            w = tf.cast(random_case(w_shape, 51, np.float64), dtype)
            algorithms = ("auto", "tf") if onednn else ("auto",)
            for algorithm in algorithms:
                run = lambda: grads_vs_reference(  # noqa: E731
                    lambda x, w: cpu_bigconv2d(x, w, 1, "SAME", algorithm=algorithm, **kwargs),
                    x, w, fmt=fmt, dil=kwargs.get("dilations", 1))
                if algorithm == "tf" and dtype == "bfloat16" and name == "grouped_dilated_nchw":
                    # tf_rules.ONEDNN_BF16_GROUPED_DILATED_NOTE: refused, not run
                    with pytest.raises(tf.errors.InvalidArgumentError, match="segmentation"):
                        run()
                    continue
                errors = run()
                assert max(errors) <= TOLERANCE[dtype], (dtype, name, algorithm, errors)
            if not onednn:
                e = tfbigconv.explain(x_shape, w_shape, padding="SAME", dtype=dtype, **kwargs)
                assert not any(e.chosen[p].startswith("tf") for p in planner.PASSES[1:]), e.chosen
        # NCHW depthwise: TF's depthwise kernels where the check says oneDNN runs them
        onednn = tf_rules.tf_cpu_onednn("DepthwiseConv2dNative", dtype, False, "NCHW")
        x = tf.cast(random_case(NCHW_DEPTHWISE[0], 52, np.float64), dtype)
        w = tf.cast(random_case(NCHW_DEPTHWISE[1], 53, np.float64), dtype)
        for algorithm in ("auto", "tf") if onednn else ("auto",):
            errors = grads_vs_reference(
                lambda x, w: cpu_bigconv2d(x, w, 1, "SAME", algorithm=algorithm,
                                           data_format="NCHW"), x, w, fmt="NCHW")
            assert max(errors) <= TOLERANCE[dtype], (dtype, "nchw depthwise", algorithm, errors)
        e = tfbigconv.explain(*NCHW_DEPTHWISE, padding="SAME", dtype=dtype, data_format="NCHW")
        kernels = {r.algorithm for r in e.rows if r.algorithm.startswith("tf") and r.available}
        assert kernels == ({"tf.DepthwiseConv2dNative"} if onednn else set()), (dtype, kernels)


def exact_tf_kernels(monkeypatch, dtype, error=0.0, fail=False):
    """Replaces TF's three kernels as tfbigconv.kernels emits them by float64 results
    (our direct kernel) rounded to dtype, after a relative error of `error`
    (NaN: NaN results); fail: they raise as TF's Eigen kernels do on NCHW."""
    def pass_fn(pass_, a, b, sizes):
        def run(a, b):
            if fail:
                raise tf.errors.InvalidArgumentError(None, None, "no NCHW here")
            out = _core.run_pass("direct", pass_, a.numpy().astype(np.float64),
                                 b.numpy().astype(np.float64), list(sizes), *attrs)
            noise = np.random.default_rng(0).standard_normal(out.shape)
            return out + error * np.linalg.norm(out) / np.sqrt(out.size) * noise
        result = tf.py_function(run, [a, b], tf.float64)
        return tf.cast(result, dtype)

    attrs = None

    def with_attrs(spec):
        nonlocal attrs
        attrs = spec.geometry_args()

    def forward(x, w, spec, depthwise=None):
        with_attrs(spec)
        return pass_fn("forward", x, w, [])

    def backprop_input(sizes, w, dy, spec, depthwise=None):
        with_attrs(spec)
        return pass_fn("backprop_input", dy, w, tf.get_static_value(sizes).tolist())

    def backprop_filter(x, f_shape, dy, spec, depthwise=None):
        with_attrs(spec)
        return pass_fn("backprop_filter", x, dy, list(f_shape))

    monkeypatch.setattr(kernels, "tf_forward", forward)
    monkeypatch.setattr(kernels, "tf_backprop_input", backprop_input)
    monkeypatch.setattr(kernels, "tf_backprop_filter", backprop_filter)


@pytest.mark.parametrize("kernel,fmt", [("Conv2D", "NHWC"), ("DepthwiseConv2dNative", "NHWC"),
                                        ("DepthwiseConv2dNative", "NCHW")])
def test_onednn_check_accepts_only_kernels_that_run_and_are_precise(monkeypatch, kernel, fmt):
    """The check itself, on stand-ins for TF's kernels: exact results pass;
    an error of 5x bfloat16's rounding (as TF's Eigen kernels accumulate),
    NaN, or a kernel that raises does not; and without oneDNN nothing is run."""
    cases = [(0.0, False, True), (5 * 2.0 ** -9, False, False), (np.nan, False, False),
             (0.0, True, False)]
    try:
        with host.use(host.Host(onednn=True)):  # TF runs oneDNN: the check runs its probe
            for error, fail, want in cases:
                tf_rules._onednn_probe.cache_clear()
                exact_tf_kernels(monkeypatch, tf.bfloat16, error, fail)
                assert tf_rules.tf_cpu_onednn(kernel, "bfloat16", False, fmt) is want, (error, fail)
        tf_rules._onednn_probe.cache_clear()
        with host.use(host.Host(onednn=False)):
            exact_tf_kernels(monkeypatch, tf.bfloat16, fail=True)
            assert tf_rules.tf_cpu_onednn(kernel, "bfloat16", False, fmt) is False
    finally:
        tf_rules._onednn_probe.cache_clear()


def _conv3d_tf_rows(**kwargs):
    e = tfbigconv.explain((2, 8, 12, 12, 8), kwargs.pop("w", (3, 3, 3, 8, 8)), padding="SAME",
                          **kwargs)
    return e, [r for r in e.rows if r.algorithm.startswith("tf")]


def test_conv3d_rules_with_onednn():
    """Where TF runs oneDNN, Conv3D is trusted in every pass and dtype and takes
    dilations and NCDHW (auto then picks it for a small filter), but never groups."""
    with onednn_host():
        for kwargs in ({}, dict(dilations=2, data_format="NCDHW"), dict(dtype="bfloat16")):
            e, rows = _conv3d_tf_rows(**kwargs)
            assert len(rows) == 3 and all(r.algorithm == "tf.Conv3D" and r.available
                                          for r in rows), rows
            assert set(e.chosen.values()) == {"tf.Conv3D"}, (kwargs, e.chosen)
        e, rows = _conv3d_tf_rows(w=(3, 3, 3, 2, 8))  # 4 groups
        assert all(not r.available and "groups" in r.note for r in rows)
        assert not any(c.startswith("tf") for c in e.chosen.values())


def test_conv3d_rules_without_onednn(eigen_tf):
    """TF's Eigen Conv3D: NDHWC without dilations only; auto never picks it in half
    precision (it accumulates in half), and in float32 only once timed fastest."""
    for kwargs in (dict(data_format="NCDHW"), dict(dilations=(1, 2, 1))):
        e, rows = _conv3d_tf_rows(**kwargs)
        assert all(not r.available and "NDHWC" in r.note for r in rows), kwargs
    e, rows = _conv3d_tf_rows(dtype="bfloat16")
    assert all(r.available and "half precision" in r.note for r in rows)
    assert not any(c.startswith("tf") for c in e.chosen.values())
    e, rows = _conv3d_tf_rows()
    assert all(r.available and "measured" in r.note for r in rows)
    assert not any(c.startswith("tf") for c in e.chosen.values())  # never timed here


def test_conv3d_onednn_check_runs_here():
    """The oneDNN check for Conv3D (a dilated NCDHW case in each dtype) agrees
    with what TF runs: where TF runs oneDNN it passes, else it fails."""
    with host.use(host.Host()):
        runs = tf_rules.tf_cpu_onednn("Conv3D", "float32", False)
    assert runs == bool(host.tf_onednn())


# (our op, TF's, input shape, filter shape, data_format, index of the batch and
# of the depth in strides and dilations). 1-D: only the channel entry, which
# tf.nn.conv1d passes to Conv2D's depth (its NWC batch entry lands on the height).
BATCH_DEPTH_OPS = [
    (tfbigconv.bigconv1d, tf.nn.conv1d, (1, 6, 2), (1, 2, 2), "NWC", (2,)),
    (tfbigconv.bigconv2d, tf.nn.conv2d, (1, 5, 6, 2), (1, 1, 2, 2), "NHWC", (0, 3)),
    (tfbigconv.bigconv2d, tf.nn.conv2d, (1, 2, 5, 6), (1, 1, 2, 2), "NCHW", (0, 1)),
    (tfbigconv.bigconv3d, tf.nn.conv3d, (1, 3, 4, 5, 2), (1, 1, 1, 2, 2), "NDHWC", (0, 4)),
    (tfbigconv.bigconv3d, tf.nn.conv3d, (1, 2, 3, 4, 5), (1, 1, 1, 2, 2), "NCDHW", (0, 1)),
]


def _raised(fn):
    try:
        fn()
    except (tf.errors.OpError, ValueError, TypeError) as e:
        return type(e)
    return None


@pytest.mark.parametrize("ours,theirs,x_shape,w_shape,fmt,where", BATCH_DEPTH_OPS,
                         ids=[case[4] for case in BATCH_DEPTH_OPS])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_strides_and_dilations_in_batch_or_depth_raise_tfs_class_here(
        ours, theirs, x_shape, w_shape, fmt, where, dtype):
    """Which class TF raises for them depends on the kernel that runs the dtype
    (oneDNN's or TF's own; tf_rules.tf_batch_depth_error): our ops raise what TF's
    op raises here, eagerly and in a tf.function, asked of TF's op itself."""
    x, w = tf.ones(x_shape, dtype), tf.ones(w_shape, dtype)
    for name in ("strides", "dilations"):
        for at in where:
            values = [1] * len(x_shape)
            values[at] = 2
            stride = "stride" if theirs is tf.nn.conv1d else "strides"  # conv1d's name
            kwargs = {stride: [1] * len(x_shape), "padding": "VALID", "data_format": fmt}
            kwargs[stride if name == "strides" else name] = values
            for run in (lambda f: f(), lambda f: tf.function(f)()):
                want = _raised(lambda: run(lambda: theirs(x, w, **kwargs)))
                got = _raised(lambda: run(lambda: ours(x, w, **kwargs)))
                assert want is not None and got is want, (name, values, want, got)


def test_tf_216_onednn_depthwise_kernel_is_never_for_auto(onednn_tf, model, monkeypatch):
    """TF 2.16's oneDNN depthwise kernel aborted the process on large filters
    (scripts/tf_matrix.sh): there auto never picks it, for any pass, even where
    the model makes it 1000x faster; from TF 2.17 on the same case runs it."""
    model("tf_depthwise_flops_per_second", 1000)  # both rate tables
    model("tf_depthwise_multiplier_flops_per_second", 1000)
    tf_dw = "tf.DepthwiseConv2dNative"
    shapes = ((2, 30, 30, 16), (15, 15, 1, 16))
    e = tfbigconv.explain(*shapes, padding="SAME")
    assert tf_dw in e.chosen.values(), e.reasons  # the case auto gives TF's kernel here
    monkeypatch.setattr(tf_rules, "tf_version", lambda: (2, 16))
    e = tfbigconv.explain(*shapes, padding="VALID")  # a new case: nothing cached
    rows = [r for r in e.rows if r.algorithm == tf_dw]
    assert rows and all("TF 2.16" in r.note for r in rows), rows
    assert tf_dw not in e.chosen.values(), e.chosen
