"""Losses that bound the update otherwise than by PPO's token clip: GMPO's clipped geometric mean,
and DPPO's masks of the tokens whose probability moved past a divergence bound."""

from __future__ import annotations

from typing import Annotated

import torch

from ..config.options import Bound
from .policy_losses import _POSITIVE, log_ratio
from .registry import LossInputs, LossResult, register_policy_loss
from .tensors import Aggregation, masked_mean, masked_sum

_DIVERGENCE = Bound(gt=0.0, why="a divergence bound of 0 or less keeps no token that moved")
_TRUNCATION = Bound(gt=1.0, why="the truncation caps the importance weight; at 1 or less it would cut on-policy tokens")


@register_policy_loss("gmpo", summary="the geometric mean of the token ratios, clipped per token in log space (GMPO)")
def gmpo(inputs: LossInputs, clip_low: Annotated[float, _POSITIVE] = 0.4, clip_high: Annotated[float, _POSITIVE] = 0.4) -> LossResult:
    """Geometric-Mean Policy Optimization (Zhao et al., 2025), verl's geo_mean: a response's
    objective is A * (prod_t r_t')^(1/|o|), where each token's log-ratio is clipped to
    [-clip_low, clip_high] pessimistically for the sign of A (PPO's min, taken in log space). The
    geometric mean is less swayed by one outlier token than GRPO's arithmetic mean. One number per
    response, mean over every row of the micro-batch: its aggregation is fixed. Importance weights
    (algorithm.tis) enter as their geometric mean over the response, as in verl. The log-ratio is
    clamped to ±20 (verl's is not: they differ only past that)."""
    lr = log_ratio(inputs)
    mask = inputs.mask
    sign = torch.sign(inputs.advantages)
    clipped = torch.clamp(lr, -clip_low, clip_high)
    pessimistic = sign * torch.minimum(sign * lr, sign * clipped)
    lengths = mask.sum(-1) + 1e-8
    seq_ratio = torch.exp(masked_sum(pessimistic, mask, dim=-1) / lengths)
    seq_advantage = masked_sum(inputs.advantages, mask, dim=-1) / lengths
    loss = -seq_advantage * seq_ratio
    if inputs.is_weights is not None:
        loss = loss * torch.exp(masked_sum(torch.log(inputs.is_weights + 1e-10), mask, dim=-1) / lengths)
    changed = (lr != clipped).float()
    return loss.mean(), {
        "approx_kl": masked_mean(-lr, mask).detach(),
        "clip_fraction": masked_mean(changed * (inputs.advantages > 0), mask).detach(),
        "clip_fraction_lower": masked_mean(changed * (inputs.advantages < 0), mask).detach(),
    }


def _dppo(inputs: LossInputs, valid: torch.Tensor, truncation: float, aggregation: Aggregation) -> LossResult:
    """-A · sg(min(r, truncation)) · log p on the tokens `valid` keeps (DPPO's common part)."""
    lr = log_ratio(inputs)
    ratio = torch.exp(lr)
    weight = torch.clamp(ratio, max=truncation).detach()
    kept = valid.detach().float()
    loss = -inputs.advantages * weight * inputs.logprobs * kept
    return inputs.aggregate(loss, aggregation), {
        "approx_kl": masked_mean(-lr, inputs.mask).detach(),
        "clip_fraction": masked_mean(1.0 - kept, inputs.mask).detach(),
        "truncated_fraction": masked_mean((ratio > truncation).float() * kept, inputs.mask).detach(),
    }


@register_policy_loss(
    "dppo_tv", summary="the policy gradient on tokens whose probability moved less than a total-variation bound (DPPO-TV)"
)
def dppo_tv(
    inputs: LossInputs,
    clip_low: Annotated[float, _DIVERGENCE] = 0.2,
    clip_high: Annotated[float | None, _DIVERGENCE] = None,
    truncation: Annotated[float, _TRUNCATION] = 20.0,
    aggregation: Aggregation = "token_mean",
) -> LossResult:
    """DPPO with the binary total variation (2026, arXiv 2602.04879), verl's dppo_tv: instead of
    clipping the ratio, a token is dropped from the update once its probability has moved too far
    in the direction its advantage pushes it: kept where A > 0 and p - p_old <= clipHigh, or A <= 0
    and p - p_old >= -clipLow. L_t = -A_t · sg(min(r_t, truncation)) · log p_t on kept tokens
    (a truncated importance weight in place of a dual clip). clipLow/clipHigh are divergence bounds
    on probabilities, not ratio ranges."""
    clip_high = clip_low if clip_high is None else clip_high
    moved = torch.exp(inputs.logprobs) - torch.exp(inputs.old_logprobs)
    valid = torch.where(inputs.advantages > 0, moved <= clip_high, moved >= -clip_low)
    return _dppo(inputs, valid, truncation, aggregation)


@register_policy_loss("dppo_kl", summary="the policy gradient on tokens whose binary KL to the old policy is within a bound (DPPO-KL)")
def dppo_kl(
    inputs: LossInputs,
    clip_low: Annotated[float, _DIVERGENCE] = 0.2,
    clip_high: Annotated[float | None, _DIVERGENCE] = None,
    truncation: Annotated[float, _TRUNCATION] = 20.0,
    aggregation: Aggregation = "token_mean",
) -> LossResult:
    """DPPO with the binary KL (same paper), verl's dppo_kl: with p, p_old the token's new and old
    probabilities, D = p_old log(p_old / p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8)),
    the KL between the two Bernoulli distributions "this token or another". A token is kept where
    A > 0 and (D <= clipHigh or p <= p_old), or A <= 0 and (D <= clipLow or p >= p_old): only a move
    in the advantage's direction is bounded. L_t as in dppo_tv."""
    clip_high = clip_low if clip_high is None else clip_high
    p, p_old = torch.exp(inputs.logprobs), torch.exp(inputs.old_logprobs)
    divergence = p_old * (inputs.old_logprobs - inputs.logprobs) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
    valid = torch.where(inputs.advantages > 0, (divergence <= clip_high) | (p <= p_old), (divergence <= clip_low) | (p >= p_old))
    return _dppo(inputs, valid, truncation, aggregation)
