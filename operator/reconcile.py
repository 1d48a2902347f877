"""The operator's decisions: observed children in, the RLJob's new status and the actions out. Pure.

Level-based: `decide` looks only at what exists now (the RLJob, its Jobs and pods, the progress the
controller rank reported) and never at the event that woke it, so running it twice, or after an
operator restart halfway through, converges to the same place.

Gang restarts are counted without double counting: every Job carries the attempt it was created
for (`kuberl.dev/attempt` = status.restarts at creation). A failed pod of the current attempt bumps
status.restarts first (the status write is the commit point); Jobs of older attempts are then
deleted, and only when none is left are the new attempt's Jobs created.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from kuberl.engine.config import ProgressReport

from .api import Condition, MetricsSnapshot, Phase, RLJob, RLJobStatus, RoleStatus
from .children import LABEL_ATTEMPT, LABEL_ROLE
from .initialization import is_initializer, observe_initializer
from .initializer_job import needs_initializer

CONDITION_TYPES: tuple[Phase, ...] = ("Initializing", "Running", "Restarting", "Suspended", "Succeeded", "Failed")
INITIALIZED = "Initialized"
"""A condition of its own, kept after the phase moves on: True once the cache holds every hub repository."""
TERMINAL: tuple[Phase, ...] = ("Succeeded", "Failed")
RESYNC_SECONDS = 30.0
ACTIVE_SECONDS = 2.0  # while children are changing, look again soon


@dataclass(frozen=True)
class Observed:
    """The children of one RLJob as read from the API (plain dicts, as the API returns them)."""

    jobs: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    progress: str | None = None
    """The raw progress.json text, if the controller rank wrote one."""


@dataclass(frozen=True)
class Decision:
    status: RLJobStatus
    create_jobs: bool = False
    """Create the current attempt's Jobs that are missing."""
    create_initializer: bool = False
    """Create the initializer's Job (it fills the cache before any trainer pod)."""
    delete_jobs: tuple[str, ...] = ()
    """Names of Jobs to delete (their pods go with them)."""
    delete_rljob: bool = False
    """ttlSecondsAfterFinished has passed."""
    requeue_after: float | None = None
    events: tuple[tuple[str, str, str], ...] = ()
    """(type, reason, message) events to record on the RLJob."""
    message: str = ""
    """Why the job is in its phase, for the log."""


def decide(job: RLJob, observed: Observed, now: datetime) -> Decision:
    old = job.status or RLJobStatus()
    status = old.model_copy(deep=True)
    status.observed_generation = job.metadata.generation if job.metadata.generation is not None else status.observed_generation
    policy = job.spec.run_policy
    attempt = status.restarts
    init_jobs = [j for j in observed.jobs if is_initializer(j)]
    trainer_jobs = [j for j in observed.jobs if not is_initializer(j)]
    current = [j for j in trainer_jobs if _attempt(j) == attempt]
    stale = [j for j in trainer_jobs if _attempt(j) != attempt]
    pods = [p for p in observed.pods if _attempt(p) == attempt and not is_initializer(p)]
    status.roles = _role_counts(pods)
    _apply_progress(status, observed.progress)

    def finish(phase: Phase, reason: str, message: str, **kw: Any) -> Decision:
        _set_phase(status, phase, reason, message, now)
        return Decision(status=status, message=message, **kw)

    if old.phase in TERMINAL:
        still_running = tuple(_name(j) for j in observed.jobs if _active_pods(observed.pods, j))
        ttl = policy.ttl_seconds_after_finished
        if ttl is not None and old.completion_time is not None:
            expires = old.completion_time + timedelta(seconds=ttl)
            if now >= expires:
                return Decision(status=status, delete_rljob=True, delete_jobs=still_running)
            return Decision(status=status, delete_jobs=still_running, requeue_after=(expires - now).total_seconds())
        return Decision(status=status, delete_jobs=still_running)

    all_jobs = tuple(_name(j) for j in observed.jobs)
    if policy.suspend:
        status.start_time = None  # the deadline counts running time, as for a Kubernetes Job
        return finish("Suspended", "Suspended", "suspended: pods removed, checkpoints kept", delete_jobs=all_jobs,
                      requeue_after=ACTIVE_SECONDS if all_jobs else None)

    deadline = policy.active_deadline_seconds
    if deadline is not None and status.start_time is not None:
        ends = status.start_time + timedelta(seconds=deadline)
        if now >= ends:
            status.completion_time = now
            return finish("Failed", "DeadlineExceeded", f"ran longer than activeDeadlineSeconds ({deadline} s)",
                          delete_jobs=all_jobs, events=(("Warning", "DeadlineExceeded", f"stopped after {deadline} s"),))

    if needs_initializer(job) and status.initialization is None:
        if status.start_time is None:
            status.start_time = now  # the deadline counts the downloads too
        init = observe_initializer(init_jobs, [p for p in observed.pods if is_initializer(p)], now)
        if init.state == "Failed":
            status.completion_time = now
            _set_condition(status, INITIALIZED, "False", init.reason, init.message, now)
            # Its Job has ended (the pod and its log stay for `kubectl logs`); no trainer pod was ever made.
            return finish("Failed", init.reason, init.message, events=(("Warning", init.reason, init.message),))
        if init.state != "Succeeded":
            _set_condition(status, INITIALIZED, "False", init.reason, init.message, now)
            return finish("Initializing", init.reason, init.message, create_initializer=init.state == "Missing",
                          requeue_after=ACTIVE_SECONDS)
        status.initialization = init.status
        _set_condition(status, INITIALIZED, "True", init.reason, init.message, now)
        events = (("Normal", init.reason, init.message),)
    else:
        events = ()

    if stale:
        return finish("Restarting", "Restarting", f"restart {attempt}: removing the pods of attempt {attempt - 1}",
                      delete_jobs=tuple(_name(j) for j in stale), requeue_after=ACTIVE_SECONDS)

    failure = _first_failure(current, pods)
    if failure is not None:
        if attempt >= policy.backoff_limit:
            status.completion_time = now
            message = f"{failure}; backoffLimit {policy.backoff_limit} reached after {attempt} restart(s)"
            return finish("Failed", "BackoffLimitExceeded", message, delete_jobs=all_jobs,
                          events=(("Warning", "BackoffLimitExceeded", message),))
        status.restarts = attempt + 1
        message = f"{failure}; restarting every role from the last checkpoint (restart {attempt + 1} of {policy.backoff_limit})"
        return finish("Restarting", "PodFailed", message, delete_jobs=all_jobs, requeue_after=ACTIVE_SECONDS,
                      events=(("Warning", "GangRestart", message),))

    actor = next((j for j in current if j["metadata"].get("labels", {}).get(LABEL_ROLE) == "actor"), None)
    if actor is not None and _job_condition(actor, "Complete"):
        status.completion_time = now
        others = tuple(_name(j) for j in current if j is not actor)
        return finish("Succeeded", "Completed", "the actor finished training", delete_jobs=others,
                      events=(("Normal", "Completed", "training finished"),))

    wanted = job.spec.roles.pods()
    missing_jobs = len(current) < len(wanted)
    if status.start_time is None:
        status.start_time = now
    requeue = ACTIVE_SECONDS
    if deadline is not None:
        requeue = min(requeue if missing_jobs else RESYNC_SECONDS,
                      max(0.0, (status.start_time + timedelta(seconds=deadline) - now).total_seconds()))
    ready = all(status.roles.get(role, RoleStatus()).ready >= count for role, count in wanted.items())
    if not missing_jobs and ready:
        return finish("Running", "AllRanksRunning", f"all {sum(wanted.values())} pods are running",
                      requeue_after=RESYNC_SECONDS if deadline is None else requeue)
    phase: Phase = "Pending" if missing_jobs and not current else "Starting"
    waiting = sum(wanted.values()) - sum(status.roles.get(r, RoleStatus()).ready for r in wanted)
    return finish(phase, "Creating" if phase == "Pending" else "WaitingForPods",
                  f"waiting for {waiting} of {sum(wanted.values())} pods", create_jobs=missing_jobs, requeue_after=requeue,
                  events=events)


# --- reading observed objects -----------------------------------------------------------------


def _name(obj: dict[str, Any]) -> str:
    return obj["metadata"]["name"]


def _attempt(obj: dict[str, Any]) -> int | None:
    value = obj["metadata"].get("labels", {}).get(LABEL_ATTEMPT)
    return int(value) if value is not None and value.isdigit() else None


def _pod_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status", {})
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])
    )


def _role_counts(pods: list[dict[str, Any]]) -> dict[str, RoleStatus]:
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
            c.ready += _pod_ready(pod)
    return counts


def _active_pods(pods: list[dict[str, Any]], job: dict[str, Any]) -> bool:
    uid = job["metadata"].get("uid")
    return any(
        p.get("status", {}).get("phase") in ("Pending", "Running", None)
        and any(ref.get("uid") == uid for ref in p["metadata"].get("ownerReferences", []))
        for p in pods
    )


def _job_condition(job: dict[str, Any], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True" for c in job.get("status", {}).get("conditions", []))


def _first_failure(jobs: list[dict[str, Any]], pods: list[dict[str, Any]]) -> str | None:
    """A sentence naming the first failed pod (or Job) of the current attempt, if any."""
    for pod in sorted(pods, key=_name):
        if pod.get("status", {}).get("phase") == "Failed":
            role = pod["metadata"].get("labels", {}).get(LABEL_ROLE, "?")
            reason = _termination(pod)
            return f"pod {_name(pod)} (role {role}) failed" + (f": {reason}" if reason else "")
    for job in jobs:
        if _job_condition(job, "Failed"):
            return f"job {_name(job)} failed"
    return None


def _termination(pod: dict[str, Any]) -> str:
    for cs in pod.get("status", {}).get("containerStatuses", []):
        terminated = cs.get("state", {}).get("terminated")
        if terminated:
            return f"container {cs.get('name')} exited with code {terminated.get('exitCode')} ({terminated.get('reason', 'Error')})"
    return pod.get("status", {}).get("reason", "")


def _apply_progress(status: RLJobStatus, raw: str | None) -> None:
    if not raw:
        return
    try:
        report = ProgressReport.model_validate_json(raw)
    except ValidationError:
        return  # a half-written or foreign report: keep the last good numbers
    status.step = report.step
    status.total_steps = report.total_steps if report.total_steps is not None else status.total_steps
    status.metrics = MetricsSnapshot(reward_mean=report.reward_mean, kl=report.kl, tokens_per_second=report.tokens_per_second)
    if report.last_checkpoint is not None:
        status.last_checkpoint = report.last_checkpoint


def _set_phase(status: RLJobStatus, phase: Phase, reason: str, message: str, now: datetime) -> None:
    status.phase = phase
    by_type = {c.type: c for c in status.conditions}
    for kind in CONDITION_TYPES:
        active = kind == phase
        existing = by_type.get(kind)
        if existing is None and not active:
            continue
        wanted = "True" if active else "False"
        if existing is not None and existing.status == wanted:
            if active:
                existing.reason, existing.message = reason, message
            continue
        by_type[kind] = Condition(
            type=kind, status=wanted, reason=reason if active else f"Not{kind}",
            message=message if active else "", last_transition_time=now,
        )
    others = [c for c in status.conditions if c.type not in CONDITION_TYPES]
    status.conditions = [by_type[k] for k in CONDITION_TYPES if k in by_type] + others


def _set_condition(status: RLJobStatus, kind: str, value: str, reason: str, message: str, now: datetime) -> None:
    """Set a condition that is not a phase; its transition time moves only when its status changes."""
    existing = next((c for c in status.conditions if c.type == kind), None)
    if existing is not None and existing.status == value:
        existing.reason, existing.message = reason, message
        return
    condition = Condition(type=kind, status=value, reason=reason, message=message, last_transition_time=now)
    status.conditions = [c for c in status.conditions if c.type != kind] + [condition]

