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
