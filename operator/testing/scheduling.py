"""Real batch schedulers on the test control plane: the Kueue manager and the JobSet controller manager.

scripts/scheduling-binaries.sh builds both from the Go module proxy and unpacks, next to its bin/
folder, their CRDs (crds/kueue, crds/jobset), their webhook configurations (webhooks/*.yaml) and
the CRD patches that turn on Kueue's conversion webhook (conversion/kueue/*.yaml). Here, for a
started ControlPlane:

- the CRDs are applied (Kueue's multi-version CRDs with their conversion webhook at a loopback URL);
- one CA signs a serving certificate for 127.0.0.1, which both managers' webhook servers use
  (Kueue's and JobSet's internal cert management is off: it writes Secrets for an in-cluster Service);
- both managers run as local processes with the plane's admin kubeconfig, no leader election, and
  die with the test process (parent-death signal, as the control plane's processes do);
- their webhook configurations are registered with `clientConfig.url: https://127.0.0.1:PORT/PATH`
  and the CA bundle, in place of the shipped Service references. Only Kueue's own webhooks and those
  of the enabled integrations are registered: a `failurePolicy: Fail` webhook on every Pod or
  Deployment would block the whole plane once Kueue stops (the certificates and the configurations
  are made in webhooks.py);
- start_schedulers returns once every registered path has its handler, not when readyz first passes:
  JobSet registers its handlers after its manager starts.

Kueue with internal cert management off reads its metrics certificate from the fixed path
/etc/kueue/metrics/certs/tls.{crt,key} and exits when it is not there (cmd/kueue/main.go at v0.17).
So Kueue runs in its own mount namespace (`unshare`), where a read-only overlay puts that folder on
top of /etc, with a certificate of this plane; nothing is written to the machine's /etc. As root this
needs only a mount namespace; otherwise unprivileged user namespaces (`unshare --user`).
Its visibility server (VisibilityOnDemand, on by default: pending workloads and their positions)
likewise reads /visibility/tls.{crt,key}, a folder at the root; it is off unless `visibility=True`,
which runs Kueue chrooted into a tmpfs root made of bind mounts of / plus that folder. The API server
cannot reach it through an APIService (that needs a Service, and the plane's API server has no
front-proxy client certificate), so Schedulers.pending_workloads() asks it directly, with the
admin token (it authenticates and authorizes callers through the API server).
"""

from __future__ import annotations

import base64
import functools
import json
import os
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..cli.ports import free_port
from .control_plane import ControlPlane, ControlPlaneError, _http_ok, _spawn_argv, _tail, _terminate, _wait
from .webhooks import serving_pki, webhook_configurations, webhook_served

KUEUE_SYSTEM = "kueue-system"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Kueue integrations (config.kueue.x-k8s.io Configuration `integrations.frameworks`) and the API
# group each one's webhooks are registered for.
DEFAULT_FRAMEWORKS = ("batch/job", "jobset.x-k8s.io/jobset")
_FRAMEWORK_GROUPS = {"batch/job": "batch", "jobset.x-k8s.io/jobset": "jobset.x-k8s.io"}


def kueue_groups(frameworks: tuple[str, ...]) -> set[str]:
    """The API groups whose Kueue webhooks are registered: Kueue's own and its enabled integrations'."""
    return {"kueue.x-k8s.io", *(_FRAMEWORK_GROUPS[f] for f in frameworks)}


def scheduling_root(script: Path) -> Path:
    """The cache folder of `script` (the repository's scripts/scheduling-binaries.sh): bin/, crds/,
    webhooks/, conversion/. Built on first use, then taken from the cache."""
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise ControlPlaneError(f"{script.name} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return Path(result.stdout.strip().splitlines()[-1]).parent


@dataclass
class Schedulers:
    """Kueue and JobSet running against a plane. `startup_seconds[name]`: spawn until webhooks ready."""

    plane: ControlPlane
    workdir: Path
    root: Path
    ca_bundle: bytes
    ports: dict[str, int]
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    startup_seconds: dict[str, float] = field(default_factory=dict)
    kueue_config: dict[str, Any] = field(default_factory=dict)

    def log(self, name: str, lines: int = 40) -> str:
        return _tail(self.workdir / f"{name}.log", lines)

    def rss_bytes(self, name: str) -> int:
        """Resident memory of a manager now (VmRSS of its process)."""
        for line in Path(f"/proc/{self.processes[name].pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def pending_workloads(
        self, cluster_queue: str | None = None, namespace: str | None = None, local_queue: str | None = None
    ) -> list[dict]:
        """Kueue's visibility API (visibility.kueue.x-k8s.io/v1beta2): the pending workloads of a
        ClusterQueue, or of a LocalQueue, in order, each with positionInClusterQueue/positionInLocalQueue."""
        if "kueue-visibility" not in self.ports:
            raise RuntimeError("Kueue was started without its visibility server (start_schedulers(visibility=True))")
        base = f"https://127.0.0.1:{self.ports['kueue-visibility']}/apis/visibility.kueue.x-k8s.io/v1beta2"
        path = (
            f"/clusterqueues/{cluster_queue}" if cluster_queue else f"/namespaces/{namespace}/localqueues/{local_queue}"
        ) + "/pendingworkloads"
        request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {self.plane.admin_token}"})
        context = ssl.create_default_context(cadata=self.ca_bundle.decode())  # it serves our certificate
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return json.loads(response.read())["items"]

    def stop(self) -> None:
        """Unregister the webhooks first (the plane outlives us: its writes must not go to a dead URL), then stop."""
        for kind, name in (
            ("mutatingwebhookconfiguration", "kueue-mutating-webhook-configuration"),
            ("validatingwebhookconfiguration", "kueue-validating-webhook-configuration"),
            ("mutatingwebhookconfiguration", "jobset-mutating-webhook-configuration"),
            ("validatingwebhookconfiguration", "jobset-validating-webhook-configuration"),
        ):
            self.plane.kubectl("delete", kind, name, "--ignore-not-found", "--wait=false", check=False)
        for name in reversed(list(self.processes)):
            _terminate(self.processes[name])
        self.processes.clear()


def start_schedulers(
    plane: ControlPlane,
    workdir: Path,
    root: Path,
    frameworks: tuple[str, ...] = DEFAULT_FRAMEWORKS,
    kueue_config: dict[str, Any] | None = None,
    feature_gates: dict[str, bool] | None = None,
    visibility: bool = False,
    timeout: float = 120.0,
) -> Schedulers:
    """Install the CRDs, start JobSet and Kueue, register their webhooks; return when both answer.

    `root`: what scheduling_root() returns (binaries and manifests).
    `kueue_config` entries are merged over the Configuration this builds (top-level keys);
    `feature_gates` go to Kueue's featureGates.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    unknown = [f for f in frameworks if f not in _FRAMEWORK_GROUPS]
    if unknown:
        raise ValueError(f"no webhook groups known for the frameworks {unknown}")
    ports = {name: free_port() for name in ("kueue-webhook", "kueue-health", "jobset-webhook", "jobset-health")}
    if visibility:
        ports["kueue-visibility"] = free_port()
    ca_pem, cert_pem, key_pem = serving_pki()
    sched = Schedulers(plane, workdir, root, ca_pem, ports)
    deadline = time.monotonic() + timeout
    try:
        plane.kubectl("create", "namespace", KUEUE_SYSTEM, check=False)
        _install_crds(plane, root, ca_pem, ports["kueue-webhook"])

        certs = workdir / "certs"
        for sub in ("jobset", "kueue", "layers/etc/kueue/metrics/certs", "layers/visibility"):
            (certs / sub).mkdir(parents=True, exist_ok=True)
            (certs / sub / "tls.crt").write_bytes(cert_pem)
            (certs / sub / "tls.key").write_bytes(key_pem)
            (certs / sub / "tls.key").chmod(0o600)

        jobset_config = {
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": ports["jobset-webhook"], "host": "127.0.0.1", "certDir": str(certs / "jobset")},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['jobset-health']}"},
            "metrics": {"bindAddress": "0"},
        }
        (workdir / "jobset-config.yaml").write_text(json.dumps(jobset_config, indent=2))
        started = time.monotonic()
        sched.processes["jobset"] = _spawn_argv(
            workdir / "jobset.log",
            [
                str(root / "bin" / "jobset-manager"),
                f"--kubeconfig={plane.kubeconfig}",
                f"--config={workdir / 'jobset-config.yaml'}",
                "--metrics-bind-address=0",
                f"--health-probe-bind-address=127.0.0.1:{ports['jobset-health']}",
                "--zap-log-level=info",
            ],
        )

        config: dict[str, Any] = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": KUEUE_SYSTEM,
            "manageJobsWithoutQueueName": False,
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": ports["kueue-webhook"], "host": "127.0.0.1", "certDir": str(certs / "kueue")},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['kueue-health']}"},
            "metrics": {"bindAddress": "0"},
            "integrations": {"frameworks": list(frameworks)},
            "featureGates": {"VisibilityOnDemand": visibility, **(feature_gates or {})},
        }
        config.update(kueue_config or {})
        sched.kueue_config = config
        (workdir / "kueue-config.yaml").write_text(json.dumps(config, indent=2))
        kueue_args = [f"--kubeconfig={plane.kubeconfig}", f"--config={workdir / 'kueue-config.yaml'}", "--zap-log-level=2"]
        if visibility:
            kueue_args.append(f"--visibility-server-port={ports['kueue-visibility']}")
        sched.processes["kueue"] = _spawn_argv(
            workdir / "kueue.log", _in_mount_namespace(certs / "layers", [str(root / "bin" / "kueue"), *kueue_args], new_root=visibility)
        )
        kueue_started = time.monotonic()

        _wait(sched, "jobset", deadline, lambda: _http_ok(f"http://127.0.0.1:{ports['jobset-health']}/readyz"))
        sched.startup_seconds["jobset"] = time.monotonic() - started
        _wait(sched, "kueue", deadline, lambda: _http_ok(f"http://127.0.0.1:{ports['kueue-health']}/readyz"))
        sched.startup_seconds["kueue"] = time.monotonic() - kueue_started

        hooks = webhook_configurations(root, ca_pem, ports, kueue_groups(frameworks))
        plane.kubectl("apply", "--server-side", "-f", "-", input="\n---\n".join(json.dumps(h) for h in hooks))
        # A manager's readyz says its webhook server listens, not that its handlers are registered:
        # JobSet adds them from a goroutine after start-up, and until then a JobSet write gets a 404
        # from "mjobset.kb.io". Wait until every registered path answers.
        for owner in ("jobset", "kueue"):
            urls = sorted(
                {
                    hook["clientConfig"]["url"]
                    for doc in hooks
                    for hook in doc["webhooks"]
                    if hook["clientConfig"]["url"].startswith(f"https://127.0.0.1:{ports[f'{owner}-webhook']}/")
                }
            )
            _wait(sched, owner, deadline, functools.partial(_all_served, urls, ca_pem))
    except BaseException:
        sched.stop()
        raise
    return sched


# --- pieces -----------------------------------------------------------------------------------


# Run in a private mount namespace (sh -c SCRIPT LAYERS ARGV...): /etc gets a read-only overlay of
# LAYERS/etc on top, so that /etc/kueue/metrics/certs holds our certificate.
_ETC_OVERLAY = 'mount -t overlay kuberl-etc -o "lowerdir=$0/etc:/etc" /etc && exec "$@"'
# The same, plus /visibility (a folder at the root, which cannot be mounted on where it does not
# exist): a new root on a tmpfs that holds every top-level folder of / (bind mounts, recursive),
# LAYERS/visibility and the /etc overlay; then chroot into it. The tmpfs is unbindable, so that
# binding /tmp (or wherever it lies) does not copy it into itself.
_NEW_ROOT = """set -eu
new=$0/root
mkdir -p "$new"
mount -t tmpfs kuberl-root "$new"
mount --make-unbindable "$new"
for entry in /*; do
  name=${entry#/}
  if [ -L "$entry" ]; then ln -s "$(readlink "$entry")" "$new/$name"
  elif [ -d "$entry" ]; then mkdir "$new/$name" && mount --rbind "$entry" "$new/$name"
  fi
done
mkdir "$new/visibility"
mount --bind "$0/visibility" "$new/visibility"
mount -t overlay kuberl-etc -o "lowerdir=$0/etc:/etc" "$new/etc"
exec chroot "$new" "$@"
"""


def _all_served(urls: list[str], ca_pem: bytes) -> bool:
    return all(webhook_served(url, ca_pem) for url in urls)


def _in_mount_namespace(layers: Path, argv: list[str], new_root: bool = False) -> list[str]:
    """`argv` in a private mount namespace where LAYERS/etc lies over /etc (and, with `new_root`,
    LAYERS/visibility is /visibility). As root a mount namespace; otherwise also a user namespace."""
    if any(c in str(layers) for c in ":,\\"):
        raise ValueError(f"an overlay layer path may not contain ':', ',' or '\\': {layers}")
    unshare = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        unshare[1:1] = ["--user", "--map-root-user"]
    return [*unshare, "--", "sh", "-c", _NEW_ROOT if new_root else _ETC_OVERLAY, str(layers), *argv]


def _install_crds(plane: ControlPlane, root: Path, ca_pem: bytes, kueue_webhook_port: int) -> None:
    conversion = {}
    for patch in sorted((root / "conversion" / "kueue").glob("*.yaml")):
        doc = yaml.safe_load(patch.read_text())
        conversion[doc["metadata"]["name"]] = {
            "strategy": "Webhook",
            "webhook": {
                "clientConfig": {"url": f"https://127.0.0.1:{kueue_webhook_port}/convert", "caBundle": base64.b64encode(ca_pem).decode()},
                "conversionReviewVersions": doc["spec"]["conversion"]["webhook"].get("conversionReviewVersions", ["v1"]),
            },
        }
    docs, names = [], []
    for path in sorted((root / "crds" / "jobset").glob("*.yaml")) + sorted((root / "crds" / "kueue").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            if doc["metadata"]["name"] in conversion:
                doc["spec"]["conversion"] = conversion[doc["metadata"]["name"]]
            docs.append(doc)
            names.append(doc["metadata"]["name"])
    # Server-side: Kueue's Workload CRD is far over the 256 KiB of a client-side apply's annotation.
    plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))
    deadline = time.monotonic() + 60
    while True:
        out = plane.kubectl("wait", "--for=condition=Established", "--timeout=30s", *[f"crd/{n}" for n in names], check=False)
        if out.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"CRDs not Established: {out.stderr}")
        time.sleep(0.5)


def wait_for_garbage_collector(plane: ControlPlane, timeout: float = 75.0) -> float:
    """Until the controller-manager's garbage collector follows owner references to JobSets; returns the seconds.

    The garbage collector finds new resource types (CRDs installed after it started) only at its
    discovery resync, every 30 s. Before that, deleting a JobSet leaves its Jobs, pods and Kueue
    Workload in place (so its quota stays taken). The probe: a suspended JobSet owning a ConfigMap;
    once deleting the JobSet removes the ConfigMap, the collector knows the types.
    """
    started = time.monotonic()
    name = f"kuberl-gc-probe-{os.urandom(3).hex()}"
    probe = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": KUEUE_SYSTEM},
        "spec": {
            "suspend": True,
            "replicatedJobs": [
                {
                    "name": "probe",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "containers": [{"name": "probe", "image": "registry.invalid/probe:none"}],
                                }
                            }
                        }
                    },
                }
            ],
        },
    }
    deadline = started + timeout
    while True:
        plane.kubectl("apply", "-f", "-", input=json.dumps(probe))
        uid = plane.kubectl("get", "jobset", name, "-n", KUEUE_SYSTEM, "-o", "jsonpath={.metadata.uid}").stdout
        owned = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": KUEUE_SYSTEM,
                "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": name, "uid": uid}],
            },
        }
        plane.kubectl("apply", "-f", "-", input=json.dumps(owned))
        plane.kubectl("delete", "jobset", name, "-n", KUEUE_SYSTEM, "--wait=true", "--timeout=30s")
        round_deadline = min(deadline, time.monotonic() + 10)
        while time.monotonic() < round_deadline:
            if plane.kubectl("get", "configmap", name, "-n", KUEUE_SYSTEM, check=False).returncode != 0:
                return time.monotonic() - started
            time.sleep(0.5)
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"the garbage collector did not collect the dependents of a JobSet in {timeout:.0f} s")
        # The orphan was left for good (the collector never saw the owner's deletion): a new probe.
        plane.kubectl("delete", "configmap", name, "-n", KUEUE_SYSTEM, "--ignore-not-found", check=False)
