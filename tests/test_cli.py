"""The command line (tfbigconv/cli.py; `python -m tfbigconv` runs its main):
explain on the CPU and the GPU, and bad arguments, each an exit status of 2
with a one-line error. Its calibrate and fit-gpu commands are tested with
what they write (cost_model/test_calibrate.py, cost_model/test_gpu_fit.py),
and memory with memory_report (memory/test_memory_report.py)."""
import pytest

from tfbigconv.cli import main as cli
from conftest import run_cli as run


def test_cli():
    r = run(["-m", "tfbigconv", "explain", "--input", "200,321,481,1", "--filter", "135,135,1,3",
             "--padding", "VALID", "--budget", "256M"])
    assert r.returncode == 0, r.stderr
    assert "forward: estimated; auto: fft" in r.stdout and "workspace budget 256.0 MiB" in r.stdout
    r = run(["-m", "tfbigconv", "explain", "--input", "1,8,8,1", "--filter", "3,3,2,1"])
    assert r.returncode == 2 and "error:" in r.stderr
    r = run(["-m", "tfbigconv", "explain", "--input", "1,8,x,1", "--filter", "3,3,1,1"])
    assert r.returncode == 2 and "comma-separated ints" in r.stderr


def test_cli_explain_1d():
    """A 3-int --input is 1-D (bigconv1d), shown as it runs: height 1, 1-D FFTs."""
    r = run(["-m", "tfbigconv", "explain", "--input", "4,4096,8", "--filter", "4096,1,8",
             "--padding", "CAUSAL"])
    assert r.returncode == 0, r.stderr
    assert "FFT 1x8192" in r.stdout and "output shape [4, 1, 4096, 8]" in r.stdout
    r = run(["-m", "tfbigconv", "explain", "--input", "4,8,100", "--filter", "9,8,2",
             "--padding", "0,0,0,0,4,4", "--data-format", "NCW"])
    assert r.returncode == 0, r.stderr
    assert "output shape [4, 2, 1, 100]" in r.stdout
    r = run(["-m", "tfbigconv", "explain", "--input", "4,100,8", "--filter", "9,9,8,2"])
    assert r.returncode == 2 and "filter_shape must be [width" in r.stderr


def test_cli_explain_3d(tmp_path):
    """5 ints are a 3-D problem (bigconv3d): every candidate's estimates (TF's Conv3D
    where it runs the case), 3-D FFT tiles, autotuning."""
    r = run(["-m", "tfbigconv", "explain", "--input", "2,24,24,24,8", "--filter", "9,9,9,1,8",
             "--padding", "SAME"])
    assert r.returncode == 0, r.stderr
    assert "FFT 32x32x32" in r.stdout or "(FFT " in r.stdout and "x" in r.stdout
    assert "output shape [2, 24, 24, 24, 8]" in r.stdout and "tf unavailable" in r.stdout
    r = run(["-m", "tfbigconv", "explain", "--input", "1,2,10,11,12", "--filter", "3,3,3,2,4",
             "--padding", "0,0,0,0,1,1,1,1,0,2", "--data-format", "NCDHW"])
    assert r.returncode == 0, r.stderr
    assert "output shape [1, 4, 10, 11, 12]" in r.stdout
    r = run(["-m", "tfbigconv", "explain", "--input", "1,10,11,12,2", "--filter", "3,3,3,2,4",
             "--autotune"], TFBIGCONV_AUTOTUNE_CACHE=str(tmp_path / "autotune.json"))
    assert r.returncode == 0 and "tf.Conv3D" in r.stdout, r.stderr
    r = run(["-m", "tfbigconv", "explain", "--input", "1,10,11,12,2", "--filter", "3,3,3,2,4",
             "--device", "GPU"])
    assert r.returncode == 2 and "CPU only" in r.stderr


def test_cli_explain_gpu():
    r = run(["-m", "tfbigconv", "explain", "--input", "16,56,56,64", "--filter", "3,3,64,64",
             "--padding", "SAME", "--device", "GPU"])
    assert r.returncode == 0, r.stderr
    assert "device GPU" in r.stdout and "forward: estimated; auto: tf" in r.stdout
    assert r.stdout.count("tf.Conv2D") >= 3


@pytest.mark.parametrize("argv", [
    ["explain", "--input", f"1,{2**70},5,1", "--filter", "3,3,1,1"],
    ["explain", "--input", "1,5,5,1", "--filter", "3,3,1,1", "--budget", "99999999999G"],
    ["explain", "--input", "1,5,5,1", "--filter", "9,9,1,1"],
    ["calibrate", "--quick", "--output", "/proc/nonexistent/x.json"],
])
def test_cli_exits_2_with_one_line(argv, capsys):
    """Issue 15's findings 6 and 7 on the command line."""
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
