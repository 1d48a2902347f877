"""The operator confined, as pure decisions: names it does not own, the token only where progress is
written, progress bounded before the status, and each job's NetworkPolicy against its pods' labels."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from kuberl.operator.api import RLJobStatus
from kuberl.operator.control.children import LABEL_JOB, LABEL_ROLE, OperatorSettings
from kuberl.operator.validation.manifest import load_rljobs
from kuberl.operator.control.ownership import name_conflicts
from kuberl.operator.control.planner import plan
from kuberl.operator.control.reconcile import Observed, decide
from kuberl.operator.control.reconcile.conflicts import NAME_CONFLICT, with_name_conflicts
from kuberl.operator.control.reconcile.progress_bounds import MAX_REPORT_BYTES, OutOfBounds, bounded_report
from kuberl.operator.control.reconcile.reading import apply_progress

from .label_selectors import selects

EXAMPLES = Path(__file__).parent.parent / "examples"
NOW = datetime(2026, 12, 6, 3, 0, tzinfo=timezone.utc)
UID = "3f0c-uid-of-this-rljob"
PROMETHEUS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}
SETTINGS = OperatorSettings(default_image="registry.example.com/kuberl-trainer:0.1.0", metrics_peers=(PROMETHEUS,))


def ppo(namespace: str = "rl"):
    job = load_rljobs(EXAMPLES / "ppo-cluster" / "rljob.yaml")[0]  # actor (2 pods), critic, ref colocated, initializer
    job.metadata.namespace = namespace
    return job


def pod_templates(desired) -> dict[str, dict[str, Any]]:
    """Each pod template the plan makes (per role, and the initializer's), by name."""
    out = {r["name"]: r["template"]["spec"]["template"] for r in desired.jobset["spec"]["replicatedJobs"]}
    if desired.initializer is not None:
        out["initializer"] = desired.initializer["spec"]["template"]
    return out


# --- NameConflict: the pure decision ---------------------------------------------------------------


def test_a_child_name_is_written_only_when_absent_or_controlled_by_this_rljob() -> None:
    desired = plan(ppo(), uid=UID, settings=SETTINGS)
    service, config = desired.support[0], desired.support[1]
    ours = {**service, "metadata": {**service["metadata"], "uid": "svc-1"}}
    foreign = {"kind": "ConfigMap", "metadata": {"name": config["metadata"]["name"], "uid": "cm-1"}}  # made by hand
    assert name_conflicts([service, config], {}, UID) == []  # both absent
    assert name_conflicts([service, config], {("Service", service["metadata"]["name"]): ours}, UID) == []
    [conflict] = name_conflicts([service, config], {("ConfigMap", config["metadata"]["name"]): foreign}, UID)
    assert (conflict.kind, conflict.name) == ("ConfigMap", "ppo-qwen-math-config")
    assert "no controller" in conflict.sentence()


@pytest.mark.parametrize(
    "ref",
    [
        {"apiVersion": "kuberl.dev/v1alpha1", "kind": "RLJob", "name": "ppo-qwen-math", "uid": "an-earlier-job", "controller": True},
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "ppo-qwen-math", "uid": UID, "controller": True},
        {"apiVersion": "kuberl.dev/v1alpha1", "kind": "RLJob", "name": "ppo-qwen-math", "uid": UID},  # owner, not controller
    ],
    ids=["same-name-other-uid", "other-kind-same-uid", "not-controller"],
)
def test_an_object_another_owner_controls_is_a_conflict(ref: dict) -> None:
    desired = plan(ppo(), uid=UID, settings=SETTINGS)
    role = next(o for o in desired.support if o["kind"] == "Role")
    held = {"kind": "Role", "metadata": {"name": role["metadata"]["name"], "ownerReferences": [ref]}}
    [conflict] = name_conflicts(desired.support, {("Role", role["metadata"]["name"]): held}, UID)
    assert conflict.kind == "Role" and conflict.name == "ppo-qwen-math-trainer"


def test_a_conflict_creates_nothing_and_says_which_object_until_the_name_is_free() -> None:
    job = ppo()
    decision = decide(job, Observed(), NOW)
    assert decision.create_initializer or decision.create_jobset
    desired = plan(job, uid=UID, settings=SETTINGS)
    found = {("Service", "ppo-qwen-math"): {"kind": "Service", "metadata": {"name": "ppo-qwen-math"}}}
    held = with_name_conflicts(decision, name_conflicts(desired.support, found, UID), NOW)
    assert not held.create_jobset and not held.create_initializer
    [condition] = [c for c in held.status.conditions if c.type == NAME_CONFLICT]
    assert condition.status == "True" and condition.reason == NAME_CONFLICT
    assert "Service/ppo-qwen-math exists and is not controlled by this RLJob" in condition.message
    assert held.status.phase == "Pending" and held.requeue_after
    assert [e[1] for e in held.events] == [NAME_CONFLICT]
    # Once the name is free, the condition turns False and the job goes on as decided.
    job.status = held.status
    again = decide(job, Observed(), NOW)
    freed = with_name_conflicts(again, [], NOW)
    assert freed.create_jobset or freed.create_initializer
    assert [c.status for c in freed.status.conditions if c.type == NAME_CONFLICT] == ["False"]
    assert (
        with_name_conflicts(decide(ppo(), Observed(), NOW), [], NOW).status.conditions == decide(ppo(), Observed(), NOW).status.conditions
    )  # no condition where none was ever set


# --- the ServiceAccount token ----------------------------------------------------------------------


def test_the_token_is_mounted_only_in_the_pods_of_the_controller_rank() -> None:
    pods = pod_templates(plan(ppo(), uid=UID, settings=SETTINGS))
    assert set(pods) == {"actor", "actor-peers", "critic", "initializer"}  # the actor's 2 pods: the controller's, the other
    mounted = {name: t["spec"]["automountServiceAccountToken"] for name, t in pods.items()}
    assert mounted == {"actor": True, "actor-peers": False, "critic": False, "initializer": False}
    # The tracking secrets follow the token: only the controller's pod tracks.
    secrets = {
        name: [e["name"] for e in t["spec"]["containers"][0].get("env", []) if "secretKeyRef" in e.get("valueFrom", {})]
        for name, t in pods.items()
    }
    assert secrets["actor-peers"] == [] and secrets["critic"] == []


# --- progress bounded before it enters the status ---------------------------------------------------

GOOD = {
    "step": 7,
    "totalSteps": 10,
    "rewardMean": 0.625,
    "kl": 0.01,
    "tokensPerSecond": 240.0,
    "etaSeconds": 30.5,
    "lastCheckpoint": {"step": 5, "path": "/checkpoints/step-5", "time": "2026-12-06T02:00:00Z"},
    "validationRewardMean": 0.5,
    "validationStep": 5,
}
HOSTILE = {
    "megabyte-path": {**GOOD, "lastCheckpoint": {"step": 5, "path": "/c/" + "x" * (1 << 20)}},
    "long-path-within-size": {**GOOD, "lastCheckpoint": {"step": 5, "path": "/" + "x" * 2000}},
    "control-characters": {**GOOD, "lastCheckpoint": {"step": 5, "path": "/c/\x1b[2J\nFAKE Running"}},
    "step-past-int64": {**GOOD, "step": 2**70},
    "total-past-bound": {**GOOD, "totalSteps": 10**12},
    "negative-step": {**GOOD, "step": -1},
    "infinite-eta": {**GOOD, "etaSeconds": 1e309},
    "huge-eta": {**GOOD, "etaSeconds": 1e300},
    "huge-reward": {**GOOD, "rewardMean": -1e300},
    "nan-kl": {**GOOD, "kl": float("nan")},
    "infinite-tokens": {**GOOD, "tokensPerSecond": float("inf")},
    "checkpoint-step-past-bound": {**GOOD, "lastCheckpoint": {"step": 10**15, "path": "/c"}},
    "year-9999": {**GOOD, "lastCheckpoint": {"step": 5, "path": "/c", "time": "9999-12-31T23:59:59Z"}},
    "extra-keys": {**GOOD, **{f"k{i}": "v" * 50 for i in range(60)}},
    "nested-object": {**GOOD, "rewardMean": {"a": [1] * 100}},
}


def _raw(report: dict) -> str:
    return json.dumps(report, allow_nan=True)


def test_a_genuine_report_is_within_bounds() -> None:
    report = bounded_report(_raw(GOOD))
    assert report.step == 7 and report.last_checkpoint.path == "/checkpoints/step-5"


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_progress_report_never_reaches_the_status(name: str) -> None:
    raw = _raw(HOSTILE[name])
    with pytest.raises(ValueError):  # OutOfBounds, or pydantic's ValidationError (both ValueErrors)
        bounded_report(raw)
    status = RLJobStatus()
    apply_progress(status, _raw(GOOD))
    before = status.model_copy(deep=True)
    apply_progress(status, raw)
    assert status == before  # the last good numbers stay
    # And through the whole reconcile: what is written is within the CRD's bounds and small.
    job = ppo()
    job.status = before
    written = decide(job, Observed(progress=raw), NOW).status
    assert (written.step, written.total_steps, written.eta_seconds, written.last_checkpoint) == (
        before.step,
        before.total_steps,
        before.eta_seconds,
        before.last_checkpoint,
    )
    assert len(written.model_dump_json()) < 8 * 1024


def test_a_report_over_the_size_bound_is_refused_before_it_is_parsed() -> None:
    raw = _raw(GOOD)[:-1] + "," + '"pad": "' + "x" * MAX_REPORT_BYTES + '"}'
    with pytest.raises(OutOfBounds, match="bytes"):
        bounded_report(raw)


# --- the NetworkPolicy against the pods' labels -----------------------------------------------------


def admits(peer: dict[str, Any], pod_labels: dict[str, str], pod_namespace: str, ns_labels: dict[str, str], policy_namespace: str) -> bool:
    """Whether a NetworkPolicy peer (podSelector and/or namespaceSelector) admits a pod."""
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], ns_labels):
            return False
    elif pod_namespace != policy_namespace:
        return False
    return selects(peer.get("podSelector", {}), pod_labels)


def test_the_policy_selects_every_pod_of_the_job_and_admits_its_trainer_pods_and_nothing_else() -> None:
    desired = plan(ppo("rl"), uid=UID, settings=SETTINGS)
    [policy] = [o for o in desired.support if o["kind"] == "NetworkPolicy"]
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]  # egress: DNS, the hub and the API server stay reachable
    pods = {name: t["metadata"]["labels"] for name, t in pod_templates(desired).items()}
    for name, labels in pods.items():
        assert selects(spec["podSelector"], labels), f"the policy does not cover the {name} pods"
    ns = {"kubernetes.io/metadata.name": "rl"}
    [own, metrics] = spec["ingress"]
    assert "ports" not in own  # every port (the TCPStore, gloo's links) among the job's own pods
    trainers = {n: l for n, l in pods.items() if n != "initializer"}
    for name, labels in trainers.items():
        assert any(admits(p, labels, "rl", ns, "rl") for p in own["from"]), f"{name} pods cannot reach their peers"
    strangers = {
        "the initializer": pods["initializer"],
        "a tool sandbox of the job": {LABEL_JOB: "ppo-qwen-math", LABEL_ROLE: "sandbox"},
        "a pod with the job's label and no role": {LABEL_JOB: "ppo-qwen-math"},
        "another job's actor": {LABEL_JOB: "other-job", LABEL_ROLE: "actor"},
        "an unlabelled pod": {},
    }
    for who, labels in strangers.items():
        assert not any(admits(p, labels, "rl", ns, "rl") for p in own["from"]), f"{who} is admitted"
    # The same labels in another namespace: a tenant there may set any label on its pods.
    other_ns = {"kubernetes.io/metadata.name": "tenant-b"}
    assert not any(admits(p, pods["actor"], "tenant-b", other_ns, "rl") for p in own["from"])
    # Prometheus, on the metrics port only.
    assert metrics["ports"] == [{"protocol": "TCP", "port": 9400}]
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    assert any(admits(p, prometheus, "monitoring", {"kubernetes.io/metadata.name": "monitoring"}, "rl") for p in metrics["from"])
    assert not any(admits(p, prometheus, "tenant-b", other_ns, "rl") for p in metrics["from"])
    assert policy["metadata"]["ownerReferences"][0]["uid"] == UID


def test_the_policy_is_on_by_default_and_can_be_turned_off() -> None:
    assert "NetworkPolicy" in {o["kind"] for o in plan(ppo(), uid=UID, settings=OperatorSettings(default_image="i")).support}
    off = OperatorSettings(default_image="i", network_policy=False)
    assert "NetworkPolicy" not in {o["kind"] for o in plan(ppo(), uid=UID, settings=off).support}
    # Without metrics peers no one from outside the job reaches the metrics port.
    [policy] = [o for o in plan(ppo(), uid=UID, settings=OperatorSettings(default_image="i")).support if o["kind"] == "NetworkPolicy"]
    assert len(policy["spec"]["ingress"]) == 1
