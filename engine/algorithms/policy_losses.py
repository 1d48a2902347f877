"""Policy losses, registered by name, and the critic's value loss.

A policy loss is a pure function of a `LossInputs` record (the micro-batch's new, old, reference
and rollout log-probs, advantages, mask, importance weights, entropy and the update's totals) and
its own options; it returns (loss, stats). Register one with `@register_policy_loss(name, ...)`.
Each follows verl's core_algos loss of the same name (PPO's is verl's "vanilla", GMPO's "geo_mean")
unless its docstring says where it differs; `inputs.aggregate` applies the importance weights of
algorithm.tis to each token's loss, as verl applies its rollout-correction weights.
"""

from __future__ import annotations

from typing import Annotated

import torch

from ..config.options import Bound
from .registry import LossInputs, LossResult, register_policy_loss
from .tensors import Aggregation, aggregate, masked_mean

_DUAL_CLIP = Bound(gt=1.0, why="a dual clip of 1 or less would cut PPO's clipped objective itself, not only its tail")
_POSITIVE = Bound(gt=0.0, why="a clip range of 0 or less leaves no update")
_TEMPERATURE = Bound(gt=0.0, why="the gate's temperature; at 0 or less the gate is flat or inverted")
_LOWER = Bound(gt=0.0, lt=1.0, why="the lower bound 1 - clipLow must lie between 0 and 1")


def log_ratio(inputs: LossInputs) -> torch.Tensor:
    """log pi_theta - log pi_old, clamped to [-20, 20] so that its exp stays finite (as verl does)."""
    return torch.clamp(inputs.logprobs - inputs.old_logprobs, -20.0, 20.0)


def approx_kl(inputs: LossInputs, clamped: torch.Tensor | None = None) -> torch.Tensor:
    """verl's ppo_kl: the mean of log pi_old - log pi_theta over the tokens (detached)."""
    lr = log_ratio(inputs) if clamped is None else clamped
    return masked_mean(-lr, inputs.mask).detach()


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(max(-A r, -A clip(r, 1 - low, 1 + high)), whether the clipped side was taken) per token."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def dual_clipped(
    loss: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, dual_clip: float | None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's per-token clipped loss with the dual clip c (Ye et al., 2020) where A < 0: at most -c A,
    so a token whose ratio has grown large cannot dominate the update; c None leaves it as it is.
    Returns the loss and, with c set, clip_fraction_lower (the share of `mask`'s tokens it capped)."""
    if dual_clip is None:
        return loss, {}
    if dual_clip <= 1.0:  # at or below 1 it would cut the clipped objective itself; verl refuses it too
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    cap = -dual_clip * advantages
    negative = advantages < 0
    lower = masked_mean(((loss > cap) & negative).float(), mask).detach()
    return torch.where(negative, torch.minimum(loss, cap), loss), {"clip_fraction_lower": lower}


@register_policy_loss(
    "ppo_clip", summary="PPO's clipped surrogate; clipHigh > clipLow is DAPO's clip-higher; dualClip bounds negative advantages"
)
def policy_loss(
    inputs: LossInputs,
    clip_low: Annotated[float, _LOWER] = 0.2,
    clip_high: Annotated[float | None, _POSITIVE] = None,
    aggregation: Aggregation = "token_mean",
    dual_clip: Annotated[float | None, _DUAL_CLIP] = None,
) -> LossResult:
    """PPO's clipped surrogate (Schulman et al., 2017), -min(r A, clip(r, 1-low, 1+high) A).

    dual_clip = c > 1 (Ye et al., 2020): where A < 0 the loss is at most -c A, so a token whose
    ratio has grown large cannot dominate the update; c <= 1 is refused, as verl refuses it. verl
    applies c = 3 by default (clip_ratio_c); here it is off unless set."""
    clip_high = clip_low if clip_high is None else clip_high
    lr = log_ratio(inputs)
    loss, clipped = clipped_surrogate(torch.exp(lr), inputs.advantages, clip_low, clip_high)
    loss, lower = dual_clipped(loss, inputs.advantages, inputs.mask, dual_clip)
    stats = {"clip_fraction": masked_mean(clipped.float(), inputs.mask).detach(), "approx_kl": approx_kl(inputs, lr), **lower}
    return inputs.aggregate(loss, aggregation), stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    aggregation: Aggregation = "token_mean",
    horizon: int | None = None,
) -> LossResult:
    """The critic's loss, 0.5 * (V - R)^2, with PPO's value clipping around the old values (clip > 0),
    as verl's compute_value_loss. Its stat vf_clipfrac is verl's: the share of the tokens where the
    clipped loss was the larger, so the one taken (0 without clipping)."""
    unclipped = (values - returns) ** 2
    if clip <= 0:
        return 0.5 * aggregate(unclipped, mask, aggregation, horizon), {"vf_clipfrac": torch.zeros(())}
    clipped = (old_values + torch.clamp(values - old_values, -clip, clip) - returns) ** 2
    loss = 0.5 * aggregate(torch.maximum(unclipped, clipped), mask, aggregation, horizon)
    return loss, {"vf_clipfrac": masked_mean((clipped > unclipped).float(), mask).detach()}


@register_policy_loss("gspo", summary="PPO clipping of the sequence-level (geometric-mean) ratio (GSPO)")
def gspo(
    inputs: LossInputs,
    clip_low: Annotated[float, _LOWER] = 3e-4,
    clip_high: Annotated[float, _POSITIVE] = 4e-4,
    aggregation: Aggregation = "seq_mean_token_mean",
) -> LossResult:
    """Group Sequence Policy Optimization (Zheng et al., 2025): every token of a response shares its
    sequence ratio s = exp(mean_t log r_t); per token log s_t = sg(log s) + log p_t - sg(log p_t),
    clamped above at 10 as in verl (past it the token has no gradient), whose value is s and whose
    gradient is s times the token's score function. The token losses (times the TIS weights, where
    the job has them) are aggregated by `aggregation` alone: seq_mean_token_mean by default, as verl
    always does; the gspo preset passes no options, so algorithm.lossAggregation does not reach it."""
    seq_log_ratio = masked_mean(inputs.logprobs - inputs.old_logprobs, inputs.mask, dim=-1)
    log_s = torch.clamp(seq_log_ratio.detach()[:, None] + inputs.logprobs - inputs.logprobs.detach(), max=10.0)
    loss, clipped = clipped_surrogate(torch.exp(log_s), inputs.advantages, clip_low, clip_high)
    stats = {
        "clip_fraction": masked_mean(clipped.float(), inputs.mask).detach(),
        "approx_kl": masked_mean(inputs.old_logprobs - inputs.logprobs, inputs.mask).detach(),
    }
    return inputs.aggregate(loss, aggregation), stats


@register_policy_loss("cispo", summary="REINFORCE with the clipped importance weight detached (CISPO)")
def cispo(
    inputs: LossInputs,
    clip_low: Annotated[float | None, _LOWER] = None,
    clip_high: Annotated[float, _POSITIVE] = 5.0,
    aggregation: Aggregation = "token_mean",
) -> LossResult:
    """Clipped IS-weight Policy Optimization (MiniMax-M1, 2025): -sg(clip(r, 1 - clipLow, 1 + clipHigh)) A log p.
    Every token keeps a gradient; only the weight is bounded, not the update's reach. clipLow None
    leaves the weight without a lower bound (the paper's choice); verl takes both bounds from the
    actor's clip ratios."""
    lr = log_ratio(inputs)
    ratio = torch.exp(lr)
    weight = torch.clamp(ratio, min=None if clip_low is None else 1.0 - clip_low, max=1.0 + clip_high)
    loss = -weight.detach() * inputs.advantages * inputs.logprobs
    stats = {"clip_fraction": masked_mean((ratio != weight).float(), inputs.mask).detach(), "approx_kl": approx_kl(inputs, lr)}
    return inputs.aggregate(loss, aggregation), stats


@register_policy_loss("gpg", summary="the plain policy gradient, -A log p, no ratio and no clipping (GPG)")
def gpg(inputs: LossInputs, aggregation: Aggregation = "token_mean") -> LossResult:
    """Group Policy Gradient's loss (Chu et al., 2025): L_t = -A_t log p_t."""
    loss = -inputs.advantages * inputs.logprobs
    return inputs.aggregate(loss, aggregation), {"approx_kl": masked_mean(inputs.old_logprobs - inputs.logprobs, inputs.mask).detach()}


@register_policy_loss("sapo", summary="a smooth sigmoid gate of the ratio instead of a hard clip, sharper for negative advantages (SAPO)")
def sapo(
    inputs: LossInputs,
    tau_pos: Annotated[float, _TEMPERATURE] = 1.0,
    tau_neg: Annotated[float, _TEMPERATURE] = 1.05,
    aggregation: Aggregation = "seq_mean_token_mean",
) -> LossResult:
    """Soft Adaptive Policy Optimization (Qwen, 2025, arXiv 2511.20347): -f(r) A with
    f(r) = 4/tau * sigmoid(tau (r - 1)), tau = tauPos where A > 0, else tauNeg. At r = 1 the gate's
    value is 2/tau and its slope 1, so an on-policy token gets the plain policy gradient; away from
    1 the unclipped surrogate's gradient is weighed by 4 s (1 - s), s the sigmoid, which fades
    smoothly instead of stopping at a clip bound. verl always aggregates SAPO by
    seq_mean_token_mean; that is the default here, and another `aggregation` is honoured."""
    lr = log_ratio(inputs)
    ratio = torch.exp(lr)
    tau = torch.where(inputs.advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    loss = -torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau * inputs.advantages
    return inputs.aggregate(loss, aggregation), {"approx_kl": approx_kl(inputs, lr)}


@register_policy_loss("dro", summary="the policy gradient with a quadratic penalty on the log-ratio instead of a clip (DRO)")
def dro(
    inputs: LossInputs,
    beta: Annotated[float, Bound(gt=0.0, why="DRO's penalty must hold the policy near the old one")] = 0.1,
    aggregation: Aggregation = "token_mean",
) -> LossResult:
    """Direct Reward Optimisation (Richemond et al., 2024, "Offline Regularised Reinforcement
    Learning for LLM Alignment"), as verl's dro: L_t = -(A_t log p_t - beta/2 (log p_t - log p_old,t)^2).
    The log-ratio is not clamped (a quadratic needs no exp)."""
    lr = inputs.logprobs - inputs.old_logprobs
    loss = -(inputs.logprobs * inputs.advantages - 0.5 * beta * lr**2)
    return inputs.aggregate(loss, aggregation), {"approx_kl": masked_mean(-lr, inputs.mask).detach()}
