import pytest


def pytest_collection_modifyitems(config, items):
    """Every test here is an end-to-end test (``-m e2e``), and a module's tests stay together on
    one pytest-xdist worker (``--dist loadgroup``): its module-scoped runs (a project copy, a
    `kedro run` several tests read) are made once, not once per worker."""
    for item in items:
        if "tests/e2e/" in item.nodeid:
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
