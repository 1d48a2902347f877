"""A second NetworkPolicy enforcer for the real test node: kube-router's network policy controller
(github.com/cloudnativelabs/kube-router, a maintained CNI whose firewall part runs on its own), built from
the Go module proxy and run as a process in the node's network namespace with its router and service
proxy off.

It turns each NetworkPolicy into iptables chains per pod and ipsets of the peers' addresses, so it needs
the kernel's ip_set and xt_set and bridged traffic through iptables (the node's namespace sets
`bridge-nf-call-iptables`), not nftables' `queue` expression that kube-network-policies needs: on a kernel
without the latter this one still enforces. The tests use kube-network-policies where the kernel takes it.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


from .control_plane import SERVICE_CIDR
from .enforcer_setup import go_binary, service_account_token

VERSION = "v2.1.0"  # the release the Go module proxy serves here; it runs only in tests, never in the product
MODULE = "github.com/cloudnativelabs/kube-router/v2"
RULES = [
    {"apiGroups": [""], "resources": ["pods", "namespaces", "nodes", "services", "endpoints"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
]
SYNC_SECONDS = 60.0
SYNCED = "sync iptables took"  # the network policy controller logs it (at -v=1) after each full sync


def kernel_refuses_ipset() -> str | None:
    """Why this machine cannot run kube-router's firewall, asked before it is built; None when it can."""
    try:
        probe = subprocess.run(
            ["unshare", "--net", "ipset", "create", "kuberl-probe", "hash:ip"], capture_output=True, text=True, timeout=30
        )
    except FileNotFoundError:
        return "the ipset command is missing (Debian's ipset package; scripts/node-deps.sh installs it)"
    if probe.returncode != 0:
        return f"the kernel refuses an ipset (ip_set): {probe.stderr.strip()[-500:]}"
    return None


def binary(cache: Path = Path.home() / ".cache" / "kuberl" / "node") -> Path:
    """kube-router's binary, built once into `cache` (minutes on 2 cores)."""
    return go_binary(MODULE, VERSION, "./cmd/kube-router", cache / f"kube-router-{VERSION}" / "kube-router")


def start(plane, netns: str, node_name: str, workdir: Path, router: Path) -> subprocess.Popen:
    """kube-router's firewall for `node_name`, in network namespace `netns`, with a ServiceAccount of its own rights."""
    name, namespace = "kube-router", "kube-system"
    token = service_account_token(plane, name, namespace, RULES)
    workdir.mkdir(parents=True, exist_ok=True)
    kubeconfig = plane.kubeconfig_for_token(token, workdir / "kubeconfig")
    argv = [
        "nsenter",
        f"--net=/run/netns/{netns}",
        str(router),
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={node_name}",
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",
        "--enable-cni=false",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--health-port=0",
        "--metrics-port=0",
        "--iptables-sync-period=10s",
        "--v=2",
    ]
    log = open(workdir / "kube-router.log", "ab")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_synced(proc: subprocess.Popen, log: Path) -> None:
    """Until the firewall has synced its rules once; AssertionError with its log when it exits or never does."""
    deadline = time.monotonic() + SYNC_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"kube-router exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        if log.exists() and SYNCED in log.read_text():
            return
        time.sleep(0.5)
    raise AssertionError(f"kube-router did not sync its rules in {SYNC_SECONDS:.0f} s:\n{log.read_text()[-3000:]}")


CHAIN_PREFIXES = ("KUBE-ROUTER-", "KUBE-POD-FW-", "KUBE-NWPLCY-")
"""The iptables chains kube-router's firewall makes (its --cleanup-config also tears down a service proxy that
never ran, and crashes doing so)."""


def without_chains(dump: str, prefixes: tuple[str, ...] = CHAIN_PREFIXES) -> str:
    """An iptables-save dump less the chains named with `prefixes` and every rule in or jumping to them."""
    kept = []
    for line in dump.splitlines():
        words = line.split()
        if line.startswith(":") and line[1:].startswith(prefixes):
            continue
        if line.startswith("-A") and (
            words[1].startswith(prefixes)
            or any(w in ("-j", "-g") and i + 1 < len(words) and words[i + 1].startswith(prefixes) for i, w in enumerate(words))
        ):
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def stop(proc: subprocess.Popen, netns: str) -> None:
    """Stop it and take its chains and ipsets out of the namespace: left there, they would go on judging the
    pods of later tests that get the same addresses."""
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    inside = ["nsenter", f"--net=/run/netns/{netns}"]
    dump = subprocess.run([*inside, "iptables-save"], capture_output=True, text=True, timeout=30, check=True).stdout
    subprocess.run([*inside, "iptables-restore"], input=without_chains(dump), capture_output=True, text=True, timeout=30, check=True)
    # Only kube-router makes ipsets in the node's namespace (kube-proxy runs in iptables mode there).
    subprocess.run([*inside, "ipset", "destroy"], capture_output=True, text=True, timeout=30, check=True)
    left = subprocess.run([*inside, "iptables-save"], capture_output=True, text=True, timeout=30).stdout
    if any(p in left for p in CHAIN_PREFIXES):
        raise AssertionError(f"kube-router's chains are still in the node's namespace:\n{left[-3000:]}")
