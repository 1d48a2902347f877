"""Clip-Cov and KL-Cov (Cui et al., 2025, "The Entropy Mechanism of Reinforcement Learning for
Reasoning Language Models"): entropy collapses through the tokens whose log-prob and advantage
covary most, so a few of them are held back from the update.

A token's covariance term is c_t = (A_t - mean A) (log p_t - mean log p) over the micro-batch's
response tokens. Both pick k = max(1, int(fraction * response tokens)) tokens, as verl does; the
padding does not count. Where verl draws Clip-Cov's tokens at random, this takes those of largest
c_t, so that a step is reproducible without a random stream. The ratio's log is clamped to ±20 as in
the other losses (verl's two covariance losses do not clamp it: they differ only past that).
"""

from __future__ import annotations

import math
from typing import Annotated

import torch

from ..config.options import Bound
from .policy_losses import _LOWER, _POSITIVE, clipped_surrogate, log_ratio
from .registry import LossInputs, LossResult, register_policy_loss
from .tensors import Aggregation, masked_mean

_FRACTION = Bound(gt=0.0, le=1.0, why="a fraction of the tokens, above 0 (verl refuses 0)")


def centred_covariance(inputs: LossInputs) -> torch.Tensor:
    """[B, T] each token's term of cov(log p, A) over the micro-batch's tokens (0 outside the mask)."""
    lp, adv, mask = inputs.logprobs.detach(), inputs.advantages, inputs.mask
    return (adv - masked_mean(adv, mask)) * (lp - masked_mean(lp, mask)) * mask


def token_budget(mask: torch.Tensor, fraction: float) -> int:
    """max(1, int(fraction * response tokens)): how many tokens a covariance loss touches."""
    return max(1, math.floor(fraction * int(mask.sum())))


def top_tokens(score: torch.Tensor, eligible: torch.Tensor, k: int) -> torch.Tensor:
    """[B, T] bool: the (at most) k eligible tokens of highest score."""
    picked = torch.zeros_like(eligible, dtype=torch.bool)
    k = min(k, int(eligible.sum()))
    if k > 0:
        flat = torch.where(eligible, score, torch.full_like(score, -math.inf)).flatten()
        picked.view(-1)[torch.topk(flat, k).indices] = True
    return picked


@register_policy_loss(
    "clip_cov", summary="PPO clip, plus no gradient for the few tokens of largest log-prob/advantage covariance (Clip-Cov)"
)
def clip_cov(
    inputs: LossInputs,
    clip_low: Annotated[float, _LOWER] = 0.2,
    clip_high: Annotated[float | None, _POSITIVE] = None,
    fraction: Annotated[float, _FRACTION] = 2e-4,
    cov_low: float = 1.0,
    cov_high: float = 5.0,
    aggregation: Aggregation = "token_mean",
) -> LossResult:
    """Clip-Cov: PPO's clipped loss, except that of the tokens PPO did not clip whose covariance term
    lies strictly between covLow and covHigh, the k of largest term lose their loss (value and
    gradient, as verl's weight of 0 does). A token PPO clipped already has no gradient, so it is
    never chosen: the budget goes to tokens that would otherwise move."""
    clip_high = clip_low if clip_high is None else clip_high
    lr = log_ratio(inputs)
    loss, clipped = clipped_surrogate(torch.exp(lr), inputs.advantages, clip_low, clip_high)
    cov = centred_covariance(inputs)
    eligible = (cov > cov_low) & (cov < cov_high) & (inputs.mask > 0) & ~clipped
    frozen = top_tokens(cov, eligible, token_budget(inputs.mask, fraction))
    loss = torch.where(frozen, torch.zeros_like(loss), loss)
    return inputs.aggregate(loss, aggregation), {
        "approx_kl": masked_mean(-lr, inputs.mask).detach(),
        "clip_fraction": masked_mean(clipped.float(), inputs.mask).detach(),
        "cov_frozen_fraction": masked_mean(frozen.float(), inputs.mask).detach(),
    }


@register_policy_loss("kl_cov", summary="the unclipped surrogate, plus a KL penalty on the few tokens of largest covariance (KL-Cov)")
def kl_cov(
    inputs: LossInputs, fraction: Annotated[float, _FRACTION] = 2e-3, kl_coef: float = 1.0, aggregation: Aggregation = "token_mean"
) -> LossResult:
    """KL-Cov: no clipping, L_t = -A_t r_t; the k response tokens of largest covariance term get
    klCoef * |log p_t - log p_old,t| added, which holds them near the old policy. (verl's default
    fraction is 2e-4; the paper's runs use 2e-3, the default here.)"""
    lr = log_ratio(inputs)
    loss = -inputs.advantages * torch.exp(lr)
    held = top_tokens(centred_covariance(inputs), inputs.mask > 0, token_budget(inputs.mask, fraction))
    penalty = kl_coef * (inputs.logprobs - inputs.old_logprobs).abs()
    loss = torch.where(held, loss + penalty, loss)
    return inputs.aggregate(loss, aggregation), {
        "approx_kl": masked_mean((inputs.logprobs - inputs.old_logprobs).abs(), inputs.mask).detach(),
        "cov_penalised_fraction": masked_mean(held.float(), inputs.mask).detach(),
    }
