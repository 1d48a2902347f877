"""The ppo preset: GAE over a learned critic, PPO's clipped surrogate (Schulman et al., 2017)."""

from __future__ import annotations

from pydantic import Field

from ...config.base import SpecModel
from .registry import clip_options, register_preset


class GAESpec(SpecModel):
    """Generalised advantage estimation."""

    gamma: float = Field(default=1.0, ge=0.0, le=1.0)
    """Discount per token, 0..1 (above 1 a return would grow with the response's length)."""
    lam: float = Field(default=0.95, ge=0.0, le=1.0, alias="lambda")
    """GAE's lambda, 0..1: 0 is one-step TD, 1 is Monte Carlo; outside that range it mixes neither."""
    whiten: bool = True
    """Whiten the advantages over the step's batch (mean 0, std 1), as PPO implementations do by
    default; false keeps their scale, which then follows the reward's."""


class PPOSpec(SpecModel):
    """PPO with a learned critic."""

    gae: GAESpec = GAESpec()
    value_clip: float = Field(default=0.2, ge=0.0, le=1000.0)
    """Clip range of the value update around the old values; 0 disables clipping (a range cannot be negative)."""
    value_loss_coef: float = Field(default=0.5, gt=0.0, le=1000.0)
    """Weight of the critic's loss; above 0, since 0 would not train the critic."""


register_preset(
    "ppo",
    summary="GAE with a learned critic (roles.critic) and PPO's clipped surrogate",
    advantage="gae",
    policy_loss="ppo_clip",
    options=PPOSpec,
    policy_loss_options=clip_options,
    advantage_options=lambda spec, block: {"gamma": block.gae.gamma, "lam": block.gae.lam, "whiten": block.gae.whiten},
)
