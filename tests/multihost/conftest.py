"""Fixtures for tests on network-namespace hosts (tests/multihost/netns.py).

Where this machine cannot make them (not root, no iproute2, no namespaces) the tests skip with the
reason; under RECSCALE_REQUIRE_SYSTEM_PACKAGES=1 (CI, which runs as root) they fail instead.
"""

import contextlib
import os

import pytest

from tests.multihost.netns import NamespaceHosts, available, cleanup_stale


def require_netns() -> None:
    """Skip (or, under RECSCALE_REQUIRE_SYSTEM_PACKAGES=1, fail) where namespace hosts are
    impossible."""
    ok, why = available()
    if ok:
        return
    if os.environ.get("RECSCALE_REQUIRE_SYSTEM_PACKAGES") == "1":
        pytest.fail(f"namespace hosts are required here (RECSCALE_REQUIRE_SYSTEM_PACKAGES=1): "
                    f"{why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def netns_ready():
    """The capability check, once per pytest session; also removes what SIGKILLed earlier runs left."""
    require_netns()
    cleanup_stale("rs")


@pytest.fixture
def netns_hosts(netns_ready):
    """Factory: `hosts = netns_hosts(n, rate=None, **kwargs)` -> an entered NamespaceHosts, removed
    at the end of the test (whatever the test did)."""
    with contextlib.ExitStack() as stack:

        def make(n: int, rate=None, **kwargs) -> NamespaceHosts:
            return stack.enter_context(NamespaceHosts(n, rate=rate, **kwargs))

        yield make


@pytest.fixture
def netns_hosts2(netns_hosts) -> NamespaceHosts:
    return netns_hosts(2)


@pytest.fixture
def netns_hosts3(netns_hosts) -> NamespaceHosts:
    return netns_hosts(3)


@pytest.fixture(scope="session")
def dataset(tmp_path_factory):
    """The jobs' train rows (tests/multihost/jobs.py make_dataset), once per pytest process."""
    from tests.multihost.jobs import make_dataset

    return make_dataset(tmp_path_factory.mktemp("mh-data"))
