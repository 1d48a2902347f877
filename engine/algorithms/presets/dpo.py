"""The dpo preset: direct preference optimisation on the data's (chosen, rejected) pairs against the
reference policy; no rollout and no reward (its step, engine/steps/dpo.py)."""

from __future__ import annotations

from pydantic import Field

from ...config.base import SpecModel
from .registry import register_preset


class DPOSpec(SpecModel):
    """Direct preference optimisation."""

    beta: float = Field(default=0.1, gt=0.0, le=100.0)
    """Strength of the implicit KL constraint; above 0 (0 would remove the constraint and the loss's scale)."""
    label_smoothing: float = Field(default=0.0, ge=0.0, lt=0.5)
    """Assumed probability that a preference label is flipped (conservative DPO); below 0.5, which would make every pair uninformative."""


register_preset(
    "dpo",
    summary="DPO's loss on the data's preference pairs against the reference policy (no rollout, no reward)",
    advantage=None,
    policy_loss="dpo",
    step="dpo",
    options=DPOSpec,
    pairs=True,
    needs_reference=True,
    policy_loss_options=lambda spec, block: {"beta": block.beta, "label_smoothing": block.label_smoothing},
)
