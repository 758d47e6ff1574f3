"""The fast GPU tier's selection, checked by collecting it (on any machine):
every entry of fast_tier.FAST picks at least one GPU test, and the tier stays
a small part of the GPU suite."""

import pathlib
import subprocess
import sys

from fast_tier import FAST

TESTS = pathlib.Path(__file__).resolve().parent


# Collects the GPU tests once, in a child process, and prints each as
# "<fast|slow> <node id>".
_LIST = """
import sys, pytest
class Print:
    def pytest_collection_finish(self, session):
        for item in session.items:
            print("slow" if item.get_closest_marker("slow") else "fast", item.nodeid)
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-m", "gpu", sys.argv[1]], plugins=[Print()]))
"""


def _collect():
    out = subprocess.run([sys.executable, "-c", _LIST, str(TESTS)], capture_output=True, text=True, cwd="/",
                         timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = [line.split(" ", 1) for line in out.stdout.splitlines() if line.startswith(("fast ", "slow "))]
    return [n for tier, n in rows if tier == "fast"], [n for _, n in rows]


def test_fast_tier_selection():
    fast, gpu = _collect()
    assert set(fast) < set(gpu) and all("[gpu" in item for item in gpu), [i for i in gpu if "[gpu" not in i][:5]
    picked = {item.split("[")[0].split("/")[-1] for item in fast}
    assert picked == set(FAST), (sorted(set(FAST) - picked), sorted(picked - set(FAST)))
    assert 150 <= len(fast) <= 320 and len(fast) < len(gpu) / 5, (len(fast), len(gpu))
