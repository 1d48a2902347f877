"""What one reconcile decides from: the RLJob, what exists of its children, and the time; what it decides."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ...api import Phase, RLJob, RLJobStatus
from .conditions import set_phase


@dataclass(frozen=True)
class Observed:
    """The children of one RLJob as read from the API (plain dicts, as the API returns them)."""

    jobsets: list[dict[str, Any]] = field(default_factory=list)
    """The job's JobSet (normally one; a second while a deleted one is going away)."""
    jobs: list[dict[str, Any]] = field(default_factory=list)
    """batch Jobs of the job: its initializer (the trainers' Jobs are the JobSet's)."""
    trainer_jobs: list[dict[str, Any]] = field(default_factory=list)
    """The JobSet's Jobs, one per role (and failed ones deleted a moment ago): their Failed condition names the role
    whose pod failed when the pod is gone."""
    gone_pods: list[dict[str, Any]] = field(default_factory=list)
    """Failed pods deleted a moment ago (a gang restart removes them), as last seen: read for how an attempt ended."""

    @property
    def failed_pods_too(self) -> list[dict[str, Any]]:
        """The pods, and the failed ones already deleted: for naming what ended an attempt, never for counting."""
        return self.pods + self.gone_pods

    pods: list[dict[str, Any]] = field(default_factory=list)
    workloads: list[dict[str, Any]] = field(default_factory=list)
    """Kueue's Workloads of the job's JobSet (none where the job is not queued or Kueue is absent)."""
    progress: str | None = None
    """The raw progress.json text, if the controller rank wrote one."""


@dataclass(frozen=True)
class Decision:
    status: RLJobStatus
    create_jobset: bool = False
    """Create the JobSet (every pod of every role)."""
    create_initializer: bool = False
    """Create the initializer's Job (it fills the cache before any trainer pod)."""
    delete: tuple[str, ...] = ()
    """Children to delete, as "kind/name" (their pods go with them)."""
    delete_rljob: bool = False
    """ttlSecondsAfterFinished has passed."""
    requeue_after: float | None = None
    events: tuple[tuple[str, str, str], ...] = ()
    """(type, reason, message) events to record on the RLJob."""
    message: str = ""
    """Why the job is in its phase, for the log."""
    progress_refused: str | None = None
    """Why the progress report was refused (bounded; the controller records it as a Warning event once)."""


@dataclass
class Context:
    """One reconcile's inputs and the status it builds; each policy reads it and may add to the status."""

    job: RLJob
    observed: Observed
    now: datetime
    old: RLJobStatus
    status: RLJobStatus
    jobset: dict[str, Any] | None
    """The live JobSet (not being deleted), if any."""
    pods: list[dict[str, Any]]
    """The trainer pods of the JobSet's current restart."""
    events: list[tuple[str, str, str]] = field(default_factory=list)


def finish(ctx: Context, phase: Phase, reason: str, message: str, **kw: Any) -> Decision:
    """The decision that ends this reconcile: `phase` with its reason, and the actions in `kw`."""
    set_phase(ctx.status, phase, reason, message, ctx.now)
    events = (*ctx.events, *kw.pop("events", ()))
    return Decision(status=ctx.status, message=message, events=events, **kw)
