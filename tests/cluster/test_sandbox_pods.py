"""A job with a python tool gets its sandbox pods on a real control plane, made by the operator with the
chart's own rights (tests/cluster/conftest.py): the Deployment, its headless Service and its
NetworkPolicy, owned by the RLJob; the NetworkPolicy's selectors, against the pods the API holds,
take in the sandbox pods and admit the trainer pods, and nothing else; the trainers are told the
address; deleting the RLJob takes it all away. A finished or suspended job holds no sandbox pod (a
resumed one gets them back), and the egress a job names reaches the policy only through the CRD's rules
and the chart's allow-list (here the operator's flags, as the chart passes them)."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kuberl.operator.testing.rljobs import EXIT_ANNOTATION, create, eventually, get, live_pods, new_namespace, small_job, wait_phase

ALLOWED_EGRESS = ("0.0.0.0/0", "203.0.113.0/24")


@pytest.fixture(scope="module")
def operator_args() -> tuple[str, ...]:
    # What the chart passes for admission.allowedSandboxEgress and admission.allowSandboxDNS.
    return (*(f"--allow-sandbox-egress={cidr}" for cidr in ALLOWED_EGRESS), "--allow-sandbox-dns")


def _selects(selector, labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.match_labels or {}).items()):
        return False
    for e in selector.match_expressions or []:
        if e.operator != "In" or labels.get(e.key) not in (e.values or []):
            return False
    return True


def test_a_job_with_a_python_tool_gets_its_sandbox_pods(control_plane, operator) -> None:
    plane = control_plane
    ns = new_namespace(plane, "sandbox")
    rollout = {"samplesPerPrompt": 4, "maxNewTokens": 64, "multiTurn": {"tools": [{"name": "python"}], "maxTotalTokens": 256}}
    create(plane, ns, small_job("tools", rollout=rollout))
    wait_phase(plane, ns, "tools", "Running", timeout=90)
    uid = get(plane, ns, "tools")["metadata"]["uid"]
    api = plane.api_client()
    apps, core, net = client.AppsV1Api(api), client.CoreV1Api(api), client.NetworkingV1Api(api)

    deployment = eventually(lambda: next(iter(apps.list_namespaced_deployment(ns).items), None), 60, "the sandbox Deployment")
    service = core.read_namespaced_service("tools-sandbox", ns)
    policy = net.read_namespaced_network_policy("tools-sandbox", ns)
    for obj in (deployment, service, policy):
        assert obj.metadata.owner_references[0].uid == uid and obj.metadata.owner_references[0].controller
    assert deployment.metadata.name == "tools-sandbox" and deployment.spec.replicas == 2
    pod = deployment.spec.template.spec
    assert pod.automount_service_account_token is False and pod.enable_service_links is False
    assert pod.security_context.run_as_non_root and pod.containers[0].security_context.read_only_root_filesystem
    assert service.spec.cluster_ip == "None"

    # The pods the ReplicaSet made, and the trainer pods, against the policy's selectors.
    sandbox_pods = eventually(
        lambda: core.list_namespaced_pod(ns, label_selector="kuberl.dev/sandbox=tools").items or None, 60, "the sandbox pods"
    )
    trainers = live_pods(plane, ns, "tools")
    everyone = core.list_namespaced_pod(ns).items
    assert len(sandbox_pods) == 2 and len(trainers) == 2
    selected = {p.metadata.name for p in everyone if _selects(policy.spec.pod_selector, p.metadata.labels or {})}
    assert selected == {p.metadata.name for p in sandbox_pods}
    [rule] = policy.spec.ingress
    [peer] = rule._from
    assert peer.namespace_selector is None and [(p.protocol, p.port) for p in rule.ports] == [("TCP", 8470)]
    admitted = {p.metadata.name for p in everyone if _selects(peer.pod_selector, p.metadata.labels or {})}
    assert admitted == {p.metadata.name for p in trainers}
    assert policy.spec.policy_types == ["Ingress", "Egress"] and not policy.spec.egress
    # The job's own Service and policy leave the sandbox pods out; the trainers know where they are.
    own = net.read_namespaced_network_policy("tools", ns)
    assert not any(_selects(own.spec.pod_selector, p.metadata.labels or {}) for p in sandbox_pods)
    for trainer in trainers:
        env = {e.name: e.value for e in trainer.spec.containers[0].env}
        assert env["KUBERL_SANDBOX_URL"] == f"http://tools-sandbox.{ns}.svc:8470"

    client.CustomObjectsApi(api).delete_namespaced_custom_object("kuberl.dev", "v1alpha1", ns, "rljobs", "tools")
    eventually(lambda: not apps.list_namespaced_deployment(ns).items, 60, "the sandbox Deployment gone with the RLJob")


def test_a_finished_job_holds_no_sandbox_pods(control_plane, operator) -> None:
    """Once the actor succeeds the job is Succeeded, and its sandbox Deployment (with its pods) is gone,
    though the RLJob stays."""
    plane = control_plane
    ns = new_namespace(plane, "sandbox-done")
    rollout = {"samplesPerPrompt": 4, "maxNewTokens": 64, "multiTurn": {"tools": [{"name": "python"}], "maxTotalTokens": 256}}
    create(plane, ns, small_job("tools", rollout=rollout))
    wait_phase(plane, ns, "tools", "Running", timeout=90)
    api = plane.api_client()
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    eventually(lambda: apps.list_namespaced_deployment(ns).items or None, 60, "the sandbox Deployment")
    for pod in live_pods(plane, ns, "tools"):
        core.patch_namespaced_pod(pod.metadata.name, ns, {"metadata": {"annotations": {EXIT_ANNOTATION: "succeed"}}})
    wait_phase(plane, ns, "tools", "Succeeded", timeout=90)
    eventually(lambda: not apps.list_namespaced_deployment(ns).items, 60, "the sandbox Deployment gone after the job finished")
    eventually(lambda: not core.list_namespaced_pod(ns, label_selector="kuberl.dev/sandbox=tools").items, 60, "the sandbox pods gone")
    assert get(plane, ns, "tools")["status"]["phase"] == "Succeeded"


def test_a_suspended_job_holds_no_sandbox_pods_and_gets_them_back_on_resume(control_plane, operator) -> None:
    plane = control_plane
    ns = new_namespace(plane, "sandbox-pause")
    rollout = {"samplesPerPrompt": 4, "maxNewTokens": 64, "multiTurn": {"tools": [{"name": "python"}], "maxTotalTokens": 256}}
    create(plane, ns, small_job("tools", rollout=rollout))
    wait_phase(plane, ns, "tools", "Running", timeout=90)
    api = plane.api_client()
    apps, custom = client.AppsV1Api(api), client.CustomObjectsApi(api)
    eventually(lambda: apps.list_namespaced_deployment(ns).items or None, 60, "the sandbox Deployment")
    custom.patch_namespaced_custom_object("kuberl.dev", "v1alpha1", ns, "rljobs", "tools", {"spec": {"runPolicy": {"suspend": True}}})
    wait_phase(plane, ns, "tools", "Suspended", timeout=60)
    eventually(lambda: not apps.list_namespaced_deployment(ns).items, 60, "the sandbox Deployment gone while suspended")
    custom.patch_namespaced_custom_object("kuberl.dev", "v1alpha1", ns, "rljobs", "tools", {"spec": {"runPolicy": {"suspend": False}}})
    wait_phase(plane, ns, "tools", "Running", timeout=90)
    back = eventually(lambda: next(iter(apps.list_namespaced_deployment(ns).items), None), 60, "the sandbox Deployment again")
    assert back.metadata.name == "tools-sandbox" and back.spec.replicas == 2


def test_the_api_server_holds_egress_to_its_rules_and_the_policy_lets_out_what_it_names(control_plane, operator) -> None:
    """The CRD's CEL rules refuse what they can say (an IPv4 CIDR's grammar, a link-local destination, a
    backwards port range, too many entries) before the operator sees it; a valid list becomes the sandbox
    NetworkPolicy's egress, with the metadata range still excepted."""
    plane = control_plane
    ns = new_namespace(plane, "sandbox-egress")

    def rollout(sandbox: dict) -> dict:
        return {
            "samplesPerPrompt": 4,
            "maxNewTokens": 64,
            "multiTurn": {"tools": [{"name": "python"}], "maxTotalTokens": 256, "sandbox": sandbox},
        }

    for bad, words in [
        ([{"cidr": "300.0.0.0/8"}], "no host bits"),
        ([{"cidr": "169.254.169.254/32"}], "link-local"),
        ([{"cidr": "10.0.0.0/8", "ports": [{"port": 90, "endPort": 80}]}], "endPort"),
        ([{"cidr": f"10.{i}.0.0/16"} for i in range(17)], "egress"),
    ]:
        with pytest.raises(ApiException) as refused:
            create(plane, ns, small_job("bad", rollout=rollout({"egress": bad})))
        assert refused.value.status == 422 and words in refused.value.body, refused.value.body

    egress = [
        {"cidr": "0.0.0.0/0", "ports": [{"port": 443}]},
        {"cidr": "203.0.113.0/24", "ports": [{"protocol": "UDP", "port": 4000, "endPort": 4010}]},
    ]
    create(plane, ns, small_job("tools", rollout=rollout({"egress": egress, "dns": True})))
    net = client.NetworkingV1Api(plane.api_client())
    policy = eventually(
        lambda: next((p for p in net.list_namespaced_network_policy(ns).items if p.metadata.name == "tools-sandbox"), None),
        60,
        "the sandbox NetworkPolicy",
    )
    rules = policy.spec.egress
    assert [(r.to[0].ip_block.cidr, r.to[0].ip_block._except) for r in rules[:2]] == [
        ("0.0.0.0/0", ["169.254.0.0/16"]),
        ("203.0.113.0/24", None),
    ]
    assert [(p.protocol, p.port, p.end_port) for p in rules[1].ports] == [("UDP", 4000, 4010)]
    assert [(p.protocol, p.port) for p in rules[2].ports] == [("UDP", 53), ("TCP", 53)] and len(rules) == 3

    # A network the chart does not list: refused before anything is made (a pod that wore the job's sandbox
    # label would borrow whatever the job opens).
    create(plane, ns, small_job("wider", rollout=rollout({"egress": [{"cidr": "198.51.100.0/24"}]})))
    status = wait_phase(plane, ns, "wider", "Failed", timeout=60)
    [condition] = [c for c in status["conditions"] if c["reason"] == "InvalidSpec"]
    assert "sandbox.egress[0].cidr" in condition["message"] and "admission.allowedSandboxEgress" in condition["message"]
    assert not [p for p in net.list_namespaced_network_policy(ns).items if p.metadata.name.startswith("wider")]
