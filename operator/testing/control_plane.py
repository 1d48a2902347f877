"""A real Kubernetes control plane on loopback, for tests and benchmarks.

etcd, kube-apiserver (TLS, static-token authentication, RBAC, service-account signing),
kube-controller-manager, kube-scheduler and kwok run as local processes from the binaries that
scripts/kube-binaries.sh builds. kwok plays the kubelets: its nodes carry whatever capacity a node
pool gives them (`nvidia.com/gpu` included), and its stages (kwok-stages.yaml beside this file) make
scheduled pods Running, and Succeeded or Failed when a test sets the annotation EXIT_ANNOTATION.

Nothing here is a fake of the API: every request goes to a real kube-apiserver backed by etcd.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..cli.ports import free_port
from .credentials import make_pki, write_kubeconfig

# A pod with this annotation leaves Running: "succeed" -> Succeeded, "fail" -> Failed (exit code 1).
EXIT_ANNOTATION = "kuberl.dev/kwok-exit"
KWOK_NODE_LABEL = "kuberl.dev/kwok-node"
STAGES_FILE = Path(__file__).with_name("kwok-stages.yaml")
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubectl", "helm")
SERVICE_CIDR = "10.96.0.0/16"  # virtual: no packet is ever sent to these addresses


class ControlPlaneError(RuntimeError):
    """The control plane could not be started; the message says which part and shows its log."""


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str = "NoSchedule"


@dataclass(frozen=True)
class NodePool:
    """`count` kwok nodes labelled `kuberl.dev/pool: name` (plus `labels`) with this capacity."""

    name: str
    count: int
    gpus: int = 0
    cpu: str = "32"
    memory: str = "256Gi"
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()

    def node_manifests(self) -> list[dict[str, Any]]:
        capacity = {"cpu": self.cpu, "memory": self.memory, "pods": "110"}
        if self.gpus:
            capacity["nvidia.com/gpu"] = str(self.gpus)
        return [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": f"{self.name}-{i}",
                    "labels": {
                        "kuberl.dev/pool": self.name,
                        KWOK_NODE_LABEL: "true",
                        "kubernetes.io/hostname": f"{self.name}-{i}",
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                        **self.labels,
                    },
                },
                "spec": {"taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in self.taints]},
                "status": {"capacity": capacity, "allocatable": capacity},
            }
            for i in range(self.count)
        ]


DEFAULT_POOLS = (
    NodePool(
        name="gpu-h100",
        count=2,
        gpus=8,
        labels={"nvidia.com/gpu.product": "H100-SXM5-80GB"},
        taints=(Taint("nvidia.com/gpu", "present"),),
    ),
    NodePool(
        name="gpu-a100",
        count=2,
        gpus=8,
        labels={"nvidia.com/gpu.product": "A100-SXM4-80GB"},
        taints=(Taint("nvidia.com/gpu", "present"),),
    ),
    NodePool(name="cpu", count=2),
)


@dataclass
class ControlPlane:
    """A running control plane. `kubeconfig` holds an admin (system:masters) token."""

    workdir: Path
    bin_dir: Path
    server: str
    kubeconfig: Path
    ca_file: Path
    admin_token: str
    kubeconfigs: dict[str, Path] = field(default_factory=dict)
    """One kubeconfig per identity of the token file, by its key ("admin", "scheduler", ...)."""
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        return _run([str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args], check, input=input)

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(self.workdir / "helm-cache"),
            "HELM_CONFIG_HOME": str(self.workdir / "helm-config"),
            "HELM_DATA_HOME": str(self.workdir / "helm-data"),
        }
        return _run([str(self.bin_dir / "helm"), "--kubeconfig", str(self.kubeconfig), *args], check, env=env)

    def api_client(self, token: str | None = None):
        """A kubernetes.client.ApiClient for the admin, or for `token` (e.g. a ServiceAccount's)."""
        from kubernetes import client

        config = client.Configuration()
        config.host = self.server
        config.ssl_ca_cert = str(self.ca_file)
        config.api_key = {"authorization": token or self.admin_token}
        config.api_key_prefix = {"authorization": "Bearer"}
        return client.ApiClient(config)

    def kubeconfig_for_token(self, token: str, path: Path) -> Path:
        """A kubeconfig that authenticates with `token` (to run a program as a ServiceAccount)."""
        write_kubeconfig(path, self.server, self.ca_file, token, user="token-user")
        return path

    def log(self, name: str) -> str:
        return _tail(self.workdir / f"{name}.log")

    def stop(self) -> None:
        for name in reversed(list(self.processes)):
            _terminate(self.processes[name])
        self.processes.clear()


@dataclass(frozen=True)
class User:
    """An identity of the static token file: a kubeconfig named `key` authenticates as `name` in `groups`."""

    key: str
    name: str
    groups: tuple[str, ...] = ()


def start_control_plane(
    bin_dir: Path,
    workdir: Path,
    pools: tuple[NodePool, ...] = DEFAULT_POOLS,
    timeout: float = 90.0,
    address: str = "127.0.0.1",
    users: tuple[User, ...] = (),
    profiling: bool = False,
) -> ControlPlane:
    """Start every part, wait until pods can be scheduled onto the pools, and return the plane.

    The API server listens on `address`. On loopback nothing can reach it through the `kubernetes`
    Service; a real node (node.py) passes the host end of its veth instead, and the Service then
    leads there. `users` get a kubeconfig each (plane.kubeconfigs[key]). `profiling`: the API server
    serves Go's pprof at /debug/pprof (a benchmark's question: where its CPU goes).
    """
    missing = [b for b in BINARIES if not (bin_dir / b).is_file()]
    if missing:
        raise ControlPlaneError(f"missing binaries in {bin_dir}: {', '.join(missing)} (run scripts/kube-binaries.sh)")
    workdir.mkdir(parents=True, exist_ok=True)
    loopback = ipaddress.ip_address(address).is_loopback
    pki = make_pki(workdir / "pki", address, SERVICE_CIDR)
    identities = (
        User("admin", "admin", ("system:masters",)),
        User("controller-manager", "system:kube-controller-manager"),
        User("scheduler", "system:kube-scheduler"),
        *users,
    )
    tokens = {user.key: os.urandom(16).hex() for user in identities}
    (workdir / "tokens.csv").write_text(
        "".join(f"{tokens[u.key]},{u.name},{u.key}," + (f'"{",".join(u.groups)}"' if u.groups else "") + "\n" for u in identities)
    )
    ports = {name: free_port() for name in ("etcd", "etcd-peer", "apiserver", "kcm", "scheduler", "kwok")}
    server = f"https://{address}:{ports['apiserver']}"
    kubeconfigs = {
        name: write_kubeconfig(workdir / f"{name}.kubeconfig", server, pki["ca.crt"], token, user=name) for name, token in tokens.items()
    }
    plane = ControlPlane(workdir, bin_dir, server, kubeconfigs["admin"], pki["ca.crt"], tokens["admin"], kubeconfigs=kubeconfigs)
    deadline = time.monotonic() + timeout
    try:
        etcd_url = f"http://127.0.0.1:{ports['etcd']}"
        peer_url = f"http://127.0.0.1:{ports['etcd-peer']}"
        _spawn(
            plane,
            "etcd",
            [
                "--name=kuberl-test",
                f"--data-dir={workdir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=kuberl-test={peer_url}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        _wait(plane, "etcd", deadline, lambda: _http_ok(f"{etcd_url}/health"))

        _spawn(
            plane,
            "kube-apiserver",
            [
                f"--etcd-servers={etcd_url}",
                f"--bind-address={address}",
                f"--advertise-address={address}",
                f"--secure-port={ports['apiserver']}",
                f"--tls-cert-file={pki['apiserver.crt']}",
                f"--tls-private-key-file={pki['apiserver.key']}",
                f"--client-ca-file={pki['ca.crt']}",
                f"--token-auth-file={workdir / 'tokens.csv'}",
                # Node: a kubelet (system:node:NAME) may touch only its own node and pods.
                "--authorization-mode=Node,RBAC",
                "--anonymous-auth=false",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki['sa.pub']}",
                f"--service-account-signing-key-file={pki['sa.key']}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--profiling={str(profiling).lower()}",
                # A node's address, never its name: no name here is known to the machine's resolver.
                "--kubelet-preferred-address-types=InternalIP",
                f"--cert-dir={workdir / 'pki'}",
                # The kubernetes Service's endpoints must be a routable address: on loopback nothing
                # reaches the API server through that Service, so no endpoints are kept for it.
                f"--endpoint-reconciler-type={'none' if loopback else 'lease'}",
            ],
        )
        _wait(plane, "kube-apiserver", deadline, lambda: _http_ok(f"{server}/readyz", pki["ca.crt"], tokens["admin"]))

        common = ["--leader-elect=false", "--bind-address=127.0.0.1", "--profiling=false"]
        _spawn(
            plane,
            "kube-controller-manager",
            [
                f"--kubeconfig={kubeconfigs['controller-manager']}",
                f"--authentication-kubeconfig={kubeconfigs['controller-manager']}",
                f"--authorization-kubeconfig={kubeconfigs['controller-manager']}",
                f"--secure-port={ports['kcm']}",
                f"--cert-dir={workdir / 'kcm-certs'}",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki['sa.key']}",
                f"--root-ca-file={pki['ca.crt']}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                *common,
            ],
        )
        _spawn(
            plane,
            "kube-scheduler",
            [
                f"--kubeconfig={kubeconfigs['scheduler']}",
                f"--authentication-kubeconfig={kubeconfigs['scheduler']}",
                f"--authorization-kubeconfig={kubeconfigs['scheduler']}",
                f"--secure-port={ports['scheduler']}",
                f"--cert-dir={workdir / 'scheduler-certs'}",
                *common,
            ],
        )
        _spawn(
            plane,
            "kwok",
            [
                f"--kubeconfig={kubeconfigs['admin']}",
                f"--config={STAGES_FILE}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-label-selector={KWOK_NODE_LABEL}=true",
                "--node-lease-duration-seconds=40",
                "--cidr=10.244.0.1/16",
                "--node-ip=10.240.0.1",
                f"--server-address=127.0.0.1:{ports['kwok']}",
            ],
        )
        _wait(plane, "kube-controller-manager", deadline, lambda: _http_ok(f"https://127.0.0.1:{ports['kcm']}/healthz", None))
        _wait(plane, "kube-scheduler", deadline, lambda: _http_ok(f"https://127.0.0.1:{ports['scheduler']}/healthz", None))

        nodes = [n for pool in pools for n in pool.node_manifests()]
        if nodes:
            plane.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(n) for n in nodes))
        names = {n["metadata"]["name"] for n in nodes}
        _wait(plane, "kwok", deadline, lambda: names <= _ready_nodes(plane))
        # The controller-manager creates each namespace's "default" ServiceAccount; pods need it.
        _wait(
            plane,
            "kube-controller-manager",
            deadline,
            lambda: plane.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0,
        )
    except BaseException:
        plane.stop()
        raise
    return plane


# --- helpers ----------------------------------------------------------------------------------


def _run(argv: list[str], check: bool, **kwargs: Any) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, **kwargs)
    if check and result.returncode != 0:
        raise ControlPlaneError(f"{Path(argv[0]).name} {' '.join(argv[3:])} failed ({result.returncode}):\n{result.stderr}")
    return result


def _die_with_parent() -> None:
    # Linux: if the test process is killed outright, its control plane goes with it instead of
    # holding ports and CPU for whatever runs next. SIGKILL: an apiserver whose etcd is gone
    # ignores SIGTERM for a long while.
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _spawn(plane: ControlPlane, name: str, args: list[str]) -> None:
    plane.processes[name] = _spawn_argv(plane.workdir / f"{name}.log", [str(plane.bin_dir / name), *args])


def _spawn_argv(log_path: Path, argv: list[str]) -> subprocess.Popen:
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )


def _wait(plane: Any, name: str, deadline: float, ready: Callable[[], bool]) -> None:
    """Until `ready()`, failing as soon as one of `plane.processes` (a ControlPlane's or a Node's) dies."""
    while True:
        for proc_name, proc in plane.processes.items():
            if proc.poll() is not None:
                raise ControlPlaneError(
                    f"{proc_name} exited with status {proc.returncode} while waiting for {name}:\n{plane.log(proc_name)}"
                )
        try:
            if ready():
                return
        except (OSError, subprocess.SubprocessError):
            pass
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"{name} was not ready in time; its log ends with:\n{plane.log(name)}")
        time.sleep(0.2)


def _ready_nodes(plane: ControlPlane) -> set[str]:
    out = plane.kubectl("get", "nodes", "-o", "json", check=False)
    if out.returncode != 0:
        return set()
    ready = set()
    for node in json.loads(out.stdout)["items"]:
        conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
        if conditions.get("Ready") == "True":
            ready.add(node["metadata"]["name"])
    return ready


def _http_ok(url: str, ca_file: Path | None = None, token: str | None = None) -> bool:
    context = None
    if url.startswith("https"):
        context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else ssl._create_unverified_context()
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, context=context, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _terminate(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def remove_workdir(workdir: Path) -> None:
    shutil.rmtree(workdir, ignore_errors=True)
