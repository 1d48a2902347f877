"""The progress contract between a job's controller rank and the operator.

The controller rank writes a ProgressReport as JSON under PROGRESS_KEY in the job's progress
ConfigMap (engine/runtime/progress.py); the operator reads it back with the same model and copies it
into the RLJob's status (operator/control/reconcile.py). Both import it from here, so a key cannot be renamed
on one side only; the engine still never imports the operator.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from .base import SpecModel

PROGRESS_KEY = "progress.json"


class CheckpointStatus(SpecModel):
    """The newest complete checkpoint: where a restarted job resumes from."""

    step: int = Field(ge=0)
    """The training step the checkpoint holds."""
    path: str
    """The step folder as the trainer pods see it (under trainer.checkpoint.path)."""
    time: datetime | None = None
    """When the checkpoint was committed (UTC)."""


class ProgressReport(SpecModel):
    """What the controller rank reports after every step."""

    step: int = Field(ge=0)
    total_steps: int | None = Field(default=None, ge=0)
    reward_mean: float | None = None
    kl: float | None = None
    tokens_per_second: float | None = Field(default=None, ge=0)
    last_checkpoint: CheckpointStatus | None = None
    eta_seconds: float | None = Field(default=None, ge=0)
    """Seconds until the last step, from the recent steps' times (engine/runtime/progress.py: eta_seconds);
    None while too few steps have been timed since the ranks started."""
    validation_reward_mean: float | None = None
    """The latest mean reward on the validation set (greedy responses), measured at `validation_step`."""
    validation_step: int | None = Field(default=None, ge=0)
    staleness: int | None = Field(default=None, ge=0)
    """How many policy versions the last step's batch was behind (rollout.placement: separate; None colocated)."""
    trainer_idle_fraction: float | None = Field(default=None, ge=0, le=1)
    """The share of the last step the trainers waited for the rollout fleet (rollout.placement: separate)."""
    rollout_idle_fraction: float | None = Field(default=None, ge=0, le=1)
    """The share of the rollout replicas' time spent waiting for a command, from their previous batch to the last step's."""

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True)
