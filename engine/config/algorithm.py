"""The RL algorithm and its hyperparameters.

Options common to the policy-gradient family sit at the top; what belongs to one algorithm sits in
a block named after it, and a block for another algorithm than the one chosen is an error.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Rule, SpecModel

AlgorithmName = Literal["ppo", "grpo", "rloo", "reinforce_pp", "dpo"]
# Algorithms that compare several samples of the same prompt to form their baseline.
GROUP_BASELINE_ALGORITHMS: tuple[AlgorithmName, ...] = ("grpo", "rloo")


class GAESpec(SpecModel):
    """Generalised advantage estimation."""

    gamma: float = Field(default=1.0, ge=0.0, le=1.0)
    """Discount per token."""
    lam: float = Field(default=0.95, ge=0.0, le=1.0, alias="lambda")
    """GAE's lambda: 0 is one-step TD, 1 is Monte Carlo."""


class PPOSpec(SpecModel):
    """PPO with a learned critic."""

    gae: GAESpec = GAESpec()
    value_clip: float = Field(default=0.2, ge=0.0)
    """Clip range of the value update around the old values; 0 disables clipping."""
    value_loss_coef: float = Field(default=0.5, gt=0.0)
    """Weight of the critic's loss."""


class GRPOSpec(SpecModel):
    """Group relative policy optimisation."""

    normalize_by_std: bool = True
    """Divide group-centred rewards by the group's standard deviation (false: Dr. GRPO)."""


class ReinforcePPSpec(SpecModel):
    """REINFORCE++."""

    baseline: bool = True
    """Subtract the mean reward of the prompt's samples before the global normalisation."""


class DPOSpec(SpecModel):
    """Direct preference optimisation."""

    beta: float = Field(default=0.1, gt=0.0, le=100.0)
    """Strength of the implicit KL constraint."""
    label_smoothing: float = Field(default=0.0, ge=0.0, le=0.5)
    """Assumed probability that a preference label is flipped (conservative DPO); 0.5 would make every pair uninformative."""


def _block_rule(block: str, attr: str, algorithm: str) -> Rule:
    return Rule(
        message=f"{block} applies only to name: {algorithm}",
        check=lambda s: getattr(s, attr) is None or s.name == algorithm,
        cel=f"!has(self.{block}) || self.name == '{algorithm}'",
        field=block,
    )


class AlgorithmSpec(SpecModel):
    """Which algorithm, and how it weighs its terms."""

    name: AlgorithmName
    """ppo (needs a critic), grpo, rloo, reinforce_pp or dpo (preference pairs, no rollout)."""
    clip_ratio: float = Field(default=0.2, gt=0.0, lt=1.0)
    """PPO-style clipping of the probability ratio: 1 - clipRatio .. 1 + clipRatio."""
    clip_ratio_high: float | None = Field(default=None, gt=0.0, lt=10.0)
    """Upper clip bound when it differs from clipRatio (asymmetric clipping)."""
    kl_coef: float = Field(default=0.0, ge=0.0, le=100.0)
    """Weight of the KL divergence to the reference policy; above 0 it needs roles.ref."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token KL estimator (Schulman's k1, k2, k3)."""
    kl_in_reward: bool = False
    """Subtract the KL from the reward (PPO style) instead of adding it to the loss."""
    entropy_coef: float = Field(default=0.0, ge=0.0, le=10.0)
    """Weight of the entropy bonus."""
    loss_aggregation: Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"] = "token_mean"
    """How per-token losses become one number."""
    update_epochs: int = Field(default=1, ge=1, le=100)
    """Passes over each step's rollouts."""
    ppo: PPOSpec | None = None
    grpo: GRPOSpec | None = None
    reinforce_pp: ReinforcePPSpec | None = None
    dpo: DPOSpec | None = None

    RULES = (
        _block_rule("ppo", "ppo", "ppo"),
        _block_rule("grpo", "grpo", "grpo"),
        _block_rule("reinforcePp", "reinforce_pp", "reinforce_pp"),
        _block_rule("dpo", "dpo", "dpo"),
        Rule(
            message="clipRatioHigh must be at least clipRatio",
            check=lambda s: s.clip_ratio_high is None or s.clip_ratio_high >= s.clip_ratio,
            cel="!has(self.clipRatioHigh) || self.clipRatioHigh >= self.clipRatio",
            field="clipRatioHigh",
            detail=lambda s: f"{s.clip_ratio_high} < {s.clip_ratio}",
        ),
        Rule(
            message="dpo has no klCoef: its KL constraint is dpo.beta",
            check=lambda s: s.name != "dpo" or s.kl_coef == 0.0,
            cel="self.name != 'dpo' || self.klCoef == 0.0",
            field="klCoef",
        ),
    )

    @property
    def needs_reference(self) -> bool:
        """Whether a reference policy must compute log-probs."""
        return self.name == "dpo" or self.kl_coef > 0.0

    @property
    def needs_critic(self) -> bool:
        return self.name == "ppo"
