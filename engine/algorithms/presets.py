"""What `algorithm.name` means: which registered estimator and policy loss, with which options.

A pure function of the spec, so that the step, the losses and the checks all read one answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..config.algorithm import AlgorithmSpec, GRPOSpec, PPOSpec, ReinforcePPSpec


@dataclass(frozen=True)
class AlgorithmChoice:
    advantage: str
    """A name in ADVANTAGES; empty for dpo, which has no advantages."""
    advantage_options: dict[str, Any] = field(default_factory=dict)
    policy_loss: str = "ppo_clip"
    """A name in POLICY_LOSSES; empty for dpo."""
    policy_loss_options: dict[str, Any] = field(default_factory=dict)


def choice_of(spec: AlgorithmSpec) -> AlgorithmChoice:
    """The registry entries and options behind a spec's preset (ppo, grpo, rloo, reinforce_pp, dpo)."""
    loss_options = {"clip_low": spec.clip_ratio, "clip_high": spec.clip_ratio_high, "aggregation": spec.loss_aggregation}
    if spec.name == "ppo":
        gae = (spec.ppo or PPOSpec()).gae
        return AlgorithmChoice("gae", {"gamma": gae.gamma, "lam": gae.lam, "whiten": gae.whiten}, "ppo_clip", loss_options)
    if spec.name == "grpo":
        return AlgorithmChoice("grpo", {"normalize_by_std": (spec.grpo or GRPOSpec()).normalize_by_std}, "ppo_clip", loss_options)
    if spec.name == "rloo":
        return AlgorithmChoice("rloo", {}, "ppo_clip", loss_options)
    if spec.name == "reinforce_pp":
        return AlgorithmChoice("reinforce_pp", {"baseline": (spec.reinforce_pp or ReinforcePPSpec()).baseline}, "ppo_clip", loss_options)
    # dpo trains on preference pairs with its own loss (algorithms.preference), not these registries.
    return AlgorithmChoice("", {}, "", {})
