"""The cispo preset: GRPO's advantages with CISPO's loss and its own bound on the detached weight."""

from __future__ import annotations

from .registry import register_preset

register_preset("cispo", summary="GRPO's advantages, CISPO's clipped and detached importance weight", advantage="grpo", policy_loss="cispo")
