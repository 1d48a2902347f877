"""The RL algorithm and its hyperparameters.

Options common to the policy-gradient family sit at the top; what belongs to one preset sits in a
block named after it, and a block for another preset than the one chosen is an error. The presets,
their blocks and their traits come from the generated catalog (algorithm_catalog.py), and the rules
here are written over those traits: none names a preset.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from . import algorithm_catalog as catalog
from .algorithm_rules import (
    ALGORITHM_RULES,
    CRITIC_PRESETS,
    GROUP_PRESETS,
    group_baseline_cel,
    needs_critic_cel,
    option_rule,
)
from .base import LocalPath, Rule, SpecModel, pattern
from .options import option_manifest_name, option_python_name

__all__ = [
    "AdvantageChoice",
    "AlgorithmName",
    "AsyncSpec",
    "AlgorithmSpec",
    "PRESET_ADVANTAGE",
    "PRESET_STEP",
    "PluginFile",
    "PolicyLossChoice",
    "StepChoice",
    "TISSpec",
    "group_baseline_cel",
    "needs_critic_cel",
    "option_manifest_name",
    "option_python_name",
]

AlgorithmName = catalog.AlgorithmName
"""The built-in presets (a plug-in may register more)."""
# What each preset's estimator and step are (engine/algorithms/presets/ fills in their options).
PRESET_ADVANTAGE: dict[str, str] = {name: p.advantage for name, p in catalog.PRESETS.items() if p.advantage}
PRESET_STEP: dict[str, str] = {name: p.step for name, p in catalog.PRESETS.items()}
CRITIC_ALGORITHMS, GROUP_BASELINE_ALGORITHMS = CRITIC_PRESETS, GROUP_PRESETS

# Options are checked here only: the CRD keeps them as free values (each entry has its own), and
# CEL cannot range over such a map. Names and options of plug-in entries are checked when the
# engine has loaded the plug-ins (engine/runtime/plugins.py), before any model loads.
ENTRY_NAME = pattern(r"^[a-z][a-z0-9_]*$", "a registered name: lower-case letters, digits and '_', starting with a letter")


class AdvantageChoice(SpecModel):
    """An advantage estimator by its registered name (`kuberl algorithms` lists them) and its options."""

    name: str = Field(min_length=1, max_length=64, pattern=ENTRY_NAME)
    """A registered estimator: a built-in (`kuberl algorithms` lists them) or one of algorithm.plugins."""
    options: dict[str, Any] = Field(default={}, max_length=32)
    """Keyword options of the estimator, by their camelCase names (e.g. normalizeByStd: false)."""

    RULES = (option_rule(catalog.ADVANTAGES),)


class PolicyLossChoice(SpecModel):
    """A policy loss by its registered name (`kuberl algorithms` lists them) and its options."""

    name: str = Field(min_length=1, max_length=64, pattern=ENTRY_NAME)
    """A registered policy loss: a built-in (`kuberl algorithms` lists them) or one of algorithm.plugins."""
    options: dict[str, Any] = Field(default={}, max_length=32)
    """Keyword options of the loss, by their camelCase names (e.g. clipHigh: 0.28)."""

    RULES = (option_rule(catalog.POLICY_LOSSES),)


class PluginFile(SpecModel):
    """A Python file that registers estimators, losses, steps or presets with kuberl.engine's decorators."""

    path: LocalPath
    """The .py file; every rank of the job imports it before any model loads."""

    RULES = (
        Rule(message="path must name a .py file", check=lambda s: s.path.endswith(".py"), cel="self.path.endsWith('.py')", field="path"),
    )


class TISSpec(SpecModel):
    """Truncated importance sampling of the rollout engine's samples (Yao et al., 2025)."""

    cap: float = Field(default=2.0, gt=1.0, le=100.0)
    """Upper bound of the weight pi_train / pi_rollout of a sampled token; above 1 (a cap of 1 or less
    would down-weight every token the trainer likes more than vLLM did)."""


class AsyncSpec(SpecModel):
    """Generation ahead of training (rollout.placement: separate): how far the batches may lag the policy."""

    max_staleness: int = Field(ge=0, le=64)
    """The most policy versions (updates) a batch's oldest token may be behind the policy it trains:
    0 generates each batch with the current weights (the synchronous run, exactly); N generates up to
    N batches ahead, while the trainer updates. At most 64: further behind, the samples say little
    about the policy that learns from them."""
    partial_rollout: bool = False
    """Continue generations in flight under newly arrived weights (not supported yet: must be false)."""

    RULES = (
        Rule(
            message="partialRollout is not supported yet: a generation finishes under the weights it started with; "
            "set partialRollout: false",
            check=lambda s: not s.partial_rollout,
            cel="!has(self.partialRollout) || !self.partialRollout",
            field="partialRollout",
        ),
    )


class StepChoice(SpecModel):
    """A step function by its registered name: built-in (on_policy, dynamic_sampling, dpo) or a plug-in's."""

    name: str = Field(min_length=1, max_length=64, pattern=ENTRY_NAME)
    """A registered step function: on_policy, dynamic_sampling, dpo, or one of algorithm.plugins."""


class AlgorithmSpec(catalog.PresetBlocks):
    """Which algorithm, and how it weighs its terms."""

    name: str = Field(min_length=1, max_length=64, pattern=ENTRY_NAME)
    """A preset (`kuberl algorithms` lists them): ppo (needs a critic), grpo, rloo, reinforce_pp, dpo
    (preference pairs, no rollout), dapo (clip-higher, dynamic sampling, token-mean, overlong
    shaping), gspo, cispo (GRPO's advantages with that loss and its own clip defaults) or dr_grpo (no
    std, a constant length normaliser); or one registered by a file of algorithm.plugins."""
    clip_ratio: float = Field(default=0.2, gt=0.0, lt=1.0)
    """PPO-style clipping of the probability ratio: 1 - clipRatio .. 1 + clipRatio; strictly between 0
    (no update could move the policy) and 1 (the lower bound would be a ratio of 0)."""
    clip_ratio_high: float | None = Field(default=None, gt=0.0, lt=10.0)
    """Upper clip bound when it differs from clipRatio (asymmetric clipping, as in DAPO); below 10, past
    which clipping no longer bounds the update."""
    kl_coef: float = Field(default=0.0, ge=0.0, le=100.0)
    """Weight of the KL divergence to the reference policy; above 0 it needs roles.ref. At most 100:
    a larger weight only keeps the policy at the reference."""
    kl_estimator: Literal["k1", "k2", "k3", "abs", "k1+", "k3+", "abs+"] = "k3"
    """Per-token KL estimator: Schulman's k1, k2, k3, or abs (|log-ratio|); a trailing + is
    straight-through (its value, with k2's gradient)."""
    kl_in_reward: bool = False
    """Subtract the KL from the reward (PPO style) instead of adding it to the loss."""
    entropy_coef: float = Field(default=0.0, ge=0.0, le=10.0)
    """Weight of the entropy bonus, 0..10 (a negative weight would punish exploration; past 10 the
    bonus drowns the reward)."""
    loss_aggregation: Literal["token_mean", "token_sum", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = (
        "token_mean"
    )
    """How per-token losses become one number."""
    loss_scale_factor: int | None = Field(default=None, ge=1, le=1_000_000)
    """The constant that seq_mean_token_sum_norm divides each response's token sum by (default:
    rollout.maxNewTokens); at least 1."""
    update_epochs: int = Field(default=1, ge=1, le=100)
    """Passes over each step's rollouts."""
    advantage: AdvantageChoice | None = None
    """Replaces the preset's advantage estimator (and its block's options: grpo, reinforcePp, ppo.gae)."""
    policy_loss: PolicyLossChoice | None = None
    """Replaces the preset's loss (clipRatio, clipRatioHigh and lossAggregation then apply to the KL
    and entropy terms only; the loss takes its own options)."""
    plugins: list[PluginFile] = Field(default=[], max_length=8)
    """Python files loaded at start that register more estimators, losses, steps and presets (examples/plugins/)."""
    step: StepChoice | None = None
    """Replaces the preset's step function (on_policy; dynamic_sampling for dapo; dpo for dpo)."""
    old_logprobs: Literal["auto", "rollout", "recompute"] = "auto"
    """The old policy's log-probs in the ratio: rollout (vLLM's, free) or recompute (one forward of
    the actor before the update, exact where vLLM and the trainer differ in bf16/fp16). auto:
    recompute when model.dtype is bfloat16 or float16 (auto on a GPU) or when rollout.topP < 1 or
    topK is set (vLLM's are then of the truncated distribution), rollout otherwise."""
    tis: TISSpec | None = None
    """Weigh each sampled token by min(pi_train / pi_rollout, cap): needs the recomputed log-probs."""
    async_: AsyncSpec | None = Field(default=None, alias="async")
    """Generate on roles.rollout ahead of the update, at most maxStaleness versions behind (needs
    rollout.placement: separate); leave out for generation in step with training."""

    RULES = ALGORITHM_RULES

    @property
    def preset(self) -> catalog.PresetEntry | None:
        """The built-in preset of that name (None for a plug-in's, known once the engine loads it)."""
        return catalog.PRESETS.get(self.name)

    @property
    def pairs(self) -> bool:
        """It trains on given preference pairs (dpo): no rollout, no reward."""
        return self.preset is not None and self.preset.pairs

    @property
    def on_policy(self) -> bool:
        """It generates with vLLM and scores the completions: every preset but those that train on given
        pairs. check_supported holds the job's step function (a plug-in's too) to the same answer."""
        return not self.pairs

    @property
    def needs_reference(self) -> bool:
        """Whether a reference policy must compute log-probs."""
        return (self.preset is not None and self.preset.needs_reference) or self.kl_coef > 0.0

    @property
    def advantage_name(self) -> str | None:
        """The estimator that runs: the explicit one, or the preset's (None for a preset without advantages)."""
        return self.advantage.name if self.advantage is not None else PRESET_ADVANTAGE.get(self.name)

    @property
    def needs_critic(self) -> bool:
        """Whether the estimator learns a critic (a plug-in's is known once the engine loads it)."""
        entry = catalog.ADVANTAGES.get(self.advantage_name or "")
        return entry is not None and entry.needs_critic

    @property
    def min_samples(self) -> int:
        """Samples per prompt the estimator needs (2 for a group baseline)."""
        entry = catalog.ADVANTAGES.get(self.advantage_name or "")
        return entry.min_samples if entry is not None else 1

    @property
    def group_option_set(self) -> bool:
        """Whether an option asks the estimator to compare a prompt's samples (REINFORCE++'s baseline:
        true), in advantage.options or in the preset's block."""
        entry = catalog.ADVANTAGES.get(self.advantage_name or "")
        if entry is None:
            return False
        if self.advantage is not None:
            return any(self.advantage.options.get(k) == v for k, v in entry.group_options.items())
        given = getattr(self, self.name, None) if self.preset is not None and self.preset.block is not None else None
        return given is not None and any(getattr(given, option_python_name(k), None) == v for k, v in entry.group_options.items())

    def block(self, name: str) -> SpecModel | None:
        """Preset `name`'s block of options: as given, or its defaults (None for a preset without one)."""
        preset = catalog.PRESETS.get(name)
        if preset is None or preset.block is None:
            return None
        return getattr(self, name) or preset.block()
