"""Reading the children as the API returns them: JobSet conditions, pod counts, Kueue's Workload, progress."""

from __future__ import annotations

from typing import Any, Sequence

from kuberl.engine.config.termination import NOT_RETRYABLE_EXIT_CODE, PEER_LOST_REASON, TrainerFailure, read_failure

from ...api import MetricsSnapshot, RLJobStatus, RoleStatus
from ...api.status import MAX_FAILURES, AttemptFailure, progress_percent
from ..children import JOBSET_RESTART_LABEL, LABEL_ROLE, PREEMPTIONS_BEFORE, RESTARTS_BEFORE
from .progress_bounds import check_report

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
"""The Job controller's label on each of its pods: the Job's name."""


def name(obj: dict[str, Any]) -> str:
    return obj["metadata"]["name"]


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    """The object's condition of type `kind` when it is True."""
    if obj is None:
        return None
    return next((c for c in obj.get("status", {}).get("conditions", []) if c.get("type") == kind and c.get("status") == "True"), None)


def _annotation(obj: dict[str, Any], key: str) -> int:
    value = obj["metadata"].get("annotations", {}).get(key, "0")
    return int(value) if value.isdigit() else 0


# --- the JobSet -----------------------------------------------------------------------------------


def restarts(jobset: dict[str, Any]) -> int:
    """The RLJob's gang restarts: those before this JobSet was made, plus JobSet's own."""
    return _annotation(jobset, RESTARTS_BEFORE) + int(jobset.get("status", {}).get("restarts", 0) or 0)


def suspended(jobset: dict[str, Any]) -> bool:
    return bool(jobset.get("spec", {}).get("suspend"))


# --- pods -------------------------------------------------------------------------------------------


def pod_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status", {})
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])
    )


def role_counts(pods: list[dict[str, Any]]) -> dict[str, RoleStatus]:
    counts: dict[str, RoleStatus] = {}
    for pod in pods:
        role = pod["metadata"].get("labels", {}).get(LABEL_ROLE, "unknown")
        c = counts.setdefault(role, RoleStatus())
        phase = pod.get("status", {}).get("phase")
        if phase == "Succeeded":
            c.succeeded += 1
        elif phase == "Failed":
            c.failed += 1
        elif pod["metadata"].get("deletionTimestamp") is None:
            c.active += 1
            c.ready += pod_ready(pod)
    return counts


def active(pods: list[dict[str, Any]]) -> bool:
    return any(p.get("status", {}).get("phase") in ("Pending", "Running", None) for p in pods)


def _terminated(pod: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(container, its terminated state) of the pod's first container that ended."""
    for cs in pod.get("status", {}).get("containerStatuses", []):
        terminated = cs.get("state", {}).get("terminated") or cs.get("lastState", {}).get("terminated")
        if terminated:
            return cs.get("name", "?"), terminated
    return None


def trainer_failure(pod: dict[str, Any]) -> TrainerFailure | None:
    """What the pod's rank wrote about its failure (engine/config/termination.py), if it did."""
    ended = _terminated(pod)
    return read_failure(ended[1].get("message")) if ended else None


def termination(pod: dict[str, Any]) -> str:
    ended = _terminated(pod)
    if ended is None:
        return pod.get("status", {}).get("reason", "")
    container, terminated = ended
    said = f"container {container} exited with code {terminated.get('exitCode')} ({terminated.get('reason', 'Error')})"
    failure = read_failure(terminated.get("message"))
    return f"{said}: {failure.message}" if failure is not None else said


def _exit_code(pod: dict[str, Any]) -> int | None:
    ended = _terminated(pod)
    return ended[1].get("exitCode") if ended else None


SIGKILL_EXIT_CODE = 128 + 9


def _blame_order(pod: dict[str, Any]) -> tuple[int, str]:
    """Which failed pod started it: one whose rank said a restart cannot help; then one that failed by itself
    (an error of its own, out of memory); then one killed outright (SIGKILL: force-deleted, its node or runtime
    killed it); then one whose rank said a peer's loss made it fail (PeerLost); then one stopped by another
    signal (exit 128 + n: the Job controller stopped it after a peer's loss); then the rest."""
    code = _exit_code(pod)
    if code == NOT_RETRYABLE_EXIT_CODE:
        return 0, name(pod)
    ended = _terminated(pod)
    if ended is not None and ended[1].get("reason") == "OOMKilled":
        return 1, name(pod)
    report = trainer_failure(pod)
    if report is not None and report.reason == PEER_LOST_REASON:
        return 3, name(pod)
    if code is not None and 0 < code < 128:
        return 1, name(pod)
    if code == SIGKILL_EXIT_CODE:
        return 2, name(pod)
    return (4 if code is not None else 5), name(pod)


def _started_it(pod: dict[str, Any]) -> bool:
    """Its own end started the failure: it said a restart cannot help, failed by itself or was killed outright;
    not a rank that a peer's loss took down, nor one the Job controller stopped after it."""
    return _blame_order(pod)[0] <= 2


def _failed(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((p for p in pods if p.get("status", {}).get("phase") == "Failed"), key=_blame_order)


def attempt(pod: dict[str, Any], jobset: dict[str, Any]) -> int:
    """The RLJob's attempt number the pod ran in (JobSet's count on the pod plus the restarts before this JobSet)."""
    label = pod["metadata"].get("labels", {}).get(JOBSET_RESTART_LABEL, "0")
    return _annotation(jobset, RESTARTS_BEFORE) + (int(label) if label.isdigit() else 0)


def of_attempt(objects: list[dict[str, Any]], jobset: dict[str, Any] | None, back: int = 0) -> list[dict[str, Any]]:
    """The pods or Jobs of the JobSet's current restart attempt (`back` = 1: the one before it); all of them when
    there is no JobSet."""
    if jobset is None:
        return objects
    label = str(int(jobset.get("status", {}).get("restarts", 0) or 0) - back)
    return [o for o in objects if o["metadata"].get("labels", {}).get(JOBSET_RESTART_LABEL) == label]


def failed_pod(pods: list[dict[str, Any]], trainer_jobs: Sequence[dict[str, Any]] = ()) -> str | None:
    """A sentence naming the failed pod that most likely started the failure, if any. A pod already gone (deleted,
    its node lost) is found through its role's Job, which JobSet's restart has not yet removed: that is preferred
    to a pod that the Job controller only stopped after it."""
    failed = _failed(pods)
    if failed and _started_it(failed[0]):
        return _pod_sentence(failed[0])
    lost = failed_role_job(trainer_jobs, pods)
    if lost is not None:
        role, said = lost
        return f"a pod of role {role} failed ({said})"
    return _pod_sentence(failed[0]) if failed else None


def _pod_sentence(pod: dict[str, Any]) -> str:
    role = pod["metadata"].get("labels", {}).get(LABEL_ROLE, "?")
    reason = termination(pod)
    return f"pod {name(pod)} (role {role}) failed" + (f": {reason}" if reason else "")


def failed_role_job(trainer_jobs: Sequence[dict[str, Any]], pods: Sequence[dict[str, Any]] = ()) -> tuple[str, str] | None:
    """(role, what its Job says) of a JobSet's Job that failed (a failed pod fails its Job at once: the Job keeps
    the record when the pod itself is gone). A Job whose failed pod is gone comes first: one whose failed pod is
    still here, and did not start the failure, failed after it."""
    here = {p["metadata"].get("labels", {}).get(JOB_NAME_LABEL) for p in pods if p.get("status", {}).get("phase") == "Failed"}
    for job in sorted(trainer_jobs, key=lambda j: (name(j) in here, j["metadata"].get("creationTimestamp", ""))):
        failed = condition(job, "Failed")
        if failed is not None:
            role = job["metadata"].get("labels", {}).get(LABEL_ROLE, "?")
            return role, f"its Job {name(job)}: {failed.get('reason', 'Failed')}: {failed.get('message', '')}".rstrip(": ")
    return None


def record_failure(
    status: RLJobStatus, pods: list[dict[str, Any]], jobset: dict[str, Any], ended: int, trainer_jobs: Sequence[dict[str, Any]] = ()
) -> None:
    """Keep how the job's attempt number `ended` ended in the status (the newest MAX_FAILURES), once per attempt:
    the pod blamed for it and its last words, read before the gang restart takes the pods away. The pods carry
    JobSet's own count, which starts again with a JobSet made again after a suspension."""
    if any(f.attempt == ended for f in status.failures):
        return
    label = str(ended - _annotation(jobset, RESTARTS_BEFORE))
    attempt_pods = [p for p in pods if p["metadata"].get("labels", {}).get(JOBSET_RESTART_LABEL) == label]
    failed = _failed(attempt_pods)
    attempt_jobs = [j for j in trainer_jobs if j["metadata"].get("labels", {}).get(JOBSET_RESTART_LABEL) == label]
    lost = failed_role_job(attempt_jobs, attempt_pods)
    if lost is not None and not (failed and _started_it(failed[0])):
        role, job_says = lost  # no pod that failed by itself is left to read: its role's Job says what happened
        status.failures = [
            *status.failures,
            AttemptFailure(attempt=ended, pod="", role=role[:16], reason="PodLost", message=job_says[:4096]),
        ][-MAX_FAILURES:]
        return
    if failed:
        record_pod(status, failed[0], ended)


def record_pod(status: RLJobStatus, pod: dict[str, Any], ended: int) -> None:
    """Keep `pod` as the one whose end ended attempt `ended`, with its container's last words (once per attempt)."""
    if any(f.attempt == ended for f in status.failures):
        return
    container = _terminated(pod)
    terminated = container[1] if container else {}
    raw = terminated.get("message") or ""
    said = read_failure(raw)
    status.failures = [
        *status.failures,
        AttemptFailure(
            attempt=ended,
            pod=name(pod)[:253],
            role=pod["metadata"].get("labels", {}).get(LABEL_ROLE, "?")[:16],
            exit_code=terminated.get("exitCode"),
            reason=(said.reason if said else str(terminated.get("reason") or pod.get("status", {}).get("reason") or "Failed"))[:64],
            message=(said.message if said else raw)[-4096:],
        ),
    ][-MAX_FAILURES:]


def not_retryable(pods: list[dict[str, Any]]) -> tuple[str, TrainerFailure | None] | None:
    """(pod name, its report) of a failed pod whose rank exited saying a restart cannot help."""
    for pod in _failed(pods):
        if _exit_code(pod) == NOT_RETRYABLE_EXIT_CODE:
            return name(pod), trainer_failure(pod)
    return None


# --- Kueue's Workload -----------------------------------------------------------------------------


def owned_by(objects: list[dict[str, Any]], owners: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The objects with an owner reference to one of `owners`, by uid: Kueue's Workloads of the job's
    JobSets. By uid, not name: a Workload of an earlier JobSet of the same name (a job deleted and made
    again, before the garbage collector took its Workload) is not this job's."""
    uids = {o["metadata"]["uid"] for o in owners}
    return [obj for obj in objects if any(ref.get("uid") in uids for ref in obj["metadata"].get("ownerReferences") or [])]


def evictions(workloads: list[dict[str, Any]], jobset: dict[str, Any]) -> int:
    """The RLJob's preemptions and other evictions: before this JobSet, plus what Kueue counted on its Workload."""
    counted = sum(
        int(e.get("count", 0) or 0) for w in workloads for e in (w.get("status", {}).get("schedulingStats") or {}).get("evictions", [])
    )
    return _annotation(jobset, PREEMPTIONS_BEFORE) + counted


def waiting_reason(workloads: list[dict[str, Any]]) -> tuple[str, str]:
    """(reason, message) of a Workload that is not admitted, in Kueue's own words."""
    for workload in workloads:
        evicted = condition(workload, "Evicted")
        if evicted is not None:
            return evicted.get("reason", "Evicted"), f"evicted by Kueue: {evicted.get('message', '')}".strip()
        for c in workload.get("status", {}).get("conditions", []):
            if c.get("type") == "QuotaReserved" and c.get("status") == "False":
                return c.get("reason", "Pending"), c.get("message", "")
    if workloads:
        return "Pending", "waiting for Kueue to admit the job"
    return "WaitingForWorkload", "waiting for Kueue to make the job's Workload"


def admitted(workloads: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The Admitted condition of the job's Workload, when it holds."""
    return next((c for w in workloads if (c := condition(w, "Admitted")) is not None), None)


# --- the controller rank's progress ----------------------------------------------------------------


def apply_progress(status: RLJobStatus, raw: str | None) -> str | None:
    """Copy the report in `raw` into the status; returns why it was refused, if it was."""
    report, refused = check_report(raw)
    if report is None:
        return refused  # none yet, foreign or out of bounds: keep the last good numbers
    status.step = report.step
    status.total_steps = report.total_steps if report.total_steps is not None else status.total_steps
    status.progress = progress_percent(status.step, status.total_steps)
    # A fresh report after a restart has no ETA yet: unknown, not the old one.
    status.eta_seconds = None if report.eta_seconds is None else round(report.eta_seconds)
    # Each number of the snapshot is the report's field of the same name (a metric added to both needs no line here).
    status.metrics = MetricsSnapshot(**{name: getattr(report, name) for name in MetricsSnapshot.model_fields})
    if report.last_checkpoint is not None:
        status.last_checkpoint = report.last_checkpoint
    if report.validation_reward_mean is not None:  # kept until the next validation, across restarts too
        status.validation_reward = report.validation_reward_mean
        status.validation_step = report.validation_step
    return None
