import pytest


def pytest_collection_modifyitems(config, items):
    """Every test here is an end-to-end test (``-m e2e``), and a module's tests stay together on
    one pytest-xdist worker (``--dist loadgroup``), so the runs they share (a project copy, a
    `kedro run` several tests read) are made once. Those fixtures are session-scoped: a worker
    may take other modules' tests between one module's, and a module-scoped fixture would be
    torn down and made again each time."""
    for item in items:
        if "tests/e2e/" in item.nodeid:
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
