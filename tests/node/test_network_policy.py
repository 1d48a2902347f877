"""A job's NetworkPolicy enforced on the real node by a real enforcer: sigs.k8s.io/kube-network-policies (SIG
Network's, the one kind ships) where the kernel has nftables' `queue` expression, else kube-router's firewall
(iptables and ipsets). Where the kernel can run neither, the test says so and is skipped: the policy is then
checked only against the pods' labels (tests/test_operator_confinement.py).

A pod labelled as a job's actor serves the rendezvous port (29500) and the metrics port (9400); the
policy is the planner's own for that job. Before the policy, a pod of another namespace wearing the
job's labels connects (the enforcer lets everything through where no policy selects the pod); after
it: the job's own trainer pods connect, Prometheus reaches the metrics port but not the rendezvous,
and a tool sandbox of the job and that other tenant's pod reach neither.
"""

from __future__ import annotations

import json
import uuid

import pytest

from kuberl.operator.control.children import LABEL_JOB, LABEL_ROLE, Owner
from kuberl.operator.control.network_policy import network_policy
from kuberl.operator.control.sandbox_address import SANDBOX_PORT
from kuberl.operator.control.sandbox_pods import network_policy as sandbox_network_policy, pod_labels as sandbox_labels
from kuberl.operator.testing.waiting import eventually

# A cold build of the enforcer (Go, from the module proxy) takes minutes beyond the usual test timeout.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

EGRESS_SETTLE_S = 10.0
# Serves "ok" on each port of argv (default: the rendezvous and the metrics port).
SERVER = """
import socket, sys, threading
def serve(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", port)); s.listen()
    while True:
        c, _ = s.accept(); c.sendall(b"ok"); c.close()
ports = [int(p) for p in sys.argv[1:]] or [9400, 29500]
for port in ports[1:]:
    threading.Thread(target=serve, args=(port,), daemon=True).start()
serve(ports[0])
"""
# Exit 0 when any of `tries` connections gets the server's answer, 1 when none does; the first after `delay` seconds.
CLIENT = """
import socket, sys, time
host, port, tries, delay = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
time.sleep(delay)
for _ in range(tries):
    try:
        with socket.create_connection((host, port), timeout=3) as c:
            if c.recv(2) == b"ok":
                sys.exit(0)
    except OSError as exc:
        print(exc, flush=True)
    time.sleep(1)
sys.exit(1)
"""


def _pod(name: str, ns: str, labels: dict[str, str], image: str, command: list[str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never", "command": command}],
        },
    }


def test_the_jobs_policy_admits_its_own_pods_and_prometheus_and_nothing_else(real_node, network_policy_enforcer, built_images) -> None:
    proc, log = network_policy_enforcer
    node, image, tag = real_node, built_images["TRAINER_IMAGE"], uuid.uuid4().hex[:6]
    job_ns, tenant_ns, monitoring_ns = f"job-{tag}", f"tenant-{tag}", f"monitoring-{tag}"
    for ns in (job_ns, tenant_ns, monitoring_ns):
        node.plane.kubectl("create", "namespace", ns)
    job = "fenced"
    server = _server(node, "rank0", job_ns, {LABEL_JOB: job, LABEL_ROLE: "actor"}, image, [29500, 9400])
    assert proc.poll() is None, log.read_text()[-3000:]

    def connects(name: str, ns: str, labels: dict[str, str], port: int, tries: int) -> bool:
        return _connects(node, image, name, ns, labels, server, port, tries)

    # No policy selects the pod yet: a stranger wearing the job's labels in another namespace gets in.
    assert connects("before", tenant_ns, {LABEL_JOB: job, LABEL_ROLE: "actor"}, 29500, tries=30)

    prometheus = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": monitoring_ns}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
    policy = network_policy(Owner(name=job, namespace=job_ns, uid="unused"), ["actor", "critic"], 9400, (prometheus,))
    del policy["metadata"]["ownerReferences"]  # no RLJob here: the garbage collector would take an orphan
    node.plane.kubectl("apply", "-f", "-", input=json.dumps(policy))

    # The job's own trainer pod (another role) gets in: also the proof that the enforcer is up and the server answers.
    assert connects("peer", job_ns, {LABEL_JOB: job, LABEL_ROLE: "critic"}, 29500, tries=60), log.read_text()[-3000:]
    assert connects("scraper", monitoring_ns, {"app.kubernetes.io/name": "prometheus"}, 9400, tries=30)
    refused = {
        "prometheus on the rendezvous port": ("scraper-torch", monitoring_ns, {"app.kubernetes.io/name": "prometheus"}, 29500),
        "a tool sandbox of the job": ("sandbox", job_ns, {LABEL_JOB: job, LABEL_ROLE: "sandbox"}, 29500),
        "another tenant wearing the job's labels": ("after", tenant_ns, {LABEL_JOB: job, LABEL_ROLE: "actor"}, 29500),
        "another tenant on the metrics port": ("after-metrics", tenant_ns, {"app.kubernetes.io/name": "prometheus"}, 9400),
    }
    for who, (name, ns, labels, port) in refused.items():
        assert not connects(name, ns, labels, port, tries=3), f"{who} connected"
    assert proc.poll() is None, log.read_text()[-3000:]
    for ns in (job_ns, tenant_ns, monitoring_ns):
        node.plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _server(node, name: str, ns: str, labels: dict[str, str], image: str, ports: list[int]) -> str:
    """A pod serving "ok" on `ports`; its IP once it runs."""
    node.plane.kubectl("apply", "-f", "-", input=json.dumps(_pod(name, ns, labels, image, ["python", "-c", SERVER, *map(str, ports)])))

    def ip() -> str | None:
        out = node.plane.kubectl("get", "pod", name, "-n", ns, "-o", "jsonpath={.status.phase} {.status.podIP}").stdout.split()
        return out[1] if len(out) == 2 and out[0] == "Running" else None

    return eventually(ip, 300, f"{ns}/{name} running")


def _connects(node, image: str, name: str, ns: str, labels: dict[str, str], server: str, port: int, tries: int, delay: float = 0) -> bool:
    """Whether a new pod `name` with `labels` gets an answer from server:port in `tries` attempts, the first `delay`
    seconds after it starts."""
    node.plane.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(_pod(name, ns, labels, image, ["python", "-c", CLIENT, server, str(port), str(tries), str(delay)])),
    )
    phase = eventually(
        lambda: (
            (p := node.plane.kubectl("get", "pod", name, "-n", ns, "-o", "jsonpath={.status.phase}").stdout) in ("Succeeded", "Failed")
            and p
        ),
        180,
        f"{ns}/{name} to finish",
    )
    return phase == "Succeeded"


def test_the_sandbox_policy_lets_only_the_trainers_in_and_nothing_out(real_node, network_policy_enforcer, built_images) -> None:
    """The tool sandbox's wall on the real node: its pods reach nothing (not another namespace's open server),
    and only the job's trainer pods reach the sandbox port."""
    proc, log = network_policy_enforcer
    node, image, tag = real_node, built_images["TRAINER_IMAGE"], uuid.uuid4().hex[:6]
    job_ns, tenant_ns = f"box-{tag}", f"open-{tag}"
    for ns in (job_ns, tenant_ns):
        node.plane.kubectl("create", "namespace", ns)
    job = "boxed"
    outside = _server(node, "outside", tenant_ns, {"app": "open"}, image, [8080])
    sandbox = _server(node, "sandbox", job_ns, sandbox_labels(job), image, [SANDBOX_PORT])
    # No policy yet: a sandbox pod calls out freely (the proof that the server answers and pods can connect).
    assert _connects(node, image, "box-before", job_ns, sandbox_labels(job), outside, 8080, tries=30)

    policy = sandbox_network_policy(Owner(name=job, namespace=job_ns, uid="unused"), ["actor"])
    del policy["metadata"]["ownerReferences"]
    node.plane.kubectl("apply", "-f", "-", input=json.dumps(policy))

    # The job's trainer reaches the sandbox: also the proof that the enforcer has the policy.
    assert _connects(node, image, "trainer", job_ns, {LABEL_JOB: job, LABEL_ROLE: "actor"}, sandbox, SANDBOX_PORT, tries=60), (
        log.read_text()[-3000:]
    )
    # A pod's own egress rules exist once the enforcer has seen the pod: kube-router installs them within seconds of
    # its start (a sandbox pod runs calls once it is ready, seconds later); the calling pods wait that long.
    refused = {
        "the sandbox calling out to another namespace": ("box-after", job_ns, sandbox_labels(job), outside, 8080),
        "the sandbox calling another sandbox pod": ("box-peer", job_ns, sandbox_labels(job), sandbox, SANDBOX_PORT),
        "another tenant calling the sandbox": ("stranger", tenant_ns, {LABEL_JOB: job, LABEL_ROLE: "actor"}, sandbox, SANDBOX_PORT),
    }
    for who, (name, ns, labels, server, port) in refused.items():
        assert not _connects(node, image, name, ns, labels, server, port, tries=3, delay=EGRESS_SETTLE_S), f"{who} connected"
    assert proc.poll() is None, log.read_text()[-3000:]
    for ns in (job_ns, tenant_ns):
        node.plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
