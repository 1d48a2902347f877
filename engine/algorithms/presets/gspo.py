"""The gspo preset: GRPO's advantages with GSPO's sequence-ratio loss and its own clip range
(3e-4 / 4e-4 on a sequence ratio, orders of magnitude below PPO's: the loss's defaults, not clipRatio)."""

from __future__ import annotations

from .registry import register_preset

register_preset(
    "gspo", summary="GRPO's advantages, GSPO's clipped sequence-level ratio with its own clip range", advantage="grpo", policy_loss="gspo"
)
