"""The planner's cost model: which calibration is active, and loading it.

The constants live in a JSON profile: {"meta": {...}, "values": {name: number}}
with the names of `_core.cost_model_fields()`. The package ships one measured
on the development machine (cost_model.json beside this file);
`python -m tfbigconv calibrate` writes a profile for this machine to the
user's cache directory, which then takes precedence. TFBIGCONV_COST_MODEL
names a profile file explicitly. Importing tfbigconv applies the profile to
both compiled modules (the TF op library and _core), so the trace-time
dispatcher and the ops' run-time "auto" use the same numbers.
"""
import ctypes
import functools
import glob
import json
import math
import os
import platform
import warnings

from tfbigconv import _core
from tfbigconv import host
from tfbigconv.host import tf_onednn

SHIPPED_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cost_model.json")
# CPU-only profiles shipped beside it, measured on other kinds of host
# (benchmarks/calibrate.py --cpu-only): shipped_for() picks the one that suits
# this machine; the GPU values are always SHIPPED_PATH's.
SHIPPED_CPU_PATHS = tuple(sorted(glob.glob(os.path.join(os.path.dirname(SHIPPED_PATH),
                                                        "cost_model_cpu_*.json"))))
FORMAT = 1
GPU_PREFIX = "gpu."  # the GPU model's values (the rest are the CPU's)


def is_gpu_field(name):
    return name.startswith(GPU_PREFIX)


# GPU model features added after the first GPU profiles (cost_model.h
# GpuModelTerms): a profile with GPU values but without these has them at 0.
LATER_GPU_FEATURES = ("log_side_squared", "log_side_x_log_pixels", "cudnn_depthwise_class")
# The name prefixes of TF's depthwise rates: multiplier 1, and over 1.
DEPTHWISE_TABLE = "tf_depthwise_flops_per_second."
MULTIPLIER_TABLE = "tf_depthwise_multiplier_flops_per_second."
# Filter sides added to TF's rate tables later, with the sides they lie between.
LATER_SIDES = {14: (7, 15)}
# TF's Conv2D channel block per pass and side, added later: 1 (no blocking) is the
# model a profile without it was fitted with.
CHANNEL_BLOCK = "im2col_channel_block."
# TF's kernels' dtype slowdowns per kernel and pass, <prefix><pass>.<dtype>; a
# profile from before had one per dtype (Conv2D's forward), used for both
# kernels and every pass.
DTYPE_SLOWDOWNS = ("im2col_dtype_slowdown.", "tf_depthwise_dtype_slowdown.")
LEGACY_DTYPE_SLOWDOWN = "im2col_dtype_slowdown."
# The side from which TF's half-type Conv2D filter gradient runs float32's slow
# path, <prefix><dtype> (cost_model.h); a profile from before has none there.
HALF_SLOW_PATH = "im2col_half_slow_path_side."
HALF_TYPES = ("float16", "bfloat16")

# The direct and FFT models' fields, in the order of their terms (cost_model.h;
# the "terms" _core.plan_pass returns). A term's coefficient is the field's
# value, or 1 / it for a rate (coefficient()).
DIRECT_TERMS = ("direct_flops_per_second", "direct_load_bound_flops_per_second",
                "direct_seconds_per_output", "direct_seconds_per_packed",
                "direct_seconds_per_call")
FFT_TERMS = ("fft_seconds_per_transform_flop", "fft_seconds_per_mix_flop",
             "fft_seconds_per_byte", "fft_seconds_per_element", "fft_seconds_per_call")


def is_rate(name):
    """Whether a CPU field is a rate (FLOP/s: time goes as 1 / it), not seconds per unit."""
    return "flops_per_second" in name


def coefficient(name, value):
    """A model term's coefficient (seconds per unit) from field `name`'s value,
    and the value from the coefficient: 1 / value for a rate, else value."""
    return 1.0 / value if is_rate(name) else value


# Where the active profile came from: "env", "user", "scaled" (probe.py),
# "shipped" or "built-in",
# and its "meta" object ({} for the built-in constants).
active_source = "built-in"
active_path = None
active_meta = {}

# The CPU features that decide how fast the kernels run, ours and TensorFlow's:
# a profile measured where they differ can be off several-fold (RESULTS.md, "the
# shipped CPU profile and this machine": TF's Conv2D up to 50x).
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile")


def this_cpu():
    """This machine's CPU as a profile records it (meta "cpu"): {"name": model name
    with family and model numbers, "isa": the ISA_FLAGS it has, "cpus": logical CPUs}."""
    name, isa, cpus = _read_cpu()
    return {"name": name, "isa": list(isa), "cpus": cpus}


@functools.lru_cache(maxsize=1)
def _read_cpu():
    """(name, isa, cpus) from /proc/cpuinfo, read once per process (explain asks each call)."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "cpu family", "model", "flags") and key not in info:
                    info[key] = value.strip()
                if key == "flags":
                    break  # the first processor's block has them all
    except OSError:
        pass
    name = info.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in info and "model" in info:
        name += f" (family {info['cpu family']}, model {info['model']})"
    flags = set(info.get("flags", "").split())
    return name, tuple(f for f in ISA_FLAGS if f in flags), os.cpu_count()


def _isa(cpu):
    isa = cpu.get("isa")
    return sorted(map(str, isa)) if isinstance(isa, list) else [str(isa)] if isa else []


def _describe(cpu):
    isa = ", ".join(_isa(cpu)) or "no AVX2, FMA, AVX-512 or AMX"
    return f"{cpu.get('name')}, {cpu.get('cpus')} CPUs, {isa}"


def machine_mismatch(meta=None, cpu=None, tensorflow=None, onednn=None):
    """Why the active profile's CPU constants may not fit this machine, or "".

    The profile (`meta`, default the active one's) records the CPU, the
    TensorFlow and whether TF ran oneDNN when it was measured; a different CPU,
    ISA, CPU count, TF version or oneDNN setting changes the kernels' speeds
    (TF's above all), not only by a factor. Profiles that record no CPU (older
    ones) are reported as such."""
    meta = active_meta if meta is None else meta
    if not meta:
        return "built-in constants, not measured on this machine"
    cpu = this_cpu() if cpu is None else cpu
    if tensorflow is None:
        import tensorflow as tf
        tensorflow = tf.__version__
    reasons = []
    theirs = meta.get("cpu")
    if not isinstance(theirs, dict):
        reasons.append(f"the profile does not record its CPU (it was measured on "
                       f"{meta.get('machine', 'an unnamed machine')})")
    elif (theirs.get("name"), _isa(theirs), theirs.get("cpus")) != (
            cpu["name"], _isa(cpu), cpu["cpus"]):
        reasons.append(f"the profile was measured on {_describe(theirs)}, this machine is "
                       f"{_describe(cpu)}")
    if meta.get("tensorflow") and meta.get("tensorflow") != tensorflow:
        reasons.append(f"the profile was measured with TensorFlow {meta['tensorflow']}, this "
                       f"is {tensorflow}")
    onednn = host.current().runs_onednn() if onednn is None else onednn
    their_onednn = meta.get("tf_onednn")
    if isinstance(their_onednn, bool) and onednn is not None and their_onednn != onednn:
        state = ("off", "on")
        reasons.append(f"the profile timed TensorFlow's CPU kernels with oneDNN "
                       f"{state[their_onednn]}, here it is {state[onednn]} (TF_ENABLE_ONEDNN_OPTS)")
    return "; ".join(reasons)


def how_fitted(meta=None):
    """One line on how a profile's CPU values were fitted (`meta`, default the
    active one's): calibrated, or scaled from a shipped one by probe.py."""
    meta = active_meta if meta is None else meta
    if isinstance(meta.get("probe"), dict):
        levels = {k: r for k, r in meta.get("probe").items() if k.count(".") < 2}
        ratios = ", ".join(f"{k} x{r:.2f}" for k, r in levels.items())
        base = meta.get("scaled_from", {}).get("path", "a shipped profile")
        return (f"{base} scaled to this host on {meta.get('created', '?')} by timings (time "
                f"here / its estimate: {ratios}; and {len(meta['probe']) - len(levels)} "
                f"half-precision slowdowns of TF's kernels)")
    if meta.get("created"):
        return f"calibrated on {meta.get('machine', 'an unnamed machine')} on {meta['created']}"
    return ""


def user_path():
    """The per-user profile: $XDG_CACHE_HOME/tfbigconv/cost_model.json (~/.cache by default)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "tfbigconv", "cost_model.json")


def _older_field(name):
    """The field a profile from before `name` existed used in its place, or None:
    TF's multiplier-1 depthwise rate for a multiplier over 1 (before that
    table), and the one dtype slowdown of both kernels and every pass (before
    the per-kernel, per-pass ones)."""
    if name.startswith(MULTIPLIER_TABLE):
        return DEPTHWISE_TABLE + name[len(MULTIPLIER_TABLE):]
    if name.startswith(DTYPE_SLOWDOWNS):
        return LEGACY_DTYPE_SLOWDOWN + name.rsplit(".", 1)[1]
    return None


def read_profile(path, defaults=None):
    """The values of a profile file, in _core.cost_model_fields() order; ValueError if invalid.

    A profile may hold only the CPU or only the GPU section: the values it
    lacks come from `defaults` ({name: value}, e.g. the shipped profile's).
    """
    return read_profile_and_meta(path, defaults)[0]


def read_profile_and_meta(path, defaults=None):
    """(read_profile's values, the profile's "meta" object); ValueError if invalid."""
    with open(path) as f:
        try:
            profile = json.load(f)
        except (ValueError, OverflowError) as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None
    meta = profile.get("meta") if isinstance(profile, dict) else None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a tfbigconv cost model of format {FORMAT}")
    values = profile.get("values")
    if not isinstance(values, dict):
        raise ValueError(f"{path} has no 'values' object")
    fields = _core.cost_model_fields()
    merged = dict(defaults or {})
    merged.update(values)
    # Profiles written before direct_load_bound_flops_per_second existed had
    # one-channel column tiles at 0.3 of the direct rate (two at 0.6): the
    # same model, which that share of their own direct rate restores.
    legacy = "direct_load_bound_flops_per_second" not in values and "direct_flops_per_second" in values
    given = [name for name in fields if not (legacy and name == "direct_load_bound_flops_per_second")]
    # Profiles written before a side of TF's rate tables existed interpolated
    # there between the sides around it: interpolated the same way (log rate
    # over log side, as plan.cc's LogInterp), the same model.
    values = dict(values)
    for name in fields:
        for side, (lo, hi) in LATER_SIDES.items():
            at = f".side{side}"
            if at in name and name not in values:
                a, b = (values.get(name.replace(at, f".side{s}")) for s in (lo, hi))
                if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > 0 and b > 0:
                    t = math.log(side / lo) / math.log(hi / lo)
                    merged[name] = values[name] = math.exp(math.log(a) * (1 - t) + math.log(b) * t)
    # Fields that replaced another in the model: a profile with the older one
    # gets its value, the same model (_older_field).
    for name in fields:
        older = _older_field(name)
        if older and name not in values and older in values:
            merged[name] = values[older]
    # Profiles written before the half types' filter-gradient slow path existed
    # modelled none: the built-in kNoSlowPathSide.
    built_in = dict(zip(fields, _core.default_cost_model()))
    for name in fields:
        if name.startswith(HALF_SLOW_PATH) and name not in values:
            merged[name] = built_in[name]
    # Profiles written before TF's channel block existed modelled none: 1.
    if any(name.startswith("im2col_flops_per_second.") for name in values):
        for name in fields:
            if name.startswith(CHANNEL_BLOCK) and name not in values:
                merged[name] = 1.0
    # GPU coefficients of features added later: a profile fitted without them
    # has them at 0 (its own model), not the defaults' values.
    for name in fields:
        if is_gpu_field(name) and name.rsplit(".", 1)[1] in LATER_GPU_FEATURES:
            intercept = name.rsplit(".", 1)[0] + ".intercept"
            if intercept in values and name not in values:
                merged[name] = 0.0
    missing = [name for name in given if name not in merged]
    if missing:
        raise ValueError(f"{path} lacks cost model values: {', '.join(missing[:3])}...")
    bad = [name for name in given
           if isinstance(merged[name], bool) or not isinstance(merged[name], (int, float))]
    if bad:
        raise ValueError(f"{path}: cost model values must be numbers: {', '.join(bad[:3])}")
    try:
        result = {name: float(merged[name]) for name in given}
    except OverflowError as e:
        raise ValueError(f"{path}: {e}") from None
    if legacy:
        result["direct_load_bound_flops_per_second"] = 0.3 * result["direct_flops_per_second"]
    return [result[name] for name in fields], meta


def shipped_for_host():
    """The shipped profile for this process's CPU and oneDNN setting (shipped_for)."""
    return shipped_for(this_cpu(), tf_onednn())


def shipped_for(cpu, onednn, paths=None):
    """The shipped profile whose CPU values suit a machine (this_cpu()'s dict,
    tf_onednn()'s answer) best: one measured with the same oneDNN setting
    first, since TF's CPU kernels are other code with it (their rates moved
    2-20x between hosts, RESULTS.md "The shipped CPU profile and this
    machine"), then one with the same ISA flags. The main profile wins ties,
    and any profile whose meta cannot be read is passed over."""
    paths = (SHIPPED_PATH,) + SHIPPED_CPU_PATHS if paths is None else tuple(paths)

    def fit(path):
        try:
            with open(path) as f:
                meta = json.load(f)["meta"]
            theirs = meta.get("cpu") if isinstance(meta.get("cpu"), dict) else {}
            return (onednn is not None and meta.get("tf_onednn") is onednn,
                    bool(theirs) and _isa(theirs) == _isa(cpu))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return (False, False)

    return max(paths, key=fit)  # the first of the best: the main profile on a tie


def shipped_values():
    """{name: value} of the profile shipped in the package."""
    return _main_profile()[0]


def _main_profile():
    """({name: value}, meta) of the main shipped profile."""
    values, meta = read_profile_and_meta(SHIPPED_PATH)
    return dict(zip(_core.cost_model_fields(), values)), meta


def write_profile(path, values, meta, cpu_only=False):
    """Writes a profile (values in cost_model_fields() order) atomically; with
    cpu_only, without the GPU values (read, it takes the main profile's)."""
    fields = _core.cost_model_fields()
    if len(values) != len(fields):
        raise ValueError(f"expected {len(fields)} values, got {len(values)}")
    active = _core.get_cost_model()
    try:
        _core.set_cost_model(list(values))  # validates, naming a bad value
    finally:
        _core.set_cost_model(active)
    doc = {"meta": dict(meta, format=FORMAT),
           "values": {name: float(v) for name, v in zip(fields, values)
                      if not (cpu_only and is_gpu_field(name))}}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"  # processes probing at once each write their own
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def update_profile(path, values, meta):
    """Writes `values` ({name: value}) into the profile at `path`, keeping its other
    values (or the active model's where there is no valid profile there)."""
    fields = _core.cost_model_fields()
    current = dict(zip(fields, _core.get_cost_model()))
    old_meta = {}
    if os.path.exists(path):
        try:
            values_there, old_meta = read_profile_and_meta(path, current)
            current = dict(zip(fields, values_there))
        except (ValueError, OSError) as e:
            warnings.warn(f"tfbigconv: replacing invalid profile {path}: {e}", stacklevel=2)
    current.update(values)
    write_profile(path, [current[name] for name in fields], dict(old_meta, **meta))


def apply(values, op_library_path):
    """Makes `values` the model of _core and of the op library."""
    _core.set_cost_model(list(values))  # raises ValueError naming a bad value
    lib = ctypes.CDLL(op_library_path)  # the library TF already loaded: same handle
    array = (ctypes.c_double * len(values))(*values)
    if lib.tfbigconv_set_cost_model(array, len(values)) != 0:
        raise RuntimeError("the op library rejected the cost model")


def scaled_path():
    """Where probe.py caches the shipped profile scaled to this host: beside user_path()."""
    return os.path.join(os.path.dirname(user_path()), "cost_model_scaled.json")


def scaling_enabled():
    """TFBIGCONV_PROBE=0: no shipped profile scaled to this host, neither probed
    (probe.py) nor loaded from its cache."""
    return os.environ.get("TFBIGCONV_PROBE", "1") != "0"


def base_identity(path, meta):
    """What a scaled profile records of the profile it was scaled from."""
    return {"path": os.path.basename(path or ""), "created": meta.get("created")}


def set_active(source, path, meta):
    """Records where the applied model came from (apply() applies it)."""
    global active_source, active_path, active_meta
    active_source, active_path, active_meta = source, path, meta


# load_active runs from tfbigconv/__init__.py: its warnings name the user's
# `import tfbigconv` (warnings skip the import machinery's frames).
_IMPORTER_STACKLEVEL = 3


def load_active(op_library_path):
    """Applies the first valid profile of: $TFBIGCONV_COST_MODEL, the user's, the
    shipped one for this machine scaled to it (probe.py; only while it was scaled
    on this machine from that shipped profile), the shipped one for this machine
    (shipped_for), the main shipped one."""
    shipped = list(dict.fromkeys([shipped_for_host(), SHIPPED_PATH]))
    candidates = [("env", os.environ.get("TFBIGCONV_COST_MODEL")), ("user", user_path()),
                  ("scaled", scaled_path() if scaling_enabled() else None)] + [
        ("shipped", path) for path in shipped]
    try:
        defaults, main_meta = _main_profile()
    except (ValueError, OSError):
        defaults, main_meta = None, {}
    for source, path in candidates:
        if not path or not os.path.exists(path):
            if source == "env" and path:
                warnings.warn(f"TFBIGCONV_COST_MODEL={path} does not exist; ignored",
                              stacklevel=_IMPORTER_STACKLEVEL)
            continue
        try:
            values, meta = read_profile_and_meta(path, defaults)
            if source == "scaled":
                if not _scaled_applies(meta, shipped[0], defaults):
                    continue
                # Scaling touches the CPU model only: the GPU values are the main
                # profile's as it is now (a cache may hold an older fit's).
                values = [defaults[name] if defaults and is_gpu_field(name) else v
                          for name, v in zip(_core.cost_model_fields(), values)]
            apply(values, op_library_path)
        except (ValueError, OSError) as e:
            warnings.warn(f"tfbigconv: ignoring cost model {path}: {e}", stacklevel=_IMPORTER_STACKLEVEL)
            continue
        if "gpu_grids" not in meta and "gpu_grids" in main_meta:
            # A CPU-only profile: its GPU values are the main profile's fit.
            meta = dict(meta, gpu_grids=main_meta.get("gpu_grids"))
        set_active(source, path, meta)
        return
    set_active("built-in", None, {})


def _scaled_applies(meta, shipped_path, defaults):
    """Whether a scaled profile (its meta) was scaled on this machine from the
    shipped profile that would be active without it."""
    if machine_mismatch(meta):
        return False
    _, shipped_meta = read_profile_and_meta(shipped_path, defaults)
    return meta.get("scaled_from") == base_identity(shipped_path, shipped_meta)
