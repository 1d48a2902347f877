"""What every rank reads at start: the job's sections and where each role sits in the world.

The operator renders an `EngineConfig` into the job's ConfigMap; `kuberl run` renders the same for
local processes. The engine never sees Kubernetes objects, only this.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .algorithm import AlgorithmSpec
from .base import SpecModel
from .data import DataSpec
from .layout import ParallelLayout
from .model import ModelSpec, TokenizerSpec
from .reward import RewardSpec
from .rollout import RolloutSpec
from .tracking import TrackingSpec
from .trainer import TrainerSpec

EngineRoleName = Literal["actor", "critic", "ref", "reward", "rollout"]


class RoleTopology(SpecModel):
    """A role's place in the torch.distributed world."""

    ranks: int = Field(ge=1)
    """How many ranks compute for the role."""
    rank_offset: int = Field(ge=0)
    """The global rank of the role's first rank (the actor's first rank is 0: the controller)."""
    procs_per_pod: int = Field(ge=1)
    """Ranks per pod (one per GPU); a pod's first rank is rankOffset + podIndex * procsPerPod."""
    layout: ParallelLayout
    rollout_tp: int = Field(default=1, ge=1)
    """Actor only: tensor-parallel size of each vLLM replica."""
    colocated_with: EngineRoleName | None = None
    """Set when the role runs on another role's ranks instead of its own."""


class EngineConfig(SpecModel):
    """Everything the engine needs to run one job."""

    job: str
    """The RLJob's name (for logs and metrics labels)."""
    world_size: int = Field(ge=1)
    master_port: int = Field(ge=1, le=65535)
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    """The controller rank's /metrics port; None disables the endpoint."""
    model: ModelSpec
    tokenizer: TokenizerSpec | None = None
    data: DataSpec
    algorithm: AlgorithmSpec
    rollout: RolloutSpec | None = None
    reward: RewardSpec | None = None
    trainer: TrainerSpec
    roles: dict[EngineRoleName, RoleTopology]
    tracking: list[TrackingSpec] = []
    """monitoring.tracking of the RLJob: the experiment trackers the controller rank writes to."""

    def own_rank_roles(self) -> list[tuple[str, RoleTopology]]:
        """Roles with ranks of their own (the actor first), in the order of their ranks."""
        own = [(name, topo) for name, topo in self.roles.items() if topo.colocated_with is None]
        return sorted(own, key=lambda item: item[1].rank_offset)

    def rank_roles(self) -> list[str]:
        """The role of every global rank (colocated roles share the actor's ranks)."""
        roles = ["actor"] * self.world_size
        for name, topo in self.own_rank_roles():
            for rank in range(topo.rank_offset, min(self.world_size, topo.rank_offset + topo.ranks)):
                roles[rank] = name
        return roles


def separate_rollout(config: EngineConfig) -> bool:
    """Whether roles.rollout generates on ranks of its own (rollout.placement: separate)."""
    return config.rollout is not None and config.rollout.placement == "separate" and "rollout" in config.roles


def max_staleness(config: EngineConfig) -> int:
    """How many policy versions a batch may lag (algorithm.async.maxStaleness; 0 without async)."""
    spec = config.algorithm.async_
    return spec.max_staleness if spec is not None else 0


def policy_temperature(config: EngineConfig) -> float:
    """What the actor's and the reference's logits are divided by (RolloutSpec.training_temperature);
    1 for a job that samples nothing (DPO learns from given pairs)."""
    if config.rollout is None or not config.algorithm.on_policy:
        return 1.0
    return config.rollout.training_temperature
