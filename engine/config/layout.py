"""The parallel layout of a role: Megatron's training layout and, for the actor, vLLM's."""

from __future__ import annotations

from pydantic import Field

from .base import Rule, SpecModel


class ParallelLayout(SpecModel):
    """Training layout tp x pp x dp over a role's ranks, and a mixture of experts' expert parallelism inside dp."""

    tp: int = Field(default=1, ge=1, le=1024)
    """Tensor-parallel size."""
    pp: int = Field(default=1, ge=1, le=1024)
    """Pipeline-parallel size."""
    dp: int = Field(default=1, ge=1, le=65536)
    """Data-parallel size."""
    ep: int | None = Field(default=None, ge=1, le=1024)
    """Expert-parallel size (default 1), for a mixture-of-experts model only: each stage's experts are split
    over ep ranks, which come out of the data-parallel ranks (as megatron-core's expert_model_parallel_size:
    the attention stays data-parallel over them). It must divide dp and the model's experts."""

    RULES = (
        Rule(
            message="ep must divide dp: the expert-parallel ranks are data-parallel ranks of the rest of the model",
            check=lambda s: s.dp % s.expert_parallel == 0,
            cel="!has(self.ep) || self.dp % self.ep == 0",
            field="ep",
            detail=lambda s: f"dp = {s.dp}, ep = {s.ep}",
        ),
    )

    @property
    def expert_parallel(self) -> int:
        """ep, 1 where it is left out."""
        return self.ep or 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp


class ActorLayout(ParallelLayout):
    """The actor's training layout, and the tensor-parallel size of its vLLM replicas."""

    rollout_tp: int | None = Field(default=None, ge=1, le=1024)
    """Tensor-parallel size of each vLLM replica (default 1); it must divide tp. At 1 or tp each rank
    receives exactly HybridFlow's bytes when the actor switches to generation."""

    RULES = (
        *ParallelLayout.RULES,
        Rule(
            message="rolloutTp must divide tp: a rollout replica's shard is made of whole training TP shards",
            check=lambda s: s.rollout_tp is None or s.tp % s.rollout_tp == 0,
            cel="!has(self.rolloutTp) || self.tp % self.rolloutTp == 0",
            field="rolloutTp",
            detail=lambda s: f"tp = {s.tp}, rolloutTp = {s.rollout_tp}",
        ),
    )
