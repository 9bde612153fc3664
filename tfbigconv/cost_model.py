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
import json
import os
import warnings

from tfbigconv import _core

SHIPPED_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cost_model.json")
FORMAT = 1

# Where the active profile came from: "env", "user", "shipped" or "built-in".
active_source = "built-in"
active_path = None


def user_path():
    """The per-user profile: $XDG_CACHE_HOME/tfbigconv/cost_model.json (~/.cache by default)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "tfbigconv", "cost_model.json")


def read_profile(path, defaults=None):
    """The values of a profile file, in _core.cost_model_fields() order; ValueError if invalid.

    A profile may hold only the CPU or only the GPU section: the values it
    lacks come from `defaults` ({name: value}, e.g. the shipped profile's).
    """
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
    missing = [name for name in fields if name not in merged]
    if missing:
        raise ValueError(f"{path} lacks cost model values: {', '.join(missing[:3])}...")
    bad = [name for name in fields
           if isinstance(merged[name], bool) or not isinstance(merged[name], (int, float))]
    if bad:
        raise ValueError(f"{path}: cost model values must be numbers: {', '.join(bad[:3])}")
    try:
        return [float(merged[name]) for name in fields]
    except OverflowError as e:
        raise ValueError(f"{path}: {e}") from None


def shipped_values():
    """{name: value} of the profile shipped in the package."""
    return dict(zip(_core.cost_model_fields(), read_profile(SHIPPED_PATH)))


def write_profile(path, values, meta):
    """Writes a profile (values in cost_model_fields() order) atomically."""
    fields = _core.cost_model_fields()
    if len(values) != len(fields):
        raise ValueError(f"expected {len(fields)} values, got {len(values)}")
    active = _core.get_cost_model()
    try:
        _core.set_cost_model(list(values))  # validates, naming a bad value
    finally:
        _core.set_cost_model(active)
    doc = {"meta": dict(meta, format=FORMAT), "values": dict(zip(fields, map(float, values)))}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
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
            current = dict(zip(fields, read_profile(path, current)))
            with open(path) as f:
                old_meta = json.load(f)["meta"]  # read_profile checked it is a dict
        except (ValueError, OSError) as e:
            warnings.warn(f"tfbigconv: replacing invalid profile {path}: {e}")
    current.update(values)
    write_profile(path, [current[name] for name in fields], dict(old_meta, **meta))


def apply(values, op_library_path):
    """Makes `values` the model of _core and of the op library."""
    _core.set_cost_model(list(values))  # raises ValueError naming a bad value
    lib = ctypes.CDLL(op_library_path)  # the library TF already loaded: same handle
    array = (ctypes.c_double * len(values))(*values)
    if lib.tfbigconv_set_cost_model(array, len(values)) != 0:
        raise RuntimeError("the op library rejected the cost model")


def load_active(op_library_path):
    """Applies the first valid profile of: $TFBIGCONV_COST_MODEL, the user's, the shipped one."""
    global active_source, active_path
    candidates = [("env", os.environ.get("TFBIGCONV_COST_MODEL")), ("user", user_path()),
                  ("shipped", SHIPPED_PATH)]
    try:
        defaults = shipped_values()
    except (ValueError, OSError):
        defaults = None
    for source, path in candidates:
        if not path or not os.path.exists(path):
            if source == "env" and path:
                warnings.warn(f"TFBIGCONV_COST_MODEL={path} does not exist; ignored")
            continue
        try:
            apply(read_profile(path, defaults), op_library_path)
        except (ValueError, OSError) as e:
            warnings.warn(f"tfbigconv: ignoring cost model {path}: {e}")
            continue
        active_source, active_path = source, path
        return
    active_source, active_path = "built-in", None
