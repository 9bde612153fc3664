"""Autotuning's cache entries belong to the build that timed them (issue 52,
item 10): the key's version holds a digest of the compiled libraries
(autotune.build_id), so that after a rebuild of the kernels a layer is timed
again instead of showing timings of older code."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import tfbigconv
from tfbigconv.planning import autotune

SHAPES = ((1, 64, 64, 1), (31, 31, 1, 2))


@pytest.fixture
def fake_timing(monkeypatch):
    """measure() answers at once (fft fastest); yields the passes it was asked for."""
    calls = []

    def measure(pass_, names, *args, **kwargs):
        calls.append(pass_)
        return {n: (1e-3 if n == "fft" else 2e-3) for n in names}
    monkeypatch.setattr(autotune, "measure", measure)
    yield calls


@pytest.fixture
def other_build(tmp_path, monkeypatch):
    """A function that makes this process look like another build: its
    libraries are files with other bytes."""
    def switch(content):
        lib = tmp_path / "lib.so"
        lib.write_bytes(content)
        monkeypatch.setattr(autotune, "library_paths", lambda: [str(lib)])
        autotune.build_id.cache_clear()
        autotune.clear_memory()
    yield switch
    autotune.build_id.cache_clear()


def test_build_id_follows_the_library_bytes(other_build):
    this = autotune.build_id()
    assert this != "none" and autotune._version() == f"{tfbigconv.__version__}+{this}"
    other_build(b"one build")
    first = autotune.build_id()
    other_build(b"another build")
    assert len({this, first, autotune.build_id()}) == 3


def test_entries_of_another_build_are_not_used(autotuning, fake_timing, other_build):
    other_build(b"the build that timed")
    e = tfbigconv.explain(*SHAPES, padding="SAME", autotune=True)
    timed = list(fake_timing)
    assert timed and "measured" in e.how.values()
    # The same build reads its entries back, timing nothing.
    autotune.clear_memory()
    assert tfbigconv.explain(*SHAPES, padding="SAME").how == e.how
    # A rebuild: its entries are stale, the estimates decide, and timing runs again.
    other_build(b"a rebuild")
    with pytest.warns(UserWarning, match="stale or invalid entries"):
        again = tfbigconv.explain(*SHAPES, padding="SAME")
    assert set(again.how.values()) == {"estimated"}
    fake_timing.clear()
    tfbigconv.explain(*SHAPES, padding="SAME", autotune=True)
    assert sorted(fake_timing) == sorted(timed)


SCRIPT = """
import json, sys
import tfbigconv
from tfbigconv.planning import autotune
if sys.argv[1] == "read":
    def fail(*args, **kwargs):
        raise AssertionError("timed again")
    autotune.measure = fail
e = tfbigconv.explain((1, 64, 64, 1), (31, 31, 1, 2), padding="SAME",
                      autotune=sys.argv[1] == "write")
print(json.dumps({"how": e.how, "file": tfbigconv.__file__}))
"""


def run(arg, pythonpath, cache):
    env = dict(os.environ, PYTHONPATH=pythonpath, TFBIGCONV_AUTOTUNE="1",
               TFBIGCONV_AUTOTUNE_CACHE=str(cache), TF_CPP_MIN_LOG_LEVEL="3")
    r = subprocess.run([sys.executable, "-c", SCRIPT, arg], env=env, capture_output=True,
                       text=True, cwd=os.path.dirname(str(cache)), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_a_rebuilt_library_times_again_in_a_fresh_process(tmp_path):
    """The package copied with its op library rebuilt (other bytes: a byte
    appended, which the loader ignores) does not read the entries the original
    wrote; the original still does."""
    package = os.path.dirname(tfbigconv.__file__)
    root = os.path.dirname(package)
    copy = tmp_path / "rebuilt"
    shutil.copytree(package, copy / "tfbigconv",
                    ignore=shutil.ignore_patterns("__pycache__"))  # links followed
    with open(copy / "tfbigconv" / "_bigconv_ops.so", "ab") as f:
        f.write(b"\0")
    cache = tmp_path / "autotune.json"
    written, _ = run("write", root, cache)
    assert "measured" in written["how"].values()
    same, _ = run("read", root, cache)
    assert same["how"] == written["how"]
    rebuilt, stderr = run("read", str(copy), cache)
    assert rebuilt["file"].startswith(str(copy))
    assert set(rebuilt["how"].values()) == {"estimated"}
    assert "stale or invalid entries" in stderr
