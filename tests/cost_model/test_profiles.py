"""The cost model's profiles (tfbigconv/cost_model/profiles.py): which one is
active and whether it suits this machine (machine_mismatch, shipped_for), the
shipped profiles, reading profiles written before a field existed (each keeps
its own model), and corrupt profiles, which are refused (at import: ignored
with a warning)."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from tfbigconv import _core, host
from tfbigconv.cost_model import profiles
from conftest import TESTS_DIR


def shipped():
    return dict(zip(_core.cost_model_fields(), profiles.read_profile(profiles.SHIPPED_PATH)))


# ---- which profile, and whether it suits this machine ------------------------

def test_machine_mismatch_names_what_differs():
    here = profiles.this_cpu()
    assert here["cpus"] == os.cpu_count() and set(here["isa"]) <= set(profiles.ISA_FLAGS)
    meta = {"cpu": dict(here), "tensorflow": tf.__version__, "machine": "m"}
    assert profiles.machine_mismatch(meta) == ""
    other = dict(here, isa=sorted(set(here["isa"]) ^ {"avx512f"}))
    why = profiles.machine_mismatch(dict(meta, cpu=other))
    assert "avx512f" in why and here["name"] in why
    assert "CPUs" in profiles.machine_mismatch(dict(meta, cpu=dict(here, cpus=here["cpus"] + 1)))
    assert "TensorFlow 1.0" in profiles.machine_mismatch(dict(meta, tensorflow="1.0"))
    assert "does not record its CPU" in profiles.machine_mismatch({"machine": "m"})
    assert "built-in" in profiles.machine_mismatch({})
    assert "machine is" in profiles.machine_mismatch(dict(meta, cpu={"isa": 5}))  # no crash
    # TF's oneDNN kernels, on or off (TF_ENABLE_ONEDNN_OPTS), are other code.
    here_dnn = host.tf_onednn()
    assert isinstance(here_dnn, bool)
    assert profiles.machine_mismatch(dict(meta, tf_onednn=here_dnn)) == ""
    why = profiles.machine_mismatch(dict(meta, tf_onednn=not here_dnn))
    assert "oneDNN " + ("off" if here_dnn else "on") in why and "TF_ENABLE_ONEDNN_OPTS" in why
    assert profiles.machine_mismatch(dict(meta, tf_onednn="yes")) == ""  # malformed: ignored


def test_the_shipped_profile_for_a_machine(tmp_path):
    """shipped_for: the same oneDNN setting first, then the same ISA; the main
    profile on a tie; an unreadable profile is passed over."""
    def profile(name, isa, onednn):
        path = tmp_path / name
        path.write_text(json.dumps({"meta": {"format": 1, "tf_onednn": onednn,
                                             "cpu": {"name": name, "isa": isa, "cpus": 2}},
                                    "values": {}}))
        return str(path)
    main = profile("main", ["avx2", "fma"], False)
    avx512 = profile("avx512", ["avx2", "avx512f", "fma"], True)
    broken = tmp_path / "broken"
    broken.write_text("{")
    paths = (main, avx512, str(broken))
    zen3, zen4 = {"isa": ["fma", "avx2"]}, {"isa": ["avx2", "fma", "avx512f"]}
    assert profiles.shipped_for(zen3, False, paths) == main
    assert profiles.shipped_for(zen4, True, paths) == avx512
    assert profiles.shipped_for(zen3, True, paths) == avx512  # TF's kernels decide more
    assert profiles.shipped_for(zen4, False, paths) == main
    assert profiles.shipped_for({"isa": ["avx512f"]}, None, paths) == main  # a tie
    assert profiles.shipped_for(zen4, True, (main, str(broken))) == main


def test_shipped_cpu_profiles_hold_cpu_values_of_another_kind_of_host():
    """Each CPU-only profile is valid with the main one's GPU values, holds no
    GPU values of its own (one GPU fit), and is picked on the host it was
    measured on, not on the main profile's."""
    main_meta = profiles.read_profile_and_meta(profiles.SHIPPED_PATH)[1]
    assert profiles.SHIPPED_CPU_PATHS, "no CPU-only profile shipped"
    for path in profiles.SHIPPED_CPU_PATHS:
        with open(path) as f:
            doc = json.load(f)
        assert not any(k.startswith("gpu.") for k in doc["values"]), path
        values, meta = profiles.read_profile_and_meta(path, profiles.shipped_values())
        gpu = [i for i, n in enumerate(_core.cost_model_fields()) if n.startswith("gpu.")]
        assert [values[i] for i in gpu] == [profiles.shipped_values()[n] for n in
                                            np.array(_core.cost_model_fields())[gpu]]
        assert (meta["tf_onednn"], sorted(meta["cpu"]["isa"])) != (
            main_meta["tf_onednn"], sorted(main_meta["cpu"]["isa"]))
        assert profiles.shipped_for(meta["cpu"], meta["tf_onednn"]) == path
    assert profiles.shipped_for(main_meta["cpu"], main_meta["tf_onednn"]) == \
        profiles.SHIPPED_PATH
    # explain() names the file the constants came from.
    e = tfbigconv.explain((2, 20, 20, 3), (5, 5, 3, 4), padding="SAME")
    assert f"cost model: {profiles.active_source} ({os.path.basename(profiles.active_path)})" \
        in e.table()


# ---- profiles from before a field existed keep their model -------------------

def test_read_profile_fills_missing_fields_from_defaults(tmp_path):
    truth = shipped()
    gpu_only = {k: v for k, v in truth.items() if k.startswith("gpu.")}
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"meta": {"format": 1}, "values": gpu_only}))
    with pytest.raises(ValueError, match="lacks"):
        profiles.read_profile(str(path))
    defaults = dict(truth, direct_flops_per_second=9e10)
    values = dict(zip(_core.cost_model_fields(), profiles.read_profile(str(path), defaults)))
    assert values["direct_flops_per_second"] == 9e10
    assert all(values[k] == v for k, v in gpu_only.items())


def test_a_profile_from_before_the_load_bound_rate_keeps_its_model(tmp_path):
    """Such a profile ran one-channel column tiles at 0.3 of its direct rate;
    reading it restores that, whatever the defaults say."""
    old = {k: v for k, v in shipped().items() if k != "direct_load_bound_flops_per_second"}
    old["direct_flops_per_second"] = 4e11
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"meta": {"format": 1}, "values": old}))
    for defaults in (None, shipped()):
        values = dict(zip(_core.cost_model_fields(), profiles.read_profile(str(path), defaults)))
        assert values["direct_load_bound_flops_per_second"] == pytest.approx(1.2e11, rel=1e-12)
    # A profile that names the rate keeps it.
    old["direct_load_bound_flops_per_second"] = 7e10
    path.write_text(json.dumps({"meta": {"format": 1}, "values": old}))
    values = dict(zip(_core.cost_model_fields(), profiles.read_profile(str(path))))
    assert values["direct_load_bound_flops_per_second"] == 7e10


def test_a_profile_from_before_the_depthwise_multiplier_table_keeps_its_model(tmp_path):
    """Such a profile estimated multipliers over 1 with its multiplier-1 rates:
    reading it copies them, whatever the defaults say."""
    old = {k: v for k, v in shipped().items()
           if not k.startswith(profiles.MULTIPLIER_TABLE)}
    old["tf_depthwise_flops_per_second.forward.side7"] = 3.5e10
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"meta": {"format": 1}, "values": old}))
    defaults = dict(shipped(), **{profiles.MULTIPLIER_TABLE + "forward.side7": 1e9})
    for d in (None, defaults):
        values = dict(zip(_core.cost_model_fields(), profiles.read_profile(str(path), d)))
        for name in _core.cost_model_fields():
            if name.startswith(profiles.MULTIPLIER_TABLE):
                one = profiles.DEPTHWISE_TABLE + name[len(profiles.MULTIPLIER_TABLE):]
                assert values[name] == old[one], name
    # A profile that has the table keeps it.
    old[profiles.MULTIPLIER_TABLE + "forward.side7"] = 2e9
    path.write_text(json.dumps({"meta": {"format": 1}, "values": old}))
    values = dict(zip(_core.cost_model_fields(), profiles.read_profile(str(path), shipped())))
    assert values[profiles.MULTIPLIER_TABLE + "forward.side7"] == 2e9


def test_a_profile_from_before_side_14_keeps_its_model(tmp_path):
    """Such a profile interpolated TF's rates from side 7 to side 15; reading it
    puts its side-14 values on that line (log rate over log side), whatever the
    defaults say, so its estimates at sides 7-15 are the ones it gave."""
    old = {k: v for k, v in shipped().items() if ".side14" not in k}
    bpf = "im2col_flops_per_second.backprop_filter.side{}.channels16"
    old[bpf.format(15)] = old[bpf.format(7)] / 100  # a cliff, as oneDNN has
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"meta": {"format": 1}, "values": old}))
    t = math.log(14 / 7) / math.log(15 / 7)
    for d in (None, dict(shipped(), **{bpf.format(14): 1.0})):
        values = dict(zip(_core.cost_model_fields(), profiles.read_profile(str(path), d)))
        for name in _core.cost_model_fields():
            if ".side14" in name:
                lo, hi = (old[name.replace(".side14", f".side{s}")] for s in (7, 15))
                assert values[name] == pytest.approx(
                    math.exp(math.log(lo) * (1 - t) + math.log(hi) * t), rel=1e-12), name
    # A profile that has side 14 keeps it.
    old[bpf.format(14)] = 3e10
    path.write_text(json.dumps({"meta": {"format": 1}, "values": old}))
    values = dict(zip(_core.cost_model_fields(), profiles.read_profile(str(path), shipped())))
    assert values[bpf.format(14)] == 3e10


def test_a_profile_from_before_the_channel_block_keeps_its_model(tmp_path):
    """Such a profile modelled no channel blocking: reading it gives a block of
    1 in every pass, whatever the defaults say; a profile with the values keeps
    them, and a GPU-only profile takes them from the defaults."""
    old = {k: v for k, v in shipped().items() if not k.startswith(profiles.CHANNEL_BLOCK)}
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"meta": {"format": 1}, "values": old}))
    blocked = {k: (16.0 if k.startswith(profiles.CHANNEL_BLOCK) else v)
               for k, v in shipped().items()}
    blocks = lambda v: {k: x for k, x in v.items() if k.startswith(profiles.CHANNEL_BLOCK)}  # noqa: E731
    for d in (None, blocked):
        values = dict(zip(_core.cost_model_fields(), profiles.read_profile(str(path), d)))
        assert set(blocks(values).values()) == {1.0}
        assert len(blocks(values)) == 15  # 3 passes x 5 sides
    path.write_text(json.dumps({"meta": {"format": 1}, "values": blocked}))
    values = dict(zip(_core.cost_model_fields(), profiles.read_profile(str(path), shipped())))
    assert set(blocks(values).values()) == {16.0}
    gpu_only = {k: v for k, v in shipped().items() if k.startswith("gpu.")}
    path.write_text(json.dumps({"meta": {"format": 1}, "values": gpu_only}))
    values = dict(zip(_core.cost_model_fields(), profiles.read_profile(str(path), blocked)))
    assert set(blocks(values).values()) == {16.0}


def test_a_profile_from_before_the_per_pass_dtype_slowdowns_keeps_its_model(tmp_path):
    """Such a profile had one slowdown per dtype (TF's Conv2D forward), used for
    both TF kernels and every pass: reading it copies that value to all 18."""
    old = {k: v for k, v in shipped().items() if not k.startswith(profiles.DTYPE_SLOWDOWNS)}
    legacy = {"float16": 1.9, "bfloat16": 0.56, "float64": 3.8}
    old.update({profiles.LEGACY_DTYPE_SLOWDOWN + d: x for d, x in legacy.items()})
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"meta": {"format": 1}, "values": old}))
    values = dict(zip(_core.cost_model_fields(), profiles.read_profile(str(path), shipped())))
    slowdowns = {k: x for k, x in values.items() if k.startswith(profiles.DTYPE_SLOWDOWNS)}
    assert len(slowdowns) == 18  # 2 kernels x 3 passes x 3 dtypes
    assert all(x == legacy[k.rsplit(".", 1)[1]] for k, x in slowdowns.items()), slowdowns


def test_a_profile_from_before_the_half_slow_path_keeps_its_model(tmp_path):
    """Such a profile modelled no slow path of the half types' filter gradient:
    reading it, also without defaults, gives the built-in kNoSlowPathSide."""
    old = {k: v for k, v in shipped().items() if not k.startswith(profiles.HALF_SLOW_PATH)}
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"meta": {"format": 1}, "values": old}))
    values = dict(zip(_core.cost_model_fields(), profiles.read_profile(str(path))))
    built_in = dict(zip(_core.cost_model_fields(), _core.default_cost_model()))
    for dtype in profiles.HALF_TYPES:
        name = profiles.HALF_SLOW_PATH + dtype
        assert values[name] == built_in[name] > 1000  # beyond any filter side


# ---- corrupt profiles (issue 15's finding 4) ---------------------------------

@pytest.mark.parametrize("text", [
    '{"meta": [1], "values": {}}',
    '{"meta": {"format": 1}, "values": {"direct_flops_per_second": null}}',
    '{"meta": {"format": 1}, "values": {"direct_flops_per_second": {}}}',
    '{"meta": {"format": 1}, "values": {"direct_flops_per_second": 1' + "0" * 400 + '}}',
    '{"meta": {"format": 1}, "values": {"direct_flops_per_second": 1e400}}',
    '{"meta": {"format": 1}, "values": {"direct_flops_per_second": 1e-320}}',
    '{"meta": {"format": 1}, "values": {"direct_flops_per_second": true}}',
    '[1, 2]',
])
def test_corrupt_profile_is_rejected(tmp_path, text):
    path = tmp_path / "profile.json"
    path.write_text(text)
    with pytest.raises(ValueError):
        _core.set_cost_model(profiles.read_profile(str(path), profiles.shipped_values()))


def test_import_ignores_a_corrupt_profile(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text('{"meta": {"format": 1}, "values": {"direct_flops_per_second": 1e-320}}')
    r = subprocess.run([sys.executable, "-c", "import tfbigconv; "
                        "print(tfbigconv.cost_model.profiles.active_source)"],
                       capture_output=True, text=True, cwd=TESTS_DIR,
                       env=dict(os.environ, TFBIGCONV_COST_MODEL=str(path)))
    assert r.returncode == 0 and r.stdout.split()[-1] == "shipped", r.stderr[-2000:]
    assert "ignoring cost model" in r.stderr
