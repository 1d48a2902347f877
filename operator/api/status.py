"""RLJobStatus: what the operator observed and what the job's controller rank reported."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from kuberl.engine.config import CheckpointStatus, SpecModel
from kuberl.engine.config.initialization import FetchedRepo

Phase = Literal["Pending", "Initializing", "Queued", "Starting", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]
PHASES: tuple[Phase, ...] = ("Pending", "Initializing", "Queued", "Starting", "Running", "Restarting", "Succeeded", "Failed", "Suspended")


class Condition(SpecModel):
    """A condition in the shape of metav1.Condition."""

    type: str = Field(min_length=1, max_length=316, pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
    """A phase (Initializing, Queued, Running, Restarting, Suspended, Succeeded, Failed) or Initialized."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds now."""
    reason: str = Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    """A CamelCase word for machines."""
    message: str = Field(default="", max_length=32768)
    """A sentence for people."""
    last_transition_time: datetime
    """When status last changed."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The RLJob's metadata.generation the condition was set for."""


class RoleStatus(SpecModel):
    """Pod counts of one role."""

    active: int = Field(default=0, ge=0)
    """Pods of the current attempt that are pending or running."""
    ready: int = Field(default=0, ge=0)
    """Pods that are running and ready."""
    succeeded: int = Field(default=0, ge=0)
    """Pods that exited 0."""
    failed: int = Field(default=0, ge=0)
    """Pods that failed (each one restarts the whole gang)."""


class MetricsSnapshot(SpecModel):
    """The latest training metrics, reported by the job's controller rank."""

    reward_mean: float | None = None
    """The mean reward of the last step's responses."""
    kl: float | None = None
    """The policy's KL divergence from the reference policy at the last step."""
    tokens_per_second: float | None = Field(default=None, ge=0.0)
    """Generated tokens per second of the last step's rollout."""
    staleness: int | None = Field(default=None, ge=0)
    """How many policy versions the last step's batch was behind the policy it trained (rollout.placement: separate)."""
    trainer_idle_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    """The share of the last step the trainers waited for the rollout fleet's batch (rollout.placement: separate)."""
    rollout_idle_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    """The share of the rollout replicas' time spent waiting for a command, from their previous batch to the last step's."""


class InitializationStatus(SpecModel):
    """What the initializer put in the cache volume, once it has finished."""

    repos: list[FetchedRepo] = Field(default=[], max_length=8)
    """Each hub repository with the commit the trainer pods load."""
    fetched_bytes: int = Field(default=0, ge=0)
    """Downloaded by the initializer; 0 when the cache held everything already."""
    completion_time: datetime | None = None
    """When the initializer finished."""

    def commit_of(self, field: str) -> str | None:
        return next((r.commit for r in self.repos if r.field == field), None)


MAX_FAILURES = 8


class AttemptFailure(SpecModel):
    """How one attempt of the job ended: the pod whose failure ended it, and its last words."""

    attempt: int = Field(ge=0)
    """The attempt (0 is the first; each gang restart starts the next)."""
    pod: str = Field(max_length=253)
    """The pod whose failure ended it: one whose rank failed by itself rather than one stopped after it."""
    role: str = Field(max_length=16)
    """That pod's role."""
    exit_code: int | None = None
    """Its trainer container's exit code (3: the rank said a restart cannot help; 128 + n: killed by signal n)."""
    reason: str = Field(max_length=64)
    """The rank's reason (InvalidConfig, ModelNotFound, ...), else the kubelet's (Error, OOMKilled, ...)."""
    message: str = Field(default="", max_length=4096)
    """The rank's own report, else its termination message: the tail of its log where it wrote none."""


class RLJobStatus(SpecModel):
    """What the operator observed and what the job's controller rank reported."""

    phase: Phase | None = None
    """Pending, Initializing (fetching the hub repositories), Queued (waiting for Kueue to admit every pod, or preempted
    and waiting again), Starting, Running, Restarting, Succeeded, Failed or Suspended."""
    conditions: list[Condition] = Field(
        default=[],
        max_length=32,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """One per phase the job has been in, and Initialized; the reason and message of each say why."""
    roles: dict[str, RoleStatus] = {}
    """Pod counts by role."""
    step: int | None = Field(default=None, ge=0)
    """The last finished training step."""
    total_steps: int | None = Field(default=None, ge=0)
    """The steps the job will train (trainer.totalSteps, or the epochs' steps)."""
    progress: int | None = Field(default=None, ge=0, le=100)
    """Percent of totalSteps done: 100 * step / totalSteps, rounded down."""
    eta_seconds: int | None = Field(default=None, ge=0)
    """Seconds until the last step, as the controller rank estimated at its last report: the mean time of its
    recent steps times the steps left. Unset ("unknown") until it has timed 3 steps since its pods started."""
    validation_reward: float | None = None
    """The latest mean reward of greedy responses on data.validation (every trainer.validationInterval steps)."""
    validation_step: int | None = Field(default=None, ge=0)
    """The step at which validationReward was measured."""
    restarts: int = Field(default=0, ge=0)
    """Gang restarts so far (a failed pod restarts every pod from the last checkpoint); runPolicy.backoffLimit bounds them."""
    failures: list[AttemptFailure] = Field(default=[], max_length=MAX_FAILURES)
    """How each of the last attempts that failed ended (the newest last): `kubectl rl logs --previous` prints them."""
    preemptions: int = Field(default=0, ge=0)
    """Times Kueue took the job's admission back (preempted by a higher priority, quota reclaimed, pods not ready in
    time): its pods stopped at a step boundary with a checkpoint and it waited again. Not counted as restarts."""
    admitted_time: datetime | None = None
    """When Kueue last admitted the job (queued jobs only)."""
    last_checkpoint: CheckpointStatus | None = None
    initialization: InitializationStatus | None = None
    """Set when the initializer has filled the cache (jobs that name a hub repository)."""
    metrics: MetricsSnapshot | None = None
    """The latest training metrics."""
    start_time: datetime | None = None
    """When the job (or its initializer) started; runPolicy.activeDeadlineSeconds counts from here."""
    completion_time: datetime | None = None
    """When the job succeeded or failed."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The RLJob's metadata.generation that the status reflects."""


def progress_percent(step: int | None, total_steps: int | None) -> int | None:
    """100 * step / total_steps, rounded down and kept within 0-100; None when either is unknown (or no step is planned)."""
    if step is None or not total_steps:
        return None
    return max(0, min(100, 100 * step // total_steps))
