"""explain() gives the tables held in explain_golden.json (generated before the
package was restructured, issue 37; the GPU tables regenerated after the GPU
section's refit of issue 41; case 19's 1-D fft workspaces after 1-D plans took
up to 64 staged planes; 1-D and 3-D rows, cases 20-28, added before issue 54's
restructure; TF's workspace per pass and host kind, issue 59: the tf rows' workspace,
peak, fits and notes, and the reasons that said TF's kernel did not fit, no choice),
on pinned host facts and the shipped generic
profile: the same choices, estimates and notes. A deliberate change to the
estimates regenerates it: run explain_golden_cases.py with this test's
environment and write its output there."""
import json
import os
import subprocess
import sys

from tfbigconv.cost_model import profiles

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "explain_golden.json")


def current_tables():
    env = dict(os.environ, TFBIGCONV_COST_MODEL=profiles.SHIPPED_PATH, TFBIGCONV_AUTOTUNE="0", TFBIGCONV_ISA="avx2",
               TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, os.path.join(HERE, "explain_golden_cases.py")],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_explain_tables_are_unchanged():
    with open(GOLDEN) as f:
        golden = json.load(f)
    got = current_tables()
    assert len(golden) >= 50 and set(got) == set(golden)
    differ = [k for k in golden if got[k] != golden[k]]
    assert not differ, (len(differ), differ[:5], got[differ[0]], golden[differ[0]])
