"""The reconcile's policies, as pure functions over what the API returns (no API server)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from kuberl.engine.config import CheckpointStatus, ProgressReport
from kuberl.engine.config.termination import TrainerFailure
from kuberl.operator.api import RLJob, RLJobStatus
from kuberl.operator.control.children import JOBSET_RESTART_LABEL, LABEL_ROLE, PREEMPTIONS_BEFORE, RESTARTS_BEFORE
from kuberl.operator.validation.manifest import load_rljobs
from kuberl.operator.control.reconcile import Observed, decide

EXAMPLES = Path(__file__).parent.parent / "examples"
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


def demo(restarts: int = 0, phase: str | None = None, queue: str | None = None, **run_policy: object) -> RLJob:
    job = load_rljobs(EXAMPLES / "dpo.yaml")[0]  # two actor pods, ref colocated
    job.metadata.namespace = "ns"
    for key, value in run_policy.items():
        setattr(job.spec.run_policy, key, value)
    job.spec.run_policy.scheduling.queue_name = queue
    job.status = RLJobStatus(restarts=restarts, phase=phase, start_time=NOW - timedelta(seconds=10) if phase else None)
    return job


def jobset(
    restarts: int = 0,
    suspend: bool = False,
    conditions: tuple[str, ...] = (),
    before: int = 0,
    preemptions_before: int = 0,
    deleting: bool = False,
) -> dict:
    meta = {
        "name": "dpo-smollm2",
        "uid": "js-1",
        "annotations": {RESTARTS_BEFORE: str(before), PREEMPTIONS_BEFORE: str(preemptions_before)},
    }
    if deleting:
        meta["deletionTimestamp"] = NOW.isoformat()
    return {
        "metadata": meta,
        "spec": {"suspend": suspend},
        "status": {"restarts": restarts, "conditions": [{"type": c, "status": "True", "message": f"{c} message"} for c in conditions]},
    }


def pod(
    index: int,
    restart: int = 0,
    phase: str = "Running",
    ready: bool = True,
    exit_code: int = 1,
    message: str | None = None,
    role: str = "actor",
) -> dict:
    terminated = {"exitCode": exit_code, "reason": "Error", **({"message": message} if message is not None else {})}
    return {
        "metadata": {"name": f"dpo-smollm2-{role}-0-{index}-x", "labels": {LABEL_ROLE: role, JOBSET_RESTART_LABEL: str(restart)}},
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            **({"containerStatuses": [{"name": "trainer", "state": {"terminated": terminated}}]} if phase == "Failed" else {}),
        },
    }


def workload(*conditions: dict, evictions: int = 0) -> dict:
    status: dict = {"conditions": list(conditions)}
    if evictions:
        status["schedulingStats"] = {"evictions": [{"reason": "Preempted", "underlyingCause": "", "count": evictions}]}
    return {"metadata": {"name": "jobset-dpo-smollm2-abc"}, "status": status}


def test_a_new_job_makes_its_jobset() -> None:
    d = decide(demo(), Observed(), NOW)
    assert d.create_jobset and d.status.phase == "Pending"


def test_all_pods_ready_is_running_and_counted() -> None:
    d = decide(demo(phase="Starting"), Observed(jobsets=[jobset()], pods=[pod(0), pod(1)]), NOW)
    assert d.status.phase == "Running" and not d.create_jobset and d.status.start_time == NOW - timedelta(seconds=10)
    assert d.status.roles["actor"].ready == 2
    assert [(c.type, c.status) for c in d.status.conditions] == [("Running", "True")]


def test_a_gang_restart_is_jobsets_own_and_counted_once() -> None:
    # JobSet has recreated every Job after a failed pod: its restarts went up, the new pods start.
    observed = Observed(jobsets=[jobset(restarts=1)], pods=[pod(0, restart=0, phase="Failed"), pod(0, restart=1, ready=False)])
    d = decide(demo(phase="Running"), observed, NOW)
    assert d.status.restarts == 1 and d.status.phase == "Restarting"
    assert "restart 1 of 3" in d.message and "(role actor) failed: container trainer exited with code 1" in d.message
    assert [e[1] for e in d.events] == ["GangRestart"]
    assert d.status.roles["actor"].active == 1  # the pods of the current restart only
    again = demo(restarts=1, phase="Restarting")
    d2 = decide(again, observed, NOW)
    assert d2.status.restarts == 1 and not d2.events  # the same restart, seen twice, counts once


def test_restarts_count_on_from_the_jobset_before() -> None:
    d = decide(demo(restarts=2, phase="Running"), Observed(jobsets=[jobset(restarts=1, before=2)], pods=[pod(0, 1), pod(1, 1)]), NOW)
    assert d.status.restarts == 3


def test_a_failed_jobset_fails_the_job_with_its_pod() -> None:
    observed = Observed(jobsets=[jobset(restarts=3, conditions=("Failed",))], pods=[pod(0, restart=3, phase="Failed")])
    d = decide(demo(restarts=3, phase="Restarting"), observed, NOW)
    assert d.status.phase == "Failed" and d.status.conditions[-1].reason == "BackoffLimitExceeded"
    assert "backoffLimit 3 reached after 3 restart(s)" in d.message and d.delete == ("jobset/dpo-smollm2",)


def test_a_rank_that_says_a_restart_cannot_help_fails_the_job_at_once_with_its_words() -> None:
    said = TrainerFailure(
        reason="UnsupportedModel",
        retryable=False,
        role="actor",
        rank=1,
        message="UnsupportedModel: model_type 'gemma3' is not a Llama-family model (supported: llama, qwen2, mistral)",
    )
    observed = Observed(
        jobsets=[jobset(restarts=0, conditions=("Failed",))],
        pods=[pod(0, phase="Failed", exit_code=143), pod(1, phase="Failed", exit_code=3, message=said.to_json())],
    )
    d = decide(demo(phase="Running"), observed, NOW)
    assert d.status.phase == "Failed" and d.status.conditions[-1].reason == "UnsupportedModel"
    assert d.message.startswith("pod dpo-smollm2-actor-0-1-x (role actor, rank 1): UnsupportedModel: model_type 'gemma3'")
    assert d.message.endswith("not retried: a restart would fail the same way") and "backoffLimit" not in d.message
    assert [e[1] for e in d.events] == ["UnsupportedModel"] and d.delete == ("jobset/dpo-smollm2",)


def test_a_not_retryable_exit_without_a_report_still_fails_at_once() -> None:
    # An older trainer image, or a rank that died before it could write: the log's tail, as the kubelet kept it.
    observed = Observed(jobsets=[jobset(conditions=("Failed",))], pods=[pod(0, phase="Failed", exit_code=3, message="Traceback ...\nboom")])
    d = decide(demo(phase="Running"), observed, NOW)
    assert d.status.conditions[-1].reason == "NotRetryable" and "exited with code 3" in d.message and "not retried" in d.message


def test_a_restart_names_the_pod_that_failed_not_the_ones_stopped_after_it() -> None:
    # The critic's rank failed by itself; the Job controller then stopped the actor's ranks (exit 143).
    observed = Observed(
        jobsets=[jobset(restarts=1)],
        pods=[pod(0, phase="Failed", exit_code=143), pod(0, role="critic", phase="Failed", exit_code=1), pod(0, restart=1, ready=False)],
    )
    d = decide(demo(phase="Running"), observed, NOW)
    assert d.status.phase == "Restarting" and "pod dpo-smollm2-critic-0-0-x (role critic) failed" in d.message


def test_suspend_deletes_the_pods_and_clears_the_deadline_clock() -> None:
    d = decide(demo(phase="Running", suspend=True), Observed(jobsets=[jobset()], pods=[pod(0)]), NOW)
    assert d.status.phase == "Suspended" and d.delete == ("jobset/dpo-smollm2",) and d.status.start_time is None


def test_resume_waits_for_the_old_jobset_to_go_then_makes_it_again() -> None:
    job = demo(restarts=1, phase="Suspended")
    d = decide(job, Observed(jobsets=[jobset(deleting=True)]), NOW)
    assert not d.create_jobset and d.status.phase == "Pending" and "previous JobSet" in d.message
    d = decide(job, Observed(), NOW)
    assert d.create_jobset and d.status.restarts == 1  # the controller makes it with restarts-before = 1


def test_deadline() -> None:
    full = Observed(jobsets=[jobset()], pods=[pod(0), pod(1)])
    d = decide(demo(phase="Running", active_deadline_seconds=5), full, NOW)
    assert d.status.phase == "Failed" and d.status.conditions[-1].reason == "DeadlineExceeded" and d.delete == ("jobset/dpo-smollm2",)
    d = decide(demo(phase="Running", active_deadline_seconds=60), full, NOW)
    assert d.status.phase == "Running" and d.requeue_after == pytest.approx(30.0)


def test_completion_succeeds_and_ttl_deletes_later() -> None:
    d = decide(demo(phase="Running"), Observed(jobsets=[jobset(conditions=("Completed",))]), NOW)
    assert d.status.phase == "Succeeded" and d.status.completion_time == NOW
    finished = demo(phase="Succeeded", ttl_seconds_after_finished=60)
    finished.status.completion_time = NOW
    assert decide(finished, Observed(), NOW + timedelta(seconds=30)).requeue_after == pytest.approx(30.0)
    assert decide(finished, Observed(), NOW + timedelta(seconds=61)).delete_rljob


def test_progress_report_fills_the_status_and_garbage_is_ignored() -> None:
    checkpoint = CheckpointStatus(step=2, path="/checkpoints/demo/step-00000002", time=NOW)
    report = ProgressReport(step=3, reward_mean=0.5, tokens_per_second=12.0, last_checkpoint=checkpoint).to_json()
    d = decide(demo(phase="Starting"), Observed(jobsets=[jobset()], progress=report), NOW)
    assert d.status.step == 3 and d.status.metrics.reward_mean == 0.5 and d.status.last_checkpoint == checkpoint
    d = decide(demo(phase="Starting"), Observed(jobsets=[jobset()], progress="{not json"), NOW)
    assert d.status.step is None


def test_conditions_keep_their_transition_time_while_unchanged() -> None:
    observed = Observed(jobsets=[jobset()], pods=[pod(0), pod(1)])
    first = decide(demo(phase="Starting"), observed, NOW)
    job = demo(phase="Running")
    job.status = first.status
    second = decide(job, observed, NOW + timedelta(minutes=5))
    assert second.status.conditions[0].last_transition_time == NOW


# --- Kueue ---------------------------------------------------------------------------------------


def test_a_queued_job_waits_with_kueues_reason_and_no_deadline_clock() -> None:
    job = demo(phase="Running", queue="team-a", active_deadline_seconds=5)  # its clock started 10 s ago
    d = decide(job, Observed(jobsets=[jobset(suspend=True)]), NOW)
    assert d.status.phase == "Queued" and d.status.conditions[0].reason == "WaitingForWorkload"
    pending = workload(
        {
            "type": "QuotaReserved",
            "status": "False",
            "reason": "Pending",
            "message": "insufficient unused quota for nvidia.com/gpu in flavor h100, 8 more needed",
        }
    )
    d = decide(job, Observed(jobsets=[jobset(suspend=True)], workloads=[pending]), NOW + timedelta(hours=1))
    queued = d.status.conditions[0]
    assert (d.status.phase, queued.type, queued.reason) == ("Queued", "Queued", "Pending")
    assert queued.message == "queue team-a: insufficient unused quota for nvidia.com/gpu in flavor h100, 8 more needed"
    assert d.status.start_time is None  # an hour in the queue is not an hour of the deadline


def test_admission_records_its_time_and_the_job_starts() -> None:
    admitted = workload(
        {"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True", "lastTransitionTime": NOW.isoformat()}
    )
    d = decide(demo(phase="Queued", queue="team-a"), Observed(jobsets=[jobset()], workloads=[admitted], pods=[pod(0, ready=False)]), NOW)
    assert d.status.phase == "Starting" and d.status.admitted_time == NOW


def test_a_preempted_job_waits_again_counting_a_preemption_not_a_restart() -> None:
    job = demo(phase="Running", queue="team-a")
    job.status.last_checkpoint = CheckpointStatus(step=7, path="/c/step-00000007")
    evicted = workload(
        {
            "type": "Evicted",
            "status": "True",
            "reason": "Preempted",
            "message": "Preempted to accommodate a workload (UID: x) due to prioritization in the ClusterQueue",
        },
        evictions=1,
    )
    # Kueue suspended the JobSet: its pods are stopping (SIGTERM, a checkpoint at the step boundary).
    d = decide(job, Observed(jobsets=[jobset(suspend=True)], workloads=[evicted], pods=[pod(0, phase="Failed")]), NOW)
    assert d.status.phase == "Queued" and d.status.preemptions == 1 and d.status.restarts == 0
    assert d.status.conditions[-1].reason == "Preempted"
    assert "evicted by Kueue: Preempted to accommodate" in d.message and "resumes from the checkpoint of step 7" in d.message
    assert [e[1] for e in d.events] == ["Preempted"]
    job.status = d.status
    assert decide(job, Observed(jobsets=[jobset(suspend=True)], workloads=[evicted]), NOW).events == ()  # once


def test_a_preemption_counted_before_the_jobset_is_suspended_is_still_reported_once() -> None:
    # Kueue has counted the eviction on the Workload, which still says Admitted, and has not suspended the
    # JobSet yet: the reconcile that writes the count takes the running path, and reports it all the same.
    job = demo(phase="Running", queue="team-a")
    still = workload(
        {"type": "Admitted", "status": "True", "lastTransitionTime": NOW.isoformat()},
        {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "Preempted to accommodate a workload"},
        evictions=1,
    )
    d = decide(job, Observed(jobsets=[jobset()], workloads=[still], pods=[pod(0), pod(1)]), NOW)
    assert d.status.phase == "Running" and d.status.preemptions == 1
    assert [e[1:] for e in d.events] == [("Preempted", "evicted by Kueue: Preempted to accommodate a workload (preemption 1)")]
    job.status = d.status  # written: a later reconcile, on whatever path, reports it no more
    assert decide(job, Observed(jobsets=[jobset(suspend=True)], workloads=[still]), NOW).events == ()


def test_a_restart_first_seen_by_the_reconcile_that_fails_the_job_is_reported() -> None:
    observed = Observed(jobsets=[jobset(restarts=3, conditions=("Failed",))], pods=[pod(0, restart=3, phase="Failed")])
    d = decide(demo(restarts=2, phase="Running"), observed, NOW)
    assert d.status.phase == "Failed" and d.status.restarts == 3
    assert [e[1] for e in d.events] == ["BackoffLimitExceeded", "GangRestart"]


def test_preemptions_count_on_from_the_jobset_before() -> None:
    job = demo(phase="Queued", queue="team-a")
    d = decide(job, Observed(jobsets=[jobset(suspend=True, preemptions_before=2)], workloads=[workload(evictions=1)]), NOW)
    assert d.status.preemptions == 3


def test_a_jobs_workloads_are_those_its_jobset_owns_by_uid() -> None:
    """A Workload left by an earlier JobSet of the same name (the job deleted and made again before the
    garbage collector took it) is not this job's: its quota state must not decide the new one's phase."""
    from kuberl.operator.control.reconcile.reading import owned_by

    jobset = {"metadata": {"name": "ppo", "uid": "new"}}
    current = {"metadata": {"name": "jobset-ppo-a1", "ownerReferences": [{"kind": "JobSet", "name": "ppo", "uid": "new"}]}}
    earlier = {"metadata": {"name": "jobset-ppo-b2", "ownerReferences": [{"kind": "JobSet", "name": "ppo", "uid": "old"}]}}
    orphan = {"metadata": {"name": "jobset-ppo-c3"}}
    assert owned_by([earlier, current, orphan], [jobset]) == [current]
    assert owned_by([current], []) == []


def test_within_an_attempt_the_phase_never_goes_back_to_starting() -> None:
    # A pod lost a moment before JobSet restarts the gang, or one that finished before the others: still Running.
    lost = Observed(jobsets=[jobset()], pods=[pod(0), pod(1, phase="Failed")])
    d = decide(demo(phase="Running"), lost, NOW)
    assert d.status.phase == "Running" and d.status.conditions[-1].reason == "PodsNotReady" and not d.events
    # The first attempt starts; after a restart the next one starts again.
    assert decide(demo(phase="Pending"), Observed(jobsets=[jobset()], pods=[pod(0, ready=False)]), NOW).status.phase == "Starting"
    after = Observed(jobsets=[jobset(restarts=1)], pods=[pod(0, restart=1, ready=False), pod(1, restart=1, ready=False)])
    assert decide(demo(restarts=1, phase="Restarting"), after, NOW).status.phase == "Starting"


def test_each_failed_attempt_is_kept_with_its_pod_and_last_words() -> None:
    log_tail = "step 7 ...\nRuntimeError: NCCL watchdog timed out"
    observed = Observed(
        jobsets=[jobset(restarts=1)],
        pods=[pod(0, phase="Failed", exit_code=143), pod(1, phase="Failed", exit_code=1, message=log_tail), pod(0, restart=1, ready=False)],
    )
    d = decide(demo(phase="Running"), observed, NOW)
    [kept] = d.status.failures
    assert (kept.attempt, kept.pod, kept.role, kept.exit_code, kept.reason) == (0, "dpo-smollm2-actor-0-1-x", "actor", 1, "Error")
    assert kept.message == log_tail
    again = demo(restarts=1, phase="Restarting")
    again.status.failures = d.status.failures
    assert decide(again, observed, NOW).status.failures == d.status.failures  # seen twice, kept once

    # The last attempt's end is kept too, with the rank's own words where it wrote a report.
    said = TrainerFailure(reason="CheckpointRefused", retryable=False, role="actor", rank=0, message="CheckpointError: rng.pt")
    final = Observed(
        jobsets=[jobset(restarts=1, conditions=("Failed",), before=2)],
        pods=[pod(0, restart=1, phase="Failed", exit_code=3, message=said.to_json())],
    )
    ended = decide(demo(restarts=3, phase="Running"), final, NOW).status.failures
    assert [(f.attempt, f.reason, f.message) for f in ended] == [(3, "CheckpointRefused", "CheckpointError: rng.pt")]


def test_only_the_newest_failed_attempts_are_kept() -> None:
    from kuberl.operator.api.status import MAX_FAILURES, AttemptFailure

    job = demo(restarts=20, phase="Running")
    job.status.failures = [AttemptFailure(attempt=i, pod=f"p{i}", role="actor", reason="Error") for i in range(MAX_FAILURES)]
    observed = Observed(jobsets=[jobset(restarts=21, before=0)], pods=[pod(0, restart=20, phase="Failed"), pod(0, restart=21, ready=False)])
    kept = decide(job, observed, NOW).status.failures
    assert len(kept) == MAX_FAILURES and kept[-1].attempt == 20 and kept[0].attempt == 1


def job_of(role: str, restart: int = 0, failed: bool = True) -> dict:
    conditions = (
        [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]
        if failed
        else []
    )
    return {
        "metadata": {
            "name": f"dpo-smollm2-{role}-0",
            "creationTimestamp": "2026-11-29T11:00:00Z",
            "labels": {LABEL_ROLE: role, JOBSET_RESTART_LABEL: str(restart)},
        },
        "status": {"conditions": conditions},
    }


def test_a_pod_that_is_gone_is_named_by_its_roles_job_not_the_peers_stopped_after_it() -> None:
    # The critic's pod was force-deleted: only the actor's pod, stopped after it (exit 143), is left to see.
    observed = Observed(
        jobsets=[jobset(restarts=1)],
        pods=[pod(0, phase="Failed", exit_code=143), pod(0, restart=1, ready=False)],
        trainer_jobs=[job_of("actor", failed=False), job_of("critic")],
    )
    d = decide(demo(phase="Running"), observed, NOW)
    assert d.status.phase == "Restarting"
    assert "a pod of role critic failed (its Job dpo-smollm2-critic-0: BackoffLimitExceeded" in d.message
    [kept] = d.status.failures
    assert (kept.attempt, kept.pod, kept.role, kept.reason) == (0, "", "critic", "PodLost")
    # A pod that failed by itself, still there, is named before any Job.
    observed.pods.append(pod(1, phase="Failed", exit_code=1))
    assert "pod dpo-smollm2-actor-0-1-x (role actor) failed" in decide(demo(phase="Running"), observed, NOW).message


def test_a_pod_killed_outright_is_named_not_the_peer_its_loss_took_down() -> None:
    # The critic's pod was force-deleted (its container SIGKILLed: exit 137, still seen); the actor's rank then
    # failed on the lost link (exit 1, reason PeerLost in its report) and the ref's was stopped (exit 143).
    lost = TrainerFailure(
        reason="PeerLost",
        retryable=True,
        role="actor",
        rank=0,
        message="RuntimeError: [pair.cc:553] Connection closed by peer [10.0.0.7]:36777",
    )
    actor = pod(0, phase="Failed", exit_code=1, message=lost.to_json())
    critic = pod(0, role="critic", phase="Failed", exit_code=137)
    ref = pod(0, role="ref", phase="Failed", exit_code=143)
    observed = Observed(jobsets=[jobset(restarts=1)], pods=[actor, ref, critic, pod(0, restart=1, ready=False)])
    d = decide(demo(phase="Running"), observed, NOW)
    assert "pod dpo-smollm2-critic-0-0-x (role critic) failed" in d.message, d.message
    [kept] = d.status.failures
    assert (kept.pod, kept.role, kept.exit_code) == ("dpo-smollm2-critic-0-0-x", "critic", 137)
    # Gone at once (no pod to read): its role's Job is named, not the Job of the actor whose rank its loss took down,
    # although the actor's Job was made first and failed too.
    for p, role in ((actor, "actor"), (ref, "ref")):
        p["metadata"]["labels"]["batch.kubernetes.io/job-name"] = f"dpo-smollm2-{role}-0"
    gone = Observed(
        jobsets=[jobset(restarts=1)],
        pods=[actor, ref, pod(0, restart=1, ready=False)],
        trainer_jobs=[job_of("actor"), job_of("ref"), job_of("critic")],
    )
    d = decide(demo(phase="Running"), gone, NOW)
    assert "a pod of role critic failed (its Job dpo-smollm2-critic-0" in d.message, d.message
    # A rank that failed by itself still comes before one killed outright.
    observed.pods.append(pod(1, phase="Failed", exit_code=2))
    assert "pod dpo-smollm2-actor-0-1-x (role actor) failed" in decide(demo(phase="Running"), observed, NOW).message


def oom_pod(index: int, restart: int = 0, role: str = "actor", limit: str | None = "512Mi", phase: str = "Failed") -> dict:
    p = pod(index, restart=restart, phase="Failed", exit_code=137, role=role)
    p["status"]["phase"] = phase
    p["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] = "OOMKilled"
    p["spec"] = {"containers": [{"name": "trainer", "resources": {"limits": {"memory": limit}} if limit else {}}]}
    return p


def test_an_out_of_memory_kill_ends_the_job_at_once_naming_the_pod_its_limit_and_what_to_change() -> None:
    # The JobSet has not failed (its backoff is not spent): without this the gang would restart and be killed again.
    observed = Observed(jobsets=[jobset(restarts=0)], pods=[oom_pod(1), pod(0, phase="Failed", exit_code=143)])
    d = decide(demo(phase="Running"), observed, NOW)
    assert d.status.phase == "Failed" and d.status.conditions[-1].reason == "OutOfMemory"
    assert d.message.startswith(
        "pod dpo-smollm2-actor-0-1-x (role actor): its trainer container was killed for running out of memory (limit 512Mi); not retried"
    ), d.message
    assert "roles.actor.resources.limits.memory" in d.message and "trainer.microBatchSize" in d.message
    assert d.delete == ("jobset/dpo-smollm2",) and [e[1] for e in d.events] == ["OutOfMemory"]
    [kept] = d.status.failures
    assert (kept.attempt, kept.pod, kept.reason, kept.exit_code) == (0, "dpo-smollm2-actor-0-1-x", "OOMKilled", 137)
    # The kubelet reports the container's end before the pod's phase: the kill is read, and kept, already then.
    d = decide(demo(phase="Running"), Observed(jobsets=[jobset(restarts=0)], pods=[oom_pod(1, phase="Running")]), NOW)
    assert d.status.conditions[-1].reason == "OutOfMemory" and [f.reason for f in d.status.failures] == ["OOMKilled"]


def test_an_out_of_memory_kill_is_seen_after_jobset_restarted_the_gang_and_even_when_its_pod_is_gone() -> None:
    # JobSet restarted at once: the killed pod is of the attempt before, and already deleted (as last seen).
    observed = Observed(
        jobsets=[jobset(restarts=1)], pods=[pod(0, restart=1, ready=False)], gone_pods=[oom_pod(0, role="critic", limit=None)]
    )
    d = decide(demo(phase="Running"), observed, NOW)
    assert d.status.conditions[-1].reason == "OutOfMemory" and "no limit: the node ran out" in d.message
    assert "roles.critic.resources.limits.memory" in d.message
    assert [(f.attempt, f.role, f.reason) for f in d.status.failures] == [(0, "critic", "OOMKilled")]


def test_only_an_oom_kill_ends_the_job_not_any_exit_137_and_not_one_of_an_older_attempt() -> None:
    # A force-deleted or preempted pod's container exits 137 too: that is for a gang restart to mend.
    killed = pod(0, phase="Failed", exit_code=137)
    d = decide(demo(phase="Running"), Observed(jobsets=[jobset(restarts=1)], pods=[killed, pod(0, restart=1, ready=False)]), NOW)
    assert d.status.phase == "Restarting"
    # Two attempts back is not this decision's to make again (the job went on after it).
    d = decide(demo(phase="Running"), Observed(jobsets=[jobset(restarts=2)], pods=[pod(0, restart=2)], gone_pods=[oom_pod(0)]), NOW)
    assert d.status.phase != "Failed"
