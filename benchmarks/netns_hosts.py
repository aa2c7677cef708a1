"""Network-namespace "hosts" on one machine, for people (root): make them, list them, remove them,
and measure what `--rate` does to TCP between them. The code is tests/multihost/netns.py, the
same the multi-host tests use.

    python benchmarks/netns_hosts.py up --hosts 2 --rate 100mbit
    python benchmarks/netns_hosts.py status
    python benchmarks/netns_hosts.py down
    python benchmarks/netns_hosts.py bandwidth --hosts 2 --rate 100mbit
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests.multihost

from tests.multihost import netns as N  # noqa: E402

UP_PREFIX = "rsup"  # `up` keeps its hosts after it exits, under a prefix the tests never clean


def _check() -> None:
    ok, why = N.available()
    if not ok:
        sys.exit(f"cannot make namespace hosts: {why}")


def _fmt(bits_per_s: float) -> str:
    return f"{bits_per_s / 1e9:.2f} Gbit/s" if bits_per_s >= 1e9 else f"{bits_per_s / 1e6:.1f} Mbit/s"


def cmd_up(a) -> int:
    _check()
    if N.owned(a.prefix):
        sys.exit(f"namespace hosts with prefix {a.prefix!r} exist already (see `status`); "
                 "run `down` first")
    hosts = N.NamespaceHosts(a.hosts, prefix=a.prefix, subnet=a.subnet, rate=a.rate)
    with hosts:
        hosts.detach()
    print(f"{a.hosts} namespace hosts on bridge {hosts.bridge}, subnet {a.subnet}.0/24, "
          f"links {'shaped to ' + str(a.rate) if a.rate else 'unshaped'}:")
    for h in hosts:
        print(f"  host {h.index}: namespace {h.name}  address {h.addr}")
    print("\nrun a command in a host (as root), e.g. a shell in host 0:")
    print(f"  ip netns exec {hosts[0].name} bash")
    for h in hosts:
        print(f"  ip netns exec {h.name} python -m http.server --bind {h.addr} 8000")
    print(f"\nremove them: python {sys.argv[0]} down" +
          (f" --prefix {a.prefix}" if a.prefix != UP_PREFIX else ""))
    return 0


def cmd_status(a) -> int:
    _check()
    found = N.owned(a.prefix)
    if not found:
        print(f"no namespace hosts with prefix {a.prefix!r}")
        return 0
    for tag, names in sorted(found.items()):
        print(f"{tag}: links {' '.join(sorted(names['links']))}")
        for ns in sorted(names["netns"]):
            addr = subprocess.run(["ip", "-n", ns, "-4", "-o", "addr", "show", "dev", "eth0"],
                                  capture_output=True, text=True, timeout=10).stdout.split()
            qdisc = subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", "eth0"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            rate = qdisc.split(" rate ")[1].split()[0] if " rate " in qdisc else "unshaped"
            pids = N.Host(0, ns, "").pids()
            print(f"  {ns}: {addr[3] if len(addr) > 3 else '(no address)'}  rate {rate}  "
                  f"{len(pids)} process(es)")
    return 0


def cmd_down(a) -> int:
    _check()
    removed = N.remove_all(a.prefix)
    print(f"removed {len(removed)}: {' '.join(removed)}" if removed
          else f"nothing with prefix {a.prefix!r}")
    left = N.owned(a.prefix)
    if left:
        sys.exit(f"still present: {left}")
    return 0


def _median(hosts, src, dst, nbytes, repeats, addr=None):
    runs = [N.tcp_transfer(hosts, src, dst, nbytes, addr=addr, timeout=120)["bits_per_s"]
            for _ in range(repeats)]
    return statistics.median(runs), runs


def cmd_bandwidth(a) -> int:
    _check()
    rate_bits = None if a.rate is None else N.parse_rate(a.rate)
    # about one second per transfer at the shaped rate; large enough to swamp the tbf burst
    between = a.bytes or (min(256 << 20, max(4 << 20, rate_bits // 8)) if rate_bits else 256 << 20)
    loop = a.bytes or 256 << 20
    with N.NamespaceHosts(a.hosts, prefix="rsbw", rate=a.rate) as hosts:
        med, runs = _median(hosts, 0, 1, between, a.repeats)
        lmed, lruns = _median(hosts, 0, 0, loop, a.repeats, addr="127.0.0.1")
    shaping = f"tbf {a.rate} ({_fmt(rate_bits)})" if rate_bits else "none"
    print(f"links: {shaping}; TCP, one stream, median of {a.repeats}")
    print(f"  between hosts (host 0 -> host 1, {between >> 20} MiB): {_fmt(med):>14}   runs: "
          + ", ".join(_fmt(r) for r in runs)
          + (f"   ({med / rate_bits:.2f} x the rate)" if rate_bits else ""))
    print(f"  loopback inside host 0 ({loop >> 20} MiB):      {_fmt(lmed):>14}   runs: "
          + ", ".join(_fmt(r) for r in lruns))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, hlp in (("up", "make hosts and keep them"), ("status", "list hosts"),
                      ("down", "remove hosts"), ("bandwidth", "measure TCP between two hosts")):
        s = sub.add_parser(name, help=hlp)
        if name in ("up", "bandwidth"):
            s.add_argument("--hosts", type=int, default=2)
            s.add_argument("--rate", default=None, help="tc rate per host link, e.g. 100mbit")
        if name == "up":
            s.add_argument("--subnet", default="10.77.0", help="first three octets of the /24")
        if name != "bandwidth":
            s.add_argument("--prefix", default=UP_PREFIX)
        else:
            s.add_argument("--bytes", type=int, default=None, help="bytes per transfer")
            s.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    if a.cmd == "bandwidth" and a.hosts < 2:
        p.error("bandwidth needs --hosts 2 or more")
    return {"up": cmd_up, "status": cmd_status, "down": cmd_down,
            "bandwidth": cmd_bandwidth}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
