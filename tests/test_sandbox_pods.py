"""The sandbox pods a job with code-running tools gets, as the planner makes them: nothing of the
trainer's in them (no token, no environment, no volumes but the scratch), the restricted security
context, and a NetworkPolicy whose selectors take in the sandbox pods and admit the trainer pods and
nothing else."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl.engine.agents.sandbox_protocol import DEFAULT_PORT, SANDBOX_URL_ENV as ENGINE_URL_ENV
from kuberl.engine.agents.tools import BUILTIN_TOOLS as ENGINE_BUILTINS
from kuberl.engine.config.multi_turn import BUILTIN_TOOLS, CODE_TOOLS
from kuberl.operator.validation.admission import AdmissionPolicy, admission_problems
from kuberl.operator.control.children import LABEL_JOB, LABEL_ROLE, OperatorSettings
from kuberl.operator.validation.manifest import parse_rljob
from kuberl.operator.control.planner import plan
from kuberl.operator.control.pod_spec import CONTAINER_SECURITY, POD_SECURITY
from kuberl.operator.control.sandbox_address import LABEL_SANDBOX, SANDBOX_PORT, SANDBOX_URL_ENV

from .label_selectors import selects

EXAMPLE = Path(__file__).parent.parent / "examples" / "ppo-cluster" / "rljob.yaml"
UID = "uid-of-the-rljob"
SETTINGS = OperatorSettings(default_image="registry.example.com/kuberl-trainer:0.1.0")


def job(tools: list[dict[str, Any]] | None = None, sandbox: dict[str, Any] | None = None, namespace: str = "rl"):
    doc = yaml.safe_load(EXAMPLE.read_text())
    multi_turn: dict[str, Any] = {"tools": tools if tools is not None else [{"name": "python"}], "maxTotalTokens": 1024}
    if sandbox is not None:
        multi_turn["sandbox"] = sandbox
    doc["spec"]["rollout"]["multiTurn"] = multi_turn
    doc["metadata"]["namespace"] = namespace
    return parse_rljob(doc, "rljob.yaml")


def by_kind(support: list[dict[str, Any]], name: str) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in support if o["metadata"]["name"] == name}


def sandbox(tools=None, sandbox_spec=None, settings: OperatorSettings = SETTINGS) -> dict[str, dict[str, Any]]:
    j = job(tools, sandbox_spec)
    return by_kind(plan(j, uid=UID, settings=settings).support, f"{j.metadata.name}-sandbox")


def test_the_constants_agree_with_the_engine() -> None:
    assert SANDBOX_URL_ENV == ENGINE_URL_ENV and SANDBOX_PORT == DEFAULT_PORT
    assert set(CODE_TOOLS) == {name for name in BUILTIN_TOOLS if ENGINE_BUILTINS[name].sandboxed}


def test_only_jobs_whose_tools_run_code_get_sandbox_pods(tmp_path: Path) -> None:
    assert set(sandbox()) == {"Deployment", "Service", "NetworkPolicy"}
    assert sandbox([{"name": "calculator"}]) == {}
    assert sandbox([{"name": "python"}], {"pods": False}) == {}
    assert set(sandbox([{"name": "f", "path": "tools/f.py"}])) == {"Deployment", "Service", "NetworkPolicy"}
    assert sandbox([{"name": "h", "url": "http://tools.example.com/h"}]) == {}


def test_a_sandbox_pod_holds_nothing_of_the_trainer() -> None:
    deployment = sandbox(None, {"replicas": 3, "runtimeClassName": "gvisor", "cpu": "2", "memory": "2Gi", "scratchSize": "512Mi"})[
        "Deployment"
    ]
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False
    assert "serviceAccountName" not in pod and "hostNetwork" not in pod and "shareProcessNamespace" not in pod
    assert pod["securityContext"] == POD_SECURITY and pod["runtimeClassName"] == "gvisor"
    [container] = pod["containers"]
    assert container["securityContext"] == CONTAINER_SECURITY and CONTAINER_SECURITY["readOnlyRootFilesystem"] is True
    assert container["image"] == SETTINGS.default_image
    assert container["command"][:2] == ["kuberl", "sandbox-serve"] and str(SANDBOX_PORT) in container["command"]
    # No variable of the trainer's (its job, config, tracking secrets, the user's), no envFrom.
    assert {e["name"] for e in container["env"]} == {"HOME", "TMPDIR"} and "envFrom" not in container
    assert all("valueFrom" not in e for e in container["env"])
    # The one volume: a size-limited emptyDir, the scratch.
    assert pod["volumes"] == [{"name": "kuberl-scratch", "emptyDir": {"sizeLimit": "512Mi"}}]
    assert [m["name"] for m in container["volumeMounts"]] == ["kuberl-scratch"]
    assert container["resources"] == {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}}
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": SANDBOX_PORT}


def test_the_trainers_are_told_where_the_sandbox_is_and_nothing_else_changes() -> None:
    with_pods = plan(job(), uid=UID, settings=SETTINGS)
    without = plan(job(sandbox={"pods": False}), uid=UID, settings=SETTINGS)
    for role in with_pods.jobset["spec"]["replicatedJobs"]:
        [container] = role["template"]["spec"]["template"]["spec"]["containers"]
        urls = [e["value"] for e in container["env"] if e["name"] == SANDBOX_URL_ENV]
        assert urls == [f"http://ppo-qwen-math-sandbox.rl.svc:{SANDBOX_PORT}"]
    for role in without.jobset["spec"]["replicatedJobs"]:
        [container] = role["template"]["spec"]["template"]["spec"]["containers"]
        assert all(e["name"] != SANDBOX_URL_ENV for e in container["env"])


def test_the_service_is_headless_and_selects_the_sandbox_pods_only() -> None:
    objects = sandbox()
    service, pod_labels = objects["Service"], objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["ports"][0]["port"] == SANDBOX_PORT
    assert selects({"matchLabels": service["spec"]["selector"]}, pod_labels)
    assert selects(objects["Deployment"]["spec"]["selector"], pod_labels)


def test_the_network_policy_admits_the_trainers_to_the_port_and_lets_nothing_out() -> None:
    desired = plan(job(), uid=UID, settings=SETTINGS)
    objects = by_kind(desired.support, "ppo-qwen-math-sandbox")
    policy, sandbox_labels = objects["NetworkPolicy"]["spec"], objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    trainers = {r["name"]: r["template"]["spec"]["template"]["metadata"]["labels"] for r in desired.jobset["spec"]["replicatedJobs"]}
    initializer = desired.initializer["spec"]["template"]["metadata"]["labels"]
    assert trainers and initializer
    # Whom it applies to: the sandbox pods, and no trainer or initializer pod.
    assert selects(policy["podSelector"], sandbox_labels)
    assert not any(selects(policy["podSelector"], labels) for labels in [*trainers.values(), initializer])
    # Who may come in: every trainer pod, to the sandbox port only; not a sandbox pod, not the initializer,
    # not a pod of another job, not a pod that merely claims the job's label.
    [rule] = policy["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": SANDBOX_PORT}]
    [peer] = rule["from"]
    assert set(peer) == {"podSelector"}  # this namespace only
    assert all(selects(peer["podSelector"], labels) for labels in trainers.values())
    assert not selects(peer["podSelector"], sandbox_labels) and not selects(peer["podSelector"], initializer)
    assert not selects(peer["podSelector"], {**trainers["actor"], LABEL_JOB: "another-job"})
    assert not selects(peer["podSelector"], {LABEL_JOB: "ppo-qwen-math", LABEL_ROLE: "sandbox"})
    # Out: nothing (Egress without a rule).
    assert policy["policyTypes"] == ["Ingress", "Egress"] and policy["egress"] == []


def test_the_jobs_own_objects_do_not_take_in_the_sandbox_pods() -> None:
    """The job's Service, NetworkPolicy (all ports from the trainers) and status select kuberl.dev/job:
    the sandbox pods do not carry it, so they are neither ranks nor reachable on other ports."""
    desired = plan(job(), uid=UID, settings=SETTINGS)
    sandbox_labels = by_kind(desired.support, "ppo-qwen-math-sandbox")["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert LABEL_JOB not in sandbox_labels and LABEL_SANDBOX in sandbox_labels
    own = by_kind(desired.support, "ppo-qwen-math")
    assert not selects({"matchLabels": own["Service"]["spec"]["selector"]}, sandbox_labels)
    assert not selects(own["NetworkPolicy"]["spec"]["podSelector"], sandbox_labels)


def test_the_sandbox_policy_stays_where_the_chart_turns_the_jobs_own_off() -> None:
    objects = sandbox(settings=OperatorSettings(default_image="img:1", network_policy=False))
    assert objects["NetworkPolicy"]["spec"]["egress"] == []


def test_every_sandbox_object_is_owned_by_the_rljob() -> None:
    for obj in sandbox().values():
        [ref] = obj["metadata"]["ownerReferences"]
        assert ref["uid"] == UID and ref["controller"] is True and obj["metadata"]["labels"][LABEL_JOB] == "ppo-qwen-math"


def test_a_sandbox_runtime_class_must_be_allowed_by_the_chart() -> None:
    j = job(sandbox={"runtimeClassName": "runc-privileged"})
    [problem] = [p for p in admission_problems(j, "rljob.yaml") if "sandbox" in p.path]
    assert problem.path == "spec.rollout.multiTurn.sandbox.runtimeClassName" and "allowedRuntimeClasses" in problem.message
    allowed = AdmissionPolicy(allowed_runtime_classes=("runc-privileged",))
    assert not [p for p in admission_problems(j, "rljob.yaml", allowed) if "sandbox" in p.path]


@pytest.mark.parametrize(
    "bad,field",
    [
        ({"replicas": 0}, "replicas"),
        ({"memory": "lots"}, "memory"),
        ({"runtimeClassName": "Not_A_Name"}, "runtimeClassName"),
        ({"nodes": 2}, "nodes"),
    ],
)
def test_bad_sandbox_settings_are_refused_naming_the_field(bad: dict[str, Any], field: str) -> None:
    from kuberl.operator.validation.manifest import ManifestError

    with pytest.raises(ManifestError) as refused:
        job(sandbox=copy.deepcopy(bad))
    assert f"sandbox.{field}" in str(refused.value)


def test_the_policy_lets_out_exactly_the_destinations_the_job_names() -> None:
    egress = [
        {"cidr": "203.0.113.0/24", "ports": [{"port": 443}, {"protocol": "UDP", "port": 4000, "endPort": 4010}]},
        {"cidr": "2001:db8::/32"},
    ]
    policy = sandbox(None, {"egress": egress})["NetworkPolicy"]["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["egress"] == [
        {
            "to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}],
            "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "UDP", "port": 4000, "endPort": 4010}],
        },
        {"to": [{"ipBlock": {"cidr": "2001:db8::/32"}}]},  # every port of that network
    ]
    # The ingress side does not change with it.
    assert policy["ingress"] == sandbox()["NetworkPolicy"]["spec"]["ingress"]


def test_a_wide_destination_still_leaves_out_the_metadata_servers() -> None:
    """The attack: a job opens 0.0.0.0/0 for a web tool, and the model's code asks 169.254.169.254 for the node's
    cloud credentials. The link-local ranges stay excepted from any block that covers them."""
    policy = sandbox(None, {"egress": [{"cidr": "0.0.0.0/0", "ports": [{"port": 443}]}, {"cidr": "::/0"}, {"cidr": "10.0.0.0/8"}]})[
        "NetworkPolicy"
    ]["spec"]
    blocks = [rule["to"][0]["ipBlock"] for rule in policy["egress"]]
    assert blocks == [
        {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]},
        {"cidr": "::/0", "except": ["fe80::/10"]},
        {"cidr": "10.0.0.0/8"},
    ]


def test_dns_is_opened_only_when_asked_and_only_to_the_cluster_dns() -> None:
    assert sandbox(None, {"egress": [{"cidr": "203.0.113.0/24"}]})["NetworkPolicy"]["spec"]["egress"] == [
        {"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}]}
    ]
    [rule] = sandbox(None, {"dns": True})["NetworkPolicy"]["spec"]["egress"]
    assert rule["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    [peer] = rule["to"]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}
    assert selects(peer["podSelector"], {"k8s-app": "kube-dns", "pod-template-hash": "x"})
    assert not selects(peer["podSelector"], {"app": "anything-else"})


@pytest.mark.parametrize(
    "egress,field,words",
    [
        ([{"cidr": "203.0.113.7/24"}], "egress[0].cidr", "no host bits"),
        ([{"cidr": "203.0.113.0/33"}], "egress[0].cidr", "no host bits"),
        ([{"cidr": "300.0.0.0/8"}], "egress[0].cidr", "no host bits"),
        ([{"cidr": "example.com/32"}], "egress[0].cidr", "CIDR"),
        ([{"cidr": "10.0.0.0"}], "egress[0].cidr", "CIDR"),
        ([{"cidr": "169.254.169.254/32"}], "egress[0].cidr", "link-local"),
        ([{"cidr": "fe80::/64"}], "egress[0].cidr", "link-local"),
        ([{"cidr": "10.0.0.0/8", "ports": [{"port": 0}]}], "egress[0].ports[0].port", ""),
        ([{"cidr": "10.0.0.0/8", "ports": [{"port": 70000}]}], "egress[0].ports[0].port", ""),
        ([{"cidr": "10.0.0.0/8", "ports": [{"port": 80, "protocol": "SCTP"}]}], "egress[0].ports[0].protocol", ""),
        ([{"cidr": "10.0.0.0/8", "ports": [{"port": 90, "endPort": 80}]}], "egress[0].ports[0].endPort", "at least port"),
        ([{"cidr": "10.0.0.0/8", "ports": [{"port": p} for p in range(1, 18)]}], "egress[0].ports", ""),
        ([{"cidr": f"10.{i}.0.0/16"} for i in range(17)], "egress", ""),
    ],
)
def test_bad_egress_is_refused_naming_the_field(egress: list[dict[str, Any]], field: str, words: str) -> None:
    from kuberl.operator.validation.manifest import ManifestError

    with pytest.raises(ManifestError) as refused:
        job(sandbox={"egress": egress})
    assert f"sandbox.{field}" in str(refused.value) and words in str(refused.value)


def test_the_jobs_queue_seconds_reach_the_trainers_pod_backend(monkeypatch) -> None:
    """sandbox.queueSeconds crosses from the plan (the trainer pods' env) to the engine's pod backend, which
    gives up on a busy fleet after it; a value the operator could not have written is refused by name."""
    from kuberl.engine.agents.sandbox_pod import QUEUE_SECONDS, PodBackend

    j = job(sandbox={"queueSeconds": 7})
    [actor] = [r for r in plan(j, uid=UID, settings=SETTINGS).jobset["spec"]["replicatedJobs"] if r["name"] == "actor"]
    env = {e["name"]: e["value"] for e in actor["template"]["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}
    for name in (SANDBOX_URL_ENV, "KUBERL_SANDBOX_QUEUE_SECONDS"):
        monkeypatch.setenv(name, env[name])
    backend = PodBackend()
    assert backend.queue_seconds == 7.0 and backend.url == env[SANDBOX_URL_ENV]
    monkeypatch.delenv("KUBERL_SANDBOX_QUEUE_SECONDS")
    assert PodBackend().queue_seconds == QUEUE_SECONDS == job().spec.rollout.multi_turn.sandbox.queue_seconds
    for bad in ("0", "-3", "nan", "1e9", "soon"):
        monkeypatch.setenv("KUBERL_SANDBOX_QUEUE_SECONDS", bad)
        with pytest.raises(ValueError, match="KUBERL_SANDBOX_QUEUE_SECONDS=.*a number of seconds in"):
            PodBackend()
