"""A job's NetworkPolicy enforced on the real node by sigs.k8s.io/kube-network-policies.

Where the kernel cannot run the enforcer (it needs nftables' `queue` expression), the test says so and is
skipped: the policy is then checked only against the pods' labels (tests/test_operator_confinement.py).

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

from kuberl.operator.children import LABEL_JOB, LABEL_ROLE, Owner
from kuberl.operator.network_policy import network_policy
from kuberl.operator.testing import network_policies
from kuberl.operator.testing.waiting import eventually

# A cold build of the enforcer (Go, from the module proxy) takes minutes beyond the usual test timeout.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

SERVER = """
import socket, threading
def serve(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", port)); s.listen()
    while True:
        c, _ = s.accept(); c.sendall(b"ok"); c.close()
threading.Thread(target=serve, args=(9400,), daemon=True).start()
serve(29500)
"""
# Exit 0 when any of `tries` connections gets the server's answer, 1 when none does.
CLIENT = """
import socket, sys, time
host, port, tries = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
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


def _skip_unenforceable(missing: str) -> None:
    pytest.skip(f"no NetworkPolicy can be enforced on this machine: {missing}. The policy is checked against the "
                "pods' labels instead (tests/test_operator_confinement.py::"
                "test_the_policy_selects_every_pod_of_the_job_and_admits_its_trainer_pods_and_nothing_else)")


@pytest.fixture(scope="module")
def enforcer(real_node, tmp_path_factory):
    try:
        missing = network_policies.kernel_refuses_queue()
        if missing:
            _skip_unenforceable(missing)
        built = network_policies.binary()
    except network_policies.EnforcerError as exc:
        pytest.fail(str(exc), pytrace=False)
    workdir = tmp_path_factory.mktemp("netpol")
    proc = network_policies.start(real_node.plane, real_node.network.netns, real_node.name, workdir, built)
    log = workdir / "kube-network-policies.log"
    try:
        missing = network_policies.kernel_lacks(proc, log)
    except AssertionError:
        proc.kill()
        raise
    if missing:
        proc.kill()
        _skip_unenforceable(missing)
    yield proc, log
    proc.terminate()
    try:
        proc.wait(15)
    except Exception:  # noqa: BLE001 - it must not outlive the test
        proc.kill()


def _pod(name: str, ns: str, labels: dict[str, str], image: str, command: list[str]) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never", "command": command}]}}


def test_the_jobs_policy_admits_its_own_pods_and_prometheus_and_nothing_else(real_node, enforcer, built_images) -> None:
    proc, log = enforcer
    node, image, tag = real_node, built_images["TRAINER_IMAGE"], uuid.uuid4().hex[:6]
    job_ns, tenant_ns, monitoring_ns = f"job-{tag}", f"tenant-{tag}", f"monitoring-{tag}"
    for ns in (job_ns, tenant_ns, monitoring_ns):
        node.plane.kubectl("create", "namespace", ns)
    job = "fenced"
    node.plane.kubectl("apply", "-f", "-", input=json.dumps(
        _pod("rank0", job_ns, {LABEL_JOB: job, LABEL_ROLE: "actor"}, image, ["python", "-c", SERVER])))

    def ip() -> str | None:
        out = node.plane.kubectl("get", "pod", "rank0", "-n", job_ns, "-o", "jsonpath={.status.phase} {.status.podIP}").stdout.split()
        return out[1] if len(out) == 2 and out[0] == "Running" else None

    server = eventually(ip, 300, "the rank-0 pod running")
    assert proc.poll() is None, log.read_text()[-3000:]

    def connects(name: str, ns: str, labels: dict[str, str], port: int, tries: int) -> bool:
        node.plane.kubectl("apply", "-f", "-", input=json.dumps(
            _pod(name, ns, labels, image, ["python", "-c", CLIENT, server, str(port), str(tries)])))
        phase = eventually(lambda: (p := node.plane.kubectl("get", "pod", name, "-n", ns, "-o", "jsonpath={.status.phase}").stdout)
                           in ("Succeeded", "Failed") and p, 180, f"{ns}/{name} to finish")
        return phase == "Succeeded"

    # No policy selects the pod yet: a stranger wearing the job's labels in another namespace gets in.
    assert connects("before", tenant_ns, {LABEL_JOB: job, LABEL_ROLE: "actor"}, 29500, tries=30)

    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": monitoring_ns}},
                  "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
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
