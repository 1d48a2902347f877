"""The rloo preset: leave-one-out baselines, PPO's clipped surrogate (Ahmadian et al., 2024)."""

from __future__ import annotations

from .registry import clip_options, register_preset

register_preset(
    "rloo",
    summary="score minus the mean of the other samples of its prompt, PPO's clipped surrogate",
    advantage="rloo",
    policy_loss="ppo_clip",
    policy_loss_options=clip_options,
)
