"""Policy losses, registered by name, and the critic's value loss.

A policy loss is a pure function of the new and old log-probs of the sampled tokens, their
advantages and mask, and its own options; it returns (loss, stats). Register one with
`@register_policy_loss(name, ...)`.
"""

from __future__ import annotations

import math

import torch

from .registry import register_policy_loss
from .tensors import Aggregation, aggregate, masked_mean, masked_sum


@register_policy_loss("ppo_clip", summary="PPO's clipped surrogate; clipHigh > clipLow is DAPO's clip-higher; dualClip bounds negative advantages")
def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip_low: float = 0.2, clip_high: float | None = None,
                aggregation: Aggregation = "token_mean", dual_clip: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate, -min(r A, clip(r, 1-low, 1+high) A); returns (loss, stats).

    dual_clip = c > 1 (Ye et al., 2020): where A < 0 the loss is at most -c A, so a token whose
    ratio has grown large cannot dominate the update."""
    clip_high = clip_low if clip_high is None else clip_high
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(torch.clamp(log_ratio, -20.0, 20.0))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -dual_clip * advantages), loss)
    stats = {
        "clip_fraction": masked_mean((clipped > unclipped).float(), mask).detach(),
        "approx_kl": masked_mean(-log_ratio, mask).detach(),
    }
    return aggregate(loss, mask, aggregation), stats


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float, aggregation: Aggregation = "token_mean") -> torch.Tensor:
    """The critic's loss, 0.5 * (V - R)^2, with PPO's value clipping around the old values (clip > 0)."""
    loss = (values - returns) ** 2
    if clip > 0:
        clipped = old_values + torch.clamp(values - old_values, -clip, clip)
        loss = torch.maximum(loss, (clipped - returns) ** 2)
    return 0.5 * aggregate(loss, mask, aggregation)


def _sequence_log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] the mean log-ratio over each response's tokens: the log of the geometric-mean ratio."""
    return masked_mean(logprobs - old_logprobs, mask, dim=-1)


@register_policy_loss("gspo", summary="PPO clipping of the sequence-level (geometric-mean) ratio (GSPO)")
def gspo(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
         clip_low: float = 3e-4, clip_high: float = 4e-4,
         aggregation: Aggregation = "seq_mean_token_mean") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Group Sequence Policy Optimization: every token of a response shares its sequence ratio
    s = exp(mean_t log r_t); per token s_t = sg(s) * exp(log p_t - sg(log p_t)), whose value is s and
    whose gradient is s times the token's score function, as in the paper's token-level form."""
    seq_log_ratio = torch.clamp(_sequence_log_ratio(logprobs, old_logprobs, mask), max=10.0)
    log_s = seq_log_ratio.detach()[:, None] + logprobs - logprobs.detach()
    ratio = torch.exp(log_s)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    stats = {
        "clip_fraction": masked_mean((clipped > unclipped).float(), mask).detach(),
        "approx_kl": masked_mean(old_logprobs - logprobs, mask).detach(),
    }
    return aggregate(loss, mask, aggregation), stats


@register_policy_loss("cispo", summary="REINFORCE with the clipped importance weight detached (CISPO)")
def cispo(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
          clip_high: float = 5.0, aggregation: Aggregation = "token_mean") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped IS-weight Policy Optimization (MiniMax-M1): -sg(min(r, 1 + clipHigh)) A log p. Every
    token keeps a gradient; only the weight is bounded, not the update's reach."""
    ratio = torch.exp(torch.clamp(logprobs - old_logprobs, -20.0, 20.0))
    weight = torch.clamp(ratio, max=1.0 + clip_high).detach()
    loss = -weight * advantages * logprobs
    stats = {
        "clip_fraction": masked_mean((ratio > 1.0 + clip_high).float(), mask).detach(),
        "approx_kl": masked_mean(old_logprobs - logprobs, mask).detach(),
    }
    return aggregate(loss, mask, aggregation), stats


@register_policy_loss("gpg", summary="the plain policy gradient, -A log p, no ratio and no clipping (GPG)")
def gpg(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
        aggregation: Aggregation = "token_mean") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss = -advantages * logprobs
    return aggregate(loss, mask, aggregation), {"approx_kl": masked_mean(old_logprobs - logprobs, mask).detach()}


def _ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    return torch.exp(torch.clamp(logprobs - old_logprobs, -20.0, 20.0))


@register_policy_loss("sapo", summary="a smooth sigmoid gate of the ratio instead of a hard clip, sharper for negative advantages (SAPO)")
def sapo(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
         tau_pos: float = 1.0, tau_neg: float = 1.05,
         aggregation: Aggregation = "token_mean") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Soft Adaptive Policy Optimization (Qwen, 2025): -f(r) A with f(r) = 4/tau * sigmoid(tau (r - 1)).
    At r = 1 the gate's value is 2/tau and its slope 1, so an on-policy token gets the plain policy
    gradient; away from 1 the unclipped surrogate's gradient is weighed by 4 s (1 - s), s the
    sigmoid, which fades smoothly instead of stopping at a clip bound. Negative
    advantages use the larger tau_neg, which fades faster (their updates are the unstable ones)."""
    ratio = _ratio(logprobs, old_logprobs)
    tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
    loss = -gate * advantages
    return aggregate(loss, mask, aggregation), {"approx_kl": masked_mean(old_logprobs - logprobs, mask).detach()}


def _centred_covariance(logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] each token's term of cov(log p, A) over the batch's tokens (0 outside the mask)."""
    lp = logprobs.detach()
    return (advantages - masked_mean(advantages, mask)) * (lp - masked_mean(lp, mask)) * mask


def _top_tokens(score: torch.Tensor, eligible: torch.Tensor, fraction: float) -> torch.Tensor:
    """[B, T] bool: the ceil(fraction * tokens) eligible tokens of highest score (none if none is eligible)."""
    picked = torch.zeros_like(eligible, dtype=torch.bool)
    n_eligible = int(eligible.sum())
    k = min(n_eligible, math.ceil(fraction * int(eligible.numel()))) if fraction > 0 else 0
    if k > 0:
        flat = torch.where(eligible, score, torch.full_like(score, -math.inf)).flatten()
        picked.view(-1)[torch.topk(flat, k).indices] = True
    return picked


@register_policy_loss("clip_cov", summary="PPO clip, plus no gradient for the few tokens of largest log-prob/advantage covariance (Clip-Cov)")
def clip_cov(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
             clip_low: float = 0.2, clip_high: float | None = None, fraction: float = 2e-4, cov_low: float = 1.0,
             cov_high: float = 5.0, aggregation: Aggregation = "token_mean") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clip-Cov (Cui et al., 2025, "The Entropy Mechanism of RL for Reasoning LMs"): entropy collapses
    through the tokens whose log-prob and advantage covary most; a `fraction` of the tokens whose
    covariance term lies in [cov_low, cov_high] is excluded from the gradient. The paper draws them
    at random; this picks the largest, so that a step is reproducible without a random stream."""
    clip_high = clip_low if clip_high is None else clip_high
    ratio = _ratio(logprobs, old_logprobs)
    loss = torch.maximum(-advantages * ratio, -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high))
    cov = _centred_covariance(logprobs, advantages, mask)
    frozen = _top_tokens(cov, (cov >= cov_low) & (cov <= cov_high) & (mask > 0), fraction)
    loss = torch.where(frozen, loss.detach(), loss)
    return aggregate(loss, mask, aggregation), {
        "approx_kl": masked_mean(old_logprobs - logprobs, mask).detach(),
        "cov_frozen_fraction": masked_mean(frozen.float(), mask).detach(),
    }


@register_policy_loss("kl_cov", summary="the unclipped surrogate, plus a KL penalty on the few tokens of largest covariance (KL-Cov)")
def kl_cov(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
           fraction: float = 2e-3, kl_coef: float = 1.0,
           aggregation: Aggregation = "token_mean") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL-Cov (same paper): no clipping; the `fraction` of tokens with the largest covariance term
    get kl_coef * |log p - log p_old| added, which holds them near the old policy."""
    ratio = _ratio(logprobs, old_logprobs)
    loss = -advantages * ratio
    cov = _centred_covariance(logprobs, advantages, mask)
    held = _top_tokens(cov, mask > 0, fraction)
    loss = torch.where(held, loss + kl_coef * (logprobs - old_logprobs).abs(), loss)
    return aggregate(loss, mask, aggregation), {
        "approx_kl": masked_mean(old_logprobs - logprobs, mask).detach(),
        "cov_penalised_fraction": masked_mean(held.float(), mask).detach(),
    }


@register_policy_loss("gmpo", summary="the geometric mean of the token ratios, clipped per token in log space (GMPO)")
def gmpo(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
         clip_low: float = 0.4, clip_high: float = 0.4) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Geometric-Mean Policy Optimization (Zhao et al., 2025): a response's objective is
    A * (prod_t r_t')^(1/|o|), where each token's log-ratio is clipped to [-clip_low, clip_high]
    pessimistically for the sign of A (PPO's min, taken in log space). The geometric mean is
    less swayed by one outlier token than GRPO's arithmetic mean. One number per response, mean
    over responses: its aggregation is fixed."""
    log_ratio = torch.clamp(logprobs - old_logprobs, -20.0, 20.0)
    sign = torch.sign(advantages)
    clipped = torch.clamp(log_ratio, -clip_low, clip_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped)
    lengths = mask.sum(-1).clamp(min=1)
    seq_ratio = torch.exp(masked_sum(pessimistic, mask, dim=-1) / lengths)
    seq_advantage = masked_sum(advantages, mask, dim=-1) / lengths
    loss = (-seq_advantage * seq_ratio).mean()
    return loss, {"approx_kl": masked_mean(-log_ratio, mask).detach(),
                  "clip_fraction": masked_mean((pessimistic != log_ratio).float(), mask).detach()}
