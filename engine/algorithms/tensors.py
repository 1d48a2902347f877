"""Tensor helpers every algorithm shares: masked reductions, loss aggregation, KL estimators, groups.

Shapes: a batch of B responses padded on the right to T tokens. `mask` is [B, T] with 1 on response
tokens. `scores` are per-response rewards [B]. Responses of the same prompt share a `group` id [B].
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

Aggregation = Literal["token_mean", "token_sum", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
KLEstimator = Literal["k1", "k2", "k3", "abs", "k1+", "k3+", "abs+"]


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    return (x * mask).sum() if dim is None else (x * mask).sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    # The clamp keeps an all-masked row at 0 instead of NaN.
    return masked_sum(x, mask, dim) / (mask.sum() if dim is None else mask.sum(dim)).clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked entries (unbiased std, as in REINFORCE++)."""
    mean = masked_mean(x, mask)
    n = mask.sum().clamp(min=2)
    var = masked_sum((x - mean) ** 2, mask) / (n - 1)
    return (x - mean) * torch.rsqrt(var + eps) * mask


def responses(mask: torch.Tensor) -> torch.Tensor:
    """The number of responses with at least one token: the divisor of the per-response aggregations
    (an empty row weighs nothing, as in verl's agg_loss)."""
    return (mask.sum(-1) > 0).sum().clamp(min=1).to(torch.float32)


def aggregate(loss: torch.Tensor, mask: torch.Tensor, mode: Aggregation, horizon: int | None = None) -> torch.Tensor:
    """One number from per-token losses [B, T], as verl's agg_loss on one rank.

    token_mean: every token weighs the same (long responses weigh more); token_sum: the sum over
    tokens (no divisor); seq_mean_token_sum: sum over a response's tokens, mean over responses (Dr.
    GRPO); seq_mean_token_mean: every response weighs the same (the original GRPO);
    seq_mean_token_sum_norm: sum over all tokens divided by the number of responses times a constant
    `horizon` (Dr. GRPO's constant normaliser: algorithm.lossScaleFactor, by default the rollout's
    maxNewTokens; without one, the batch's width T). The per-response modes count only responses
    with at least one token.
    """
    if mode == "token_mean":
        return masked_mean(loss, mask)
    if mode == "token_sum":
        return masked_sum(loss, mask)
    if mode == "seq_mean_token_sum":
        return masked_sum(loss, mask, dim=-1).sum() / responses(mask)
    if mode == "seq_mean_token_mean":
        return masked_mean(loss, mask, dim=-1).sum() / responses(mask)
    if mode == "seq_mean_token_sum_norm":
        return masked_sum(loss, mask) / (responses(mask) * (horizon or mask.shape[-1]))
    raise ValueError(f"unknown loss aggregation {mode!r}")


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from samples of the policy (Schulman, 2020).

    With x = log p - log q: k1 = x (unbiased, high variance, can be negative); abs = |x|;
    k2 = x^2 / 2; k3 = exp(-x) - 1 + x (unbiased, always >= 0), with -x clamped to [-20, 20] and the
    result to [-10, 10], as verl's kl_penalty does. A name ending in "+" is straight-through: the
    value of its estimator, the gradient of k2 (whose gradient is the KL's own in expectation).
    """
    if estimator.endswith("+"):
        value = kl_estimate(logprobs, ref_logprobs, estimator[:-1])  # type: ignore[arg-type]
        k2 = kl_estimate(logprobs, ref_logprobs, "k2")
        return k2 - k2.detach() + value.detach()
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "abs":
        return log_ratio.abs()
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        neg = torch.clamp(-log_ratio, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(neg) - 1.0 - neg, min=-10.0, max=10.0)
    raise ValueError(f"unknown KL estimator {estimator!r}")


def last_token_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] rewards that are zero except the score on each response's last token."""
    rewards = torch.zeros_like(mask, dtype=scores.dtype)
    lengths = mask.long().sum(-1)
    has_tokens = lengths > 0
    rows = torch.arange(mask.shape[0])[has_tokens]
    # The last token is the last masked position (a multi-turn mask can have holes).
    last = mask.shape[-1] - 1 - torch.argmax(torch.flip(mask, [-1]).to(torch.long), dim=-1)
    rewards[rows, last[has_tokens]] = scores[has_tokens]
    return rewards


def _group_stats(scores: torch.Tensor, group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-response (group mean, group std (unbiased), group size)."""
    _, inverse, counts = torch.unique(group, return_inverse=True, return_counts=True)
    sums = torch.zeros(len(counts), dtype=scores.dtype).index_add_(0, inverse, scores)
    means = sums / counts
    sq = torch.zeros(len(counts), dtype=scores.dtype).index_add_(0, inverse, (scores - means[inverse]) ** 2)
    stds = torch.sqrt(sq / (counts - 1).clamp(min=1))
    return means[inverse], stds[inverse], counts[inverse]


def group_mean(scores: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Per-response mean score of its group (REINFORCE++'s baseline)."""
    return _group_stats(scores, group)[0]


def broadcast_to_tokens(per_response: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return per_response[:, None] * mask


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of the categorical distribution over the last dimension."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)
