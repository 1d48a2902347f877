"""A NetworkPolicy enforcer for the real test node: sigs.k8s.io/kube-network-policies (SIG Network's, the one
kind ships), built from the Go module proxy and run as a process in the node's network namespace.

It reads pods, namespaces and NetworkPolicies from the API and judges each new connection to a pod in
user space (nftables sends them to an NFQUEUE). It expects the in-cluster credentials of a pod; here it gets
them in a mount namespace of its own, on a tmpfs over /run, so nothing on the host changes.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse


from .enforcer_setup import EnforcerError, go_binary, service_account_token

VERSION = "v0.8.0"
MODULE = "sigs.k8s.io/kube-network-policies"
RULES = [
    {"apiGroups": [""], "resources": ["pods", "namespaces", "nodes"], "verbs": ["list", "watch"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["list", "watch"]},
]


def binary(cache: Path = Path.home() / ".cache" / "kuberl" / "node") -> Path:
    """The enforcer's binary, built once into `cache` (a few minutes on 2 cores)."""
    return go_binary(MODULE, VERSION, "./cmd", cache / f"kube-network-policies-{VERSION}" / "kube-network-policies")


def start(plane, netns: str, node_name: str, workdir: Path, enforcer: Path) -> subprocess.Popen:
    """The enforcer for `node_name`, in network namespace `netns`, with a ServiceAccount of its own rights."""
    name, namespace = "kube-network-policies", "kube-system"
    token = service_account_token(plane, name, namespace, RULES)
    secrets = workdir / "serviceaccount"
    secrets.mkdir(parents=True, exist_ok=True)
    (secrets / "token").write_text(token)
    (secrets / "ca.crt").write_bytes(Path(plane.ca_file).read_bytes())
    (secrets / "namespace").write_text(namespace)
    server = urlparse(plane.server)
    script = (
        "mount -t tmpfs tmpfs /run && mkdir -p /run/secrets/kubernetes.io/serviceaccount && "
        'cp "$1"/* /run/secrets/kubernetes.io/serviceaccount/ && '
        'exec "$2" --hostname-override="$3" --disable-nri --netfilter-bug-1766-fix=false --nfqueue-id=98 --metrics-bind-address=127.0.0.1:9080 --v=2'
    )
    argv = [
        "nsenter",
        f"--net=/run/netns/{netns}",
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        "sh",
        str(secrets),
        str(enforcer),
        node_name,
    ]
    env = {**os.environ, "KUBERNETES_SERVICE_HOST": server.hostname or "", "KUBERNETES_SERVICE_PORT": str(server.port or 443)}
    log = open(workdir / "kube-network-policies.log", "ab")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return proc


QUEUE_PROBE = "table inet kuberl_probe {\n chain c {\n  type filter hook forward priority 0;\n  queue num 98 bypass\n }\n}\n"
KERNEL_LACKS_QUEUE = (
    "the kernel refuses kube-network-policies' nftables rules (ENOENT: no nftables `queue` expression, "
    "module nft_queue, and no modules can be loaded here)"
)


def kernel_refuses_queue() -> str | None:
    """Why this kernel cannot run the enforcer, asked before it is built (minutes of Go on a cold cache): a rule
    with nftables' `queue` expression, loaded in a network namespace of its own; None when the kernel takes it."""
    probe = subprocess.run(["unshare", "--net", "nft", "-f", "-"], input=QUEUE_PROBE, capture_output=True, text=True, timeout=30)
    if probe.returncode == 0:
        return None
    if "No such file or directory" in probe.stderr:
        return KERNEL_LACKS_QUEUE
    raise EnforcerError(f"probing nftables' queue expression failed: {probe.stderr[-2000:]}")


SYNC_SECONDS = 30.0
MISSING_QUEUE = "netlink receive: no such file or directory"


def kernel_lacks(proc: subprocess.Popen, log: Path) -> str | None:
    """Why the enforcer cannot work here, once it has tried its first sync of the nftables rules; None when it can.
    kube-network-policies sends each new connection to user space with nftables' `queue` expression: a kernel
    built without it (nft_queue) refuses every rule set (ENOENT), and then nothing is enforced at all."""
    deadline = time.monotonic() + SYNC_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"kube-network-policies exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        text = log.read_text() if log.exists() else ""
        if '"Syncing nftables rules"' in text:
            time.sleep(2)
            text = log.read_text()
            if '"syncing nftables rules" error' in text and MISSING_QUEUE in text:
                return KERNEL_LACKS_QUEUE
            return None
        time.sleep(0.5)
    raise AssertionError(f"kube-network-policies did not sync its rules in {SYNC_SECONDS:.0f} s:\n{log.read_text()[-3000:]}")
