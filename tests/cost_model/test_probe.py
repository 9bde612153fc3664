"""The shipped profile scaled to this host (tfbigconv/cost_model/probe.py):
which constants each measured ratio moves, the estimates moving by exactly
that ratio, and, in fresh processes, the probe running once on a host unlike
the profile's, its cache being loaded next time without timing, and neither
happening where it is turned off or does not apply."""
import json

import pytest

from tfbigconv import _core, host
from tfbigconv.cost_model import probe, profiles
from conftest import TESTS_DIR, run_python

ATTRS = dict(strides=[1, 1, 1, 1], explicit_paddings=[], data_format="NHWC",
             dilations=[1, 1, 1, 1])
RATIOS = {"direct": 0.5, "fft": 2.0, "Conv2D": 0.25, "DepthwiseConv2dNative": 3.0,
          "Conv2D.forward.float16": 0.4, "DepthwiseConv2dNative.backprop_filter.bfloat16": 5.0}


def base():
    return dict(zip(_core.cost_model_fields(), profiles.read_profile(profiles.SHIPPED_PATH)))


def test_the_direct_kernels_two_probes_scale_its_compute_rate_and_the_rest_apart():
    values = base()
    scaled = probe.scale(values, dict(RATIOS, direct_depthwise=4.0))
    assert scaled["direct_flops_per_second"] == pytest.approx(values["direct_flops_per_second"] / 0.5)
    assert scaled["direct_load_bound_flops_per_second"] == pytest.approx(
        values["direct_load_bound_flops_per_second"] / 4.0)
    for name in ("direct_seconds_per_output", "direct_seconds_per_packed", "direct_seconds_per_call"):
        assert scaled[name] == pytest.approx(values[name] * 4.0)


def test_scale_moves_each_group_by_its_ratio():
    values = base()
    scaled = probe.scale(values, RATIOS)
    for name, v in values.items():
        got = scaled[name]
        if name in ("direct_flops_per_second", "direct_load_bound_flops_per_second"):
            assert got == pytest.approx(v / 0.5)
        elif name.startswith("direct_"):
            assert got == pytest.approx(v * 0.5)
        elif name.startswith("fft_"):
            assert got == pytest.approx(v * 2.0)
        elif name.startswith("im2col_flops_per_second."):
            assert got == pytest.approx(v / 0.25)
        elif name.startswith((profiles.DEPTHWISE_TABLE, profiles.MULTIPLIER_TABLE)):
            assert got == pytest.approx(v / 3.0)
        elif name == "im2col_dtype_slowdown.forward.float16":
            assert got == pytest.approx(v * 0.4)
        elif name == "tf_depthwise_dtype_slowdown.backprop_filter.bfloat16":
            assert got == pytest.approx(v * 5.0)
        else:  # GPU, channel blocks, slowdowns without a ratio
            assert got == v, name


@pytest.mark.parametrize("algorithm,kernel,dtype,x,w,ratio", [
    ("direct", "", "float32", (2, 40, 40, 8), (9, 9, 8, 8), 0.5),
    ("fft", "", "float32", (2, 64, 64, 4), (31, 31, 4, 4), 2.0),
    ("tf", "Conv2D", "float32", (2, 40, 40, 8), (5, 5, 8, 8), 0.25),
    ("tf", "Conv2D", "float16", (2, 40, 40, 8), (5, 5, 8, 8), 0.25 * 0.4),
    ("tf", "DepthwiseConv2dNative", "float32", (2, 40, 40, 16), (7, 7, 1, 16), 3.0),
    ("tf", "DepthwiseConv2dNative", "bfloat16", (2, 40, 40, 16), (7, 7, 1, 16), 15.0),
])
@pytest.mark.parametrize("pass_", ["forward", "backprop_filter"])
def test_a_ratio_moves_the_estimates_by_itself(algorithm, kernel, dtype, x, w, ratio, pass_):
    """A group's estimates, every pass, become `ratio` times longer; a
    half-precision slowdown's ratio moves its own pass only."""
    if dtype != "float32" and f"{kernel}.{pass_}.{dtype}" not in RATIOS:
        ratio = {"Conv2D": 0.25, "DepthwiseConv2dNative": 3.0}[kernel]

    def estimate(values):
        active = _core.get_cost_model()
        try:
            _core.set_cost_model([values[n] for n in _core.cost_model_fields()])
            p = _core.plan_pass(list(x), list(w), padding="SAME", pass_=pass_, dtype=dtype,
                                device="CPU", algorithm=algorithm, workspace_limit=0,
                                workers=host.current().threads(), tf_kernel=kernel,
                                **ATTRS)
        finally:
            _core.set_cost_model(active)
        return getattr(p, algorithm).seconds

    values = base()
    assert estimate(probe.scale(values, RATIOS)) == pytest.approx(ratio * estimate(values),
                                                                  rel=1e-6)


def test_how_fitted_says_where_the_profile_came_from():
    meta = {"created": "2026-01-01", "scaled_from": {"path": "p.json", "created": "x"},
            "probe": {"direct": 0.5, "fft": 1.25, "Conv2D.forward.float16": 3.0}}
    line = profiles.how_fitted(meta)
    assert "p.json scaled to this host" in line and "direct x0.50" in line and "fft x1.25" in line
    assert "1 half-precision slowdowns" in line and "x3.00" not in line
    assert "calibrated on m" in profiles.how_fitted({"created": "2026", "machine": "m"})
    assert profiles.how_fitted({}) == ""


# A host unlike the profile's: the active profile's CPU made another one, so
# that the probe applies wherever the suite runs (including on the host the
# shipped profile was measured on).
PRETEND_OTHER_HOST = """
    import os, json, time
    import tfbigconv
    from tfbigconv.cost_model import probe, profiles
    if os.environ.get("PRETEND_OTHER_HOST") == "1" and profiles.active_source == "shipped":
        profiles.active_meta = dict(profiles.active_meta, cpu={"name": "another CPU", "isa": [],
                                                               "cpus": 1})
    source_at_import = profiles.active_source
    t0 = time.perf_counter()
    e = tfbigconv.explain([2, 32, 32, 8], [9, 9, 8, 8], padding="SAME")
    print(json.dumps({"at_import": source_at_import, "source": profiles.active_source,
                      "path": profiles.active_path, "table": e.table(),
                      "fit": e.cost_model_fit, "seconds": time.perf_counter() - t0}))
"""


def _run(cache, **env):
    env = {"XDG_CACHE_HOME": str(cache), "TFBIGCONV_PROBE": "1", **env}
    return json.loads(run_python(PRETEND_OTHER_HOST, TESTS_DIR, env).strip().splitlines()[-1])


def test_a_host_unlike_the_profile_is_probed_once_and_the_result_cached(tmp_path):
    first = _run(tmp_path, PRETEND_OTHER_HOST="1")
    path = tmp_path / "tfbigconv" / "cost_model_scaled.json"
    assert first["at_import"] == "shipped" and first["source"] == "scaled"
    assert first["path"] == str(path) and path.exists()
    assert "scaled to this host" in first["fit"] and "cost model: scaled" in first["table"]
    doc = json.loads(path.read_text())
    meta = doc["meta"]
    assert set(meta["probe"]) >= {"direct", "fft", "Conv2D", "DepthwiseConv2dNative"}
    assert all(1 / probe.MAX_RATIO <= r <= probe.MAX_RATIO for r in meta["probe"].values())
    assert meta["probe_seconds"] < 10  # about a second here; a loaded CI host is slower
    assert profiles.machine_mismatch(meta) == ""  # it records this machine
    # Its values are the shipped profile's, scaled (both read the same way); the
    # GPU values are not its own: they are the main profile's when read.
    assert doc["values"] and not any(profiles.is_gpu_field(n) for n in doc["values"])
    values, _ = profiles.read_profile_and_meta(str(path), base())
    shipped_path = profiles.shipped_for_host()
    shipped, _ = profiles.read_profile_and_meta(shipped_path, base())
    fields = _core.cost_model_fields()
    expected = probe.scale(dict(zip(fields, shipped)), meta["probe"])
    assert values == pytest.approx([expected[n] for n in fields], rel=1e-9)
    # The next processes load it at import and probe again until PROBE_RUNS
    # have: each probe's time is the fastest so far, and the values are the
    # shipped profile scaled by the ratios of those times.
    times = meta["probe_ms"]
    for run in range(2, probe.PROBE_RUNS + 1):
        again = _run(tmp_path, PRETEND_OTHER_HOST="0")
        assert again["at_import"] == "scaled" and again["source"] == "scaled"
        doc = json.loads(path.read_text())
        meta = doc["meta"]
        assert meta["probe_runs"] == run
        assert all(meta["probe_ms"][k] <= t for k, t in times.items() if k in meta["probe_ms"])
        times = meta["probe_ms"]
        values, _ = profiles.read_profile_and_meta(str(path), base())
        expected = probe.scale(dict(zip(fields, shipped)), meta["probe"])
        assert values == pytest.approx([expected[n] for n in fields], rel=1e-9)
    # Then a process loads it at import and times nothing.
    mtime = path.stat().st_mtime_ns
    second = _run(tmp_path, PRETEND_OTHER_HOST="0")
    assert second["at_import"] == "scaled" and second["path"] == str(path)
    assert path.stat().st_mtime_ns == mtime
    # A cache written with GPU values (an older fit's) plans the GPU with the main
    # profile's as they are now.
    stale = dict(doc, values=dict(doc["values"], **{n: 1.5 * v for n, v in base().items()
                                                    if profiles.is_gpu_field(n)}))
    path.write_text(json.dumps(stale))
    code = ("import json, tfbigconv\nfrom tfbigconv import _core\nfrom tfbigconv.cost_model "
            "import profiles\nprint(json.dumps([profiles.active_source, "
            "dict(zip(_core.cost_model_fields(), _core.get_cost_model()))]))")
    source, applied = json.loads(run_python(code, TESTS_DIR, {
        "XDG_CACHE_HOME": str(tmp_path), "TFBIGCONV_PROBE": "1"}).strip().splitlines()[-1])
    assert source == "scaled"
    assert {n: v for n, v in applied.items() if profiles.is_gpu_field(n)} == pytest.approx(
        {n: v for n, v in base().items() if profiles.is_gpu_field(n)}, rel=1e-12)
    # A cache scaled from another shipped profile, or on another machine, is not used.
    for changed in (dict(meta, scaled_from={"path": "other.json", "created": "x"}),
                    dict(meta, cpu={"name": "another CPU", "isa": [], "cpus": 1})):
        path.write_text(json.dumps(dict(doc, meta=changed)))
        assert _run(tmp_path, PRETEND_OTHER_HOST="0")["at_import"] == "shipped"


def test_no_probe_where_turned_off_or_calibrated(tmp_path):
    off = _run(tmp_path / "off", PRETEND_OTHER_HOST="1", TFBIGCONV_PROBE="0")
    assert off["source"] == "shipped"
    assert not (tmp_path / "off" / "tfbigconv" / "cost_model_scaled.json").exists()
    # A profile named by TFBIGCONV_COST_MODEL (or the user's own) is never scaled.
    env = _run(tmp_path / "env", PRETEND_OTHER_HOST="1",
               TFBIGCONV_COST_MODEL=profiles.SHIPPED_PATH)
    assert env["source"] == "env"
    assert not (tmp_path / "env" / "tfbigconv" / "cost_model_scaled.json").exists()


def test_a_failed_probe_leaves_the_shipped_profile(tmp_path):
    code = PRETEND_OTHER_HOST.replace(
        "source_at_import = profiles.active_source",
        "source_at_import = profiles.active_source\n"
        "    probe._estimate = lambda *a: (_ for _ in ()).throw(RuntimeError('broken'))")
    out = json.loads(run_python(code, TESTS_DIR, {"XDG_CACHE_HOME": str(tmp_path),
                                                   "TFBIGCONV_PROBE": "1",
                                                   "PRETEND_OTHER_HOST": "1"}).splitlines()[-1])
    assert out["source"] == "shipped" and "cost model:" in out["table"]
    assert not (tmp_path / "tfbigconv" / "cost_model_scaled.json").exists()


def test_a_failed_probe_of_a_later_process_leaves_the_scaled_profile(tmp_path):
    """A later process's probe switches to the shipped profile to divide by its
    estimates; when it fails, the cached scaled profile plans, as before."""
    first = _run(tmp_path, PRETEND_OTHER_HOST="1")
    path = tmp_path / "tfbigconv" / "cost_model_scaled.json"
    assert first["source"] == "scaled"
    written = path.read_text()
    code = PRETEND_OTHER_HOST.replace(
        "source_at_import = profiles.active_source",
        "source_at_import = profiles.active_source\n"
        "    probe._estimate = lambda *a, **k: (_ for _ in ()).throw(RuntimeError('broken'))")
    out = json.loads(run_python(code, TESTS_DIR, {"XDG_CACHE_HOME": str(tmp_path),
                                                   "TFBIGCONV_PROBE": "1"}).splitlines()[-1])
    assert out["at_import"] == "scaled" and out["source"] == "scaled"
    rows = lambda table: [line for line in table.splitlines() if line.startswith("|")]  # noqa: E731
    assert rows(out["table"]) == rows(first["table"])  # the cached profile's estimates
    assert path.read_text() == written


def test_fit_recovers_known_ratios_from_timings(tmp_path, monkeypatch):
    """fit() on synthetic timings: the direct kernel's depthwise layer at 0.5x
    its estimate, the compute part of its dense layer at 2x (the rest as the
    depthwise layer scaled it), every other float32 group at 3x, and the half
    types' slowdowns at 0.25x the profile's: those are the ratios it finds and
    the profile it writes and applies."""
    from tfbigconv import _native
    active = (_core.get_cost_model(), profiles.active_source, profiles.active_path,
              profiles.active_meta)
    values = dict(zip(_core.cost_model_fields(), active[0]))

    def synthetic(probe_case):
        group, pass_, x, w, dtype = probe_case
        if (x, w) in [(px, pw) for _, px, pw in probe.SLOWDOWN_PROBES]:
            float32 = 1e-3 * (1 + probe.PASSES.index(pass_))  # any times will do
            if dtype == "float32":
                return float32
            return float32 * values[probe._slowdown_field(group, pass_, dtype)] * 0.25
        if group == "direct_depthwise":
            return 0.5 * probe._estimate(group, x, w, dtype)
        if group == "direct":
            terms = probe._estimate(group, x, w, dtype, terms=True)
            return 2.0 * terms[0] + 0.5 * sum(terms[1:])
        return 3.0 * probe._estimate(group, x, w, dtype)

    class Call:  # what _call returns: a callable, here one that remembers its probe
        def __init__(self, case):
            self.case = case

        def __call__(self):
            pass

    monkeypatch.setattr(probe, "_call", lambda *case: Call(case))
    monkeypatch.setattr(probe, "_time", lambda call, spent_s: synthetic(call.case))
    try:
        ratios = probe.fit(str(tmp_path / "scaled.json"))
        assert profiles.active_source == "scaled"
        applied = dict(zip(_core.cost_model_fields(), _core.get_cost_model()))
    finally:
        profiles.apply(active[0], _native.LIB_PATH)
        profiles.set_active(*active[1:])
    expected = {"direct_depthwise": 0.5, "direct": 2.0, "fft": 3.0, "Conv2D": 3.0,
                "DepthwiseConv2dNative": 3.0}
    expected.update({f"{k}.{p}.{d}": 0.25 for k in ("Conv2D", "DepthwiseConv2dNative")
                     for p in probe.PASSES for d in probe.HALF_TYPES})
    assert ratios == pytest.approx(expected, rel=1e-9)
    scaled = probe.scale(values, ratios)
    assert [applied[n] for n in applied] == pytest.approx([scaled[n] for n in applied], rel=1e-12)
    written, meta = profiles.read_profile_and_meta(str(tmp_path / "scaled.json"), base())
    assert written == pytest.approx([scaled[n] for n in _core.cost_model_fields()], rel=1e-12)
    assert meta["probe"] == pytest.approx(expected, rel=1e-9)


def test_probes_past_the_budget_are_not_run(tmp_path, monkeypatch):
    """Once the probes have spent BUDGET_S, the rest are not run: their ratios
    are left out, and the constants they would scale stay the profile's."""
    from tfbigconv import _native
    active = (_core.get_cost_model(), profiles.active_source, profiles.active_path,
              profiles.active_meta)
    ran = []
    monkeypatch.setattr(probe, "BUDGET_S", 0.0)
    monkeypatch.setattr(probe, "_call", lambda *case: ran.append(case))
    try:
        ratios = probe.fit(str(tmp_path / "scaled.json"))
        applied = _core.get_cost_model()
    finally:
        profiles.apply(active[0], _native.LIB_PATH)
        profiles.set_active(*active[1:])
    assert ran == [] and ratios == {}
    assert applied == pytest.approx(active[0], rel=1e-12)


@pytest.mark.parametrize("x,w", [((8, 64, 64, 32), (7, 7, 32, 32)), ((8, 56, 56, 128), (7, 7, 1, 128))])
def test_the_direct_models_terms_add_up_to_its_estimate(x, w):
    """profiles.DIRECT_TERMS names the direct model's terms in plan_pass's order:
    the terms, each times its coefficient, add up to the estimate."""
    terms = probe._estimate("direct", x, w, "float32", terms=True)
    assert len(terms) == len(profiles.DIRECT_TERMS)
    assert sum(terms) == pytest.approx(probe._estimate("direct", x, w, "float32"), rel=1e-12)
