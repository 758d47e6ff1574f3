import os
import shutil

# Eight CPU devices for the shard_map tests (set before JAX initializes).
_flags = [os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8"]
# On a machine without an NVIDIA GPU, XLA compiles the tests' many small
# programs without LLVM's optimizations: the suite runs about 10% faster, the
# same values (XLA's own HLO passes still run). A GPU machine keeps XLA's
# defaults, for its GPU programs too.
if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidiactl"):
    _flags.append("--xla_backend_optimization_level=0")
os.environ["XLA_FLAGS"] = " ".join(f for f in _flags if f)

import pytest

from fast_tier import is_fast
from reference import PLATFORMS


def pytest_collection_modifyitems(config, items):
    # A test parametrized over `platform` runs on that platform: on "gpu" it
    # is marked gpu, and slow unless the fast tier (fast_tier.py) selects it;
    # it is skipped where that platform has no device.
    for item in items:
        callspec = getattr(item, "callspec", None)
        if not callspec or callspec.params.get("platform") != "gpu":
            continue
        item.add_marker(pytest.mark.gpu)
        if not is_fast(item):
            item.add_marker(pytest.mark.slow)
        if "gpu" not in PLATFORMS:
            item.add_marker(pytest.mark.skip(reason="no GPU visible to JAX"))


@pytest.fixture(params=["cpu", "gpu"])
def platform(request):
    return request.param
