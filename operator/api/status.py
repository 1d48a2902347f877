"""RLJobStatus: what the operator observed and what the job's controller rank reported."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from kuberl.engine.config import CheckpointStatus, SpecModel

Phase = Literal["Pending", "Starting", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]
PHASES: tuple[Phase, ...] = ("Pending", "Starting", "Running", "Restarting", "Succeeded", "Failed", "Suspended")


class Condition(SpecModel):
    """A condition in the shape of metav1.Condition."""

    type: str = Field(min_length=1, max_length=316, pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    """A CamelCase word for machines."""
    message: str = Field(default="", max_length=32768)
    """A sentence for people."""
    last_transition_time: datetime
    observed_generation: int | None = Field(default=None, ge=0)


class RoleStatus(SpecModel):
    """Pod counts of one role."""

    active: int = Field(default=0, ge=0)
    ready: int = Field(default=0, ge=0)
    succeeded: int = Field(default=0, ge=0)
    failed: int = Field(default=0, ge=0)


class MetricsSnapshot(SpecModel):
    """The latest training metrics, reported by the job's controller rank."""

    reward_mean: float | None = None
    kl: float | None = None
    tokens_per_second: float | None = Field(default=None, ge=0.0)


class RLJobStatus(SpecModel):
    phase: Phase | None = None
    conditions: list[Condition] = Field(
        default=[],
        max_length=32,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    roles: dict[str, RoleStatus] = {}
    """Pod counts by role."""
    step: int | None = Field(default=None, ge=0)
    """The last finished training step."""
    total_steps: int | None = Field(default=None, ge=0)
    restarts: int = Field(default=0, ge=0)
    """Gang restarts so far."""
    last_checkpoint: CheckpointStatus | None = None
    metrics: MetricsSnapshot | None = None
    start_time: datetime | None = None
    completion_time: datetime | None = None
    observed_generation: int | None = Field(default=None, ge=0)
