"""rollout.multiTurn.sandbox.backend agentSandbox on a real control plane, with the real kubernetes-sigs
agent-sandbox controller (v1.0.1, built from the Go module proxy by scripts/agent-sandbox-binaries.sh, run with
--extensions against the plane: kuberl.operator.testing.agent_sandbox) and the operator with the chart's own
rights (tests/cluster/conftest.py).

Without the agent-sandbox CRDs the job waits, Pending with a MissingAPI condition and a Warning event that
say what to install, and starts once they are there. With them, the operator makes the SandboxTemplate and
SandboxWarmPool (owned by the RLJob) beside the headless Service and NetworkPolicy; the agent-sandbox
controller makes the warm pool's Sandboxes and, from those, their Pods, which carry the template's security
settings (no token automount, runAsNonRoot, a read-only root) and the labels the Service and NetworkPolicy
select. No container runs here: there is no kubelet in the cluster tier (kwok plays the nodes: it binds and
marks pods Running, but runs no image), so these tests check the objects the API holds, not tool calls.
A suspended job's warm pool goes (its pods with it), and the RLJob's deletion takes everything away."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from kuberl.operator.testing.control_plane import ControlPlaneError
from kuberl.operator.testing.rljobs import create, eventually, get, live_pods, new_namespace, small_job, wait_phase

REPO = Path(__file__).resolve().parent.parent.parent
GROUP, VERSION = "extensions.agents.x-k8s.io", "v1beta1"
CRDS = (
    "sandboxes.agents.x-k8s.io",
    "sandboxclaims.extensions.agents.x-k8s.io",
    "sandboxtemplates.extensions.agents.x-k8s.io",
    "sandboxwarmpools.extensions.agents.x-k8s.io",
)
ROLLOUT = {
    "samplesPerPrompt": 4,
    "maxNewTokens": 64,
    "multiTurn": {"tools": [{"name": "python"}], "maxTotalTokens": 256, "sandbox": {"backend": "agentSandbox", "replicas": 2}},
}


@pytest.fixture(scope="module")
def agent_sandbox_root() -> Path:
    """bin/agent-sandbox-controller and crds/, built on first use (about two minutes on 2 cores)."""
    from kuberl.operator.testing.agent_sandbox import agent_sandbox_root as build

    try:
        return build(REPO / "scripts" / "agent-sandbox-binaries.sh")
    except ControlPlaneError as exc:  # as for every binary of the suite (docs/testing.md): a failure, never a skip
        pytest.fail(f"the agent-sandbox controller could not be built from the Go module proxy: {exc}", pytrace=False)


@pytest.fixture(scope="module")
def agent_sandbox(control_plane, agent_sandbox_root, tmp_path_factory):
    """The CRDs installed and the controller running, for the module."""
    from kuberl.operator.testing.agent_sandbox import start_agent_sandbox

    try:
        started = start_agent_sandbox(control_plane, tmp_path_factory.mktemp("agent-sandbox"), agent_sandbox_root)
    except ControlPlaneError as exc:
        pytest.fail(f"the agent-sandbox controller did not start: {exc}", pytrace=False)
    yield started
    started.stop_checking_for_panics()


def _crds_installed(plane) -> bool:
    names = {c.metadata.name for c in client.ApiextensionsV1Api(plane.api_client()).list_custom_resource_definition().items}
    return any(n in names for n in CRDS)


def _custom(plane, ns: str, plural: str) -> list[dict]:
    return client.CustomObjectsApi(plane.api_client()).list_namespaced_custom_object(GROUP, VERSION, ns, plural)["items"]


def test_without_the_crds_the_job_waits_then_starts_once_they_are_installed(control_plane, operator, agent_sandbox_root, request) -> None:
    plane = control_plane
    if _crds_installed(plane):
        pytest.skip("the agent-sandbox CRDs are already installed in this session's control plane (this test must run first)")
    ns = new_namespace(plane, "agent-missing")
    create(plane, ns, small_job("tools", rollout=ROLLOUT))
    held = eventually(
        lambda: next(
            (
                c
                for c in (get(plane, ns, "tools").get("status") or {}).get("conditions", [])
                if c["type"] == "MissingAPI" and c["status"] == "True"
            ),
            None,
        ),
        60,
        "the MissingAPI condition",
    )
    assert "SandboxTemplate" in held["message"] and "agent-sandbox" in held["message"] and "backend: pods" in held["message"]
    assert get(plane, ns, "tools")["status"]["phase"] == "Pending" and not live_pods(plane, ns, "tools")
    events = client.CoreV1Api(plane.api_client()).list_namespaced_event(ns).items
    assert [e.reason for e in events if e.type == "Warning"].count("MissingAPI") == 1
    # The admin installs agent-sandbox: the job starts on its own (it looks again every 30 s).
    request.getfixturevalue("agent_sandbox")
    wait_phase(plane, ns, "tools", "Running", timeout=120)
    conditions = {c["type"]: c["status"] for c in get(plane, ns, "tools")["status"]["conditions"]}
    assert conditions["MissingAPI"] == "False"
    eventually(lambda: _custom(plane, ns, "sandboxwarmpools") or None, 60, "the SandboxWarmPool")


def test_the_controller_makes_the_warm_pools_pods_from_the_template(control_plane, operator, agent_sandbox) -> None:
    plane = control_plane
    ns = new_namespace(plane, "agent-sandbox")
    create(plane, ns, small_job("tools", rollout=ROLLOUT))
    wait_phase(plane, ns, "tools", "Running", timeout=90)
    uid = get(plane, ns, "tools")["metadata"]["uid"]
    api = plane.api_client()
    apps, core, net = client.AppsV1Api(api), client.CoreV1Api(api), client.NetworkingV1Api(api)

    [template] = eventually(lambda: _custom(plane, ns, "sandboxtemplates") or None, 60, "the SandboxTemplate")
    [pool] = eventually(lambda: _custom(plane, ns, "sandboxwarmpools") or None, 60, "the SandboxWarmPool")
    for obj in (template, pool):
        [ref] = obj["metadata"]["ownerReferences"]
        assert obj["metadata"]["name"] == "tools-sandbox" and ref["uid"] == uid and ref["controller"]
    assert pool["spec"]["replicas"] == 2 and pool["spec"]["sandboxTemplateRef"] == {"name": "tools-sandbox"}
    assert not apps.list_namespaced_deployment(ns).items  # no Deployment with this backend

    # The controller's Sandboxes (owned by the warm pool) and their Pods (owned by each Sandbox).
    sandboxes = eventually(
        lambda: (
            (s := client.CustomObjectsApi(api).list_namespaced_custom_object("agents.x-k8s.io", "v1beta1", ns, "sandboxes")["items"])
            and len(s) == 2
            and s
        ),
        90,
        "the warm pool's two Sandboxes",
    )
    assert {s["metadata"]["ownerReferences"][0]["kind"] for s in sandboxes} == {"SandboxWarmPool"}
    pods = eventually(
        lambda: len(p := core.list_namespaced_pod(ns, label_selector="kuberl.dev/sandbox=tools").items) == 2 and p,
        90,
        "the warm pool's two pods, made by the agent-sandbox controller",
    )
    service = core.read_namespaced_service("tools-sandbox", ns)
    policy = net.read_namespaced_network_policy("tools-sandbox", ns)
    for pod in pods:
        assert pod.metadata.owner_references[0].kind == "Sandbox"
        assert pod.spec.automount_service_account_token is False and pod.spec.enable_service_links is False
        assert pod.spec.security_context.run_as_non_root is True
        [container] = pod.spec.containers
        assert container.security_context.read_only_root_filesystem is True
        assert container.security_context.allow_privilege_escalation is False
        assert container.command[:2] == ["kuberl", "sandbox-serve"]
        assert [v.empty_dir.size_limit for v in pod.spec.volumes] == ["1Gi"]
        # The template's labels (what the Service and NetworkPolicy select), none of the job's, and the
        # DNS left alone (the controller rewrites it only for its own Managed network policy).
        labels = pod.metadata.labels
        assert all(labels.get(k) == v for k, v in service.spec.selector.items())
        assert all(labels.get(k) == v for k, v in policy.spec.pod_selector.match_labels.items())
        assert "kuberl.dev/job" not in labels and pod.spec.dns_policy == "ClusterFirst"
    # Ours is the only policy on the sandbox pods: the template's is Unmanaged, so the controller makes none.
    policies = [
        p.metadata.name
        for p in net.list_namespaced_network_policy(ns).items
        if all((pods[0].metadata.labels or {}).get(k) == v for k, v in (p.spec.pod_selector.match_labels or {}).items())
    ]
    assert policies == ["tools-sandbox"]

    # Suspended: the warm pool goes, and the pods with it; the template stays.
    custom = client.CustomObjectsApi(api)
    custom.patch_namespaced_custom_object("kuberl.dev", "v1alpha1", ns, "rljobs", "tools", {"spec": {"runPolicy": {"suspend": True}}})
    wait_phase(plane, ns, "tools", "Suspended", timeout=60)
    eventually(lambda: not _custom(plane, ns, "sandboxwarmpools"), 60, "the SandboxWarmPool gone while suspended")
    eventually(
        lambda: not core.list_namespaced_pod(ns, label_selector="kuberl.dev/sandbox=tools").items,
        90,
        "the sandbox pods gone while suspended",
    )
    assert _custom(plane, ns, "sandboxtemplates")
    custom.patch_namespaced_custom_object("kuberl.dev", "v1alpha1", ns, "rljobs", "tools", {"spec": {"runPolicy": {"suspend": False}}})
    wait_phase(plane, ns, "tools", "Running", timeout=90)
    eventually(
        lambda: len(core.list_namespaced_pod(ns, label_selector="kuberl.dev/sandbox=tools").items) == 2,
        90,
        "the sandbox pods back after the resume",
    )

    custom.delete_namespaced_custom_object("kuberl.dev", "v1alpha1", ns, "rljobs", "tools")
    eventually(
        lambda: not _custom(plane, ns, "sandboxtemplates") and not _custom(plane, ns, "sandboxwarmpools"),
        90,
        "the SandboxTemplate and SandboxWarmPool gone with the RLJob",
    )
    eventually(
        lambda: not core.list_namespaced_pod(ns, label_selector="kuberl.dev/sandbox=tools").items,
        90,
        "the sandbox pods gone with the RLJob",
    )
