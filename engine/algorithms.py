"""RL algorithms as pure tensor functions: advantages, losses, KL estimators, aggregation.

Shapes: a batch of B responses padded on the right to T tokens. `mask` is [B, T] with 1 on response
tokens. `scores` are per-response rewards [B]. Responses of the same prompt share a `group` id [B].
Nothing here touches a model, a process group or a global: every function is its own unit test.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

Aggregation = Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"]
KLEstimator = Literal["k1", "k2", "k3"]


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


def aggregate(loss: torch.Tensor, mask: torch.Tensor, mode: Aggregation) -> torch.Tensor:
    """One number from per-token losses [B, T].

    token_mean: every token weighs the same (long responses weigh more); seq_mean_token_sum: sum
    over a response's tokens, mean over responses (Dr. GRPO); seq_mean_token_mean: every response
    weighs the same (the original GRPO).
    """
    if mode == "token_mean":
        return masked_mean(loss, mask)
    if mode == "seq_mean_token_sum":
        return masked_sum(loss, mask, dim=-1).mean()
    if mode == "seq_mean_token_mean":
        return masked_mean(loss, mask, dim=-1).mean()
    raise ValueError(f"unknown loss aggregation {mode!r}")


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from samples of the policy (Schulman, 2020).

    k1 = log p - log q (unbiased, high variance, can be negative); k2 = (log p - log q)^2 / 2;
    k3 = q/p - 1 - log(q/p) (unbiased, always >= 0).
    """
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        # Clamped as verl does: exp of a large negative log-ratio is harmless, of a large positive not.
        neg = torch.clamp(-log_ratio, min=-20.0, max=20.0)
        return torch.exp(neg) - 1.0 - neg
    raise ValueError(f"unknown KL estimator {estimator!r}")


def last_token_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] rewards that are zero except the score on each response's last token."""
    rewards = torch.zeros_like(mask, dtype=scores.dtype)
    lengths = mask.long().sum(-1)
    has_tokens = lengths > 0
    rows = torch.arange(mask.shape[0])[has_tokens]
    rewards[rows, lengths[has_tokens] - 1] = scores[has_tokens]
    return rewards


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over tokens; returns (advantages, returns), both [B, T].

    The value after a response's last token is 0 (the episode ends). Masked positions get 0.
    """
    B, T = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros(B, dtype=rewards.dtype)
    running = torch.zeros(B, dtype=rewards.dtype)
    for t in reversed(range(T)):
        m = mask[:, t].to(rewards.dtype)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = delta + gamma * lam * running
        # Padding after a response must not leak into it: outside the mask, reset.
        running = running * m
        advantages[:, t] = running
        next_value = values[:, t] * m
    returns = (advantages + values) * mask
    return advantages, returns


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


def grpo_advantages(scores: torch.Tensor, group: torch.Tensor, normalize_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Per-response advantage: score minus its group's mean, divided by the group's std (GRPO) or not (Dr. GRPO)."""
    mean, std, _ = _group_stats(scores, group)
    centred = scores - mean
    return centred / (std + eps) if normalize_by_std else centred


def rloo_advantages(scores: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Leave-one-out baseline: score minus the mean of the other responses to the same prompt."""
    mean, _, count = _group_stats(scores, group)
    if bool((count < 2).any()):
        raise ValueError("rloo needs at least 2 responses per prompt")
    others = (mean * count - scores) / (count - 1)
    return scores - others


def reinforce_pp_advantages(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """REINFORCE++: discounted return-to-go of token rewards, whitened over the whole batch."""
    B, T = token_rewards.shape
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros(B, dtype=token_rewards.dtype)
    for t in reversed(range(T)):
        running = token_rewards[:, t] + gamma * running
        running = running * mask[:, t]
        returns[:, t] = running
    return masked_whiten(returns, mask)


def broadcast_to_tokens(per_response: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return per_response[:, None] * mask


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip_low: float, clip_high: float | None = None,
                aggregation: Aggregation = "token_mean") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate, -min(r A, clip(r, 1-low, 1+high) A); returns (loss, stats)."""
    clip_high = clip_low if clip_high is None else clip_high
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(torch.clamp(log_ratio, -20.0, 20.0))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
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


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of the categorical distribution over the last dimension."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def dpo_loss(chosen_logps: torch.Tensor, rejected_logps: torch.Tensor, ref_chosen_logps: torch.Tensor,
             ref_rejected_logps: torch.Tensor, beta: float, label_smoothing: float = 0.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPO's sigmoid loss over preference pairs (sequence log-probs [N]); returns (mean loss, stats).

    With label smoothing eps (conservative DPO) a label is assumed flipped with probability eps.
    """
    chosen_reward = beta * (chosen_logps - ref_chosen_logps)
    rejected_reward = beta * (rejected_logps - ref_rejected_logps)
    margin = chosen_reward - rejected_reward
    losses = -(1 - label_smoothing) * F.logsigmoid(margin) - label_smoothing * F.logsigmoid(-margin)
    stats = {
        "reward_accuracy": (margin > 0).float().mean().detach(),
        "reward_margin": margin.mean().detach(),
        "chosen_reward": chosen_reward.mean().detach(),
        "rejected_reward": rejected_reward.mean().detach(),
    }
    return losses.mean(), stats
