"""The TF-free CUDA harness (scripts/gpu_check.sh) must at least compile and
import wherever nvcc exists, so that a compile error in cuda/harness fails CI
even on machines without a GPU. There the direct kernels' bodies also run on
the CPU (check_kernels.py --host) against the float64 reference, which
checks their index arithmetic without a GPU."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_gpu_harness_compiles_and_imports(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, BUILD_DIR=str(tmp_path / "harness"))
    r = subprocess.run([os.path.join(ROOT, "scripts", "gpu_check.sh"), "--compile-only"],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "compile-only OK" in r.stdout
    assert "[200, 187, 347, 3]" in r.stdout  # the harness's shape math is ConvGeometry's
    r = subprocess.run([sys.executable, os.path.join(ROOT, "cuda", "harness", "check_kernels.py"),
                        "--host"], env=dict(env, PYTHONPATH=os.pathsep.join(
                            [str(tmp_path / "harness"), os.path.join(ROOT, "tests")])),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "host kernel tests (direct):" in r.stdout and "host kernel tests (fft):" in r.stdout
    assert "host kernel tests (fft, non-finite):" in r.stdout  # the staging check (issue 15)


def test_gpu_measure_runs_steps_in_order_to_its_deadline(tmp_path):
    """scripts/gpu_measure.sh with stand-ins for python3, cmake, nvidia-smi and
    compute-sanitizer: the named steps run in order with the harness on the path,
    a step past the deadline is skipped, and every log comes back packed."""
    bin_dir, build = tmp_path / "bin", tmp_path / "harness"
    bin_dir.mkdir()
    build.mkdir()
    (build / "tfbigconv_gpu_harness.so").write_text("")  # what the build step leaves
    for name in ("cmake", "nvidia-smi", "compute-sanitizer", "nvcc"):
        (bin_dir / name).write_text(f'#!/bin/bash\necho "{name} $*"\n')
    # The "python" sleeps in the timings step, so that the deadline falls there.
    (bin_dir / "py").write_text('#!/bin/bash\necho "py $* PYTHONPATH=$PYTHONPATH"\n'
                                '[[ "$*" == *--seed-batch* ]] && sleep 30\nexit 0\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    out = tmp_path / "out"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", PYTHON=str(bin_dir / "py"),
               BUILD_DIR=str(build))
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_measure.sh"), str(out), "20",
                        "correctness", "fft_grid_f32", "timings", "grid_f32"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    steps = [line.split("]")[0][1:] for line in r.stdout.splitlines() if line.startswith("[")]
    assert steps[:4] == ["build", "correctness", "fft_grid_f32", "timings"], r.stdout
    assert "[timings] rc=124" in r.stdout  # cut off at the deadline
    assert "[grid_f32] skipped: out of time" in r.stdout
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    subprocess.run(["tar", "xzf", str(out / "results.tgz"), "-C", str(unpacked)], check=True)
    names = {p.name for p in unpacked.iterdir()}
    assert {"env.log", "steps.log", "matrix.log", "memcheck_subset.log",
            "memcheck_depthwise.log", "fft_grid_f32.log"} <= names
    calib = (unpacked / "fft_grid_f32.log").read_text()
    assert "--calibrate" in calib and "--algos fft" in calib and str(build) in calib
