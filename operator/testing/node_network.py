"""The network of the test node: a network namespace of its own, joined to the host by a veth pair.

    host namespace: HOST_IP (the API server listens here)  <-veth->  node namespace: NODE_IP

The node namespace has no default route, so nothing sent inside it can leave the machine. The host
gets a route to the pods through the node (Prometheus scrapes trainer pods from the host).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

HOST_IP, NODE_IP = "10.250.0.1", "10.250.0.2"
VETH_PREFIX = 24
POD_CIDR = "10.244.0.0/24"
NETNS_PREFIX = "kuberl-"
COMMAND_TIMEOUT = 30
"""Seconds for one `ip` or `sysctl` command: they take milliseconds; a hung one fails the set-up instead of the run."""


class NodeNetworkError(RuntimeError):
    """A step of making the node's network failed; the message names the command."""


@dataclass(frozen=True)
class NodeNetwork:
    """The node's network namespace and the veth pair that joins it to the host."""

    netns: str
    host_if: str
    node_if: str

    @staticmethod
    def named(tag: str) -> "NodeNetwork":
        """The names of the network of `tag` (interface names have at most 15 characters)."""
        return NodeNetwork(netns=f"{NETNS_PREFIX}{tag}", host_if=f"krh{tag}"[:15], node_if=f"krn{tag}"[:15])

    @staticmethod
    def create(tag: str) -> "NodeNetwork":
        net = NodeNetwork.named(tag)
        net.destroy()  # what a killed run of the same tag left
        steps = [
            ["ip", "netns", "add", net.netns],
            ["ip", "link", "add", net.host_if, "type", "veth", "peer", "name", net.node_if],
            ["ip", "link", "set", net.node_if, "netns", net.netns],
            ["ip", "addr", "add", f"{HOST_IP}/{VETH_PREFIX}", "dev", net.host_if],
            ["ip", "link", "set", net.host_if, "up"],
            *[
                net.inside(cmd)
                for cmd in (
                    ["ip", "addr", "add", f"{NODE_IP}/{VETH_PREFIX}", "dev", net.node_if],
                    ["ip", "link", "set", net.node_if, "up"],
                    ["ip", "link", "set", "lo", "up"],
                    # Per namespace: routing between pods and the veth, and iptables on bridged traffic
                    # (kube-proxy's rules must see a pod's reply to another pod on the same bridge).
                    ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"],
                    ["sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1"],
                )
            ],
            # The host reaches pods (Prometheus scraping a trainer) through the node.
            ["ip", "route", "add", POD_CIDR, "via", NODE_IP, "dev", net.host_if],
        ]
        for cmd in steps:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
            if result.returncode != 0:
                net.destroy()
                raise NodeNetworkError(f"node network: `{' '.join(cmd)}` failed: {result.stderr.strip()}")
        return net

    def inside(self, argv: list[str]) -> list[str]:
        """`argv` run in the node's network namespace, with the host's mounts (cgroups, /sys)."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--", *argv]

    def destroy(self) -> None:
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, timeout=COMMAND_TIMEOUT)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, timeout=COMMAND_TIMEOUT)
