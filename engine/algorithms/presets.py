"""What `algorithm.name` means: which registered estimator and policy loss, with which options.

A pure function of the spec, so that the step, the losses and the checks all read one answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


from ..config.algorithm import PRESET_ADVANTAGE, PRESET_STEP, AlgorithmSpec, GRPOSpec, PPOSpec, ReinforcePPSpec, option_python_name
from .registry import AdvantageEstimator, advantage_estimator


@dataclass(frozen=True)
class AlgorithmChoice:
    advantage: str
    """A name in ADVANTAGES; empty for dpo, which has no advantages."""
    advantage_options: dict[str, Any] = field(default_factory=dict)
    policy_loss: str = "ppo_clip"
    """A name in POLICY_LOSSES; empty for dpo."""
    policy_loss_options: dict[str, Any] = field(default_factory=dict)
    step: str = "on_policy"
    """A name in engine.steps' registry: the function that runs one step."""


def choice_of(spec: AlgorithmSpec) -> AlgorithmChoice:
    """The registry entries and options that run: the preset's, with `advantage` and `policyLoss` in their place when set."""
    choice = _preset(spec)
    if spec.advantage is not None:
        choice = replace(choice, advantage=spec.advantage.name, advantage_options=_kwargs(spec.advantage.options))
    if spec.policy_loss is not None:
        choice = replace(choice, policy_loss=spec.policy_loss.name, policy_loss_options=_kwargs(spec.policy_loss.options))
    if spec.step is not None:
        choice = replace(choice, step=spec.step.name)
    return choice


def estimator_of(spec: AlgorithmSpec) -> AdvantageEstimator | None:
    """The registered estimator that runs (None for dpo); a plug-in's once its file is loaded."""
    name = choice_of(spec).advantage
    return advantage_estimator(name) if name else None


def _kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """Manifest option names (camelCase) as the functions' keyword arguments."""
    return {option_python_name(k): v for k, v in options.items()}


# DAPO's clip-higher bound when clipRatioHigh is not set (the paper's 0.28 over a clipRatio of 0.2).
DAPO_CLIP_HIGH = 0.28


def _preset(spec: AlgorithmSpec) -> AlgorithmChoice:
    """The registry entries and options behind a spec's preset."""
    step = PRESET_STEP.get(spec.name, "on_policy")
    if spec.name not in PRESET_ADVANTAGE:
        # dpo trains on preference pairs with its own loss (algorithms.preference), not these registries.
        return AlgorithmChoice("", {}, "", {}, step)
    options: dict[str, Any] = {}
    loss, loss_options = "ppo_clip", {"clip_low": spec.clip_ratio, "clip_high": spec.clip_ratio_high, "aggregation": spec.loss_aggregation}
    if spec.name == "ppo":
        gae = (spec.ppo or PPOSpec()).gae
        options = {"gamma": gae.gamma, "lam": gae.lam, "whiten": gae.whiten}
    elif spec.name == "grpo":
        options = {"normalize_by_std": (spec.grpo or GRPOSpec()).normalize_by_std}
    elif spec.name == "reinforce_pp":
        options = {"baseline": (spec.reinforce_pp or ReinforcePPSpec()).baseline}
    elif spec.name == "dapo":
        loss_options = {"clip_low": spec.clip_ratio, "clip_high": spec.clip_ratio_high or DAPO_CLIP_HIGH, "aggregation": "token_mean"}
    elif spec.name == "dr_grpo":
        options = {"normalize_by_std": False}
        loss_options["aggregation"] = "seq_mean_token_sum_norm"
    elif spec.name in ("gspo", "cispo"):
        # Their own clip ranges differ from PPO's by orders of magnitude (GSPO's 3e-4 on a sequence
        # ratio, CISPO's bound on a detached weight): the registered defaults, not clipRatio.
        loss, loss_options = spec.name, {}
    return AlgorithmChoice(PRESET_ADVANTAGE[spec.name], options, loss, loss_options, step)
