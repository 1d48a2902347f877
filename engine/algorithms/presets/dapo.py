"""The dapo preset (Yu et al., 2025): GRPO's advantages with clip-higher, token-mean aggregation,
dynamic sampling and overlong reward shaping (its step, engine/steps/dynamic_sampling.py)."""

from __future__ import annotations

from pydantic import Field

from ...config.base import SpecModel
from .registry import register_preset

# DAPO's clip-higher bound when clipRatioHigh is not set (the paper's 0.28 over a clipRatio of 0.2).
DAPO_CLIP_HIGH = 0.28


class DAPOSpec(SpecModel):
    """DAPO's dynamic sampling and overlong reward shaping (the clip-higher bound is clipRatioHigh)."""

    max_draws: int = Field(default=3, ge=1, le=32)
    """Batches of prompts drawn at most per step to fill it with groups whose rewards differ; a step
    that is still short trains on the groups it has (at most 32: each draw is a whole rollout)."""
    overlong_buffer: int | None = Field(default=None, ge=0, le=1_000_000)
    """The last tokens before rollout.maxNewTokens over which the length penalty grows from 0 to
    overlongPenalty (default: a fifth of maxNewTokens, as DAPO's 4096 of 20480; 0 turns it off)."""
    overlong_penalty: float = Field(default=1.0, ge=0.0, le=100.0)
    """The penalty of a response cut at maxNewTokens, 0..100 (at most the scale of a reward)."""


register_preset(
    "dapo",
    summary="GRPO's advantages, clip-higher, token-mean, dynamic sampling and overlong shaping",
    advantage="grpo",
    policy_loss="ppo_clip",
    step="dynamic_sampling",
    options=DAPOSpec,
    policy_loss_options=lambda spec, block: {
        "clip_low": spec.clip_ratio,
        "clip_high": spec.clip_ratio_high or DAPO_CLIP_HIGH,
        "aggregation": "token_mean",
    },
)
