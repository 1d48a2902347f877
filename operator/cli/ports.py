"""Free TCP ports on loopback: for `kuberl run`'s rank-0 store, and for the tests' and benchmarks' servers."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Above the well-known ports of Kubernetes components that tests start with their defaults (the
# kubelet's healthz 10248 and API 10250, kube-proxy's 10249/10256, controller manager's 10257, ...).
_LOWEST_PORT = 20000
_RANDOM = random.SystemRandom()  # not the seeded module RNG: two seeded processes would draw the same ports
_handed_out: set[int] = set()  # registry of this process's picks: a port is never handed out twice


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now, and that the kernel will not hand out.

    A port taken with bind(0) lies in the kernel's ephemeral range, which is also where every outgoing
    connection gets its local port: between our check and the server's own bind, a client socket of a
    busy test (an API server talking to etcd) can take it ("address already in use", seen in CI).
    So the port is drawn at random below that range, where the kernel never assigns one by itself.
    """
    low = _ephemeral_low()
    if low - _LOWEST_PORT < 1000:  # no room below the ephemeral range on this machine
        return _bound_port(0)
    for _ in range(200):
        port = _RANDOM.randrange(_LOWEST_PORT, low)
        if port in _handed_out:
            continue
        try:
            _bound_port(port)
        except OSError:
            continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free TCP port on loopback between {_LOWEST_PORT} and {low}")


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bound_port(port: int) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        return s.getsockname()[1]
