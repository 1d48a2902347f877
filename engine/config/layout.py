"""The parallel layout of a role: Megatron's training layout and, for the actor, vLLM's."""

from __future__ import annotations

from pydantic import Field

from .base import Rule, SpecModel


class ParallelLayout(SpecModel):
    """Training layout tp x pp x dp over a role's ranks."""

    tp: int = Field(default=1, ge=1, le=1024)
    """Tensor-parallel size."""
    pp: int = Field(default=1, ge=1, le=1024)
    """Pipeline-parallel size."""
    dp: int = Field(default=1, ge=1, le=65536)
    """Data-parallel size."""
    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp


class ActorLayout(ParallelLayout):
    """The actor's training layout, and the tensor-parallel size of its vLLM replicas."""

    rollout_tp: int | None = Field(default=None, ge=1, le=1024)
    """Tensor-parallel size of each vLLM replica (default 1); it must divide tp. At 1 or tp each rank
    receives exactly HybridFlow's bytes when the actor switches to generation."""

    RULES = (
        Rule(
            message="rolloutTp must divide tp: a rollout replica's shard is made of whole training TP shards",
            check=lambda s: s.rollout_tp is None or s.tp % s.rollout_tp == 0,
            cel="!has(self.rolloutTp) || self.tp % self.rolloutTp == 0",
            field="rolloutTp",
            detail=lambda s: f"tp = {s.tp}, rolloutTp = {s.rollout_tp}",
        ),
    )

