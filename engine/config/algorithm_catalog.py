"""The registered advantage estimators, policy losses, step functions and presets: names, traits,
options and the presets' blocks, without torch.

Generated from kuberl.engine.algorithms' and kuberl.engine.steps' registries. Do not edit: run
`.venv/bin/python -m kuberl.engine.runtime.catalog > engine/config/algorithm_catalog.py`.
Options are by their manifest (camelCase) names, with their defaults (None: required or unset).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from .base import SpecModel
from .options import Bound


@dataclass(frozen=True)
class CatalogEntry:
    summary: str
    options: dict[str, Any]
    bounds: dict[str, Bound] = field(default_factory=dict)
    needs_critic: bool = False
    min_samples: int = 1
    needs_greedy: bool = False
    needs_pi_squared: bool = False
    group_options: dict[str, Any] = field(default_factory=dict)
    pairs: bool = False
    corrects_rollout: bool = False
    on_policy: bool = True


@dataclass(frozen=True)
class PresetEntry:
    summary: str
    advantage: str | None
    policy_loss: str
    step: str
    block: type[SpecModel] | None = None
    pairs: bool = False
    needs_reference: bool = False


ADVANTAGES: dict[str, CatalogEntry] = {
    'gae': CatalogEntry('generalised advantage estimation with a learned critic (PPO)', {'gamma': 1.0, 'lambda': 0.95, 'whiten': True}, bounds={'gamma': Bound(ge=0.0, le=1.0, why="a discount above 1 would grow a return with the response's length"), 'lambda': Bound(ge=0.0, le=1.0, why='lambda mixes one-step TD (0) and Monte Carlo (1)')}, needs_critic=True),
    'gdpo': CatalogEntry("GRPO's normalisation of each reward source apart, then their weighted sum, whitened (GDPO)", {'normalizeByStd': True}, min_samples=2),
    'gpg': CatalogEntry("score minus its group's mean, scaled by batch / informative samples (GPG)", {}, min_samples=2),
    'grpo': CatalogEntry("score minus its group's mean, over the group's std (or not: Dr. GRPO)", {'normalizeByStd': True}, min_samples=2),
    'grpo_passk': CatalogEntry('only the best sample of a group learns, by its margin over the second best (pass@k)', {'normalizeByStd': True}, min_samples=2),
    'opo': CatalogEntry("score minus its group's length-weighted mean score (OPO's optimal baseline)", {}, min_samples=2),
    'optimal_token_baseline': CatalogEntry('return-to-go minus a per-position baseline weighted by accumulated gradient variance (OTB)', {'handleZeroTail': False}, min_samples=2, needs_pi_squared=True),
    'reinforce_pp': CatalogEntry('return-to-go whitened over the batch, after an optional group baseline (REINFORCE++)', {'baseline': None, 'gamma': 1.0}, bounds={'gamma': Bound(ge=0.0, le=1.0, why="a discount above 1 would grow a return with the response's length")}, group_options={'baseline': True}),
    'remax': CatalogEntry('return minus the reward of a greedy response to the same prompt (ReMax)', {}, needs_greedy=True),
    'rloo': CatalogEntry('score minus the mean of the other samples of its prompt', {}, min_samples=2),
    'tir_optimal_token_baseline': CatalogEntry("OTB aligned by each response's own tokens, skipping tool outputs (multi-turn, TIR)", {'handleZeroTail': True}, min_samples=2, needs_pi_squared=True),
}

POLICY_LOSSES: dict[str, CatalogEntry] = {
    'bypass': CatalogEntry("rollout correction without an old-policy forward: vLLM's log-probs as the old policy's (bypass mode)", {'lossType': 'ppo_clip', 'rolloutIs': 'token', 'isThreshold': 2.0, 'isBatchNormalize': False, 'rolloutRs': 'none', 'rsThreshold': 2.0, 'clipLow': 0.2, 'clipHigh': None, 'aggregation': 'token_mean', 'dualClip': None}, bounds={'lossType': Bound(one_of=('ppo_clip', 'reinforce')), 'rolloutIs': Bound(one_of=('token', 'sequence', 'none')), 'isThreshold': Bound(gt=0.0, why="a weight's upper bound"), 'rolloutRs': Bound(one_of=('none', 'token_k1', 'token_k2', 'token_k3', 'seq_sum_k1', 'seq_sum_k2', 'seq_sum_k3', 'seq_mean_k1', 'seq_mean_k2', 'seq_mean_k3', 'seq_max_k2', 'seq_max_k3')), 'rsThreshold': Bound(gt=0.0, why='the largest divergence kept'), 'clipLow': Bound(gt=0.0, lt=1.0, why='the lower bound 1 - clipLow must lie between 0 and 1'), 'clipHigh': Bound(gt=0.0, why='a clip range of 0 or less leaves no update'), 'aggregation': Bound(one_of=('token_mean', 'token_sum', 'seq_mean_token_sum', 'seq_mean_token_mean', 'seq_mean_token_sum_norm')), 'dualClip': Bound(gt=1.0, why="a dual clip of 1 or less would cut PPO's clipped objective itself, not only its tail")}, corrects_rollout=True),
    'cispo': CatalogEntry('REINFORCE with the clipped importance weight detached (CISPO)', {'clipLow': None, 'clipHigh': 5.0, 'aggregation': 'token_mean'}, bounds={'clipLow': Bound(gt=0.0, lt=1.0, why='the lower bound 1 - clipLow must lie between 0 and 1'), 'clipHigh': Bound(gt=0.0, why='a clip range of 0 or less leaves no update'), 'aggregation': Bound(one_of=('token_mean', 'token_sum', 'seq_mean_token_sum', 'seq_mean_token_mean', 'seq_mean_token_sum_norm'))}),
    'clip_cov': CatalogEntry('PPO clip, plus no gradient for the few tokens of largest log-prob/advantage covariance (Clip-Cov)', {'clipLow': 0.2, 'clipHigh': None, 'fraction': 0.0002, 'covLow': 1.0, 'covHigh': 5.0, 'aggregation': 'token_mean'}, bounds={'clipLow': Bound(gt=0.0, lt=1.0, why='the lower bound 1 - clipLow must lie between 0 and 1'), 'clipHigh': Bound(gt=0.0, why='a clip range of 0 or less leaves no update'), 'fraction': Bound(gt=0.0, le=1.0, why='a fraction of the tokens, above 0 (verl refuses 0)'), 'aggregation': Bound(one_of=('token_mean', 'token_sum', 'seq_mean_token_sum', 'seq_mean_token_mean', 'seq_mean_token_sum_norm'))}),
    'dpo': CatalogEntry("DPO's sigmoid loss over (chosen, rejected) pairs against the reference policy", {'beta': 0.1, 'labelSmoothing': 0.0}, bounds={'beta': Bound(gt=0.0, why='beta scales the implicit KL constraint'), 'labelSmoothing': Bound(ge=0.0, lt=0.5, why='at 0.5 every pair is uninformative')}, pairs=True),
    'dppo_kl': CatalogEntry('the policy gradient on tokens whose binary KL to the old policy is within a bound (DPPO-KL)', {'clipLow': 0.2, 'clipHigh': None, 'truncation': 20.0, 'aggregation': 'token_mean'}, bounds={'clipLow': Bound(gt=0.0, why='a divergence bound of 0 or less keeps no token that moved'), 'clipHigh': Bound(gt=0.0, why='a divergence bound of 0 or less keeps no token that moved'), 'truncation': Bound(gt=1.0, why='the truncation caps the importance weight; at 1 or less it would cut on-policy tokens'), 'aggregation': Bound(one_of=('token_mean', 'token_sum', 'seq_mean_token_sum', 'seq_mean_token_mean', 'seq_mean_token_sum_norm'))}),
    'dppo_tv': CatalogEntry('the policy gradient on tokens whose probability moved less than a total-variation bound (DPPO-TV)', {'clipLow': 0.2, 'clipHigh': None, 'truncation': 20.0, 'aggregation': 'token_mean'}, bounds={'clipLow': Bound(gt=0.0, why='a divergence bound of 0 or less keeps no token that moved'), 'clipHigh': Bound(gt=0.0, why='a divergence bound of 0 or less keeps no token that moved'), 'truncation': Bound(gt=1.0, why='the truncation caps the importance weight; at 1 or less it would cut on-policy tokens'), 'aggregation': Bound(one_of=('token_mean', 'token_sum', 'seq_mean_token_sum', 'seq_mean_token_mean', 'seq_mean_token_sum_norm'))}),
    'dro': CatalogEntry('the policy gradient with a quadratic penalty on the log-ratio instead of a clip (DRO)', {'beta': 0.1, 'aggregation': 'token_mean'}, bounds={'beta': Bound(gt=0.0, why="DRO's penalty must hold the policy near the old one"), 'aggregation': Bound(one_of=('token_mean', 'token_sum', 'seq_mean_token_sum', 'seq_mean_token_mean', 'seq_mean_token_sum_norm'))}),
    'gmpo': CatalogEntry('the geometric mean of the token ratios, clipped per token in log space (GMPO)', {'clipLow': 0.4, 'clipHigh': 0.4}, bounds={'clipLow': Bound(gt=0.0, why='a clip range of 0 or less leaves no update'), 'clipHigh': Bound(gt=0.0, why='a clip range of 0 or less leaves no update')}),
    'gpg': CatalogEntry('the plain policy gradient, -A log p, no ratio and no clipping (GPG)', {'aggregation': 'token_mean'}, bounds={'aggregation': Bound(one_of=('token_mean', 'token_sum', 'seq_mean_token_sum', 'seq_mean_token_mean', 'seq_mean_token_sum_norm'))}),
    'gspo': CatalogEntry('PPO clipping of the sequence-level (geometric-mean) ratio (GSPO)', {'clipLow': 0.0003, 'clipHigh': 0.0004, 'aggregation': 'seq_mean_token_mean'}, bounds={'clipLow': Bound(gt=0.0, lt=1.0, why='the lower bound 1 - clipLow must lie between 0 and 1'), 'clipHigh': Bound(gt=0.0, why='a clip range of 0 or less leaves no update'), 'aggregation': Bound(one_of=('token_mean', 'token_sum', 'seq_mean_token_sum', 'seq_mean_token_mean', 'seq_mean_token_sum_norm'))}),
    'kl_cov': CatalogEntry('the unclipped surrogate, plus a KL penalty on the few tokens of largest covariance (KL-Cov)', {'fraction': 0.002, 'klCoef': 1.0, 'aggregation': 'token_mean'}, bounds={'fraction': Bound(gt=0.0, le=1.0, why='a fraction of the tokens, above 0 (verl refuses 0)'), 'aggregation': Bound(one_of=('token_mean', 'token_sum', 'seq_mean_token_sum', 'seq_mean_token_mean', 'seq_mean_token_sum_norm'))}),
    'ppo_clip': CatalogEntry("PPO's clipped surrogate; clipHigh > clipLow is DAPO's clip-higher; dualClip bounds negative advantages", {'clipLow': 0.2, 'clipHigh': None, 'aggregation': 'token_mean', 'dualClip': None}, bounds={'clipLow': Bound(gt=0.0, lt=1.0, why='the lower bound 1 - clipLow must lie between 0 and 1'), 'clipHigh': Bound(gt=0.0, why='a clip range of 0 or less leaves no update'), 'aggregation': Bound(one_of=('token_mean', 'token_sum', 'seq_mean_token_sum', 'seq_mean_token_mean', 'seq_mean_token_sum_norm')), 'dualClip': Bound(gt=1.0, why="a dual clip of 1 or less would cut PPO's clipped objective itself, not only its tail")}),
    'sapo': CatalogEntry('a smooth sigmoid gate of the ratio instead of a hard clip, sharper for negative advantages (SAPO)', {'tauPos': 1.0, 'tauNeg': 1.05, 'aggregation': 'seq_mean_token_mean'}, bounds={'tauPos': Bound(gt=0.0, why="the gate's temperature; at 0 or less the gate is flat or inverted"), 'tauNeg': Bound(gt=0.0, why="the gate's temperature; at 0 or less the gate is flat or inverted"), 'aggregation': Bound(one_of=('token_mean', 'token_sum', 'seq_mean_token_sum', 'seq_mean_token_mean', 'seq_mean_token_sum_norm'))}),
}

STEPS: dict[str, CatalogEntry] = {
    'dpo': CatalogEntry("DPO on the data's chosen/rejected pairs against the reference policy", {}, on_policy=False),
    'dynamic_sampling': CatalogEntry('DAPO: keep only groups whose rewards differ, drawing more prompts to fill the step', {}),
    'on_policy': CatalogEntry('generate, score, reference/critic forward, advantages, update (PPO, GRPO, RLOO, REINFORCE++, ...)', {}),
}


# The presets' blocks of options, as engine/algorithms/presets/*.py defines them.

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
    Default: when rollout.samplesPerPrompt is at least 2; with one sample per prompt there is no group to take a mean of."""
    gamma: float = Field(default=1.0, ge=0.0, le=1.0)
    """Discount per token of the return-to-go, 0..1 (above 1 a return would grow with the response's length)."""


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


PRESETS: dict[str, PresetEntry] = {
    'ppo': PresetEntry("GAE with a learned critic (roles.critic) and PPO's clipped surrogate", 'gae', 'ppo_clip', 'on_policy', PPOSpec),
    'grpo': PresetEntry("score minus its group's mean over the group's std, PPO's clipped surrogate", 'grpo', 'ppo_clip', 'on_policy', GRPOSpec),
    'rloo': PresetEntry("score minus the mean of the other samples of its prompt, PPO's clipped surrogate", 'rloo', 'ppo_clip', 'on_policy', None),
    'reinforce_pp': PresetEntry("return-to-go whitened over the batch (after a group baseline with several samples), PPO's clipped surrogate", 'reinforce_pp', 'ppo_clip', 'on_policy', ReinforcePPSpec),
    'dpo': PresetEntry("DPO's loss on the data's preference pairs against the reference policy (no rollout, no reward)", None, 'dpo', 'dpo', DPOSpec, pairs=True, needs_reference=True),
    'dapo': PresetEntry("GRPO's advantages, clip-higher, token-mean, dynamic sampling and overlong shaping", 'grpo', 'ppo_clip', 'dynamic_sampling', DAPOSpec),
    'gspo': PresetEntry("GRPO's advantages, GSPO's clipped sequence-level ratio with its own clip range", 'grpo', 'gspo', 'on_policy', None),
    'cispo': PresetEntry("GRPO's advantages, CISPO's clipped and detached importance weight", 'grpo', 'cispo', 'on_policy', None),
    'dr_grpo': PresetEntry("GRPO without the group's std, and a constant length normaliser (seq_mean_token_sum_norm)", 'grpo', 'ppo_clip', 'on_policy', None),
}

AlgorithmName = Literal['ppo', 'grpo', 'rloo', 'reinforce_pp', 'dpo', 'dapo', 'gspo', 'cispo', 'dr_grpo']


class PresetBlocks(SpecModel):
    """Each preset's own block of options, by the preset's name: a block applies only with its preset."""

    ppo: PPOSpec | None = None
    """ppo's options (only with name: ppo)."""
    grpo: GRPOSpec | None = None
    """grpo's options (only with name: grpo)."""
    reinforce_pp: ReinforcePPSpec | None = None
    """reinforce_pp's options (only with name: reinforce_pp)."""
    dpo: DPOSpec | None = None
    """dpo's options (only with name: dpo)."""
    dapo: DAPOSpec | None = None
    """dapo's options (only with name: dapo)."""
