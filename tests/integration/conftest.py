import pytest


def pytest_collection_modifyitems(config, items):
    """Every test here is an integration test (``-m integration`` / ``-m "not integration"``)."""
    for item in items:
        if "tests/integration/" in item.nodeid:
            item.add_marker(pytest.mark.integration)
