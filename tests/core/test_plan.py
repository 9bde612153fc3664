"""The planner (plan.cc through _core.plan_pass): every candidate's estimate,
the budget, the choice and its reason, and the cost model's fields."""
import math

import pytest

from tfbigconv import _core

ATTRS = dict(strides=[1, 1, 1, 1], explicit_paddings=[], data_format="NHWC",
             dilations=[1, 1, 1, 1])
PASSES = ("forward", "backprop_input", "backprop_filter")
MIB = 1 << 20


def plan(x, w, pass_="forward", padding="SAME", algorithm="auto", limit=1 << 34,
         tf_kernel="Conv2D", dtype="float32", workers=3, device="CPU", trusted=True, note="",
         onednn=False, **attrs):
    return _core.plan_pass(list(x), list(w), padding=padding, pass_=pass_, dtype=dtype,
                           device=device, algorithm=algorithm, workspace_limit=limit,
                           workers=workers, tf_kernel=tf_kernel, tf_trusted=trusted,
                           tf_note=note, tf_onednn=onednn, **dict(ATTRS, **attrs))


CASES = [
    ((8, 64, 64, 16), (3, 3, 16, 16)),
    ((2, 96, 96, 1), (31, 31, 1, 3)),
    ((16, 321, 481, 1), (135, 135, 1, 3)),
    ((4, 56, 56, 32), (31, 31, 1, 32)),
    ((3, 37, 41, 6), (7, 5, 3, 4)),
]


@pytest.mark.parametrize("x,w", CASES)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("limit", [1 << 34, 64 * MIB, 6 * MIB])
def test_choice_fits_and_is_the_fastest_that_fits(x, w, pass_, limit):
    p = plan(x, w, pass_, limit=limit)
    assert p.limit == limit
    est = {a: getattr(p, a) for a in ("tf", "direct", "fft")}
    usable = {a: e for a, e in est.items() if e.available and e.fits}
    assert p.chosen in usable
    chosen = est[p.chosen]
    assert chosen.workspace_bytes <= limit
    assert chosen.seconds == min(e.seconds for e in usable.values())
    for a, e in est.items():
        assert math.isfinite(e.seconds) and e.peak_bytes >= e.workspace_bytes >= 0
        if e.available:
            assert e.fits == (e.workspace_bytes <= limit), a
    # The reason names the choice and every runner-up's estimate or why it is out.
    assert p.reason.startswith(f"auto: {p.chosen}")
    for a in est:
        assert a in p.reason


def test_small_filters_go_to_tf_and_huge_ones_to_fft():
    assert plan((8, 64, 64, 16), (3, 3, 16, 16)).chosen == "tf"
    for pass_ in PASSES:
        assert plan((16, 321, 481, 1), (135, 135, 1, 3), pass_, padding="VALID").chosen == "fft"


def test_estimates_grow_with_the_filter():
    prev = None
    for k in (3, 7, 15, 31, 63):
        p = plan((2, 128, 128, 8), (k, k, 8, 8))
        col_buffer = plan((2, 128, 128, 8), (k, k, 8, 8), "backprop_input").tf.workspace_bytes
        cur = (p.tf.seconds, p.direct.seconds, col_buffer)
        if prev:
            assert all(c > q for c, q in zip(cur, prev)), (k, cur, prev)
        prev = cur


def test_direct_estimate_has_a_compute_bound_and_a_load_bound_rate():
    """Column tiles of one or two output channels are load-bound: their flops
    go to the second term, per channel; wider tiles to the first."""
    dense = plan((4, 64, 64, 16), (7, 7, 16, 16), algorithm="direct").direct.terms
    one = plan((4, 64, 64, 16), (7, 7, 16, 1), algorithm="direct").direct.terms
    two = plan((4, 64, 64, 16), (7, 7, 16, 2), algorithm="direct").direct.terms
    assert dense[0] > 0 and dense[1] == 0
    assert one[0] == 0 and two[0] == 0
    # Same lanes and tasks: two channels do twice the flops at twice the rate.
    assert two[1] == pytest.approx(one[1], rel=1e-12)
    saved = _core.get_cost_model()
    seconds = lambda cout: plan((4, 64, 64, 16), (7, 7, 16, cout), algorithm="direct").direct.seconds
    before = {c: seconds(c) for c in (1, 16)}
    try:
        _core.set_cost_model(_scaled("direct_load_bound_flops_per_second", 0.5))
        rate = dict(zip(_core.cost_model_fields(), saved))["direct_load_bound_flops_per_second"]
        assert seconds(1) == pytest.approx(before[1] + one[1] / rate, rel=1e-9)
        assert seconds(16) == before[16]
    finally:
        _core.set_cost_model(saved)


def test_direct_estimate_counts_idle_workers_in_the_last_wave():
    """A filter gradient with a 9x9 output is one task: with 4 workers, 3 idle."""
    args = ((8, 160, 160, 1), (9, 9, 1, 3), "backprop_filter")
    one = plan(*args, algorithm="direct", workers=1).direct.terms
    four = plan(*args, algorithm="direct", workers=4).direct.terms
    assert four[0] == pytest.approx(4 * one[0], rel=1e-12)
    # The forward pass has 40 tasks: 10 waves of 4, none idle.
    one = plan(*args[:2], algorithm="direct", workers=1).direct.terms
    four = plan(*args[:2], algorithm="direct", workers=4).direct.terms
    assert four[0] == pytest.approx(one[0], rel=1e-12)


def test_fft_workspace_shrinks_with_the_limit_and_time_does_not_fall():
    x, w = (16, 321, 481, 1), (135, 135, 1, 3)
    last = None
    for limit in (1 << 34, 256 * MIB, 64 * MIB, 16 * MIB, 4 * MIB):
        f = plan(x, w, padding="VALID", algorithm="fft", limit=limit).fft
        assert f.fits and f.workspace_bytes <= limit
        if last:
            assert f.workspace_bytes <= last.workspace_bytes
            assert f.seconds >= last.seconds * 0.999
        last = f


@pytest.mark.parametrize("x,w,strides", [
    ((1, 321, 358, 128), (15, 15, 128, 64), [1, 1, 1, 1]),
    ((8, 321, 358, 16), (31, 31, 16, 64), [1, 1, 1, 1]),
    ((1, 321, 358, 64), (15, 15, 64, 64), [1, 2, 2, 1]),
])
def test_fft_memory_slack_does_not_compound(x, w, strides):
    # A plan chosen under a smaller limit also fits every larger one, so the
    # plan chosen there may cost at most the slack (10%) more. These cases
    # drifted to 1.3-2.7x when the slack was measured from the last plan taken.
    chosen = []
    for quarter_octave in range(8, 44):  # 4 MiB .. 2 GiB
        limit = int(2 ** (quarter_octave / 4) * MIB)
        try:
            p = _core.fft_plan(list(x), list(w), strides, "SAME", [], "NHWC", [1, 1, 1, 1],
                               "float32", limit, 2)
        except ValueError:  # below the minimum workspace
            continue
        for cost in chosen:
            assert p.cost <= 1.10 * cost * (1 + 1e-9), (limit, p.cost, cost)
        chosen.append(p.cost)
    assert len(chosen) > 20


def test_tf_is_out_when_unavailable_or_too_big():
    p = plan((8, 64, 64, 16), (3, 3, 16, 16), tf_kernel="", note="TF cannot")
    assert not p.tf.available and p.chosen != "tf"
    assert "tf unavailable" in p.reason and p.tf.note == "TF cannot"
    # One image's patch matrix: out_h * out_w * KH * KW * Cin floats.
    p = plan((2, 64, 64, 4), (9, 9, 4, 4), "backprop_input", limit=64 * 64 * 81 * 4 * 4 - 1)
    assert p.tf.workspace_bytes == 64 * 64 * 81 * 4 * 4
    assert not p.tf.fits and p.chosen != "tf"


def test_tf_gradient_col_buffer_holds_the_images_of_its_working_set():
    """TF's CPU gradient kernels fill their col_buffer with the patch matrices
    of as many images as fit a 32 MiB (filter) or 30 MiB (input) working set,
    at most the batch; the input gradient takes one image when one image's
    work per thread is over 256 KiB, or the batch is 1 (TfColBufferImages)."""
    x, w = (4, 48, 48, 3), (25, 25, 3, 2)  # VALID: 24x24 outputs
    one = 24 * 24 * 25 * 25 * 3 * 4       # one image's patch matrix, bytes
    p = {q: plan(x, w, q, padding="VALID").tf for q in PASSES}
    assert p["forward"].workspace_bytes == 0  # Eigen's forward: no patch matrix
    # Filter: a work unit of 24*24*1875 + 1875*2 + 24*24*2 elements, so
    # ceil(8 Mi / 1.08 M) = 8 images fit 32 MiB; the batch is 4.
    assert p["backprop_filter"].workspace_bytes == 4 * one
    # (after it, the note may say how the channel block widens the layer)
    assert p["backprop_filter"].note.split(";")[0] == "col_buffer of 4 images"
    # Input: 1.08 M elements / 2 threads is over 64 Ki floats (256 KiB).
    assert p["backprop_input"].workspace_bytes == one
    assert p["backprop_input"].note.split(";")[0] == "col_buffer of one image"
    assert plan((16,) + x[1:], w, "backprop_filter", padding="VALID").tf.workspace_bytes \
        == 8 * one
    # A small problem: the whole batch (a 10384-element work unit).
    small = 16 * 16 * 3 * 3 * 4 * 4
    for q in PASSES[1:]:
        assert plan((8, 16, 16, 4), (3, 3, 4, 4), q).tf.workspace_bytes == 8 * small
        assert plan((1, 16, 16, 4), (3, 3, 4, 4), q).tf.workspace_bytes == small
    # The estimate decides whether TF's kernel fits the limit.
    q = plan((8, 16, 16, 4), (3, 3, 4, 4), "backprop_filter", limit=8 * small - 1)
    assert not q.tf.fits and q.chosen != "tf"


def test_forced_algorithm_that_does_not_fit_states_the_minimum():
    x, w = (4, 200, 200, 1), (63, 63, 1, 3)
    with pytest.raises(RuntimeError, match=r"at least (\d+) bytes") as e:
        plan(x, w, algorithm="fft", limit=1024)
    minimum = int(e.value.args[0].split("at least ")[1].split()[0])
    assert plan(x, w, algorithm="fft", limit=minimum).chosen == "fft"
    with pytest.raises(RuntimeError, match="no algorithm fits"):
        plan(x, w, limit=1024, tf_kernel="")
    # A candidate that cannot run the case, or an unknown name, is a bad argument
    # (InvalidArgumentError in TensorFlow), not a lack of memory.
    with pytest.raises(ValueError, match="algorithm 'tf' is not available: no TF here"):
        plan(x, w, algorithm="tf", tf_kernel="", note="no TF here")
    with pytest.raises(ValueError, match="algorithm must be"):
        plan(x, w, algorithm="winograd")
    with pytest.raises(ValueError, match="algorithm must be"):
        plan(x, w, algorithm="im2col")  # the alias is Python's (arguments.requested_algorithm)


def test_forced_algorithms_are_obeyed():
    for a in ("tf", "direct", "fft"):
        p = plan((2, 64, 64, 4), (15, 15, 4, 4), algorithm=a)
        assert p.chosen == a and p.reason == f"{a} requested"


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="pass must be"):
        plan((1, 8, 8, 1), (3, 3, 1, 1), pass_="sideways")
    with pytest.raises(ValueError, match="dtype"):
        plan((1, 8, 8, 1), (3, 3, 1, 1), dtype="int8")
    with pytest.raises(ValueError, match="padding"):
        plan((1, 8, 8, 1), (3, 3, 1, 1), padding="FULL")


def test_cost_model_round_trip_and_validation():
    fields, values = _core.cost_model_fields(), _core.get_cost_model()
    assert len(fields) == len(values) == len(set(fields))
    try:
        faster = list(values)
        faster[fields.index("direct_flops_per_second")] *= 2
        _core.set_cost_model(faster)
        assert _core.get_cost_model() == faster
        bad = list(values)
        bad[fields.index("fft_seconds_per_transform_flop")] = float("nan")
        with pytest.raises(ValueError, match="fft_seconds_per_transform_flop"):
            _core.set_cost_model(bad)
        with pytest.raises(ValueError, match="needs"):
            _core.set_cost_model(values[:-1])
        assert _core.get_cost_model() == faster
    finally:
        _core.set_cost_model(values)


def test_the_model_moves_the_choice():
    """Making direct 1000x faster in the model makes auto pick it."""
    fields, values = _core.cost_model_fields(), _core.get_cost_model()
    x, w = (16, 321, 481, 1), (135, 135, 1, 3)
    try:
        assert plan(x, w, padding="VALID").chosen == "fft"
        fast = list(values)
        fast[fields.index("direct_flops_per_second")] *= 1000
        _core.set_cost_model(fast)
        assert plan(x, w, padding="VALID").chosen == "direct"
    finally:
        _core.set_cost_model(values)


def test_bad_device_and_tf_kernel_are_value_errors():
    with pytest.raises(ValueError, match="device"):
        plan((1, 8, 8, 1), (3, 3, 1, 1), device="TPU")
    with pytest.raises(ValueError, match="tf_kernel"):
        plan((1, 8, 8, 1), (3, 3, 1, 1), tf_kernel="Conv1D")


def test_depthwise_with_a_channel_multiplier_has_its_own_rates():
    """TF's depthwise kernels with a multiplier over 1 are estimated from their
    own table (oneDNN runs multiplier 1 only), in every pass; multiplier 1
    keeps its rates."""
    one = ((4, 32, 32, 16), (15, 15, 1, 16))
    two = ((4, 32, 32, 16), (15, 15, 1, 32))
    saved = _core.get_cost_model()
    try:
        for pass_ in PASSES:
            before = [plan(*c, pass_=pass_, tf_kernel="DepthwiseConv2dNative").tf.seconds
                      for c in (one, two)]
            _core.set_cost_model(_scaled("tf_depthwise_multiplier_flops_per_second", 0.01))
            after = [plan(*c, pass_=pass_, tf_kernel="DepthwiseConv2dNative").tf.seconds
                     for c in (one, two)]
            assert after[0] == before[0], pass_
            assert after[1] == pytest.approx(100 * before[1]), pass_
            _core.set_cost_model(saved)
    finally:
        _core.set_cost_model(saved)


def test_tf_rates_at_side_14_and_15_are_apart():
    """oneDNN's Conv2D filter gradient runs 100x slower from K = 15 than at 14:
    the table holds both sides, so a 15x15 filter's rate does not pull down a
    13x13 or 14x14 one (interpolated from 7 to 15, it did by 10-100x)."""
    saved = _core.get_cost_model()
    fields, values = _core.cost_model_fields(), _with_channel_block(1)  # the table alone
    for i, name in enumerate(fields):
        if name.startswith("im2col_flops_per_second.backprop_filter.side15"):
            values[i] = values[fields.index(name.replace("side15", "side14"))] / 100
    try:
        _core.set_cost_model(_with_channel_block(1))
        x = (4, 48, 48, 4)  # 4 x 4 channels: the table's channel16 column

        def rate(k):
            p = plan(x, (k, k, 4, 4), pass_="backprop_filter")
            return p.tf.terms[0] / p.tf.seconds
        before = {k: rate(k) for k in (13, 14, 15)}
        _core.set_cost_model(values)
        after = {k: rate(k) for k in (13, 14, 15)}
        assert after[13] == pytest.approx(before[13]) and after[14] == pytest.approx(before[14])
        assert after[15] == pytest.approx(before[14] / 100)
    finally:
        _core.set_cost_model(saved)


def test_half_types_filter_gradient_stops_below_the_float32_slow_path():
    """oneDNN's float32 filter gradient slows down from side 15; the half types
    run other code at one rate across sides (AMX bfloat16, float16 on the
    Xeon), so theirs take float32's rates below side 15 (times their slowdown)."""
    saved = _core.get_cost_model()
    fields, values = _core.cost_model_fields(), _with_channel_block(1)
    built_in = dict(zip(fields, _core.default_cost_model()))
    for i, name in enumerate(fields):
        if name.startswith("im2col_half_slow_path_side."):  # none: their one rate
            values[i] = built_in[name]
        if name.startswith("im2col_flops_per_second.backprop_filter.side15") or \
                name.startswith("im2col_flops_per_second.backprop_filter.side31"):
            values[i] = values[fields.index(name.replace("side15", "side14")
                                             .replace("side31", "side14"))] / 100
    try:
        _core.set_cost_model(values)
        x = (4, 48, 48, 4)

        def rate(k, dtype):
            p = plan(x, (k, k, 4, 4), pass_="backprop_filter", dtype=dtype)
            return p.tf.terms[0] / p.tf.seconds
        for dtype in ("bfloat16", "float16"):
            assert rate(15, dtype) == pytest.approx(rate(14, dtype))
            assert rate(21, dtype) == pytest.approx(rate(14, dtype))
        assert rate(15, "float32") == pytest.approx(rate(14, "float32") / 100)
        assert rate(15, "float64") == pytest.approx(rate(14, "float64") / 100)
        # From their own slow path's side (oneDNN's bfloat16 on Zen 4: 15), float32's
        # rate and time.
        values[fields.index("im2col_half_slow_path_side.bfloat16")] = 21
        _core.set_cost_model(values)
        assert rate(15, "bfloat16") == pytest.approx(rate(14, "bfloat16"))
        assert rate(21, "bfloat16") == pytest.approx(rate(21, "float32"))

        def seconds(dtype):
            return plan(x, (21, 21, 4, 4), pass_="backprop_filter", dtype=dtype).tf.seconds
        assert seconds("bfloat16") == pytest.approx(seconds("float32"))
        assert seconds("float16") != pytest.approx(seconds("float32"))
    finally:
        _core.set_cost_model(saved)


def test_tf_workspace_per_pass_and_host_kind():
    """TF's own (Eigen) kernels: no patch matrix forward, the col_buffer in both
    gradients; oneDNN's (tf_onednn): none in any pass (measured RSS growth, one
    321x481 frame by 135x135x1x3: Eigen +7.4 MiB, +4.41 GiB, +4.41 GiB; oneDNN
    +0, +3.7, +0.1 MiB; benchmarks/tf_workspace_rss.py)."""
    x, w = (1, 321, 481, 1), (135, 135, 1, 3)
    patch = 187 * 347 * 135 * 135 * 4
    eigen = [plan(x, w, p, padding="VALID").tf for p in PASSES]
    onednn = [plan(x, w, p, padding="VALID", onednn=True).tf for p in PASSES]
    assert [e.workspace_bytes for e in eigen] == [0, patch, patch]
    assert [e.workspace_bytes for e in onednn] == [0, 0, 0]
    assert [e.seconds for e in eigen] == [e.seconds for e in onednn]


def _with_channel_block(block, where="im2col_channel_block."):
    """The active model with TF's Conv2D channel block at `block` in the
    fields starting with `where` (all passes and sides by default)."""
    fields, values = _core.cost_model_fields(), list(_core.get_cost_model())
    for i, name in enumerate(fields):
        if name.startswith(where):
            values[i] = block
    return values


@pytest.mark.parametrize("kernel,prefix", [("Conv2D", "im2col_dtype_slowdown."),
                                           ("DepthwiseConv2dNative", "tf_depthwise_dtype_slowdown.")])
def test_tf_kernels_take_their_own_dtype_slowdown_per_pass(kernel, prefix):
    """TF's estimate in a dtype is float32's times that kernel's slowdown for
    that pass (oneDNN's bfloat16 depthwise runs at 0.5-1.4x float32's time, its
    Conv2D at 0.5x; Eigen's float16 Conv2D gradients at 5-30x, its forward 1-3x)."""
    x, w = ((4, 32, 32, 16), (7, 7, 1, 16)) if kernel != "Conv2D" else ((4, 32, 32, 16), (7, 7, 16, 16))
    fields = _core.cost_model_fields()
    saved = _core.get_cost_model()
    try:
        base = {p: plan(x, w, pass_=p, tf_kernel=kernel, dtype="bfloat16").tf.seconds
                for p in PASSES}
        values = list(saved)
        values[fields.index(prefix + "backprop_filter.bfloat16")] *= 4
        _core.set_cost_model(values)
        after = {p: plan(x, w, pass_=p, tf_kernel=kernel, dtype="bfloat16").tf.seconds
                 for p in PASSES}
        f32 = plan(x, w, pass_="backprop_filter", tf_kernel=kernel).tf.seconds
    finally:
        _core.set_cost_model(saved)
    assert after["backprop_filter"] == pytest.approx(4 * base["backprop_filter"])
    assert after["forward"] == base["forward"] and after["backprop_input"] == base["backprop_input"]
    slowdown = dict(zip(fields, saved))[prefix + "backprop_filter.bfloat16"]
    assert base["backprop_filter"] == pytest.approx(slowdown * f32)


@pytest.mark.parametrize("pass_", PASSES)
def test_tf_conv2d_runs_the_channels_it_writes_in_blocks(pass_):
    """oneDNN runs 1 to 16 written channels (forward and filter gradient:
    output; input gradient: input) in the time of 16: with a block of 16, a
    narrow dense layer is estimated as the layer with 16 (or the next multiple)
    and its note says so; with a block of 1 it is not; grouped layers never."""
    def layer(written, other=64):
        cin, cout = (written, other) if pass_ == "backprop_input" else (other, written)
        return (4, 40, 40, cin), (9, 9, cin, cout)

    def tf_estimate(written, **kw):
        return plan(*layer(written), pass_=pass_, **kw).tf

    saved = _core.get_cost_model()
    try:
        _core.set_cost_model(_with_channel_block(16))
        for narrow, full in ((1, 16), (3, 16), (16, 16), (20, 32)):
            e = tf_estimate(narrow)
            assert e.seconds == pytest.approx(tf_estimate(full).seconds), narrow
            assert (f"channels run as {full}" in e.note) == (narrow != full), e.note
        grouped = ((4, 40, 40, 64), (9, 9, 16, 4))  # 4 groups of 16 -> 1
        assert "run as" not in plan(*grouped, pass_=pass_).tf.note
        blocked = plan(*grouped, pass_=pass_).tf.seconds
        _core.set_cost_model(_with_channel_block(1))
        assert tf_estimate(1).seconds < tf_estimate(16).seconds / 2
        assert "run as" not in tf_estimate(3).note
        assert plan(*grouped, pass_=pass_).tf.seconds == blocked
    finally:
        _core.set_cost_model(saved)


def test_channel_block_is_per_filter_side():
    """A side takes the block of the largest table side not above it: here the
    filter gradient has blocks of 16 up to side 14 and none from 15 (oneDNN's
    slow path from side 15 measured 2), the forward pass 16 everywhere."""
    saved = _core.get_cost_model()
    try:
        _core.set_cost_model(_with_channel_block(16))
        values = list(_core.get_cost_model())
        fields = _core.cost_model_fields()
        for side in (15, 31):
            values[fields.index(f"im2col_channel_block.backprop_filter.side{side}")] = 1
        _core.set_cost_model(values)

        def tf_seconds(k, cout, pass_="backprop_filter"):
            return plan((2, 48, 48, 8), (k, k, 8, cout), pass_=pass_).tf.seconds
        for k in (3, 9, 14):  # sides 3-14: blocks of 16
            assert tf_seconds(k, 1) == pytest.approx(tf_seconds(k, 16)), k
        for k in (15, 21, 40):  # from side 15: none
            assert tf_seconds(k, 1) < tf_seconds(k, 16) / 2, k
            assert tf_seconds(k, 1, "forward") == pytest.approx(tf_seconds(k, 16, "forward")), k
        # A non-square filter goes by the square root of its taps: 1x31 is side 5.6.
        assert plan((2, 48, 48, 8), (1, 31, 8, 1), pass_="backprop_filter").tf.seconds == \
            pytest.approx(plan((2, 48, 48, 8), (1, 31, 8, 16), pass_="backprop_filter").tf.seconds)
    finally:
        _core.set_cost_model(saved)


def test_channel_block_must_be_a_count():
    saved = _core.get_cost_model()
    try:
        for bad in (0.5, 0.0, 2048.0, float("inf")):
            with pytest.raises(ValueError, match="im2col_channel_block.forward"):
                _core.set_cost_model(_with_channel_block(bad))
        assert _core.get_cost_model() == saved
    finally:
        _core.set_cost_model(saved)


def _scaled(prefix, factor):
    """The active model with every field starting with `prefix` scaled."""
    fields, values = _core.cost_model_fields(), list(_core.get_cost_model())
    for i, name in enumerate(fields):
        if name.startswith(prefix):
            values[i] *= factor
    return values


def test_untrusted_tf_is_shown_but_never_chosen_on_its_estimate():
    """An untrusted TF estimate (grouped Conv2D on the CPU) that the model
    makes look free is still estimated and shown, but auto does not pick it on
    the estimate alone; a request for tf is obeyed."""
    saved = _core.get_cost_model()
    x, w = (2, 32, 32, 16), (9, 9, 2, 16)
    try:
        _core.set_cost_model(_scaled("im2col_flops_per_second", 1e6))
        trusted = plan(x, w)
        assert trusted.chosen == "tf"
        p = plan(x, w, trusted=False, note="untrusted here")
        assert p.chosen in ("direct", "fft")
        assert p.tf.available and p.tf.fits and p.tf.note == "untrusted here"
        assert p.tf.seconds == trusted.tf.seconds
        assert p.tf.seconds < min(p.direct.seconds, p.fft.seconds)
        assert "untrusted" in p.reason
        assert plan(x, w, algorithm="tf", trusted=False).chosen == "tf"
    finally:
        _core.set_cost_model(saved)


def test_depthwise_kernel_has_its_own_estimate():
    """DepthwiseConv2dNative is estimated with its own constants, without a
    patch matrix; Conv2D's estimate of the same grouped case is unchanged."""
    x, w = (4, 56, 56, 32), (31, 31, 1, 32)
    conv = plan(x, w, tf_kernel="Conv2D")
    dw = plan(x, w, tf_kernel="DepthwiseConv2dNative")
    assert conv.tf_kernel == "tf.Conv2D" and dw.tf_kernel == "tf.DepthwiseConv2dNative"
    conv_gradient = plan(x, w, "backprop_input", tf_kernel="Conv2D")
    assert dw.tf.workspace_bytes == 0 < conv_gradient.tf.workspace_bytes
    assert dw.tf.seconds != conv.tf.seconds
    assert "tf.DepthwiseConv2dNative" in dw.reason
    saved = _core.get_cost_model()
    try:
        _core.set_cost_model(_scaled("tf_depthwise_flops_per_second", 1e6))
        fast = plan(x, w, tf_kernel="DepthwiseConv2dNative")
        assert fast.tf.seconds == pytest.approx(dw.tf.seconds / 1e6)
        assert fast.chosen == "tf"
        assert plan(x, w, tf_kernel="Conv2D").tf.seconds == conv.tf.seconds
    finally:
        _core.set_cost_model(saved)



@pytest.mark.parametrize("x, w, padding, dil", [
    ((2, 13, 17, 6), (3, 5, 1, 12), "SAME", (3, 2)),
    ((1, 20, 19, 4), (3, 3, 1, 4), "VALID", (4, 3)),
    ((2, 15, 15, 4), (3, 3, 1, 8), "EXPLICIT", (2, 3)),
    ((2, 20, 21, 4), (3, 3, 1, 4), "SAME", (8, 8)),  # dilated side 17: its forward too
])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dilated_depthwise_kernels_count_their_space_to_batch_copies(x, w, padding, dil, dtype):
    """Where TF's depthwise kernel runs a dilated filter (as
    tf.nn.depthwise_conv2d does), each pass holds the padded input and the
    undilated output in the batch: sizes here from TF's own SpaceToBatchND.
    Undilated filters hold none."""
    import numpy as np
    import tensorflow as tf
    explicit = [0, 0, 1, 3, 2, 0, 0, 0] if padding == "EXPLICIT" else []
    base = {"VALID": [[0, 0], [0, 0]], "EXPLICIT": [[1, 3], [2, 0]]}.get(padding) or [
        [(k - 1) * d // 2, (k - 1) * d - (k - 1) * d // 2] for k, d in zip(w[:2], dil)]
    pads, _ = tf.required_space_to_batch_paddings(x[1:3], dil, base_paddings=base)
    xb = tf.space_to_batch_nd(tf.zeros(x), dil, pads)
    yb = tf.nn.depthwise_conv2d(xb, tf.zeros(w[:2] + (x[3], w[3] // x[3])), [1, 1, 1, 1], "VALID")
    want = (int(np.prod(xb.shape)) + int(np.prod(yb.shape))) * (4 if dtype == "float32" else 2)
    attrs = dict(dilations=[1, dil[0], dil[1], 1], explicit_paddings=explicit)
    for pass_ in PASSES:
        p = plan(x, w, pass_, padding, tf_kernel="DepthwiseConv2dNative", dtype=dtype, **attrs)
        assert p.tf.workspace_bytes == want, pass_
        undilated = plan(x, w, pass_, padding, tf_kernel="DepthwiseConv2dNative", dtype=dtype,
                         explicit_paddings=explicit)
        assert undilated.tf.workspace_bytes == 0
        assert plan(x, w, pass_, padding, tf_kernel="DepthwiseConv2dNative", dtype=dtype,
                    limit=want, **attrs).tf.fits
        try:  # one byte less: TF's kernel is out
            tight = plan(x, w, pass_, padding, tf_kernel="DepthwiseConv2dNative", dtype=dtype,
                         limit=want - 1, **attrs)
        except RuntimeError as e:  # and ours did not fit either
            assert "no algorithm fits" in str(e)
        else:
            assert not tight.tf.fits and tight.chosen != "tf"


@pytest.mark.parametrize("x,w", CASES)
@pytest.mark.parametrize("pass_", PASSES)
def test_gpu_plans_choose_the_fastest_gpu_estimate(x, w, pass_):
    """On the GPU: TF's kernel (cuDNN) has no modelled workspace, no
    trace-time limit unless one is given, and its own (GPU) estimates."""
    kernel = "DepthwiseConv2dNative" if w[2] == 1 and x[3] > 1 else "Conv2D"
    p = plan(x, w, pass_, device="GPU", limit=0, tf_kernel=kernel)
    assert p.device == "GPU" and p.limit >= 1 << 62
    assert p.tf.workspace_bytes == 0 and p.tf_kernel == "tf." + kernel
    est = {a: getattr(p, a) for a in ("tf", "direct", "fft")}
    assert all(e.available and e.fits and e.seconds > 0 for e in est.values())
    assert est[p.chosen].seconds == min(e.seconds for e in est.values())
    cpu = plan(x, w, pass_, tf_kernel=kernel)
    assert p.direct.seconds != cpu.direct.seconds
    # The GPU kernels' own choice needs no thread count.
    assert summary(plan(x, w, pass_, device="GPU", limit=0, tf_kernel=kernel, workers=9)) \
        == summary(p)


def summary(p):
    """A PassPlan's choice and estimates, comparable."""
    return (p.pass_, p.device, p.limit, p.tf_kernel, p.chosen, p.reason,
            [(e.available, e.fits, e.seconds, e.workspace_bytes, e.peak_bytes, e.note, e.terms)
             for e in (p.tf, p.direct, p.fft)])


def test_gpu_fft_that_does_not_fit_states_the_minimum():
    x, w = (16, 321, 481, 1), (135, 135, 1, 3)
    with pytest.raises(RuntimeError, match="at least"):
        plan(x, w, padding="VALID", algorithm="fft", device="GPU", limit=1024)
    p = plan(x, w, padding="VALID", device="GPU", limit=1024)
    assert not p.fft.fits and p.chosen != "fft"
