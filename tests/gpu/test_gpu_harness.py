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
