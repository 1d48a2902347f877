"""rollout.multiTurn.sandbox.backend agentSandbox, as the planner and the reconcile make it: in place of the
Deployment, an agent-sandbox SandboxTemplate holding exactly the Deployment's pod template and a
SandboxWarmPool of `replicas` sandboxes from it, both owned by the RLJob; the same headless Service and
NetworkPolicy; the operator's rights cover exactly the two new kinds; a cluster without the CRDs holds the
job with a MissingAPI condition. Pure (tests/cluster/test_sandbox_agent_backend.py runs the real controller)."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl.operator.api import RLJobStatus
from kuberl.operator.control.children import LABEL_JOB, OperatorSettings
from kuberl.operator.control.controller import CHILD_API_VERSIONS, CHILD_KINDS
from kuberl.operator.validation.manifest import ManifestError, parse_rljob
from kuberl.operator.control.planner import plan
from kuberl.operator.control.reconcile.context import Decision
from kuberl.operator.control.reconcile.missing_api import MISSING_API, with_missing_apis
from kuberl.operator.control.reconcile.sandbox import WARM_POOL_KIND, sandbox_deletions
from kuberl.operator.control.sandbox_address import AGENT_SANDBOX_EXTENSIONS_API_VERSION, LABEL_SANDBOX

from .label_selectors import selects

REPO = Path(__file__).parent.parent
EXAMPLE = REPO / "examples" / "ppo-cluster" / "rljob.yaml"
RULES = REPO / "helm" / "kuberl" / "files" / "operator-rules.yaml"
UID = "uid-of-the-rljob"
SETTINGS = OperatorSettings(default_image="registry.example.com/kuberl-trainer:0.1.0")
NAME = "ppo-qwen-math-sandbox"
NOW = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)


def job(sandbox: dict[str, Any] | None = None, suspend: bool = False):
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["rollout"]["multiTurn"] = {"tools": [{"name": "python"}], "maxTotalTokens": 1024, "sandbox": sandbox or {}}
    doc["metadata"]["namespace"] = "rl"
    doc["spec"].setdefault("runPolicy", {})["suspend"] = suspend
    return parse_rljob(doc, "rljob.yaml")


def objects(sandbox: dict[str, Any] | None = None, suspend: bool = False) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in plan(job(sandbox, suspend), uid=UID, settings=SETTINGS).support if o["metadata"]["name"] == NAME}


AGENT = {"backend": "agentSandbox", "replicas": 3, "runtimeClassName": "gvisor", "cpu": "2", "memory": "2Gi"}


def test_the_default_backend_is_the_deployment_as_before() -> None:
    assert set(objects()) == {"Deployment", "Service", "NetworkPolicy"}
    assert objects({"backend": "pods"}) == objects()


def test_agent_sandbox_renders_a_template_and_a_warm_pool_in_place_of_the_deployment() -> None:
    agent = objects(AGENT)
    assert set(agent) == {"SandboxTemplate", "SandboxWarmPool", "Service", "NetworkPolicy"}
    template, pool = agent["SandboxTemplate"], agent["SandboxWarmPool"]
    assert template["apiVersion"] == pool["apiVersion"] == AGENT_SANDBOX_EXTENSIONS_API_VERSION == "extensions.agents.x-k8s.io/v1beta1"
    # Exactly the Deployment's pod: same labels, same spec (no token, restricted context, read-only root, scratch, runtime class).
    deployment = objects({k: v for k, v in AGENT.items() if k != "backend"})["Deployment"]
    assert template["spec"]["podTemplate"] == deployment["spec"]["template"]
    pod = template["spec"]["podTemplate"]["spec"]
    assert pod["automountServiceAccountToken"] is False and pod["runtimeClassName"] == "gvisor"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert [v["emptyDir"] for v in pod["volumes"]] == [{"sizeLimit": "1Gi"}]
    # Our NetworkPolicy is the only one on the pods (a Managed one would add the controller's default egress);
    # no Service per sandbox; no claim may inject variables or volumes.
    assert template["spec"]["networkPolicyManagement"] == "Unmanaged" and template["spec"]["service"] is False
    assert template["spec"]["envVarsInjectionPolicy"] == template["spec"]["volumeClaimTemplatesPolicy"] == "Disallowed"
    assert pool["spec"] == {"replicas": 3, "sandboxTemplateRef": {"name": NAME}, "updateStrategy": {"type": "Recreate"}}


def test_the_service_and_policy_are_the_same_and_select_the_templates_pods() -> None:
    agent, pods = objects(AGENT), objects({k: v for k, v in AGENT.items() if k != "backend"})
    assert agent["Service"] == pods["Service"] and agent["NetworkPolicy"] == pods["NetworkPolicy"]
    labels = agent["SandboxTemplate"]["spec"]["podTemplate"]["metadata"]["labels"]
    # What the agent-sandbox controller adds to a warm pool's pod (all under agents.x-k8s.io/) changes no selection.
    labels = {**labels, "agents.x-k8s.io/warm-pool-sandbox": "1a2b3c", "agents.x-k8s.io/sandbox-name-hash": "4d5e6f"}
    assert selects({"matchLabels": agent["Service"]["spec"]["selector"]}, labels)
    assert selects(agent["NetworkPolicy"]["spec"]["podSelector"], labels)
    assert LABEL_JOB not in labels and labels[LABEL_SANDBOX] == "ppo-qwen-math"


def test_every_agent_sandbox_object_is_owned_by_the_rljob() -> None:
    for obj in objects(AGENT).values():
        [ref] = obj["metadata"]["ownerReferences"]
        assert ref["uid"] == UID and ref["controller"] is True and ref["kind"] == "RLJob"
        assert obj["metadata"]["labels"][LABEL_JOB] == "ppo-qwen-math"


def test_a_stopped_job_deletes_its_warm_pool_and_keeps_the_template() -> None:
    suspended = objects(AGENT, suspend=True)
    assert set(suspended) == {"SandboxTemplate", "Service", "NetworkPolicy"}
    assert sandbox_deletions(job(AGENT, suspend=True), "Suspended") == (f"{WARM_POOL_KIND}/{NAME}",)
    assert sandbox_deletions(job(AGENT), "Succeeded") == (f"{WARM_POOL_KIND}/{NAME}",)
    assert sandbox_deletions(job(AGENT), "Running") == ()
    # The controller deletes it by the kind and apiVersion the planner writes.
    assert (CHILD_KINDS[WARM_POOL_KIND], CHILD_API_VERSIONS[WARM_POOL_KIND]) == ("SandboxWarmPool", AGENT_SANDBOX_EXTENSIONS_API_VERSION)


def test_agent_sandbox_without_pods_is_refused_naming_the_field() -> None:
    with pytest.raises(ManifestError) as refused:
        job({"backend": "agentSandbox", "pods": False})
    assert "sandbox.backend" in str(refused.value) and "pods" in str(refused.value)
    with pytest.raises(ManifestError) as unknown:
        job({"backend": "kata"})
    assert "sandbox.backend" in str(unknown.value)


def test_the_operator_may_write_exactly_the_two_new_kinds() -> None:
    rules = [
        r
        for r in yaml.safe_load(RULES.read_text())
        if "extensions.agents.x-k8s.io" in r["apiGroups"] or any(g.endswith("agents.x-k8s.io") for g in r["apiGroups"])
    ]
    granted = {(g, res): set(r["verbs"]) for r in rules for g in r["apiGroups"] for res in r["resources"]}
    assert granted == {
        ("extensions.agents.x-k8s.io", "sandboxtemplates"): {"get", "create", "patch"},
        ("extensions.agents.x-k8s.io", "sandboxwarmpools"): {"get", "create", "patch", "delete"},
    }


def _decision(**kw: Any) -> Decision:
    return Decision(status=RLJobStatus(phase="Pending"), **kw)


def test_missing_crds_hold_the_job_with_a_condition_and_one_event() -> None:
    missing = [(AGENT_SANDBOX_EXTENSIONS_API_VERSION, "SandboxTemplate"), (AGENT_SANDBOX_EXTENSIONS_API_VERSION, "SandboxWarmPool")]
    held = with_missing_apis(_decision(create_jobset=True), missing, NOW)
    assert not held.create_jobset and held.requeue_after
    [condition] = [c for c in held.status.conditions if c.type == MISSING_API]
    assert condition.status == "True" and "SandboxWarmPool" in condition.message and "agent-sandbox" in condition.message
    assert "backend: pods" in condition.message and held.status.phase == "Pending"
    assert [e[:2] for e in held.events] == [("Warning", MISSING_API)]
    # Still missing at the next reconcile: no second event.
    again = with_missing_apis(dataclasses.replace(_decision(create_jobset=True), status=held.status), missing, NOW)
    assert again.events == () and not again.create_jobset
    # Installed: the condition turns False, nothing is held.
    served = with_missing_apis(dataclasses.replace(_decision(create_jobset=True), status=held.status), [], NOW)
    assert served.create_jobset and [c.status for c in served.status.conditions if c.type == MISSING_API] == ["False"]
    assert with_missing_apis(_decision(create_jobset=True), [], NOW) == _decision(create_jobset=True)
