import os

# Eight CPU devices for the shard_map tests (set before JAX initializes).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import pytest

from reference import PLATFORMS


def pytest_collection_modifyitems(config, items):
    # Each test parametrized over `platform` is skipped where that platform has no device.
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec and callspec.params.get("platform") == "gpu" and "gpu" not in PLATFORMS:
            item.add_marker(pytest.mark.skip(reason="no GPU visible to JAX"))


@pytest.fixture(params=["cpu", "gpu"])
def platform(request):
    return request.param
