"""Advantage estimators, registered by name: each turns a step's scores into per-token advantages.

An estimator is a pure function of an `AdvantageInputs` record and its own options; it returns an
`Advantages` record. Register one with `@register_advantage(name, ...)`, stating what it needs
(a critic, several samples per prompt) so that jobs that cannot run it are refused before they start.
"""

from __future__ import annotations

import torch

from .registry import AdvantageInputs, Advantages, register_advantage
from .tensors import _group_stats, broadcast_to_tokens, group_mean, last_token_rewards, masked_whiten


def token_rewards(inputs: AdvantageInputs, scores: torch.Tensor) -> torch.Tensor:
    """[B, T] rewards: each response's score on its last token, minus the KL penalty when it is in the reward."""
    rewards = last_token_rewards(scores, inputs.mask)
    return rewards - inputs.kl_penalty if inputs.kl_penalty is not None else rewards


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


@register_advantage("gae", needs_critic=True, summary="generalised advantage estimation with a learned critic (PPO)")
def gae_advantages(inputs: AdvantageInputs, gamma: float = 1.0, lam: float = 0.95, whiten: bool = True) -> Advantages:
    """GAE over tokens. Whitened over the batch by default, as PPO implementations do (verl,
    OpenRLHF, CleanRL): the scale of the advantages then no longer depends on the reward's."""
    assert inputs.values is not None, "gae needs the critic's values"
    advantages, returns = gae(token_rewards(inputs, inputs.scores), inputs.values, inputs.mask, gamma, lam)
    if whiten:
        advantages = masked_whiten(advantages, inputs.mask)
    return Advantages(advantages, returns)


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


@register_advantage("grpo", min_samples=2, summary="score minus its group's mean, over the group's std (or not: Dr. GRPO)")
def grpo(inputs: AdvantageInputs, normalize_by_std: bool = True) -> Advantages:
    return Advantages(broadcast_to_tokens(grpo_advantages(inputs.scores, inputs.group, normalize_by_std), inputs.mask))


@register_advantage("rloo", min_samples=2, summary="score minus the mean of the other samples of its prompt")
def rloo(inputs: AdvantageInputs) -> Advantages:
    return Advantages(broadcast_to_tokens(rloo_advantages(inputs.scores, inputs.group), inputs.mask))


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


@register_advantage("reinforce_pp", summary="return-to-go whitened over the batch, after an optional group baseline (REINFORCE++)")
def reinforce_pp(inputs: AdvantageInputs, baseline: bool | None = None) -> Advantages:
    """`baseline` None: subtract the group mean when prompts have several samples (REINFORCE++-baseline), not
    when each has one (plain REINFORCE++), where the sample's own mean would leave every advantage 0."""
    if baseline is None:
        baseline = bool(inputs.group.numel()) and inputs.group.unique().numel() < inputs.group.numel()
    scores = inputs.scores - group_mean(inputs.scores, inputs.group) if baseline else inputs.scores
    return Advantages(reinforce_pp_advantages(token_rewards(inputs, scores), inputs.mask))


def _lengths(mask: torch.Tensor) -> torch.Tensor:
    return mask.sum(-1).to(torch.float32)


@register_advantage("opo", min_samples=2, summary="score minus its group's length-weighted mean score (OPO's optimal baseline)")
def opo(inputs: AdvantageInputs) -> Advantages:
    """On-Policy RL with Optimal reward baseline: b = sum_j |o_j| r_j / sum_j |o_j| over the group."""
    lengths = _lengths(inputs.mask)
    _, inverse = torch.unique(inputs.group, return_inverse=True)
    groups = int(inverse.max()) + 1 if len(inverse) else 0
    weighted = torch.zeros(groups).index_add_(0, inverse, lengths * inputs.scores)
    total = torch.zeros(groups).index_add_(0, inverse, lengths).clamp(min=1)
    baseline = (weighted / total)[inverse]
    return Advantages(broadcast_to_tokens(inputs.scores - baseline, inputs.mask))


@register_advantage("gpg", min_samples=2, summary="score minus its group's mean, scaled by batch / informative samples (GPG)")
def gpg(inputs: AdvantageInputs) -> Advantages:
    """Group Policy Gradient: centred scores times B / B_valid, where B_valid counts the samples of
    groups whose rewards differ (groups with equal rewards carry no gradient, and would otherwise
    dilute the batch's)."""
    mean, std, _ = _group_stats(inputs.scores, inputs.group)
    valid = int((std > 0).sum())
    scale = len(inputs.scores) / max(valid, 1)
    return Advantages(broadcast_to_tokens((inputs.scores - mean) * scale, inputs.mask))


def returns_to_go(token_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] undiscounted sum of the token rewards from each token to the response's end."""
    return torch.flip(torch.cumsum(torch.flip(token_rewards * mask, [-1]), -1), [-1]) * mask


@register_advantage("remax", needs_greedy=True, summary="return minus the reward of a greedy response to the same prompt (ReMax)")
def remax(inputs: AdvantageInputs) -> Advantages:
    """ReMax (Li et al., 2023): REINFORCE whose baseline is the reward of the greedy response to the
    prompt, one extra deterministic rollout per prompt instead of a critic or a group."""
    assert inputs.greedy_scores is not None, "remax needs the greedy responses' scores"
    returns = returns_to_go(token_rewards(inputs, inputs.scores), inputs.mask)
    return Advantages(returns - broadcast_to_tokens(inputs.greedy_scores, inputs.mask))


@register_advantage("grpo_passk", min_samples=2, summary="only the best sample of a group learns, by its margin over the second best (pass@k)")
def grpo_passk(inputs: AdvantageInputs, normalize_by_std: bool = True) -> Advantages:
    """GRPO for pass@k (Thrampoulidis et al., 2025): a group is worth its best sample, so only that
    sample gets an advantage, its score minus the group's second best (over the group's std when
    asked); every other sample gets 0. Ties for best go to the first."""
    advantages = torch.zeros_like(inputs.scores)
    _, std, _ = _group_stats(inputs.scores, inputs.group)
    for g in inputs.group.unique():
        members = torch.nonzero(inputs.group == g).flatten()
        if len(members) < 2:
            continue
        top = torch.topk(inputs.scores[members], 2)
        best = members[top.indices[0]]
        margin = top.values[0] - top.values[1]
        advantages[best] = margin / (std[best] + 1e-6) if normalize_by_std else margin
    return Advantages(broadcast_to_tokens(advantages, inputs.mask))
