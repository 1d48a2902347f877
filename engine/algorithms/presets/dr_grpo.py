"""The dr_grpo preset (Liu et al., 2025): GRPO without the std, and a constant length normaliser."""

from __future__ import annotations

from .registry import clip_options, register_preset

register_preset(
    "dr_grpo",
    summary="GRPO without the group's std, and a constant length normaliser (seq_mean_token_sum_norm)",
    advantage="grpo",
    policy_loss="ppo_clip",
    advantage_options=lambda spec, block: {"normalize_by_std": False},
    policy_loss_options=lambda spec, block: {**clip_options(spec), "aggregation": "seq_mean_token_sum_norm"},
)
