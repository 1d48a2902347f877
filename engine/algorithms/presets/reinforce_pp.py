"""The reinforce_pp preset: REINFORCE++'s whitened returns, PPO's clipped surrogate (Hu, 2025)."""

from __future__ import annotations

from pydantic import Field

from ...config.base import SpecModel
from .registry import clip_options, register_preset


class ReinforcePPSpec(SpecModel):
    """REINFORCE++."""

    baseline: bool | None = None
    """Subtract the mean reward of the prompt's samples before the global normalisation (REINFORCE++-baseline).
    Default: when rollout.samplesPerPrompt is at least 2; with one sample per prompt there is no group to take a mean of."""
    gamma: float = Field(default=1.0, ge=0.0, le=1.0)
    """Discount per token of the return-to-go, 0..1 (above 1 a return would grow with the response's length)."""


register_preset(
    "reinforce_pp",
    summary="return-to-go whitened over the batch (after a group baseline with several samples), PPO's clipped surrogate",
    advantage="reinforce_pp",
    policy_loss="ppo_clip",
    options=ReinforcePPSpec,
    policy_loss_options=clip_options,
)
