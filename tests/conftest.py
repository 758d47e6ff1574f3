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


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run the I-th of N interleaved parts of the selected tests (1 <= I <= N): "
                          "the whole suite split over N runs")


class _Shard:
    """--shard I/N: keeps every N-th selected test from the I-th."""

    @pytest.hookimpl(trylast=True)  # after -m and -k have deselected theirs: the parts split what is left
    def pytest_collection_modifyitems(self, config, items):
        shard = config.getoption("--shard")
        if not shard:
            return
        try:
            i, n = (int(v) for v in shard.split("/"))
        except ValueError:
            i = n = 0
        if not 1 <= i <= n:
            raise pytest.UsageError(f"--shard: expected I/N with 1 <= I <= N, got {shard!r}")
        config.hook.pytest_deselected(items=[item for k, item in enumerate(items) if k % n != i - 1])
        items[:] = items[i - 1::n]


def pytest_configure(config):
    config.pluginmanager.register(_Shard(), "jrn-shard")


@pytest.fixture(params=["cpu", "gpu"])
def platform(request):
    return request.param
