"""The grpo preset: group-relative advantages, PPO's clipped surrogate (Shao et al., 2024)."""

from __future__ import annotations

from ...config.base import SpecModel
from .registry import clip_options, register_preset


class GRPOSpec(SpecModel):
    """Group relative policy optimisation."""

    normalize_by_std: bool = True
    """Divide group-centred rewards by the group's standard deviation (false: Dr. GRPO)."""


register_preset(
    "grpo",
    summary="score minus its group's mean over the group's std, PPO's clipped surrogate",
    advantage="grpo",
    policy_loss="ppo_clip",
    options=GRPOSpec,
    policy_loss_options=clip_options,
)
