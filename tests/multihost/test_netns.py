"""Namespace hosts: reachability and isolation, tbf shaping, removal, losing a host."""

import ipaddress
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import PROJECT_ROOT
from tests.multihost import netns as N
from tests.multihost.conftest import require_netns

pytestmark = pytest.mark.multihost

MB4 = 4 << 20


def _present(names: dict) -> list[str]:
    return sorted((set(names["netns"]) & set(N.list_netns()))
                  | (set(names["links"]) & set(N.list_links())))


def _root_addresses_outside(subnet: str) -> list[str]:
    """The root namespace's IPv4 addresses, but its loopback's and the test subnet's."""
    net = ipaddress.ip_network(f"{subnet}.0/24")
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True,
                         timeout=10).stdout
    addrs = [line.split()[3].split("/")[0] for line in out.splitlines()]
    return [a for a in addrs
            if ipaddress.ip_address(a) not in net and not ipaddress.ip_address(a).is_loopback]


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie runs nothing
    except FileNotFoundError:
        return True


# -- no root needed ---------------------------------------------------------------------------
def test_rates_parse_like_tc_and_bad_arguments_are_named():
    assert N.parse_rate("100mbit") == 100_000_000
    assert N.parse_rate("1gbit") == 1_000_000_000
    assert N.parse_rate("10mbps") == 80_000_000  # tc: bps is bytes per second
    assert N.parse_rate(2e6) == 2_000_000
    with pytest.raises(ValueError, match="'fast'"):
        N.parse_rate("fast")
    with pytest.raises(ValueError, match="subnet='10.77'"):
        N.NamespaceHosts(2, subnet="10.77")
    with pytest.raises(ValueError, match="longer than 15"):
        N.NamespaceHosts(2, prefix="averylongprefix")


# -- on namespace hosts -----------------------------------------------------------------------
def test_hosts_reach_each_other_and_nothing_else(netns_hosts3):
    hosts = netns_hosts3
    assert [h.addr for h in hosts] == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]
    for src in (1, 2):
        got = N.tcp_transfer(hosts, src, 0, 1000, timeout=20)
        assert (got["bytes"], got["peer"]) == (1000, hosts[src].addr)

    with socket.create_server(("0.0.0.0", 0)) as srv:  # a server in the root namespace
        port = srv.getsockname()[1]
        res = N.probe(hosts[1], "127.0.0.1", port, timeout=2)
        assert "refused" in res["error"], res  # the host's own loopback: nothing listens there
        for addr in _root_addresses_outside(hosts.subnet):
            res = N.probe(hosts[1], addr, port, timeout=2)
            assert "unreachable" in res["error"], (addr, res)  # no route out of the subnet
        srv.setblocking(False)
        with pytest.raises(BlockingIOError):
            srv.accept()  # nothing from the hosts arrived
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # while root can


def test_tbf_limits_traffic_between_hosts_in_both_directions_not_loopback(netns_hosts):
    floor = MB4 * 8 / 100e6  # seconds 4 MiB take at 100 Mbit/s
    shaped = netns_hosts(2, rate="100mbit")
    for src, dst in ((0, 1), (1, 0)):
        got = N.tcp_transfer(shaped, src, dst, MB4, timeout=30)
        assert got["bytes"] == MB4
        assert got["seconds"] >= 0.6 * floor, (src, dst, got)
    loop = N.tcp_transfer(shaped, 0, 0, MB4, addr="127.0.0.1", timeout=30)
    assert loop["bytes"] == MB4 and loop["seconds"] < 0.5 * floor, loop

    unshaped = netns_hosts(2)
    got = N.tcp_transfer(unshaped, 0, 1, MB4, timeout=30)
    assert got["bytes"] == MB4 and got["seconds"] < 0.5 * floor, got


def test_everything_is_removed_on_exit_and_when_the_body_raises():
    require_netns()
    with N.NamespaceHosts(2, rate="100mbit") as hosts:
        names = hosts.names()
        assert _present(names) == sorted(names["netns"] + names["links"])
    assert _present(names) == []

    with pytest.raises(KeyError, match="boom"):
        with N.NamespaceHosts(2) as hosts:
            names = hosts.names()
            sleeper = hosts[1].popen(["sleep", "60"])
            raise KeyError("boom")
    assert _present(names) == []
    assert sleeper.wait(timeout=5) == -signal.SIGKILL


_OWNER = """
import json, sys, time
sys.path.insert(0, {root!r})
from tests.multihost.netns import NamespaceHosts
with NamespaceHosts(2, prefix="rst") as hosts:
    sleeper = hosts[1].popen(["sleep", "60"])
    print(json.dumps({{"names": hosts.names(), "sleeper": sleeper.pid}}), flush=True)
    time.sleep(60)
"""


def _start_owner():
    proc = subprocess.Popen([sys.executable, "-c", _OWNER.format(root=str(PROJECT_ROOT))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(20):
        proc.kill()
        raise TimeoutError("the owner process printed no names within 20 s")
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    return proc, json.loads(line)


def test_sigterm_removes_everything_and_sigkill_leftovers_go_with_cleanup_stale():
    require_netns()
    proc, info = _start_owner()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == -signal.SIGTERM
    assert _present(info["names"]) == [] and _gone(info["sleeper"])

    proc, info = _start_owner()
    proc.kill()
    proc.wait(timeout=20)
    assert _present(info["names"]) != []  # a SIGKILLed owner cannot clean up ...
    removed = N.cleanup_stale("rst")  # ... so the next run does
    assert set(removed) >= set(info["names"]["netns"] + info["names"]["links"])
    assert _present(info["names"]) == []
    deadline = time.monotonic() + 5
    while not _gone(info["sleeper"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _gone(info["sleeper"])


def test_kill_host_ends_every_process_in_that_host_only(netns_hosts2):
    hosts = netns_hosts2
    other = hosts[0].popen(["sleep", "60"])
    direct = hosts[1].popen(["sleep", "60"])
    escaped = hosts[1].popen(["/bin/sh", "-c", "setsid sleep 60 & echo $!; wait"],
                             stdout=subprocess.PIPE, text=True)  # a grandchild detached by setsid
    sel = selectors.DefaultSelector()
    sel.register(escaped.stdout, selectors.EVENT_READ)
    assert sel.select(10), "the shell in host 1 printed no pid within 10 s"
    grandchild = int(escaped.stdout.readline())
    assert grandchild in hosts[1].pids()

    before = set(hosts[1].pids())
    assert {direct.pid, escaped.pid, grandchild} <= before
    hosts.kill_host(1)
    assert hosts[1].pids() == []
    assert all(_gone(p) for p in before)
    assert direct.returncode == -signal.SIGKILL and escaped.returncode == -signal.SIGKILL
    assert other.poll() is None and hosts[0].pids() == [other.pid]
    os.kill(other.pid, 0)  # host 0 untouched


def test_kill_host_ends_a_process_it_started_before_it_entered_the_namespace(netns_hosts2):
    """A host's process killed at once after its start may not be in the namespace yet (`ip
    netns exec` before its setns, on a loaded machine): the host's own processes are killed
    anyway, not waited on until the deadline. Stood in for by a process outside the namespace."""
    hosts = netns_hosts2
    late = subprocess.Popen(["sleep", "60"], **N.OWN_GROUP)
    hosts[1]._procs.append(late)
    assert late.pid not in hosts[1].pids()
    t0 = time.monotonic()
    assert late.pid in hosts.kill_host(1, timeout=30)
    assert late.returncode == -signal.SIGKILL and time.monotonic() - t0 < 10
    assert late not in hosts[1]._procs


def test_the_docs_snippet_runs_on_namespace_hosts(netns_ready):
    """docs/multihost.md's snippet as written, from the project root; it leaves nothing behind."""
    import ast

    from tests.doc_snippets import run_snippet

    before = set(N.list_netns()) | set(N.list_links())
    out = run_snippet("multihost.hosts", cwd=PROJECT_ROOT, timeout=120).stdout.splitlines()
    assert out[:2] == ["10.77.0.1", "0 1"], out
    got = ast.literal_eval(out[-1])
    assert (got["bytes"], got["peer"]) == (MB4, "10.77.0.2"), got
    assert set(N.list_netns()) | set(N.list_links()) <= before
