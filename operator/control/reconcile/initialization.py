"""The initialization policy: is the job's cache filled, being filled, or impossible to fill? Pure.

A job that names a hub repository runs one initializer pod before its first trainer pod
(initializer_job.py). This module reads that Job and its pods as the API returns them and says what
the RLJob's status should show: still downloading, done (with the initializer's report), or failed
with the initializer's own reason (RepositoryNotFound, TokenRefused, CacheVolumeFull, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from kuberl.engine.config.initialization import InitializationReport

from ...api import InitializationStatus
from ..children import INITIALIZER, LABEL_COMPONENT
from ..initializer_job import CONTAINER, needs_initializer
from .conditions import INITIALIZED, set_condition
from .context import Context, Decision, finish

ACTIVE_SECONDS = 2.0


def is_initializer(obj: dict[str, Any]) -> bool:
    return obj["metadata"].get("labels", {}).get(LABEL_COMPONENT) == INITIALIZER


@dataclass(frozen=True)
class Initialization:
    """Where the initializer stands."""

    state: str
    """Missing (no Job yet), Running, Succeeded or Failed."""
    reason: str
    message: str
    status: InitializationStatus | None = None
    """Succeeded: what goes into the RLJob's status."""


def observe_initializer(jobs: list[dict[str, Any]], pods: list[dict[str, Any]], now: datetime) -> Initialization:
    """`jobs` and `pods`: the initializer's own (is_initializer)."""
    if not jobs:
        return Initialization("Missing", "Creating", "creating the initializer that fills the cache")
    job = jobs[0]
    conditions = {c.get("type"): c for c in job.get("status", {}).get("conditions", []) if c.get("status") == "True"}
    if "Complete" in conditions:
        report = _report(pods, "Succeeded")
        if report is None or not report.ok:
            return Initialization("Failed", "InitializerFailed", "the initializer finished without a report of what it fetched")
        status = InitializationStatus(repos=report.repos, fetched_bytes=report.fetched_bytes, completion_time=now)
        return Initialization("Succeeded", "CacheReady", _summary(report), status)
    if "Failed" in conditions:
        report = _report(pods, "Failed")
        if report is not None and not report.ok:
            return Initialization("Failed", report.reason or "InitializerFailed", report.message or "the initializer failed")
        failed = conditions["Failed"]
        if failed.get("reason") == "DeadlineExceeded":
            deadline = job.get("spec", {}).get("activeDeadlineSeconds")
            return Initialization(
                "Failed",
                "InitializerDeadlineExceeded",
                f"the downloads took longer than spec.initializer.activeDeadlineSeconds ({deadline} s)",
            )
        text = _last_message(pods)
        return Initialization(
            "Failed",
            "InitializerFailed",
            "the initializer failed" + (f": {text}" if text else f" ({failed.get('reason', 'Failed')}: {failed.get('message', '')})"),
        )
    waiting = _waiting_reason(pods)
    return Initialization("Running", "Downloading", waiting or "the initializer is fetching the hub repositories into the cache")


def _summary(report: InitializationReport) -> str:
    repos = ", ".join(f"{r.repo}@{r.commit[:12]}" for r in report.repos)
    if report.fetched_bytes == 0:
        return f"cache ready: {repos} (all in the cache already, nothing fetched)"
    return f"cache ready: {repos} ({report.fetched_bytes} bytes fetched)"


def _terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    for cs in pod.get("status", {}).get("containerStatuses", []):
        if cs.get("name") == CONTAINER and "terminated" in cs.get("state", {}):
            return cs["state"]["terminated"]
    return None


def _by_recency(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "", reverse=True)


def _report(pods: list[dict[str, Any]], phase: str) -> InitializationReport | None:
    for pod in _by_recency(pods):
        terminated = _terminated(pod)
        if pod.get("status", {}).get("phase") != phase or terminated is None:
            continue
        try:
            return InitializationReport.model_validate_json(terminated.get("message") or "")
        except ValidationError:
            continue
    return None


def _last_message(pods: list[dict[str, Any]]) -> str:
    for pod in _by_recency(pods):
        terminated = _terminated(pod)
        if terminated is not None:
            text = (terminated.get("message") or "").strip()
            code = terminated.get("exitCode")
            return (text.splitlines()[-1][:500] if text else "") or f"exit code {code}"
    return ""


def _waiting_reason(pods: list[dict[str, Any]]) -> str:
    """Why the initializer pod has not started, as the kubelet or scheduler says (ImagePullBackOff, Unschedulable, ...)."""
    for pod in _by_recency(pods):
        for cs in pod.get("status", {}).get("containerStatuses", []):
            waiting = cs.get("state", {}).get("waiting")
            if waiting and waiting.get("reason") not in (None, "ContainerCreating"):
                return f"the initializer pod is waiting: {waiting.get('reason')}: {waiting.get('message', '')}".strip()
        for condition in pod.get("status", {}).get("conditions", []):
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                return f"the initializer pod is not scheduled: {condition.get('message', condition.get('reason', ''))}"
    return ""


def initialization(ctx: Context) -> Decision | None:
    """Before the first trainer pod: the initializer fills the cache; its failure fails the job with its reason."""
    if not needs_initializer(ctx.job) or ctx.status.initialization is not None:
        return None
    if ctx.status.start_time is None:
        ctx.status.start_time = ctx.now  # the deadline counts the downloads too
    init = observe_initializer(
        [j for j in ctx.observed.jobs if is_initializer(j)], [p for p in ctx.observed.pods if is_initializer(p)], ctx.now
    )
    if init.state == "Failed":
        ctx.status.completion_time = ctx.now
        set_condition(ctx.status, INITIALIZED, "False", init.reason, init.message, ctx.now)
        # Its Job has ended (the pod and its log stay for `kubectl logs`); no trainer pod was ever made.
        return finish(ctx, "Failed", init.reason, init.message, events=(("Warning", init.reason, init.message),))
    if init.state != "Succeeded":
        set_condition(ctx.status, INITIALIZED, "False", init.reason, init.message, ctx.now)
        return finish(
            ctx, "Initializing", init.reason, init.message, create_initializer=init.state == "Missing", requeue_after=ACTIVE_SECONDS
        )
    ctx.status.initialization = init.status
    set_condition(ctx.status, INITIALIZED, "True", init.reason, init.message, ctx.now)
    ctx.events.append(("Normal", init.reason, init.message))
    return None
