"""The planner and the reconcile decisions, as pure functions (no API server)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from kuberl.operator.api import RLJob, RLJobStatus
from kuberl.operator.manifest import load_rljobs, parse_rljob, read_documents
from kuberl.operator.children import LABEL_ATTEMPT, LABEL_JOB, LABEL_ROLE, OperatorSettings
from kuberl.operator.planner import engine_config, plan
from kuberl.engine.config import CheckpointStatus, ProgressReport
from kuberl.operator.reconcile import Observed, decide

EXAMPLES = Path(__file__).parent.parent / "examples"
MANIFESTS = Path(__file__).parent / "manifests"
SETTINGS = OperatorSettings(default_image="registry.example.com/kuberl-trainer:0.1.0")
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


def example(name: str, namespace: str = "ns", **run_policy: object) -> RLJob:
    job = load_rljobs(EXAMPLES / name)[0]
    job.metadata.namespace = namespace
    for key, value in run_policy.items():
        setattr(job.spec.run_policy, key, value)
    return job


def test_ranks_are_laid_out_actor_first() -> None:
    config = engine_config(example("ppo-cluster/rljob.yaml"))
    roles = config.roles
    assert config.world_size == 24
    assert (roles["actor"].rank_offset, roles["actor"].ranks, roles["actor"].procs_per_pod) == (0, 16, 8)
    assert (roles["critic"].rank_offset, roles["critic"].ranks) == (16, 8)
    assert roles["ref"].colocated_with == "actor" and roles["ref"].ranks == 16 and roles["ref"].layout.dp == 16
    assert roles["actor"].rollout_tp == 2


def test_plan_makes_one_indexed_job_per_role_with_pods() -> None:
    desired = plan(example("ppo-cluster/rljob.yaml"), uid="u-1", attempt=2, settings=SETTINGS)
    assert set(desired.jobs) == {"actor", "critic"}  # ref is colocated: no pods of its own
    actor = desired.jobs["actor"]
    assert actor["metadata"]["name"] == "ppo-qwen-math-actor"
    assert actor["metadata"]["labels"][LABEL_ATTEMPT] == "2" and actor["metadata"]["labels"][LABEL_ROLE] == "actor"
    assert actor["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    spec = actor["spec"]
    assert (spec["completions"], spec["parallelism"], spec["backoffLimit"], spec["completionMode"]) == (2, 2, 0, "Indexed")
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == {"kuberl.dev/pool": "gpu-h100"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    # Time to finish the running step and checkpoint it after SIGTERM (runPolicy's default).
    assert pod["terminationGracePeriodSeconds"] == 300
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {"memory": "256Gi", "nvidia.com/gpu": "8"}
    assert container["securityContext"] == {
        "runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
    }
    env = {e["name"]: e for e in container["env"]}
    # The model comes from the cache the initializer filled: trainers never reach the hub, nor hold its token.
    assert "HF_TOKEN" not in env and env["HF_HUB_OFFLINE"]["value"] == "1"
    assert {"name": "kuberl-cache", "mountPath": "/var/cache/kuberl", "readOnly": True} in container["volumeMounts"]
    assert env["KUBERL_ROLE_RANK_OFFSET"]["value"] == "0" and env["KUBERL_PROCS_PER_POD"]["value"] == "8"
    critic_env = {e["name"]: e.get("value") for e in desired.jobs["critic"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert critic_env["KUBERL_ROLE_RANK_OFFSET"] == "16"


def test_tracking_credentials_reach_only_the_actor_pods_and_only_by_reference() -> None:
    [doc] = [d.content for d in read_documents((MANIFESTS / "good" / "tracking-all-backends.yaml").read_text(), "t")]
    doc["metadata"]["namespace"] = "ns"
    doc["spec"]["algorithm"]["klCoef"] = 0.01
    doc["spec"]["roles"]["ref"] = {"replicas": 1}  # a second role with pods of its own
    doc["spec"]["monitoring"]["tracking"][1].update(trackingUri="http://mlflow:5000", tokenSecretRef={"name": "mlflow-token", "key": "token"})
    job = parse_rljob(doc, "t")
    desired = plan(job, uid="u", attempt=0, settings=SETTINGS)
    actor_env = {e["name"]: e for e in desired.jobs["actor"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert actor_env["WANDB_API_KEY"] == {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}}
    assert actor_env["MLFLOW_TRACKING_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "mlflow-token", "key": "token"}}
    ref_env = {e["name"] for e in desired.jobs["ref"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert not ref_env & {"WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN"}  # the controller rank is the actor's
    # The engine config (the pods' ConfigMap) names the trackers and the Secrets, nothing more.
    tracking = engine_config(job).to_manifest()["tracking"]
    assert [t["backend"] for t in tracking] == ["tensorboard", "mlflow", "wandb"]
    assert tracking[2]["apiKeySecretRef"] == {"name": "wandb", "key": "api-key"}


def test_trainer_may_only_write_its_progress_configmap() -> None:
    desired = plan(example("grpo-smollm2-arith.yaml"), uid="u", attempt=0, settings=SETTINGS)
    role = next(o for o in desired.support if o["kind"] == "Role")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                              "resourceNames": ["grpo-smollm2-arith-progress"], "verbs": ["get", "update", "patch"]}]
    assert all(o["metadata"]["labels"][LABEL_JOB] == "grpo-smollm2-arith" for o in desired.support)


def test_no_secret_value_in_any_planned_object() -> None:
    desired = plan(example("ppo-cluster/rljob.yaml"), uid="u", attempt=0, settings=SETTINGS)
    text = str(desired)
    assert "hf-token" in text and "secretKeyRef" in text  # referenced ...
    assert "stringData" not in text and "kind': 'Secret'" not in text  # ... never copied


def test_kueue_jobs_start_suspended_with_their_queue_label() -> None:
    job = example("grpo-smollm2-arith.yaml")
    job.spec.run_policy.scheduling.gang_scheduler = "kueue"
    job.spec.run_policy.scheduling.queue_name = "team-a"
    actor = plan(job, uid="u", attempt=0, settings=SETTINGS).jobs["actor"]
    assert actor["spec"]["suspend"] is True
    assert actor["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"


def test_volcano_gets_a_podgroup_for_every_pod() -> None:
    job = example("ppo-cluster/rljob.yaml")
    job.spec.run_policy.scheduling.gang_scheduler = "volcano"
    desired = plan(job, uid="u", attempt=0, settings=SETTINGS)
    group = next(o for o in desired.support if o["kind"] == "PodGroup")
    assert group["spec"]["minMember"] == 3  # 2 actor pods + 1 critic pod
    template = desired.jobs["critic"]["spec"]["template"]
    assert template["spec"]["schedulerName"] == "volcano"
    assert template["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "ppo-qwen-math"


# --- decide ------------------------------------------------------------------------------------


def _k8s_job(role: str, attempt: int, complete: bool = False, uid: str = "j") -> dict:
    conditions = [{"type": "Complete", "status": "True"}] if complete else []
    return {"metadata": {"name": f"demo-{role}", "uid": uid, "labels": {LABEL_ROLE: role, LABEL_ATTEMPT: str(attempt)}},
            "status": {"conditions": conditions}}


def _pod(role: str, index: int, attempt: int, phase: str = "Running", ready: bool = True, owner: str = "j") -> dict:
    return {
        "metadata": {"name": f"demo-{role}-{index}", "labels": {LABEL_ROLE: role, LABEL_ATTEMPT: str(attempt)},
                     "ownerReferences": [{"uid": owner}]},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                   **({"containerStatuses": [{"name": "trainer", "state": {"terminated": {"exitCode": 3, "reason": "Error"}}}]}
                      if phase == "Failed" else {})},
    }


def demo(restarts: int = 0, phase: str | None = None, **run_policy: object) -> RLJob:
    job = example("dpo.yaml", **run_policy)  # two actor pods, ref colocated
    job.status = RLJobStatus(restarts=restarts, phase=phase, start_time=NOW - timedelta(seconds=10) if phase else None)
    return job


def test_new_job_creates_its_jobs() -> None:
    d = decide(demo(), Observed(), NOW)
    assert d.create_jobs and d.status.phase == "Pending" and d.status.start_time == NOW


def test_all_pods_ready_is_running_and_counted() -> None:
    observed = Observed(jobs=[_k8s_job("actor", 0)], pods=[_pod("actor", 0, 0), _pod("actor", 1, 0)])
    d = decide(demo(phase="Starting"), observed, NOW)
    assert d.status.phase == "Running" and not d.create_jobs
    assert d.status.roles["actor"].ready == 2
    assert [(c.type, c.status) for c in d.status.conditions] == [("Running", "True")]


def test_a_failed_pod_bumps_restarts_once_and_deletes_every_job() -> None:
    observed = Observed(jobs=[_k8s_job("actor", 0)], pods=[_pod("actor", 0, 0), _pod("actor", 1, 0, phase="Failed")])
    d = decide(demo(phase="Running"), observed, NOW)
    assert d.status.restarts == 1 and d.status.phase == "Restarting"
    assert d.delete_jobs == ("demo-actor",)
    assert "demo-actor-1 (role actor) failed: container trainer exited with code 3" in d.message
    # The next pass sees the same failed pod, but of the old attempt: no second restart.
    again = demo(restarts=1, phase="Restarting")
    d2 = decide(again, observed, NOW)
    assert d2.status.restarts == 1 and d2.delete_jobs == ("demo-actor",) and not d2.create_jobs
    # Once the old Jobs are gone, the new attempt's are created.
    d3 = decide(again, Observed(), NOW)
    assert d3.create_jobs and d3.status.restarts == 1


def test_backoff_limit_fails_the_job() -> None:
    observed = Observed(jobs=[_k8s_job("actor", 2)], pods=[_pod("actor", 0, 2, phase="Failed")])
    d = decide(demo(restarts=2, phase="Running", backoff_limit=2), observed, NOW)
    assert d.status.phase == "Failed" and d.status.restarts == 2
    assert d.status.conditions[-1].reason == "BackoffLimitExceeded" and d.delete_jobs == ("demo-actor",)


def test_suspend_deletes_pods_and_clears_the_deadline_clock() -> None:
    observed = Observed(jobs=[_k8s_job("actor", 0)], pods=[_pod("actor", 0, 0)])
    d = decide(demo(phase="Running", suspend=True), observed, NOW)
    assert d.status.phase == "Suspended" and d.delete_jobs == ("demo-actor",) and d.status.start_time is None


def test_deadline() -> None:
    job = demo(phase="Running", active_deadline_seconds=5)
    d = decide(job, Observed(jobs=[_k8s_job("actor", 0)], pods=[_pod("actor", 0, 0), _pod("actor", 1, 0)]), NOW)
    assert d.status.phase == "Failed" and d.status.conditions[-1].reason == "DeadlineExceeded"
    early = demo(phase="Running", active_deadline_seconds=60)
    d = decide(early, Observed(jobs=[_k8s_job("actor", 0)], pods=[_pod("actor", 0, 0), _pod("actor", 1, 0)]), NOW)
    assert d.status.phase == "Running" and d.requeue_after == pytest.approx(30.0)


def test_actor_completion_succeeds_and_ttl_deletes_later() -> None:
    d = decide(demo(phase="Running"), Observed(jobs=[_k8s_job("actor", 0, complete=True)]), NOW)
    assert d.status.phase == "Succeeded" and d.status.completion_time == NOW
    finished = demo(phase="Succeeded", ttl_seconds_after_finished=60)
    finished.status.completion_time = NOW
    assert decide(finished, Observed(), NOW + timedelta(seconds=30)).requeue_after == pytest.approx(30.0)
    assert decide(finished, Observed(), NOW + timedelta(seconds=61)).delete_rljob


def test_progress_report_fills_the_status_and_garbage_is_ignored() -> None:
    checkpoint = CheckpointStatus(step=2, path="/checkpoints/demo/step-00000002", time=NOW)
    report = ProgressReport(step=3, reward_mean=0.5, tokens_per_second=12.0, last_checkpoint=checkpoint).to_json()
    d = decide(demo(phase="Starting"), Observed(progress=report), NOW)
    assert d.status.step == 3 and d.status.metrics.reward_mean == 0.5
    assert d.status.last_checkpoint == checkpoint
    d = decide(demo(phase="Starting"), Observed(progress="{not json"), NOW)
    assert d.status.step is None


def test_conditions_keep_their_transition_time_while_unchanged() -> None:
    observed = Observed(jobs=[_k8s_job("actor", 0)], pods=[_pod("actor", 0, 0), _pod("actor", 1, 0)])
    first = decide(demo(phase="Starting"), observed, NOW)
    job = demo(phase="Running")
    job.status = first.status
    second = decide(job, observed, NOW + timedelta(minutes=5))
    assert second.status.conditions[0].last_transition_time == NOW
