"""The RL algorithm and its hyperparameters.

Options common to the policy-gradient family sit at the top; what belongs to one algorithm sits in
a block named after it, and a block for another algorithm than the one chosen is an error.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from pydantic.alias_generators import to_camel, to_snake

from . import algorithm_catalog as catalog
from .base import LocalPath, Rule, SpecModel, pattern

AlgorithmName = Literal["ppo", "grpo", "rloo", "reinforce_pp", "dpo", "dapo", "gspo", "cispo", "dr_grpo"]
# What each preset's estimator is (engine/algorithms/presets.py fills in its options); dpo has none.
PRESET_ADVANTAGE: dict[str, str] = {"ppo": "gae", "grpo": "grpo", "rloo": "rloo", "reinforce_pp": "reinforce_pp",
                                    "dapo": "grpo", "gspo": "grpo", "cispo": "grpo", "dr_grpo": "grpo"}
# The step function each preset runs (engine/steps/); any other preset runs "on_policy".
PRESET_STEP: dict[str, str] = {"dpo": "dpo", "dapo": "dynamic_sampling"}

_CRITIC_ESTIMATORS = sorted(n for n, e in catalog.ADVANTAGES.items() if e.needs_critic)
_GROUP_ESTIMATORS = sorted(n for n, e in catalog.ADVANTAGES.items() if e.min_samples >= 2)
# Presets whose estimator learns a critic, and those that compare several samples of one prompt.
CRITIC_ALGORITHMS: tuple[str, ...] = tuple(p for p, a in PRESET_ADVANTAGE.items() if a in _CRITIC_ESTIMATORS)
GROUP_BASELINE_ALGORITHMS: tuple[str, ...] = tuple(p for p, a in PRESET_ADVANTAGE.items() if a in _GROUP_ESTIMATORS)


def _by_estimator_cel(algorithm: str, estimators: list[str], presets: tuple[str, ...]) -> str:
    return (f"(has({algorithm}.advantage) ? {algorithm}.advantage.name in {estimators!r}"
            f" : {algorithm}.name in {list(presets)!r})").replace('"', "'")


def needs_critic_cel(algorithm: str) -> str:
    """CEL over the spec: whether the estimator that runs learns a critic."""
    return _by_estimator_cel(algorithm, _CRITIC_ESTIMATORS, CRITIC_ALGORITHMS)


def group_baseline_cel(algorithm: str) -> str:
    """CEL over the spec: whether the estimator that runs compares samples of one prompt."""
    return _by_estimator_cel(algorithm, _GROUP_ESTIMATORS, GROUP_BASELINE_ALGORITHMS)


# An option's manifest name is its parameter's name in camelCase, except where the manifest's word is a
# Python keyword: GAE's lambda is the parameter `lam` (as ppo.gae.lambda is the field `lam`).
_KEYWORD_OPTIONS = {"lam": "lambda"}


def option_manifest_name(python_name: str) -> str:
    """How a registered function's keyword argument is spelt in a manifest's options."""
    return _KEYWORD_OPTIONS.get(python_name) or to_camel(python_name)


def option_python_name(manifest_name: str) -> str:
    """The keyword argument a manifest's option names (the inverse of option_manifest_name)."""
    for python, manifest in _KEYWORD_OPTIONS.items():
        if manifest_name == manifest:
            return python
    return to_snake(manifest_name)


def _option_problems(options: dict[str, Any], known: dict[str, Any], what: str) -> list[str]:
    problems = []
    for key, value in options.items():
        if key not in known:
            problems.append(f"{key}: not an option of {what} (its options: {', '.join(known) or 'none'})")
            continue
        default = known[key]
        wanted = float if isinstance(default, float) else type(default) if default is not None else None
        ok = wanted is None or (isinstance(value, wanted) and not (wanted is not bool and isinstance(value, bool))) \
            or (wanted is float and isinstance(value, int) and not isinstance(value, bool))
        if not ok:
            problems.append(f"{key}: expected a {wanted.__name__}, got {value!r}")
    return problems


# Options are checked here only: the CRD keeps them as free values (each entry has its own), and
# CEL cannot range over such a map. Names and options of plug-in entries are checked when the
# engine has loaded the plug-ins (engine/algorithms/plugins.py), before any model loads.
_ENTRY_NAME = pattern(r"^[a-z][a-z0-9_]*$", "a registered name: lower-case letters, digits and '_', starting with a letter")


def _options_rule(entries: dict[str, Any]) -> Rule:
    def problems(s: Any) -> list[str]:
        entry = entries.get(s.name)
        return _option_problems(s.options, entry.options, s.name) if entry is not None else []

    return Rule(message="unknown or mistyped option", check=lambda s: not problems(s), field="options",
                detail=lambda s: "; ".join(problems(s)))


class AdvantageChoice(SpecModel):
    """An advantage estimator by its registered name (`kuberl algorithms` lists them) and its options."""

    name: str = Field(min_length=1, max_length=64, pattern=_ENTRY_NAME)
    """A registered estimator: a built-in (`kuberl algorithms` lists them) or one of algorithm.plugins."""
    options: dict[str, Any] = Field(default={}, max_length=32)
    """Keyword options of the estimator, by their camelCase names (e.g. normalizeByStd: false)."""

    RULES = (_options_rule(catalog.ADVANTAGES),)


class PolicyLossChoice(SpecModel):
    """A policy loss by its registered name (`kuberl algorithms` lists them) and its options."""

    name: str = Field(min_length=1, max_length=64, pattern=_ENTRY_NAME)
    """A registered policy loss: a built-in (`kuberl algorithms` lists them) or one of algorithm.plugins."""
    options: dict[str, Any] = Field(default={}, max_length=32)
    """Keyword options of the loss, by their camelCase names (e.g. clipHigh: 0.28)."""

    RULES = (_options_rule(catalog.POLICY_LOSSES),)


class PluginFile(SpecModel):
    """A Python file that registers estimators or losses with kuberl.engine.algorithms' decorators."""

    path: LocalPath
    """The .py file; every rank of the job imports it before any model loads."""

    RULES = (
        Rule(message="path must name a .py file", check=lambda s: s.path.endswith(".py"),
             cel="self.path.endsWith('.py')", field="path"),
    )


def _known_rule(field: str, attr: str, entries: dict[str, Any], what: str) -> Rule:
    names = sorted(entries)
    return Rule(
        message=f"unknown {what}: known are {', '.join(names)} (or register it in a file of algorithm.plugins)",
        check=lambda s: getattr(s, attr) is None or getattr(s, attr).name in entries or bool(s.plugins),
        cel=f"!has(self.{field}) || self.{field}.name in {names!r} || size(self.plugins) > 0".replace('"', "'"),
        field=f"{field}.name",
    )


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

    baseline: bool | None = None
    """Subtract the mean reward of the prompt's samples before the global normalisation (REINFORCE++-baseline).
    Default: when rollout.samplesPerPrompt is at least 2; with one sample per prompt it would make every advantage 0."""


class DPOSpec(SpecModel):
    """Direct preference optimisation."""

    beta: float = Field(default=0.1, gt=0.0, le=100.0)
    """Strength of the implicit KL constraint; above 0 (0 would remove the constraint and the loss's scale)."""
    label_smoothing: float = Field(default=0.0, ge=0.0, lt=0.5)
    """Assumed probability that a preference label is flipped (conservative DPO); below 0.5, which would make every pair uninformative."""


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


class TISSpec(SpecModel):
    """Truncated importance sampling of the rollout engine's samples (Yao et al., 2025)."""

    cap: float = Field(default=2.0, gt=1.0, le=100.0)
    """Upper bound of the weight pi_train / pi_rollout of a sampled token; above 1 (a cap of 1 or less
    would down-weight every token the trainer likes more than vLLM did)."""


class StepChoice(SpecModel):
    """A step function by its registered name: built-in (on_policy, dynamic_sampling, dpo) or a plug-in's."""

    name: str = Field(min_length=1, max_length=64, pattern=_ENTRY_NAME)
    """A registered step function: on_policy, dynamic_sampling, dpo, or one of algorithm.plugins."""


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
    """A preset: ppo (needs a critic), grpo, rloo, reinforce_pp, dpo (preference pairs, no rollout),
    dapo (clip-higher, dynamic sampling, token-mean, overlong shaping), gspo, cispo (GRPO's
    advantages with that loss and its own clip defaults) or dr_grpo (no std, a constant length
    normaliser)."""
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
    loss_aggregation: Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = "token_mean"
    """How per-token losses become one number."""
    update_epochs: int = Field(default=1, ge=1, le=100)
    """Passes over each step's rollouts."""
    advantage: AdvantageChoice | None = None
    """Replaces the preset's advantage estimator (and its block's options: grpo, reinforcePp, ppo.gae)."""
    policy_loss: PolicyLossChoice | None = None
    """Replaces the preset's loss, PPO's clipped surrogate (clipRatio, clipRatioHigh and lossAggregation
    then apply to the KL and entropy terms only; the loss takes its own options)."""
    plugins: list[PluginFile] = Field(default=[], max_length=8)
    """Python files loaded at start that register more estimators, losses and steps (examples/plugins/)."""
    step: StepChoice | None = None
    """Replaces the preset's step function (on_policy; dynamic_sampling for dapo; dpo for dpo)."""
    old_logprobs: Literal["auto", "rollout", "recompute"] = "auto"
    """The old policy's log-probs in the ratio: rollout (vLLM's, free) or recompute (one forward of
    the actor before the update, exact where vLLM and the trainer differ in bf16/fp16). auto:
    recompute when model.dtype is bfloat16 or float16 (auto on a GPU) or when rollout.topP < 1 or
    topK is set (vLLM's are then of the truncated distribution), rollout otherwise."""
    tis: TISSpec | None = None
    """Weigh each sampled token by min(pi_train / pi_rollout, cap): needs the recomputed log-probs."""
    dapo: DAPOSpec | None = None
    ppo: PPOSpec | None = None
    grpo: GRPOSpec | None = None
    reinforce_pp: ReinforcePPSpec | None = None
    dpo: DPOSpec | None = None

    RULES = (
        _known_rule("advantage", "advantage", catalog.ADVANTAGES, "advantage estimator"),
        _known_rule("policyLoss", "policy_loss", catalog.POLICY_LOSSES, "policy loss"),
        _known_rule("step", "step", catalog.STEPS, "step function"),
        Rule(
            message="the dpo step trains on preference pairs: choose it with name: dpo",
            check=lambda s: s.step is None or s.step.name != "dpo",
            cel="!has(self.step) || self.step.name != 'dpo'",
            field="step.name",
        ),
        _block_rule("ppo", "ppo", "ppo"),
        _block_rule("grpo", "grpo", "grpo"),
        _block_rule("reinforcePp", "reinforce_pp", "reinforce_pp"),
        _block_rule("dpo", "dpo", "dpo"),
        _block_rule("dapo", "dapo", "dapo"),
        Rule(
            message="tis needs oldLogprobs: recompute (its weight is the trainer's over vLLM's probability of each sampled token)",
            check=lambda s: s.tis is None or s.old_logprobs == "recompute",
            cel="!has(self.tis) || self.oldLogprobs == 'recompute'",
            field="tis",
        ),
        Rule(
            message="dpo has no rollout: oldLogprobs, tis and step do not apply",
            check=lambda s: s.name != "dpo" or (s.old_logprobs == "auto" and s.tis is None and s.step is None),
            cel="self.name != 'dpo' || (self.oldLogprobs == 'auto' && !has(self.tis) && !has(self.step))",
            field="name",
        ),
        Rule(
            message="clipRatioHigh must be at least clipRatio",
            check=lambda s: s.clip_ratio_high is None or s.clip_ratio_high >= s.clip_ratio,
            cel="!has(self.clipRatioHigh) || self.clipRatioHigh >= self.clipRatio",
            field="clipRatioHigh",
            detail=lambda s: f"{s.clip_ratio_high} < {s.clip_ratio}",
        ),
        Rule(
            message="advantage replaces the preset's estimator: set its options in advantage.options, not in a grpo or reinforcePp block",
            check=lambda s: s.advantage is None or (s.grpo is None and s.reinforce_pp is None),
            cel="!has(self.advantage) || (!has(self.grpo) && !has(self.reinforcePp))",
            field="advantage",
        ),
        Rule(
            message="dpo trains on preference pairs: it takes no advantage or policyLoss",
            check=lambda s: s.name != "dpo" or (s.advantage is None and s.policy_loss is None),
            cel="self.name != 'dpo' || (!has(self.advantage) && !has(self.policyLoss))",
            field="name",
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
    def on_policy(self) -> bool:
        """It generates with vLLM and scores the completions: every algorithm but dpo, which trains on
        given pairs. check_supported holds the job's step function (a plug-in's too) to the same answer."""
        return self.name != "dpo"

    @property
    def needs_reference(self) -> bool:
        """Whether a reference policy must compute log-probs."""
        return self.name == "dpo" or self.kl_coef > 0.0

    @property
    def advantage_name(self) -> str | None:
        """The estimator that runs: the explicit one, or the preset's (None for dpo)."""
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
