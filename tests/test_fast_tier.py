"""The fast GPU tier's selection, checked by collecting it (on any machine):
every entry of fast_tier.FAST picks at least one GPU test, and the tier stays
a small part of the GPU suite."""

import pathlib
import subprocess
import sys

from fast_tier import FAST

TESTS = pathlib.Path(__file__).resolve().parent


def _collect(marker):
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "-m", marker, str(TESTS)], capture_output=True, text=True, cwd="/", timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return [line for line in out.stdout.splitlines() if "::" in line]


def test_fast_tier_selection():
    fast, gpu = _collect("gpu and not slow"), _collect("gpu")
    assert set(fast) < set(gpu) and all("[gpu" in item for item in gpu), [i for i in gpu if "[gpu" not in i][:5]
    picked = {item.split("[")[0].split("/")[-1] for item in fast}
    assert picked == set(FAST), (sorted(set(FAST) - picked), sorted(picked - set(FAST)))
    assert 150 <= len(fast) <= 320 and len(fast) < len(gpu) / 5, (len(fast), len(gpu))
