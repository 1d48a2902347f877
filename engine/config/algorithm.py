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
    """Discount per token, 0..1 (above 1 a return would grow with the response's length)."""
    lam: float = Field(default=0.95, ge=0.0, le=1.0, alias="lambda")
    """GAE's lambda, 0..1: 0 is one-step TD, 1 is Monte Carlo; outside that range it mixes neither."""
    whiten: bool = True
    """Whiten the advantages over the step's batch (mean 0, std 1), as PPO implementations do by
    default; false keeps their scale, which then follows the reward's."""


class PPOSpec(SpecModel):
    """PPO with a learned critic."""

    gae: GAESpec = GAESpec()
    value_clip: float = Field(default=0.2, ge=0.0, le=1000.0)
    """Clip range of the value update around the old values; 0 disables clipping (a range cannot be negative)."""
    value_loss_coef: float = Field(default=0.5, gt=0.0, le=1000.0)
    """Weight of the critic's loss; above 0, since 0 would not train the critic."""


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
    """Strength of the implicit KL constraint; above 0 (0 would remove the constraint and the loss's scale)."""
    label_smoothing: float = Field(default=0.0, ge=0.0, lt=0.5)
    """Assumed probability that a preference label is flipped (conservative DPO); below 0.5, which would make every pair uninformative."""


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
    """PPO-style clipping of the probability ratio: 1 - clipRatio .. 1 + clipRatio; strictly between 0
    (no update could move the policy) and 1 (the lower bound would be a ratio of 0)."""
    clip_ratio_high: float | None = Field(default=None, gt=0.0, lt=10.0)
    """Upper clip bound when it differs from clipRatio (asymmetric clipping, as in DAPO); below 10, past
    which clipping no longer bounds the update."""
    kl_coef: float = Field(default=0.0, ge=0.0, le=100.0)
    """Weight of the KL divergence to the reference policy; above 0 it needs roles.ref. At most 100:
    a larger weight only keeps the policy at the reference."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token KL estimator (Schulman's k1, k2, k3)."""
    kl_in_reward: bool = False
    """Subtract the KL from the reward (PPO style) instead of adding it to the loss."""
    entropy_coef: float = Field(default=0.0, ge=0.0, le=10.0)
    """Weight of the entropy bonus, 0..10 (a negative weight would punish exploration; past 10 the
    bonus drowns the reward)."""
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
            message="klInReward needs klCoef > 0: there is no KL term to move into the reward",
            check=lambda s: not s.kl_in_reward or s.kl_coef > 0.0,
            cel="!self.klInReward || self.klCoef > 0.0",
            field="klInReward",
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
