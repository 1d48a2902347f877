"""Policy losses, registered by name, and the critic's value loss.

A policy loss is a pure function of the new and old log-probs of the sampled tokens, their
advantages and mask, and its own options; it returns (loss, stats). Register one with
`@register_policy_loss(name, ...)`.
"""

from __future__ import annotations

import torch

from .registry import register_policy_loss
from .tensors import Aggregation, aggregate, masked_mean


@register_policy_loss("ppo_clip", summary="PPO's clipped surrogate; clip_high > clip_low is DAPO's clip-higher; dual_clip bounds negative advantages")
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
