"""A real Kubernetes node for tests: kubelet, containerd with runc, a CNI bridge, kube-proxy and CoreDNS.

Pods run in real containers. Everything lives on this machine:

    host network namespace                node network namespace (made here, `ip netns add`)
      kube-apiserver on HOST_IP  <-veth->   NODE_IP: kubelet, containerd, kube-proxy, CoreDNS
                                              bridge kuberl0 (POD_CIDR) -> one namespace per pod

The node's daemons are started with `nsenter --net` (not `ip netns exec`, whose private /sys would
hide the cgroup mounts). The node namespace has no default route, so nothing a pod sends can leave
the machine: pod -> Service IP is rewritten by kube-proxy to a pod or to the API server across the
veth; every other destination is unreachable.

Facts of this machine the settings answer (docs/testing.md describes the real node):
- cgroups are mounted hybrid (v1 controllers, an unused v2 hierarchy): kubelet 1.35+ refuses cgroup
  v1 unless `failCgroupV1: false`; the cgroup driver is cgroupfs (no systemd runs).
- No process here holds CAP_SYS_RESOURCE (the machine's bounding set lacks it), so none may lower its
  OOM score: containerd clamps the scores the kubelet asks for (restrict_oom_score_adj).
- No registry is reachable: the pause image and the project's images are imported into containerd
  (`ctr images import`), and pods name them with imagePullPolicy IfNotPresent or Never.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .control_plane import ControlPlane, ControlPlaneError, User, _ready_nodes, _spawn_argv, _tail, _terminate, _wait
from .mounts import unmount_under
from .node_network import NETNS_PREFIX, NODE_IP, POD_CIDR, NodeNetwork

NODE_NAME = "kuberl-node"
OPERATOR_NAMESPACE = "kuberl-system"
"""Where the node tests install the chart."""
CLUSTER_DOMAIN = "cluster.local"
POD_PIDS_LIMIT = 1024
"""The kubelet's podPidsLimit: docs/security.md asks it of every node that runs sandbox pods."""
NODE_LABEL = "kuberl.dev/real-node"
CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
NODE_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "coredns", "registry")
KUBE_NODE_BINARIES = ("kubelet", "kube-proxy")


def node_users() -> tuple[User, ...]:
    """The identities the node's daemons use; pass them to start_control_plane."""
    return (
        User("kubelet", f"system:node:{NODE_NAME}", ("system:nodes",)),
        User("kube-proxy", "system:kube-proxy"),  # bound to system:node-proxier by the bootstrap policy
        User("coredns", "kuberl:coredns"),
    )


@dataclass
class Node:
    """A running node, registered as NODE_NAME and Ready."""

    plane: ControlPlane
    workdir: Path
    bin_dir: Path
    """containerd, ctr, runc, CoreDNS (scripts/node-binaries.sh)."""
    kube_bin_dir: Path
    """kubelet, kube-proxy (scripts/kube-binaries.sh)."""
    network: NodeNetwork
    containerd_socket: Path
    image_store: Path
    registry_hosts: Path
    """containerd's registry configuration folder (one hosts.toml per registry)."""
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    name: str = NODE_NAME

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [str(self.bin_dir / "ctr"), "--address", str(self.containerd_socket), "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if check and result.returncode != 0:
            raise ControlPlaneError(f"ctr {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def image_digests(self) -> dict[str, str]:
        """Every image reference in the node's store and the digest it points at."""
        rows = [line.split() for line in self.ctr("images", "list").stdout.splitlines()[1:]]  # REF TYPE DIGEST ...
        return {row[0]: row[2] for row in rows if row}

    def sync_images(self, wanted: dict[str, Path]) -> None:
        """Import the wanted images that are missing; drop the images of older trees.

        The kubelet's image service adds references of its own to an imported image (its id,
        `sha256:...`, and `name@digest`): an old image is gone, and its layers with it, only once
        every reference to its digest is removed. The kept store would otherwise grow by a trainer
        image (about 12 GB unpacked) with every change of the tree."""
        present = self.image_digests()
        # Old images go before new ones come: the store then holds one trainer image at a time, not two (disk).
        kept = {present[ref] for ref in wanted if ref in present}
        old = [ref for ref, digest in present.items() if ref not in wanted and digest not in kept]
        if old:
            self.ctr("images", "remove", "--sync", *old)
        for ref, archive in wanted.items():
            if ref not in present:
                self.ctr("images", "import", str(archive))
        digests = self.image_digests()
        keep = {digests[ref] for ref in wanted if ref in digests}
        stale = [ref for ref, digest in digests.items() if digest not in keep]
        if stale:
            self.ctr("images", "remove", "--sync", *stale)

    def trust_registry(self, host: str) -> None:
        """Let the node pull from `host` (host:port) over plain HTTP, as a lab registry without TLS serves.
        containerd reads the folder at each pull: no restart."""
        folder = self.registry_hosts / host
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "hosts.toml").write_text(f'server = "http://{host}"\n\n[host."http://{host}"]\n  capabilities = ["pull", "resolve"]\n')

    def remove_containers(self) -> None:
        """What the node ran (sandboxes and containers, their processes already killed), so that the
        kept image store holds images only."""

        def listed(kind: str) -> list[str]:
            return self.ctr(kind, "list", "-q", check=False).stdout.split()

        for task in listed("tasks"):
            self.ctr("tasks", "delete", "--force", task, check=False)
        for kind in ("containers", "sandboxes"):
            if ids := listed(kind):
                self.ctr(kind, "remove", *ids, check=False)

    def log(self, name: str) -> str:
        return _tail(self.workdir / f"{name}.log")

    def stop(self) -> None:
        containerd = self.processes.pop("containerd", None)
        for name in reversed(list(self.processes)):
            _terminate(self.processes[name])
        self.processes.clear()
        _kill_containers(self.network, keep=containerd)
        if containerd is not None:
            if containerd.poll() is None:
                self.remove_containers()
            _terminate(containerd)
        unmount_under(self.workdir)
        self.network.destroy()


def start_node(
    plane: ControlPlane,
    bin_dir: Path,
    kube_bin_dir: Path,
    workdir: Path,
    network: NodeNetwork,
    pause_image: str,
    images: dict[str, Path],
    image_store: Path | None = None,
    timeout: float = 180.0,
) -> Node:
    """Start containerd, import `images` (reference -> docker archive; `pause_image` is the pods'
    sandbox), then kubelet, kube-proxy and CoreDNS; wait until the node is Ready.

    `image_store`: containerd's root (images, snapshots) kept between runs, as a real node keeps its
    disk across reboots: an image already there is not imported again, and every container is
    removed when the node stops. None keeps it under `workdir`.
    """
    missing = [b for b in NODE_BINARIES if not (bin_dir / b).is_file()]
    missing += [b for b in KUBE_NODE_BINARIES if not (kube_bin_dir / b).is_file()]
    missing += [str(p) for p in (CNI_BIN_DIR / "bridge", CNI_BIN_DIR / "host-local", CNI_BIN_DIR / "loopback") if not p.exists()]
    missing += [tool for tool in ("iptables", "nsenter", "ip") if shutil.which(tool) is None]
    if missing:
        raise ControlPlaneError(f"the real node needs: {', '.join(missing)} (scripts/node-deps.sh, node-binaries.sh, kube-binaries.sh)")
    workdir.mkdir(parents=True, exist_ok=True)
    socket = workdir / "containerd" / "containerd.sock"
    node = Node(
        plane,
        workdir,
        bin_dir,
        kube_bin_dir,
        network,
        socket,
        image_store=image_store or workdir / "containerd" / "root",
        registry_hosts=workdir / "containerd" / "certs.d",
    )
    deadline = time.monotonic() + timeout
    try:
        _start_containerd(node, pause_image)
        _wait(node, "containerd", deadline, lambda: node.ctr("version", check=False).returncode == 0)
        node.sync_images(images)
        # An import of a new trainer image (6 GB) takes minutes of its own, bounded by ctr's timeout:
        # the node's start is timed from here.
        deadline = time.monotonic() + timeout
        _start_kubelet(node)
        _wait(node, "kubelet", deadline, lambda: NODE_NAME in _ready_nodes(plane))
        _start_kube_proxy(node)
        _start_coredns(node)
        _wait(node, "coredns", deadline, lambda: _coredns_answers(node))
    except BaseException:
        node.stop()
        raise
    return node


# --- the daemons --------------------------------------------------------------------------------


def _spawn(node: Node, name: str, args: list[str]) -> None:
    binary = (node.kube_bin_dir if name in KUBE_NODE_BINARIES else node.bin_dir) / name
    node.processes[name] = _spawn_argv(node.workdir / f"{name}.log", node.network.inside([str(binary), *args]))


def _start_containerd(node: Node, pause_image: str) -> None:
    root = node.workdir / "containerd"
    cni = node.workdir / "cni"
    (cni / "net.d").mkdir(parents=True, exist_ok=True)
    (cni / "net.d" / "10-kuberl.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "kuberl",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": "kuberl0",
                        "isGateway": True,
                        "hairpinMode": True,
                        # Pod traffic to the API server leaves with the node's address, so the host can answer it.
                        # The default route ends in the node namespace, which has none: nothing gets further.
                        "ipMasq": True,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": POD_CIDR}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                            "dataDir": str(cni / "ipam"),
                        },
                    }
                ],
            }
        )
    )
    config = root / "config.toml"
    root.mkdir(parents=True, exist_ok=True)
    config.write_text(f"""version = 3
root = "{node.image_store}"
state = "{root / "state"}"

[grpc]
  address = "{node.containerd_socket}"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.registry]
    # hosts.toml per registry (Node.trust_registry): where and how the node pulls from a registry.
    config_path = "{node.registry_hosts}"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{pause_image}"

[plugins.'io.containerd.cri.v1.runtime']
  netns_mounts_under_state_dir = true
  # This machine withholds CAP_SYS_RESOURCE, so no process may lower its OOM score below its
  # parent's; the kubelet asks -998 for every sandbox. Clamp instead of failing every pod.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{node.bin_dir / "runc"}"
        Root = "{root / "runc"}"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{CNI_BIN_DIR}"]
    conf_dir = "{cni / "net.d"}"
""")
    _spawn(node, "containerd", ["--config", str(config), "--log-level", "info"])


def _start_kubelet(node: Node) -> None:
    kubelet = node.workdir / "kubelet"
    kubelet.mkdir(parents=True, exist_ok=True)
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This machine mounts cgroups hybrid (v1 controllers): kubelet 1.35+ refuses v1 by default.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",  # no systemd runs here
        "containerRuntimeEndpoint": f"unix://{node.containerd_socket}",
        "failSwapOn": False,
        # The API server reaches the kubelet (logs, exec) with no client certificate of its own.
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "address": NODE_IP,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [NODE_IP],
        "resolvConf": "",  # pods get cluster DNS only: no name of the host's resolver leaks in
        "podLogsDir": str(node.workdir / "pod-logs"),
        # The suite's disk and memory are whatever the machine has; never evict a test's pods.
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "0%", "imagefs.available": "0%", "nodefs.inodesFree": "0%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "maxPods": 40,
        # What docs/security.md asks of a node that runs sandbox pods: a fork bomb in one gets this many
        # processes, not the node's. Trainer pods (torch's and vLLM's threads count) stay far below it.
        "podPidsLimit": POD_PIDS_LIMIT,
        "serializeImagePulls": False,
        # The images the suite imports are named localhost/*. Once the kubelet has pulled the same image
        # (same config digest) under another name, as the quickstart does from its registry, its pull
        # records make every later pod of the imported name prove credentials first, which a pod with
        # imagePullPolicy Never cannot do (ErrImageNeverPull). Imported images are the admin's, exempt.
        "imagePullCredentialsVerificationPolicy": "NeverVerifyAllowlistedImages",
        "preloadedImagesVerificationAllowlist": ["localhost/*"],
    }
    (kubelet / "config.json").write_text(json.dumps(config, indent=2))
    _spawn(
        node,
        "kubelet",
        [
            f"--config={kubelet / 'config.json'}",
            f"--kubeconfig={node.plane.kubeconfigs['kubelet']}",
            f"--root-dir={kubelet / 'root'}",
            f"--cert-dir={kubelet / 'pki'}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={NODE_IP}",
            f"--node-labels={NODE_LABEL}=true",
            "--v=1",
        ],
    )


def _start_kube_proxy(node: Node) -> None:
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(node.plane.kubeconfigs["kube-proxy"])},
        "mode": "iptables",
        "clusterCIDR": POD_CIDR,
        "hostnameOverride": NODE_NAME,
        "bindAddress": NODE_IP,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "oomScoreAdj": 0,  # lowering it needs CAP_SYS_RESOURCE, which this machine withholds
        # Leave the kernel's conntrack limits alone (they are the host's, not this namespace's).
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }
    path = node.workdir / "kube-proxy.json"
    path.write_text(json.dumps(config, indent=2))
    _spawn(node, "kube-proxy", [f"--config={path}"])


def _start_coredns(node: Node) -> None:
    rbac = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "kuberl:coredns"},
            "rules": [
                {"apiGroups": [""], "resources": ["services", "namespaces"], "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "kuberl:coredns"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kuberl:coredns"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kuberl:coredns"}],
        },
    ]
    node.plane.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(doc) for doc in rbac))
    corefile = node.workdir / "Corefile"
    # No `forward`: a name outside the cluster gets no answer, as nothing outside is reachable anyway.
    corefile.write_text(f""".:53 {{
    bind {NODE_IP}
    errors
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {node.plane.kubeconfigs["coredns"]}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
}}
""")
    _spawn(node, "coredns", ["-conf", str(corefile)])


def _coredns_answers(node: Node, timeout: float = 1.0) -> bool:
    """Whether CoreDNS answers an A query for the kubernetes Service.

    Asked from this process, across the veth (the host reaches NODE_IP), with a socket timeout: no
    child process. The probe used to start a Python inside the node namespace with no timeout of its
    own, and one such start hung a fresh machine's run until pytest-timeout ended it after 600 s;
    a probe now costs at most `timeout` and `_wait` retries it until its deadline."""
    import socket
    import struct

    query = struct.pack(">HHHHHH", 0x4B52, 0x0100, 1, 0, 0, 0)
    query += b"".join(bytes([len(p)]) + p.encode() for p in f"kubernetes.default.svc.{CLUSTER_DOMAIN}".split(".")) + b"\0"
    query += struct.pack(">HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        try:
            s.sendto(query, (NODE_IP, 53))
            answer = s.recv(512)
        except OSError:  # timeout, unreachable, refused: not yet
            return False
    return len(answer) >= 8 and answer[3] & 15 == 0 and int.from_bytes(answer[6:8], "big") > 0


# --- clean-up -------------------------------------------------------------------------------------


def remove_stale_nodes(tmp_root: Path) -> None:
    """What a node of an earlier run left when its test process was killed outright: the processes in
    its namespace and its pods, the namespace itself, and mounts under `tmp_root` (where the test
    runs keep their workdirs)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout.split("\n")
    for netns in (line.split()[0] for line in listed if line.startswith(NETNS_PREFIX)):
        stale = NodeNetwork.named(netns.removeprefix(NETNS_PREFIX))
        _kill_containers(stale, keep=None)
        stale.destroy()
    unmount_under(tmp_root)


def _kill_containers(network: NodeNetwork, keep: subprocess.Popen | None) -> None:
    """Every process the node started outlives its daemons (shims, containers): kill them all, but
    `keep` (containerd, still needed to remove what it ran)."""
    victims: set[int] = set()
    listed = subprocess.run(["ip", "netns", "pids", network.netns], capture_output=True, text=True, timeout=30)
    victims |= {int(p) for p in listed.stdout.split()}
    if keep is not None:
        # nsenter execs containerd: the Popen's pid is containerd's own.
        victims.discard(keep.pid)
    for procs in Path("/sys/fs/cgroup").glob("*/kubepods*/**/cgroup.procs"):
        try:
            victims |= {int(p) for p in procs.read_text().split()}
        except OSError:
            pass
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(0.5)
    # Empty pod cgroups, deepest first, so the next node starts clean.
    for top in Path("/sys/fs/cgroup").glob("*/kubepods*"):
        for directory in sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)) + [top]:
            try:
                directory.rmdir()
            except OSError:
                pass
