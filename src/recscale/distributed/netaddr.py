"""Which address and network interface this host uses to reach another one.

On a host with several interfaces (or a network namespace, where the host name resolves to an
address the namespace does not have) the peers must be told the address that actually routes to
them, and gloo must listen on that interface (``GLOO_SOCKET_IFNAME``). Both follow from the
rendezvous endpoint: the local address the kernel picks to reach it, and the interface that
holds that address.
"""

from __future__ import annotations

import fcntl
import socket
import struct

_SIOCGIFADDR = 0x8915


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def route_addr(endpoint: str) -> str:
    """The local IPv4 address this host uses to reach ``endpoint`` (host:port). No packet is
    sent (a UDP socket only asks the kernel for a route); raises OSError if there is no route."""
    host, port = split_endpoint(endpoint)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(host), port or 9))
        return s.getsockname()[0]


def interface_of(addr: str) -> str | None:
    """The name of the interface that holds IPv4 address ``addr`` (None if none does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR,
                                  struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
            if socket.inet_ntoa(raw[20:24]) == addr:
                return name
    return None
