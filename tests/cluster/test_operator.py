"""The RLJob operator on a real control plane, running as the ServiceAccount and rules the chart ships."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kuberl.operator.api import GROUP, PLURAL, VERSION
from kuberl.operator.validation.manifest import read_documents
from kuberl.operator.testing.control_plane import EXIT_ANNOTATION
from kuberl.operator.testing.operator_process import TEST_TRAINER_IMAGE

REPO = Path(__file__).resolve().parent.parent.parent


from kuberl.operator.testing.rljobs import (
    create,
    eventually,
    fail_pod,
    get,
    jobsets,
    live_pods,
    new_namespace,
    pods,
    small_job,
    status,
    trainer_token,
    wait_phase,
)

# --- tests -------------------------------------------------------------------------------------------


def bind_claim(plane, ns: str, claim: str) -> None:
    """A claim bound to a static volume (no provisioner here), so that pods mounting it are scheduled."""
    core = client.CoreV1Api(plane.api_client())
    core.create_persistent_volume(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"{claim}-{ns}"},
            "spec": {
                "capacity": {"storage": "10Gi"},
                "accessModes": ["ReadWriteMany"],
                "hostPath": {"path": f"/tmp/{ns}/{claim}"},
                "storageClassName": "",
                "claimRef": {"namespace": ns, "name": claim},
            },
        }
    )
    core.create_namespaced_persistent_volume_claim(
        ns,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "resources": {"requests": {"storage": "10Gi"}},
                "storageClassName": "",
                "volumeName": f"{claim}-{ns}",
            },
        },
    )


COMMIT = "0123456789abcdef0123456789abcdef01234567"


def finish_initializer(plane, ns: str, job: str, report: dict[str, Any], exit_code: int = 0) -> None:
    """Play the initializer's part on a kwok node: end its pod with `report` as its termination message."""

    def initializer_pod():
        found = [p for p in pods(plane, ns, f"kuberl.dev/job={job},kuberl.dev/component=initializer") if p.status.phase == "Running"]
        return found[0] if found else None

    pod = eventually(initializer_pod, 60, "the initializer pod to run")
    annotations = {EXIT_ANNOTATION: "succeed" if exit_code == 0 else "fail", "kuberl.dev/kwok-message": json.dumps(report)}
    if exit_code:
        annotations["kuberl.dev/kwok-exit-code"] = str(exit_code)
    client.CoreV1Api(plane.api_client()).patch_namespaced_pod(pod.metadata.name, ns, {"metadata": {"annotations": annotations}})


def test_example_creates_its_children_and_lands_on_the_named_pools(control_plane, operator) -> None:
    plane = control_plane
    ns = new_namespace(plane, "rl")
    core = client.CoreV1Api(plane.api_client())
    for claim in ("gsm8k", "hub-cache", "ppo-qwen-math-ckpt"):  # examples/ppo-cluster/storage.yaml's claims
        bind_claim(plane, ns, claim)
    doc = read_documents((REPO / "examples" / "ppo-cluster" / "rljob.yaml").read_text(), "ppo")[0].content
    doc["metadata"]["namespace"] = ns
    create(plane, ns, doc)
    name = doc["metadata"]["name"]

    # First the initializer alone: no JobSet, no trainer Job until the cache holds the model.
    s = wait_phase(plane, ns, name, "Initializing", 60)
    batch = client.BatchV1Api(plane.api_client())
    assert [j.metadata.name for j in batch.list_namespaced_job(ns).items] == [f"{name}-initializer"]
    assert not jobsets(plane, ns)
    init_pod = pods(plane, ns, "kuberl.dev/component=initializer")[0]
    init = init_pod.spec.containers[0]
    assert init.command == ["kuberl", "initialize"] and init_pod.spec.automount_service_account_token is False
    assert {e.name: e.value_from.secret_key_ref.name for e in init.env if e.value_from and e.value_from.secret_key_ref} == {
        "HF_TOKEN": "hf-token"
    }
    assert any(m.mount_path == "/var/cache/kuberl" and not m.read_only for m in init.volume_mounts)
    report = {
        "repos": [
            {
                "field": "model",
                "repo": "Qwen/Qwen2.5-1.5B-Instruct",
                "revision": "main",
                "commit": COMMIT,
                "files": 9,
                "bytes": 3_100_000_000,
                "fetchedBytes": 3_100_000_000,
            }
        ]
    }
    finish_initializer(plane, ns, name, report)

    s = wait_phase(plane, ns, name, "Running", 90)
    assert s["restarts"] == 0
    assert s["roles"]["actor"]["ready"] == 2 and s["roles"]["critic"]["ready"] == 1
    assert any(c["type"] == "Running" and c["status"] == "True" for c in s["conditions"])
    initialized = next(c for c in s["conditions"] if c["type"] == "Initialized")
    assert (
        initialized["status"] == "True" and initialized["reason"] == "CacheReady" and "3100000000 bytes fetched" in initialized["message"]
    )
    assert s["initialization"]["repos"][0]["commit"] == COMMIT and s["initialization"]["fetchedBytes"] == 3_100_000_000
    assert "initializer" not in s["roles"]  # its pod is nobody's rank

    service = core.read_namespaced_service(name, ns)
    assert service.spec.cluster_ip == "None" and service.spec.publish_not_ready_addresses
    config = json.loads(core.read_namespaced_config_map(f"{name}-config", ns).data["engine-config.json"])
    assert config["worldSize"] == 24  # 2 actor pods x 8 GPUs + 1 critic pod x 8 GPUs
    assert config["roles"]["critic"]["rankOffset"] == 16 and config["roles"]["ref"]["colocatedWith"] == "actor"
    assert config["model"]["revision"] == COMMIT  # every pod, every attempt, loads the commit that was fetched

    # One JobSet holds every role (JobSet makes a Job per replicated job, <jobset>-<role>-<index>).
    [jobset] = jobsets(plane, ns)
    assert jobset["metadata"]["ownerReferences"][0]["kind"] == "RLJob" and jobset["metadata"]["ownerReferences"][0]["controller"]
    jobs = {j.metadata.name: j for j in batch.list_namespaced_job(ns).items}
    # The actor's first pod (the controller rank's: the only one with the ServiceAccount token) has a Job of its own.
    assert set(jobs) == {f"{name}-initializer", f"{name}-actor-0", f"{name}-actor-peers-0", f"{name}-critic-0"}
    assert jobs[f"{name}-actor-0"].spec.parallelism == 1 and jobs[f"{name}-actor-0"].spec.completion_mode == "Indexed"
    assert jobs[f"{name}-actor-peers-0"].spec.parallelism == 1
    assert jobs[f"{name}-actor-0"].metadata.owner_references[0].kind == "JobSet"

    actor_pods, critic_pods = pods(plane, ns, "kuberl.dev/role=actor"), pods(plane, ns, "kuberl.dev/role=critic")
    assert all(p.spec.node_name.startswith("gpu-h100-") for p in actor_pods)
    assert all(p.spec.node_name.startswith("gpu-a100-") for p in critic_pods)
    pod = actor_pods[0]
    container = pod.spec.containers[0]
    env = {e.name: e.value for e in container.env}
    assert env["WORLD_SIZE"] == "24" and env["MASTER_ADDR"] == f"{name}-actor-0-0.{name}.{ns}.svc"
    # JobSet names each pod's host after its place, under the job's headless Service: rank 0 resolves there.
    [pod0] = [p for p in actor_pods if p.metadata.labels["jobset.sigs.k8s.io/replicatedjob-name"] == "actor"]
    assert (pod0.spec.hostname, pod0.spec.subdomain) == (f"{name}-actor-0-0", name)
    assert pod0.spec.automount_service_account_token is True
    assert [p.spec.automount_service_account_token for p in actor_pods if p is not pod0] == [False]
    assert env["KUBERL_ROLE"] == "actor" and env["MASTER_PORT"] == "29500"
    assert env["HF_HUB_OFFLINE"] == "1" and "HF_TOKEN" not in env
    assert container.resources.limits["nvidia.com/gpu"] == "8"
    assert container.security_context.allow_privilege_escalation is False
    assert container.security_context.capabilities.drop == ["ALL"]
    assert pod.spec.security_context.run_as_non_root
    claims = {v.persistent_volume_claim.claim_name: v.name for v in pod.spec.volumes if v.persistent_volume_claim}
    assert claims == {"ppo-qwen-math-ckpt": "kuberl-checkpoints", "hub-cache": "kuberl-cache", "gsm8k": "gsm8k"}
    mounts = {m.mount_path: m for m in container.volume_mounts}
    assert mounts["/data"].name == "gsm8k" and mounts["/data"].read_only and mounts["/var/cache/kuberl"].read_only
    assert any(v.empty_dir and v.empty_dir.medium == "Memory" for v in pod.spec.volumes)
    critic = critic_pods[0].spec
    assert "gsm8k" not in {v.name for v in critic.volumes}  # a role gets the volumes it mounts, no others

    # Its pods hold the plane's GPU nodes (and, for Kueue, their quota): later modules need them free.
    client.CustomObjectsApi(plane.api_client()).delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    eventually(lambda: not live_pods(plane, ns, name), 120, "the example job's pods to go")


def test_a_refused_token_fails_the_job_at_initialization_with_the_initializers_reason(control_plane, operator) -> None:
    plane = control_plane
    ns = new_namespace(plane, "token")
    bind_claim(plane, ns, "hub-cache")
    doc = read_documents((REPO / "tests" / "manifests" / "good" / "cluster-hub-cache-claim.yaml").read_text(), "hub")[0].content
    create(plane, ns, doc)
    wait_phase(plane, ns, "from-hub", "Initializing", 60)
    message = "model.hubId HuggingFaceTB/SmolLM2-135M-Instruct: the hub refused the token (401)"
    finish_initializer(plane, ns, "from-hub", {"reason": "TokenRefused", "message": message}, exit_code=3)
    s = wait_phase(plane, ns, "from-hub", "Failed", 60)
    failed = next(c for c in s["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "TokenRefused" and failed["message"] == message
    assert next(c for c in s["conditions"] if c["type"] == "Initialized")["status"] == "False"
    # Exit code 3 fails the initializer's Job at once (podFailurePolicy), and no trainer Job was made.
    jobs = client.BatchV1Api(plane.api_client()).list_namespaced_job(ns).items
    assert [j.metadata.name for j in jobs] == ["from-hub-initializer"] and not jobsets(plane, ns)
    assert len(pods(plane, ns, "kuberl.dev/component=initializer")) == 1


def test_a_cache_of_a_size_is_a_claim_the_job_owns(control_plane, operator) -> None:
    plane = control_plane
    ns = new_namespace(plane, "owncache")
    doc = read_documents((REPO / "tests" / "manifests" / "good" / "cluster-hub-cache-size.yaml").read_text(), "c")[0].content
    create(plane, ns, doc)
    wait_phase(plane, ns, "own-cache", "Initializing", 60)
    claim = client.CoreV1Api(plane.api_client()).read_namespaced_persistent_volume_claim("own-cache-cache", ns)
    assert claim.spec.storage_class_name == "fast-ssd" and claim.spec.access_modes == ["ReadWriteOnce"]
    assert claim.spec.resources.requests["storage"] == "20Gi"
    assert claim.metadata.owner_references[0].kind == "RLJob"
    # No provisioner here: the claim stays Pending and the status says why the initializer waits.
    s = eventually(
        lambda: (
            (s := status(plane, ns, "own-cache"))
            and "not scheduled" in next(c for c in s["conditions"] if c["type"] == "Initializing")["message"]
            and s
        ),
        60,
        "the unbound claim in the status",
    )
    assert "persistentvolumeclaim" in next(c for c in s["conditions"] if c["type"] == "Initializing")["message"].lower()


CLUSTER_RULES = sorted(p for p in (REPO / "tests" / "manifests" / "bad").glob("cluster-*.yaml"))


@pytest.mark.parametrize("path", CLUSTER_RULES, ids=lambda p: p.stem)
def test_the_operator_refuses_what_only_a_cluster_rule_catches_before_any_pod(control_plane, operator, path: Path) -> None:
    """The API server accepts these (their header says why); the operator fails them with the field and the fix."""
    plane = control_plane
    ns = new_namespace(plane, "rule")
    text = path.read_text()
    expected = dict(line[2:].split(": ", 1) for line in text.splitlines() if line.startswith("# expect-"))
    doc = read_documents(text, str(path))[-1].content
    create(plane, ns, doc)
    s = wait_phase(plane, ns, doc["metadata"]["name"], "Failed", 60)
    failed = next(c for c in s["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert f"{expected['expect-path']}: " in failed["message"] and expected["expect-message"] in failed["message"]
    assert not client.BatchV1Api(plane.api_client()).list_namespaced_job(ns).items and not jobsets(plane, ns)
    assert not pods(plane, ns, "")


def test_a_failed_pod_restarts_the_gang_and_backoff_limit_ends_it(control_plane, operator) -> None:
    plane = control_plane
    ns = new_namespace(plane, "restart")
    create(plane, ns, small_job("gang", runPolicy={"backoffLimit": 1}))
    wait_phase(plane, ns, "gang", "Running")
    before = live_pods(plane, ns, "gang")
    indexes = sorted(p.metadata.labels["batch.kubernetes.io/job-completion-index"] for p in before)

    fail_pod(plane, before[1])
    s = wait_phase(plane, ns, "gang", "Running", 60, restarts=1)
    after = eventually(lambda: (ps := live_pods(plane, ns, "gang")) and len(ps) == 2 and ps, 30, "two new pods")
    assert {p.metadata.uid for p in after}.isdisjoint(p.metadata.uid for p in before)
    assert sorted(p.metadata.labels["batch.kubernetes.io/job-completion-index"] for p in after) == indexes
    assert all(p.metadata.labels["jobset.sigs.k8s.io/restart-attempt"] == "1" for p in after)  # JobSet recreated every Job
    assert s["roles"]["actor"]["ready"] == 2

    fail_pod(plane, after[0])
    s = wait_phase(plane, ns, "gang", "Failed", 60)
    failed = next(c for c in s["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded" and "backoffLimit 1" in failed["message"]
    assert s["restarts"] == 1
    eventually(lambda: not live_pods(plane, ns, "gang"), 60, "the pods to go")


def test_a_pod_gone_before_it_is_read_is_named_by_its_roles_job(control_plane, operator) -> None:
    """A pod killed (exit 137) and removed at once, as a lost node's or a force-deleted pod is on a real node: its
    role's Job, failed by it, names it in the restart and in status.failures. (A kwok pod deleted while running
    vanishes with no terminal status, which the Job controller, under a podFailurePolicy, does not count as a
    failure; a kubelet reports the killed container first.)"""
    plane = control_plane
    ns = new_namespace(plane, "pod-gone")
    create(plane, ns, small_job("lost", runPolicy={"backoffLimit": 2}))
    wait_phase(plane, ns, "lost", "Running")
    [_, victim] = sorted(live_pods(plane, ns, "lost"), key=lambda p: p.metadata.name)
    core = client.CoreV1Api(plane.api_client())
    core.patch_namespaced_pod(
        victim.metadata.name, ns, {"metadata": {"annotations": {EXIT_ANNOTATION: "fail", "kuberl.dev/kwok-exit-code": "137"}}}
    )
    # Once its Job has counted it (kwok's deletion drops the Job controller's finalizer, which a kubelet would not),
    # or JobSet has already recreated the Jobs (the victim's Job, of one pod, failed at once):
    batch = client.BatchV1Api(plane.api_client())

    def counted() -> bool:
        if any((j.status.failed or 0) > 0 for j in batch.list_namespaced_job(ns).items):
            return True
        return victim.metadata.name not in {p.metadata.name for p in core.list_namespaced_pod(ns).items}

    eventually(counted, 30, "the Job to count the failure")
    try:
        core.delete_namespaced_pod(victim.metadata.name, ns, grace_period_seconds=0)
    except ApiException as exc:  # JobSet's restart may have removed it already
        assert exc.status == 404, exc
    s = wait_phase(plane, ns, "lost", "Running", 90, restarts=1)
    [kept] = s["failures"]
    assert (kept["attempt"], kept["role"]) == (0, "actor"), kept
    events = core.list_namespaced_event(ns, field_selector="involvedObject.name=lost").items
    restart = [e.message for e in events if e.reason == "GangRestart"]
    assert restart and (
        "a pod of role actor failed (its Job lost-actor-peers-0" in restart[0]
        or f"pod {victim.metadata.name} (role actor) failed" in restart[0]
    ), restart


def test_a_rank_that_says_a_restart_cannot_help_fails_the_job_at_once(control_plane, operator) -> None:
    """The rank's exit code 3 fails its Job by the Job's podFailurePolicy, that fails the JobSet by its rule
    (no gang restart although backoffLimit allows one), and the RLJob says what the rank wrote."""
    from kuberl.engine.config.termination import TrainerFailure

    plane = control_plane
    ns = new_namespace(plane, "not-retryable")
    create(plane, ns, small_job("doomed", runPolicy={"backoffLimit": 2}))
    wait_phase(plane, ns, "doomed", "Running")
    said = TrainerFailure(
        reason="ModelNotFound",
        retryable=False,
        role="actor",
        rank=1,
        message="ModelNotFound: model.path: /models/smollm2 is not a Hugging Face folder (no config.json)",
    )
    [_, second] = sorted(live_pods(plane, ns, "doomed"), key=lambda p: p.metadata.name)
    client.CoreV1Api(plane.api_client()).patch_namespaced_pod(
        second.metadata.name,
        ns,
        {
            "metadata": {
                "annotations": {EXIT_ANNOTATION: "fail", "kuberl.dev/kwok-exit-code": "3", "kuberl.dev/kwok-message": said.to_json()}
            }
        },
    )
    s = wait_phase(plane, ns, "doomed", "Failed", 60)
    failed = next(c for c in s["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "ModelNotFound" and s["restarts"] == 0, failed
    assert failed["message"] == (
        f"pod {second.metadata.name} (role actor, rank 1): {said.message}; not retried: a restart would fail the same way"
    )

    def warned() -> bool:
        events = client.CoreV1Api(plane.api_client()).list_namespaced_event(ns, field_selector="involvedObject.name=doomed").items
        return any(e.reason == "ModelNotFound" and e.type == "Warning" for e in events)

    # The operator posts its events in the background: the Warning may come a moment after the status.
    eventually(warned, 30, "a ModelNotFound Warning event on the RLJob")


def test_suspend_removes_pods_and_resume_brings_them_back(control_plane, operator) -> None:
    plane = control_plane
    ns = new_namespace(plane, "suspend")
    create(plane, ns, small_job("pausable"))
    wait_phase(plane, ns, "pausable", "Running")
    api = client.CustomObjectsApi(plane.api_client())
    api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "pausable", {"spec": {"runPolicy": {"suspend": True}}})
    wait_phase(plane, ns, "pausable", "Suspended")
    eventually(lambda: not pods(plane, ns, "kuberl.dev/job=pausable"), 60, "the pods to go")
    assert client.CoreV1Api(plane.api_client()).read_namespaced_config_map("pausable-config", ns)  # kept
    api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "pausable", {"spec": {"runPolicy": {"suspend": False}}})
    s = wait_phase(plane, ns, "pausable", "Running")
    assert s["restarts"] == 0  # a suspension is not a failure


def test_deleting_the_rljob_removes_every_child(control_plane, operator) -> None:
    plane = control_plane
    ns = new_namespace(plane, "delete")
    create(plane, ns, small_job("doomed"))
    wait_phase(plane, ns, "doomed", "Running")
    client.CustomObjectsApi(plane.api_client()).delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "doomed")
    core, batch = client.CoreV1Api(plane.api_client()), client.BatchV1Api(plane.api_client())

    def nothing_left() -> bool:
        selector = "kuberl.dev/job=doomed"
        return not (
            jobsets(plane, ns)
            or batch.list_namespaced_job(ns, label_selector=selector).items
            or core.list_namespaced_pod(ns, label_selector=selector).items
            or core.list_namespaced_service(ns, label_selector=selector).items
            or core.list_namespaced_config_map(ns, label_selector=selector).items
            or core.list_namespaced_service_account(ns, label_selector=selector).items
        )

    eventually(nothing_left, 90, "the garbage collector to remove every child")


def test_an_object_gone_while_applying_is_a_race_not_a_failure(control_plane, operator) -> None:
    """An RLJob deleted after the operator read it: the garbage collector may take a child the
    operator is applying, or the namespace may be gone (the API answers 404 either way). The
    reconciler looks again instead of failing with a traceback (seen once in CI, in the test above)."""
    from datetime import datetime, timezone

    from kuberl.operator.control.controller import OperatorMetrics, Reconciler
    from kuberl.operator.validation.manifest import parse_rljob
    from kuberl.operator.control.children import OperatorSettings
    from kuberl.operator.control.reconcile import Observed, decide

    plane = control_plane
    ns = new_namespace(plane, "gone")
    create(plane, ns, small_job("vanishing"))
    raw = client.CustomObjectsApi(plane.api_client()).get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "vanishing")
    raw["metadata"]["namespace"] = f"gone-{uuid.uuid4().hex[:6]}"  # as read just before its namespace went away
    job = parse_rljob(raw, "vanishing")
    decision = decide(job, Observed(), datetime.now(timezone.utc))
    reconciler = Reconciler(plane.api_client(), OperatorSettings(default_image=TEST_TRAINER_IMAGE), OperatorMetrics())
    with pytest.raises(ApiException) as gone:
        reconciler._apply(raw, job, decision)
    assert gone.value.status == 404
    assert reconciler.apply_unless_gone(raw, job, decision) is None


def test_progress_reaches_the_status_through_the_trainers_one_configmap(control_plane, operator) -> None:
    plane = control_plane
    ns = new_namespace(plane, "progress")
    create(plane, ns, small_job("reporting"))
    wait_phase(plane, ns, "reporting", "Running")
    token = trainer_token(plane, ns, "reporting")
    as_trainer = plane.api_client(token=token)
    report = {
        "step": 7,
        "totalSteps": 10,
        "rewardMean": 0.625,
        "kl": 0.01,
        "tokensPerSecond": 240.0,
        "lastCheckpoint": {"step": 5, "path": "/checkpoints/step-5"},
    }

    def write_report() -> bool:  # the RoleBinding may take a moment to reach the authorizer
        try:
            client.CoreV1Api(as_trainer).patch_namespaced_config_map(
                "reporting-progress", ns, {"data": {"progress.json": json.dumps(report)}}
            )
            return True
        except ApiException as exc:
            assert exc.status == 403
            return False

    eventually(write_report, 20, "the trainer's Role to apply")
    s = eventually(lambda: (x := status(plane, ns, "reporting")).get("step") == 7 and x, 30, "the step in the status")
    assert s["metrics"] == {"rewardMean": 0.625, "kl": 0.01, "tokensPerSecond": 240.0}
    assert s["lastCheckpoint"]["path"] == "/checkpoints/step-5" and s["totalSteps"] == 10
    printed = plane.kubectl("get", "rlj", "reporting", "-n", ns, "--no-headers").stdout.split()
    assert printed[1:4] == ["Running", "7", "0.625"]

    # Least privilege: the trainer can touch nothing else.
    for attempt in (
        lambda: client.CustomObjectsApi(as_trainer).patch_namespaced_custom_object_status(
            GROUP, VERSION, ns, PLURAL, "reporting", {"status": {"step": 99}}
        ),
        lambda: client.CoreV1Api(as_trainer).read_namespaced_config_map("reporting-config", ns),
        lambda: client.CoreV1Api(as_trainer).list_namespaced_pod(ns),
    ):
        with pytest.raises(ApiException) as caught:
            attempt()
        assert caught.value.status == 403


def test_success_of_the_actor_ends_the_job(control_plane, operator) -> None:
    plane = control_plane
    ns = new_namespace(plane, "done")
    create(plane, ns, small_job("finisher"))
    wait_phase(plane, ns, "finisher", "Running")
    for pod in live_pods(plane, ns, "finisher"):
        client.CoreV1Api(plane.api_client()).patch_namespaced_pod(
            pod.metadata.name, ns, {"metadata": {"annotations": {EXIT_ANNOTATION: "succeed"}}}
        )
    s = wait_phase(plane, ns, "finisher", "Succeeded")
    assert s["completionTime"] and s["roles"]["actor"]["succeeded"] == 2


def test_separate_placement_runs_the_rollout_role_as_pods_of_the_jobset(control_plane, operator) -> None:
    """rollout.placement: separate: the rollout role is a replicated job of the JobSet, its pods the actor's with
    their own replicas and GPUs, ranks after the actor's, trainer peers in the NetworkPolicy, a role in the status."""
    plane = control_plane
    ns = new_namespace(plane, "async")
    h100 = {
        "nodeSelector": {"kuberl.dev/pool": "gpu-h100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    doc = small_job(
        "fleet",
        algorithm={"name": "grpo", "async": {"maxStaleness": 1}},
        rollout={"samplesPerPrompt": 4, "placement": "separate"},
        roles={
            "actor": {
                "replicas": 1,
                "gpusPerReplica": 1,
                **h100,
                "resources": {"requests": {"memory": "8Gi"}},
                "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
            },
            "rollout": {"replicas": 2, "gpusPerReplica": 2},
        },
    )
    create(plane, ns, doc)
    s = wait_phase(plane, ns, "fleet", "Running", 90)
    assert s["roles"]["actor"]["ready"] == 1 and s["roles"]["rollout"]["ready"] == 2
    assert next(c for c in s["conditions"] if c["type"] == "Running")["message"] == "all 3 pods are running"

    core = client.CoreV1Api(plane.api_client())
    config = json.loads(core.read_namespaced_config_map("fleet-config", ns).data["engine-config.json"])
    assert config["worldSize"] == 5  # 1 actor rank, then 2 rollout pods x 2 GPUs
    assert (config["roles"]["rollout"]["rankOffset"], config["roles"]["rollout"]["ranks"]) == (1, 4)
    [jobset] = jobsets(plane, ns)
    assert [r["name"] for r in jobset["spec"]["replicatedJobs"]] == ["actor", "rollout"]
    jobs = {j.metadata.name: j for j in client.BatchV1Api(plane.api_client()).list_namespaced_job(ns).items}
    assert set(jobs) == {"fleet-actor-0", "fleet-rollout-0"}
    assert (jobs["fleet-rollout-0"].spec.parallelism, jobs["fleet-rollout-0"].spec.completion_mode) == (2, "Indexed")

    rollout_pods = pods(plane, ns, "kuberl.dev/role=rollout")
    assert len(rollout_pods) == 2 and all(p.spec.node_name.startswith("gpu-h100-") for p in rollout_pods)
    by_index = {p.metadata.labels["batch.kubernetes.io/job-completion-index"]: p for p in rollout_pods}
    for index, pod in by_index.items():
        container = pod.spec.containers[0]
        env = {e.name: e.value for e in container.env}
        assert (env["KUBERL_ROLE"], env["KUBERL_ROLE_RANK_OFFSET"], env["KUBERL_PROCS_PER_POD"], env["WORLD_SIZE"]) == (
            "rollout",
            "1",
            "2",
            "5",
        )
        assert env["MASTER_ADDR"] == f"fleet-actor-0-0.fleet.{ns}.svc"
        assert container.command == ["kuberl", "worker"]
        assert container.resources.limits == {"nvidia.com/gpu": "2"} and container.resources.requests["memory"] == "8Gi"
        assert any(m.mount_path == "/data" and m.read_only for m in container.volume_mounts)
        assert pod.spec.automount_service_account_token is False
        assert (pod.spec.hostname, pod.spec.subdomain) == (f"fleet-rollout-0-{index}", "fleet")
    assert sorted(by_index) == ["0", "1"]

    policy = client.NetworkingV1Api(plane.api_client()).read_namespaced_network_policy("fleet", ns)
    [peer] = policy.spec.ingress[0]._from
    assert peer.pod_selector.match_expressions[0].values == ["actor", "rollout"]

    # The actor's success ends the job, whatever the fleet is doing.
    [actor] = pods(plane, ns, "kuberl.dev/role=actor")
    core.patch_namespaced_pod(actor.metadata.name, ns, {"metadata": {"annotations": {EXIT_ANNOTATION: "succeed"}}})
    wait_phase(plane, ns, "fleet", "Succeeded", 60)
    # Its pods hold GPU nodes that later tests need.
    client.CustomObjectsApi(plane.api_client()).delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "fleet")
    eventually(lambda: not live_pods(plane, ns, "fleet"), 120, "the job's pods to go")


def test_active_deadline_fails_the_job(control_plane, operator) -> None:
    plane = control_plane
    ns = new_namespace(plane, "deadline")
    create(plane, ns, small_job("slow", runPolicy={"activeDeadlineSeconds": 4}))
    s = wait_phase(plane, ns, "slow", "Failed", 60)
    assert next(c for c in s["conditions"] if c["type"] == "Failed")["reason"] == "DeadlineExceeded"
    eventually(lambda: not live_pods(plane, ns, "slow"), 60, "the pods to go")


def test_a_spec_that_slips_past_the_crd_fails_with_a_message(control_plane, operator) -> None:
    plane = control_plane
    ns = new_namespace(plane, "invalid")
    bad = small_job("over-limit")
    # A request above its limit: the CRD cannot judge it (CEL's cost budget), our parser does.
    bad["spec"]["roles"]["actor"]["resources"] = {"requests": {"cpu": "4"}, "limits": {"cpu": "2"}}
    create(plane, ns, bad)
    s = wait_phase(plane, ns, "over-limit", "Failed")
    condition = next(c for c in s["conditions"] if c["type"] == "Failed")
    assert condition["reason"] == "InvalidSpec"
    assert "spec.roles.actor.resources.requests" in condition["message"]
    assert not client.BatchV1Api(plane.api_client()).list_namespaced_job(ns).items and not jobsets(plane, ns)
    create(plane, ns, small_job("still-served"))  # the operator kept running
    wait_phase(plane, ns, "still-served", "Running")


def test_operator_killed_mid_reconcile_converges_without_duplicates(control_plane, operator) -> None:
    plane = control_plane
    ns = new_namespace(plane, "crash")
    names = [f"job{i}" for i in range(4)]
    for name in names:
        create(plane, ns, small_job(name))
    time.sleep(0.3)
    operator.kill()  # somewhere in the middle of creating children
    operator.start()
    for name in names:
        wait_phase(plane, ns, name, "Running", 90)
    batch, core = client.BatchV1Api(plane.api_client()), client.CoreV1Api(plane.api_client())
    for name in names:
        selector = f"kuberl.dev/job={name}"
        assert len([j for j in jobsets(plane, ns) if j["metadata"]["name"] == name]) == 1
        # The actor's two pods: its first (the controller's) and the other, a Job each.
        assert len(batch.list_namespaced_job(ns, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}").items) == 2
        assert len(core.list_namespaced_service(ns, label_selector=selector).items) == 1
        assert len(live_pods(plane, ns, name)) == 2
        assert status(plane, ns, name)["restarts"] == 0


def test_operator_metrics_and_health(control_plane, operator) -> None:
    text = operator.metrics()
    assert 'kuberl_operator_rljobs{phase="Running"}' in text
    assert "kuberl_operator_reconcile_duration_seconds_count" in text
    assert "kuberl_operator_reconcile_errors_total" in text
    assert "kuberl_operator_gang_restarts_total" in text
    running = float(next(l for l in text.splitlines() if l.startswith('kuberl_operator_rljobs{phase="Running"}')).split()[-1])
    assert running >= 1
    assert operator.healthy()


def test_fields_of_a_running_job_cannot_change_but_run_policy_can(control_plane, rljob_crd) -> None:
    plane = control_plane
    ns = new_namespace(plane, "immutable")
    create(plane, ns, small_job("fixed"))
    api = client.CustomObjectsApi(plane.api_client())
    with pytest.raises(ApiException) as caught:
        api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "fixed", {"spec": {"model": {"path": "/models/other"}}})
    assert caught.value.status == 422
    assert "model cannot change once the RLJob exists" in json.loads(caught.value.body)["message"]
    with pytest.raises(ApiException) as caught:
        api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "fixed", {"spec": {"roles": {"actor": {"replicas": 4}}}})
    assert caught.value.status == 422
    api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "fixed", {"spec": {"runPolicy": {"backoffLimit": 9}}})
    assert get(plane, ns, "fixed")["spec"]["runPolicy"]["backoffLimit"] == 9
