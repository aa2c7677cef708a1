"""Network-namespace "hosts" on one machine, for multi-host tests and for people.

`NamespaceHosts(n)` makes n network namespaces, each joined to one bridge in the root namespace by
a veth pair, with its own address `<subnet>.<i+1>/24` on `eth0` and its own loopback. With `rate`
the link of every host is shaped by `tc ... tbf` in both directions (egress of the host's `eth0`
and egress of the bridge-side veth end), like a full-duplex NIC of that rate; loopback inside a
host is not shaped. The root namespace has no address on the bridge and the hosts have no default
route: they reach each other and nothing else. Because every instance has its own bridge (its own
L2 segment), concurrent instances may use the same subnet; their names include the owner's pid and
a per-process counter, so they never clash.

Everything is removed on exit, also when the body raises or the process gets SIGTERM; a SIGKILLed
owner leaves its namespaces behind, and `cleanup_stale(prefix)` removes those whose owner pid is
gone. Needs root, `ip` and `tc` (iproute2): see `available()`.

Run as a script, this file is also the small TCP tool the hosts use to measure each other
(`sink`, `source`, `probe`); it imports only the standard library.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import itertools
import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field

IFNAMSIZ = 15  # longest Linux interface name
DEFAULT_TIMEOUT = 60.0
_ROLE = r"(br|v\d+|h\d+)"
_counter = itertools.count()
_live: list[NamespaceHosts] = []
_live_lock = threading.RLock()
_prev_sigterm = None  # the SIGTERM handler ours replaced, while ours is installed

# a process group of its own, so os.killpg ends a command and everything it started (Python 3.11
# and later start one in the child itself; 3.10 through setpgrp before exec)
OWN_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}


def _b36(x: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        x, r = divmod(x, 36)
        out = digits[r] + out
        if x == 0:
            return out


def _tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for d in ("/usr/sbin", "/sbin", "/usr/bin", "/bin"):
        if os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    return None


def _ip() -> str:
    path = _tool("ip")
    if path is None:
        raise RuntimeError("`ip` (iproute2) not found on PATH nor in /usr/sbin, /sbin")
    return path


def _sh(argv: list[str], *, input: str | None = None, timeout: float = 30.0,
        check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout}"
            + (f"\ninput:\n{input}" if input else ""))
    return proc


def parse_rate(rate: str | int | float) -> int:
    """Bits per second from tc's notation ("100mbit", "1gbit", "500kbit", "10mbps" = bytes) or a
    number of bits per second."""
    if isinstance(rate, (int, float)):
        bits = float(rate)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(bit|bps)?\s*", str(rate).lower())
        if m is None:
            raise ValueError(f"rate {rate!r}: expected a number and a unit like '100mbit', "
                             "'1gbit', '500kbit' or '10mbps' (bytes/s)")
        scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]
        bits = float(m.group(1)) * scale * (8 if m.group(3) == "bps" else 1)
    if bits < 8000:
        raise ValueError(f"rate {rate!r}: at least 8kbit is needed")
    return int(bits)


def _tbf(rate_bits: int) -> str:
    """tbf arguments: burst of 5 ms at the rate (at least 64 KiB, so one GSO packet passes) and a
    queue of 50 ms."""
    burst = max(64 * 1024, rate_bits // 8 // 200)
    return f"root tbf rate {rate_bits}bit burst {burst} latency 50ms"


@dataclass
class Host:
    """One namespace host. `run`/`popen` start a command inside it (`ip netns exec`)."""

    index: int
    name: str  # the network namespace
    addr: str  # its address on the test subnet
    _procs: list = field(default_factory=list, repr=False)

    def argv(self, cmd) -> list[str]:
        """`cmd` (a sequence, or a string run by /bin/sh -c) prefixed to run inside this host."""
        cmd = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else [str(c) for c in cmd]
        return [_ip(), "netns", "exec", self.name, *cmd]

    def popen(self, cmd, *, env=None, cwd=None, **kwargs) -> subprocess.Popen:
        """Start `cmd` in this host, as the leader of a process group of its own (kill the
        group with os.killpg)."""
        for key in OWN_GROUP:
            kwargs.pop(key, None)
        proc = subprocess.Popen(self.argv(cmd), env=env, cwd=cwd, **OWN_GROUP, **kwargs)
        self._procs.append(proc)
        return proc

    def run(self, cmd, *, env=None, cwd=None, timeout: float = DEFAULT_TIMEOUT,
            check: bool = False, input: str | None = None,
            capture_output: bool = True) -> subprocess.CompletedProcess:
        """Run `cmd` in this host and wait at most `timeout` s (text mode; output captured unless
        capture_output=False). On timeout its whole process group is killed and
        subprocess.TimeoutExpired names the host's command."""
        pipe = subprocess.PIPE if capture_output else None
        proc = self.popen(cmd, env=env, cwd=cwd, text=True, stdout=pipe, stderr=pipe,
                          stdin=subprocess.PIPE if input is not None else None)
        try:
            out, err = proc.communicate(input=input, timeout=timeout)
        except subprocess.TimeoutExpired:
            _killpg(proc)
            out, err = proc.communicate(timeout=10)
            raise subprocess.TimeoutExpired(proc.args, timeout, out, err) from None
        finally:
            if proc in self._procs and proc.returncode is not None:
                self._procs.remove(proc)
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if check:
            done.check_returncode()
        return done

    def pids(self) -> list[int]:
        """Every process whose network namespace is this host's."""
        out = _sh([_ip(), "netns", "pids", self.name], check=False).stdout
        return [int(p) for p in out.split()]


def _killpg(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class NamespaceHosts:
    """`with NamespaceHosts(3, rate="100mbit") as hosts: hosts[0].run([...])`.

    `prefix` (lowercase letters and digits) starts every name: namespaces `<prefix>-<pid>-<k>-h<i>`,
    bridge `<prefix>-<pid>-<k>-br`, bridge-side veth ends `<prefix>-<pid>-<k>-v<i>` (pid and k in
    base 36); the host's end is `eth0` inside its namespace.
    """

    def __init__(self, n: int, prefix: str = "rs", subnet: str = "10.77.0",
                 rate: str | int | None = None, timeout: float = 30.0):
        if not 1 <= int(n) <= 250:
            raise ValueError(f"n={n!r}: between 1 and 250 hosts")
        if not re.fullmatch(r"[a-z][a-z0-9]*", prefix):
            raise ValueError(f"prefix={prefix!r}: lowercase letters and digits, starting with a "
                             "letter")
        if not re.fullmatch(r"(\d{1,3})\.(\d{1,3})\.(\d{1,3})", subnet) or any(
                int(o) > 255 for o in subnet.split(".")):
            raise ValueError(f"subnet={subnet!r}: the first three octets of a /24, e.g. '10.77.0'")
        self.n = int(n)
        self.prefix = prefix
        self.subnet = subnet
        self.rate_bits = None if rate is None else parse_rate(rate)
        self.rate = rate
        self.timeout = timeout
        self.tag = f"{prefix}-{_b36(os.getpid())}-{_b36(next(_counter))}"
        self.bridge = f"{self.tag}-br"
        self.veths = [f"{self.tag}-v{i}" for i in range(self.n)]
        longest = max([self.bridge, *self.veths], key=len)
        if len(longest) > IFNAMSIZ:
            raise ValueError(f"prefix={prefix!r}: interface name {longest!r} is longer than "
                             f"{IFNAMSIZ} characters; use a shorter prefix")
        self.hosts = [Host(i, f"{self.tag}-h{i}", f"{subnet}.{i + 1}") for i in range(self.n)]
        self._up = False
        self._detached = False

    # -- the context -----------------------------------------------------------------------
    def __enter__(self) -> NamespaceHosts:
        _register(self)
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(raise_leftovers=exc_type is None)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def __iter__(self):
        return iter(self.hosts)

    def names(self) -> dict[str, list[str]]:
        """The namespaces and root-namespace links this instance owns."""
        return {"netns": [h.name for h in self.hosts], "links": [self.bridge, *self.veths]}

    def _create(self) -> None:
        ip, tc = _ip(), _tool("tc")
        if self.rate_bits is not None and tc is None:
            raise RuntimeError("`tc` (iproute2) not found: needed for rate=" + repr(self.rate))
        self._up = True  # from here on close() has something to remove
        # bridge-nf off on our bridge: a host firewall's FORWARD rules must not see test traffic
        root = [f"netns add {h.name}" for h in self.hosts]
        root += [f"link add {self.bridge} type bridge nf_call_iptables 0 nf_call_ip6tables 0 "
                 "nf_call_arptables 0", f"link set {self.bridge} up"]
        for h, veth in zip(self.hosts, self.veths):
            root += [f"link add {veth} type veth peer name eth0 netns {h.name}",
                     f"link set {veth} master {self.bridge}", f"link set {veth} up"]
        _sh([ip, "-batch", "-"], input="\n".join(root) + "\n", timeout=self.timeout)
        for h in self.hosts:
            inside = ["link set lo up", f"addr add {h.addr}/24 dev eth0", "link set eth0 up"]
            _sh([ip, "-n", h.name, "-batch", "-"], input="\n".join(inside) + "\n",
                timeout=self.timeout)
        if self.rate_bits is not None:
            tbf = _tbf(self.rate_bits)
            for h in self.hosts:
                _sh([tc, "-n", h.name, "qdisc", "add", "dev", "eth0", *tbf.split()],
                    timeout=self.timeout)
            lines = [f"qdisc add dev {veth} {tbf}" for veth in self.veths]
            _sh([tc, "-batch", "-"], input="\n".join(lines) + "\n", timeout=self.timeout)

    # -- losing a host ---------------------------------------------------------------------
    def kill_host(self, i: int, timeout: float = 10.0) -> list[int]:
        """SIGKILL every process in host i's namespace (until none is left, at most `timeout` s)
        and reap the ones this object started. Returns the pids it signalled."""
        host = self.hosts[i]
        killed: list[int] = []
        deadline = time.monotonic() + timeout
        while True:
            pids = [p for p in host.pids() if p != os.getpid()]
            # and our own children's groups: one started just now may not be in the namespace
            # yet (`ip netns exec` before its setns, on a loaded machine)
            ours = [proc for proc in host._procs if proc.poll() is None]
            if not pids and not ours:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"kill_host({i}): processes {pids or [p.pid for p in ours]} "
                                   f"still run in namespace {host.name} after {timeout} s")
            for proc in ours:
                _killpg(proc)
                killed.append(proc.pid)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
            for proc in host._procs:  # reap our own children so they leave the namespace
                try:
                    proc.wait(timeout=0.05)
                except subprocess.TimeoutExpired:
                    pass
            time.sleep(0.01)
        for proc in list(host._procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"kill_host({i}): pid {proc.pid} ({proc.args}) did not exit "
                                   f"within {timeout} s of SIGKILL") from None
            host._procs.remove(proc)
        return sorted(set(killed))

    # -- removal ---------------------------------------------------------------------------
    def detach(self) -> NamespaceHosts:
        """Keep the hosts after exit (benchmarks/netns_hosts.py `up`); remove them later with
        `remove_all(prefix)`."""
        self._detached = True
        _unregister(self)
        return self

    def close(self, raise_leftovers: bool = True) -> None:
        """Kill every process in the hosts and remove namespaces, veths and bridge. Idempotent."""
        if self._detached:
            return
        _unregister(self)
        if not self._up:
            return
        self._up = False
        problems = []
        for i in range(self.n):
            try:
                self.kill_host(i)
            except Exception as e:  # go on removing; report below
                problems.append(str(e))
        left = _remove(self.names()["netns"], self.names()["links"])
        if left:
            problems.append(f"still present after removal: {left}")
        if problems:
            msg = f"NamespaceHosts {self.tag}: " + "; ".join(problems)
            if raise_leftovers:
                raise RuntimeError(msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=2)


# -- listing and removing by name ------------------------------------------------------------
def list_netns() -> list[str]:
    out = _sh([_ip(), "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def list_links() -> list[str]:
    out = _sh([_ip(), "-o", "link", "show"], check=False).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()
            if line.count(":") >= 2]


def _remove(netns: list[str], links: list[str], timeout: float = 10.0) -> list[str]:
    """Delete these links and namespaces (processes inside must be gone); returns what is left
    after up to `timeout` s (a namespace's veth goes away when the kernel frees the namespace)."""
    present_links = set(list_links())
    present_ns = set(list_netns())
    veth = [name for name in links if name in present_links and re.search(r"-v\d+$", name)]
    lines = [f"link del {name}" for name in veth]  # both ends go; then namespaces, then bridges
    lines += [f"netns del {name}" for name in netns if name in present_ns]
    lines += [f"link del {name}" for name in links if name in present_links and name not in veth]
    if lines:
        _sh([_ip(), "-force", "-batch", "-"], input="\n".join(lines) + "\n", check=False)
    deadline = time.monotonic() + timeout
    while True:
        left = sorted((set(netns) & set(list_netns())) | (set(links) & set(list_links())))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def owned(prefix: str = "rs") -> dict[str, dict[str, list[str]]]:
    """Namespaces and links named by NamespaceHosts(prefix=prefix), by owner tag."""
    pat = re.compile(rf"^({re.escape(prefix)}-([0-9a-z]+)-[0-9a-z]+)-{_ROLE}$")
    found: dict[str, dict[str, list[str]]] = {}
    for kind, names in (("netns", list_netns()), ("links", list_links())):
        for name in names:
            m = pat.match(name)
            if m:
                found.setdefault(m.group(1), {"netns": [], "links": []})[kind].append(name)
    return found


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_in(netns: list[str], timeout: float = 10.0) -> None:
    for name in netns:
        h = Host(0, name, "")
        deadline = time.monotonic() + timeout
        while (pids := [p for p in h.pids() if p != os.getpid()]) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)


def remove_all(prefix: str) -> list[str]:
    """Remove every namespace host with this prefix, whoever made it; returns the names removed."""
    removed = []
    for names in owned(prefix).values():
        _kill_in(names["netns"])
        left = _remove(names["netns"], names["links"])
        removed += [x for x in names["netns"] + names["links"] if x not in left]
    return sorted(removed)


def cleanup_stale(prefix: str = "rs") -> list[str]:
    """Remove namespace hosts with this prefix whose owner process is gone (a SIGKILLed test run).
    A stale owner whose pid was reused by a live process is not detected. Returns names removed."""
    removed = []
    for tag, names in owned(prefix).items():
        pid = int(tag[len(prefix) + 1:].split("-")[0], 36)
        if pid == os.getpid() or _pid_alive(pid):
            continue
        _kill_in(names["netns"])
        left = _remove(names["netns"], names["links"])
        removed += [x for x in names["netns"] + names["links"] if x not in left]
    return sorted(removed)


# -- cleanup on SIGTERM and at interpreter exit -----------------------------------------------
def _on_sigterm(signum, frame):
    with _live_lock:
        live = list(_live)
    for inst in live:
        try:
            inst.close(raise_leftovers=False)
        except Exception:
            pass
    prev = _prev_sigterm
    _restore_sigterm()
    if callable(prev):
        prev(signum, frame)
    elif prev != signal.SIG_IGN:
        os.kill(os.getpid(), signal.SIGTERM)  # the default action, now that we are clean


def _restore_sigterm():
    global _prev_sigterm
    if _prev_sigterm is not None and threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, _prev_sigterm)
        _prev_sigterm = None


def _register(inst: NamespaceHosts) -> None:
    global _prev_sigterm
    with _live_lock:
        _live.append(inst)
        if _prev_sigterm is None and threading.current_thread() is threading.main_thread():
            prev = signal.getsignal(signal.SIGTERM)
            if prev is not signal.SIG_IGN and prev is not _on_sigterm:
                _prev_sigterm = prev if prev is not None else signal.SIG_DFL
                signal.signal(signal.SIGTERM, _on_sigterm)


def _unregister(inst: NamespaceHosts) -> None:
    with _live_lock:
        if inst in _live:
            _live.remove(inst)
        if not _live:
            _restore_sigterm()


@atexit.register
def _close_all_at_exit():
    with _live_lock:
        live = list(_live)
    for inst in live:
        inst.close(raise_leftovers=False)


# -- can this machine do it? ------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    """(True, "") when this process can make namespace hosts with shaping; else (False, why)."""
    if not sys.platform.startswith("linux"):
        return False, "network namespaces need Linux"
    if os.geteuid() != 0:
        return False, "namespace hosts need root (ip netns add, tc qdisc); run the tests as root"
    for tool in ("ip", "tc"):
        if _tool(tool) is None:
            return False, f"`{tool}` is not installed (Debian: apt-get install iproute2)"
    try:  # the real thing, once: namespace, bridge, veth, tbf
        with NamespaceHosts(1, prefix="rsp", rate="1gbit", timeout=10):
            pass
    except Exception as e:
        return False, f"cannot make a namespace host here: {e}"
    return True, ""


# -- TCP between hosts --------------------------------------------------------------------------
def _read_line(proc: subprocess.Popen, timeout: float, who: str) -> str:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            raise TimeoutError(f"{who} printed nothing within {timeout} s")
        line = proc.stdout.readline()
    finally:
        sel.close()
    if not line:
        err = proc.stderr.read() if proc.stderr else ""
        raise RuntimeError(f"{who} exited before it was ready: {err.strip()}")
    return line


def tcp_transfer(hosts: NamespaceHosts, src: int, dst: int, nbytes: int, *,
                 addr: str | None = None, timeout: float = 60.0) -> dict:
    """Send `nbytes` over TCP from host `src` to a receiver in host `dst` at `addr` (default: dst's
    address; "127.0.0.1" with src == dst measures the host's loopback). Returns the receiver's view:
    {"bytes", "seconds" (accept to end of stream), "peer" (the sender's address), "bits_per_s"}."""
    me = [sys.executable, os.path.abspath(__file__)]
    bind = addr or hosts[dst].addr
    sink = hosts[dst].popen([*me, "sink", "--bind", bind, "--timeout", str(timeout)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = json.loads(_read_line(sink, timeout, f"receiver in host {dst}"))["port"]
        sent = hosts[src].run([*me, "source", "--addr", bind, "--port", str(port),
                               "--bytes", str(nbytes), "--timeout", str(timeout)],
                              timeout=timeout)
        if sent.returncode != 0:
            raise RuntimeError(f"sender in host {src} to {bind}:{port} failed: "
                               f"{sent.stderr.strip()}")
        out, err = sink.communicate(timeout=timeout)
        if sink.returncode != 0:
            raise RuntimeError(f"receiver in host {dst} failed: {err.strip()}")
    finally:
        if sink.poll() is None:
            _killpg(sink)
            sink.communicate(timeout=10)
    got = json.loads(out.strip().splitlines()[-1])
    got["bits_per_s"] = 8 * got["bytes"] / max(got["seconds"], 1e-9)
    return got


def probe(host: Host, addr: str, port: int, timeout: float = 2.0) -> dict:
    """Try a TCP connection from `host` to addr:port: {"ok": bool, "error": str}."""
    me = [sys.executable, os.path.abspath(__file__)]
    done = host.run([*me, "probe", "--addr", addr, "--port", str(port), "--timeout",
                     str(timeout)], timeout=timeout + 30)
    if done.returncode != 0:
        raise RuntimeError(f"probe in {host.name} failed: {done.stderr.strip()}")
    return json.loads(done.stdout)


def _main(argv=None) -> int:
    p = argparse.ArgumentParser(description="TCP tool run inside namespace hosts")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sink", help="accept one connection, read to EOF, print bytes and time")
    s.add_argument("--bind", required=True)
    s.add_argument("--timeout", type=float, default=60.0)
    c = sub.add_parser("source", help="connect and send --bytes, wait for the receiver's ack")
    c.add_argument("--addr", required=True)
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--bytes", type=int, required=True)
    c.add_argument("--timeout", type=float, default=60.0)
    q = sub.add_parser("probe", help="try to connect; print ok or the error")
    q.add_argument("--addr", required=True)
    q.add_argument("--port", type=int, required=True)
    q.add_argument("--timeout", type=float, default=2.0)
    a = p.parse_args(argv)
    if a.cmd == "sink":
        with socket.create_server((a.bind, 0)) as srv:
            srv.settimeout(a.timeout)
            print(json.dumps({"port": srv.getsockname()[1]}), flush=True)
            conn, peer = srv.accept()
            t0 = time.perf_counter()
            conn.settimeout(a.timeout)
            buf, total = bytearray(1 << 20), 0
            while n := conn.recv_into(buf):
                total += n
            seconds = time.perf_counter() - t0
            conn.sendall(total.to_bytes(8, "little"))
            conn.close()
        print(json.dumps({"bytes": total, "seconds": seconds, "peer": peer[0]}), flush=True)
    elif a.cmd == "source":
        chunk = memoryview(bytes(1 << 20))
        with socket.create_connection((a.addr, a.port), timeout=a.timeout) as conn:
            left = a.bytes
            while left > 0:
                conn.sendall(chunk[:min(left, len(chunk))])
                left -= min(left, len(chunk))
            conn.shutdown(socket.SHUT_WR)
            ack = conn.recv(8)
        if int.from_bytes(ack, "little") != a.bytes:
            print(f"receiver acknowledged {ack!r}, sent {a.bytes} bytes", file=sys.stderr)
            return 1
    else:
        try:
            socket.create_connection((a.addr, a.port), timeout=a.timeout).close()
            print(json.dumps({"ok": True, "error": ""}))
        except OSError as e:
            print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
