"""Where an HTTP tool may connect: the decision (pure) and a connect that keeps to it.

A tool's URL comes from the manifest, but where it leads is decided by DNS and by the redirects its
server sends, both of which a model-driven call can steer. So every address is checked after name
resolution, the socket connects to the very address that was checked (no second lookup for a
rebinding DNS server to answer differently), and redirects stay on the URL's own origin.

Refused unless allow-listed: loopback, link-local (node-local services are often there), the cloud
metadata addresses, unspecified addresses, the cluster's own API server, and the node the pod runs on
(its kubelet; KUBERL_NODE_IP, which the operator sets from the pod's status.hostIP).
`KUBERL_TOOL_ALLOWED_NETWORKS` (CIDRs separated by commas or spaces; the operator sets it from the
chart's `tools.allowedNetworks`) re-allows what it names, e.g. `127.0.0.0/8` for a tool served on
the same machine under `kuberl run`.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..config.multi_turn import NODE_IP_ENV, TOOL_NETWORKS_ENV

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

ALLOWED_NETWORKS_ENV = TOOL_NETWORKS_ENV

METADATA_ADDRESSES: frozenset[Address] = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, ...
        "fd00:ec2::254",  # AWS over IPv6
        "100.100.100.200",  # Alibaba Cloud
    )
)
_REFUSED_NETWORKS: tuple[tuple[Network, str], ...] = tuple(
    (ipaddress.ip_network(n), why)
    for n, why in (
        ("127.0.0.0/8", "a loopback address"),
        ("::1/128", "a loopback address"),
        ("169.254.0.0/16", "a link-local address"),
        ("fe80::/10", "a link-local address"),
        ("0.0.0.0/8", "an unspecified address"),
        ("::/128", "an unspecified address"),
    )
)


class NetworkSettingError(ValueError):
    """KUBERL_TOOL_ALLOWED_NETWORKS holds something that is not a CIDR."""


def address_refusal(
    address: Address, allowed: Sequence[Network] = (), cluster_api: Iterable[Address] = (), node: Iterable[Address] = ()
) -> str | None:
    """Why a tool may not connect to `address` (None: it may). `allowed` re-allows what it contains."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 reaches 127.0.0.1
    if any(address in network for network in allowed if network.version == address.version):
        return None
    if address in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if address in set(cluster_api):
        return "the cluster's API server"
    if address in set(node):
        return "the node's own address (its kubelet)"
    for network, why in _REFUSED_NETWORKS:
        if network.version == address.version and address in network:
            return why
    return None


def parse_allowed_networks(text: str) -> tuple[Network, ...]:
    """CIDRs (or single addresses) separated by commas or whitespace."""
    networks = []
    for item in text.replace(",", " ").split():
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise NetworkSettingError(
                f"{ALLOWED_NETWORKS_ENV}: {item!r} is not a network: write CIDRs such as 127.0.0.0/8 or 10.1.2.3/32, separated by commas"
            ) from None
    return tuple(networks)


@dataclass(frozen=True)
class NetworkPolicy:
    """What the tools of this process may reach."""

    allowed: tuple[Network, ...] = ()
    cluster_api: frozenset[Address] = frozenset()
    node: frozenset[Address] = frozenset()

    def refusal(self, address: Address) -> str | None:
        return address_refusal(address, self.allowed, self.cluster_api, self.node)


def policy_from_environment() -> NetworkPolicy:
    """The allow-list from the environment, and the API server's and the node's addresses where this runs in a cluster."""
    node = set()
    for item in os.environ.get(NODE_IP_ENV, "").replace(",", " ").split():
        try:
            node.add(ipaddress.ip_address(item))
        except ValueError:
            pass  # not an address: nothing to refuse by it
    return NetworkPolicy(
        parse_allowed_networks(os.environ.get(ALLOWED_NETWORKS_ENV, "")),
        _cluster_api_addresses(os.environ.get("KUBERNETES_SERVICE_HOST", "")),
        frozenset(node),
    )


@functools.lru_cache(maxsize=4)
def _cluster_api_addresses(service_host: str) -> frozenset[Address]:
    found: set[Address] = set()
    if service_host:
        try:
            found.add(ipaddress.ip_address(service_host))
        except ValueError:
            found |= set(_resolve(service_host, 443))
        # Only in a cluster: elsewhere the name does not exist, and asking for it costs a DNS timeout.
        try:
            found |= set(_resolve("kubernetes.default.svc", 443))
        except OSError:
            pass
    return frozenset(found)


def _resolve(host: str, port: int) -> list[Address]:
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


def _literal(host: str, port: int) -> list[tuple]:
    """An address written as the host needs no resolver (and some refuse IPv6 literals on IPv4-only hosts)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return []
    if address.version == 4:
        return [(socket.AF_INET, socket.SOCK_STREAM, 0, "", (host, port))]
    return [(socket.AF_INET6, socket.SOCK_STREAM, 0, "", (host, port, 0, 0))]


class RefusedAddress(OSError):
    """The host resolves only to addresses the tool may not reach."""


def checked_connection(policy: NetworkPolicy):
    """A replacement for http.client's `_create_connection`: resolve once, check every address, connect
    to a checked one."""

    def connect(address: tuple[str, int], timeout: float | None = None, source_address=None) -> socket.socket:
        host, port = address
        infos = _literal(host, port) or socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        refusals, last_error = [], None
        for family, kind, proto, _, sockaddr in infos:
            ip = ipaddress.ip_address(sockaddr[0].split("%", 1)[0])
            why = policy.refusal(ip)
            if why is not None:
                refusals.append(f"{ip} is {why}")
                continue
            sock = socket.socket(family, kind, proto)
            try:
                if timeout is not None:
                    sock.settimeout(timeout)
                sock.connect(sockaddr)  # the checked address itself, not the name again
                return sock
            except OSError as exc:
                sock.close()
                last_error = exc
        if last_error is not None:
            raise last_error
        raise RefusedAddress(
            f"{host} resolves to {', '.join(refusals)}, which tools may not call; "
            f"an administrator can allow it with the chart's tools.allowedNetworks "
            f"({ALLOWED_NETWORKS_ENV} under `kuberl run`)"
        )

    return connect
