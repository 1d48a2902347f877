"""Estimators whose baseline is another statistic of a prompt's group: OPO, GPG, GRPO pass@k, GDPO."""

from __future__ import annotations

import torch

from .advantages import grpo_advantages
from .registry import AdvantageInputs, Advantages, register_advantage
from .tensors import _group_stats, broadcast_to_tokens, masked_whiten


@register_advantage("opo", min_samples=2, summary="score minus its group's length-weighted mean score (OPO's optimal baseline)")
def opo(inputs: AdvantageInputs) -> Advantages:
    """On-Policy RL with Optimal reward baseline (Hao et al., 2025): b = sum_j |o_j| r_j / sum_j |o_j|
    over the group, A_i = r_i - b. A group of one gets 0 (verl: b = 0, its raw score)."""
    lengths = inputs.mask.sum(-1).to(torch.float32)
    _, inverse = torch.unique(inputs.group, return_inverse=True)
    groups = int(inverse.max()) + 1 if len(inverse) else 0
    weighted = torch.zeros(groups).index_add_(0, inverse, lengths * inputs.scores)
    total = torch.zeros(groups).index_add_(0, inverse, lengths).clamp(min=1)
    baseline = (weighted / total)[inverse]
    return Advantages(broadcast_to_tokens(inputs.scores - baseline, inputs.mask))


@register_advantage("gpg", min_samples=2, summary="score minus its group's mean, scaled by batch / informative samples (GPG)")
def gpg(inputs: AdvantageInputs) -> Advantages:
    """Group Policy Gradient (Chu et al., 2025): A_i = (r_i - mean_G r) · B / B_valid, B the batch's
    responses and B_valid those in groups whose rewards differ (a group of equal rewards carries no
    gradient and would otherwise dilute the batch's).

    Differs from verl on purpose: verl's scale is B / (responses with a nonzero reward), which for
    0/1 rewards counts the correct answers, not the informative samples the paper's B / (B - M)
    counts; and verl gives a group of one its raw score, here 0."""
    mean, std, _ = _group_stats(inputs.scores, inputs.group)
    valid = int((std > 0).sum())
    scale = len(inputs.scores) / max(valid, 1)
    return Advantages(broadcast_to_tokens((inputs.scores - mean) * scale, inputs.mask))


@register_advantage(
    "grpo_passk", min_samples=2, summary="only the best sample of a group learns, by its margin over the second best (pass@k)"
)
def grpo_passk(inputs: AdvantageInputs, normalize_by_std: bool = True) -> Advantages:
    """GRPO for pass@k (Thrampoulidis et al., 2025): a group is worth its best sample, so only that
    sample gets an advantage, its score minus the group's second best (over the group's std + 1e-6
    when asked); every other sample gets 0. Ties for best go to torch.topk's first, as in verl. A group
    of one gets 0 (verl refuses it)."""
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


def verl_grpo_advantages(scores: torch.Tensor, group: torch.Tensor, normalize_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """GRPO's per-response advantage as verl computes it, groups of one included: verl takes such a
    group's mean as 0 and its std as 1, so its sample keeps its raw score (over 1 + eps with the std)."""
    _, _, count = _group_stats(scores, group)
    singleton = scores / (1.0 + eps) if normalize_by_std else scores
    return torch.where(count == 1, singleton, grpo_advantages(scores, group, normalize_by_std, eps))


@register_advantage(
    "gdpo", min_samples=2, summary="GRPO's normalisation of each reward source apart, then their weighted sum, whitened (GDPO)"
)
def gdpo(inputs: AdvantageInputs, normalize_by_std: bool = True) -> Advantages:
    """Group reward-Decoupled Normalization Policy Optimization (2026, arXiv 2601.05242): a strong
    reward source would drown a weak one in GRPO's sum, so each source k is normalised within the
    group on its own, A_k = (r_k - mean_G r_k) / (std_G r_k + 1e-6), then
    A = whiten(sum_k w_k A_k) over the batch's tokens. The sources are the job's reward rules, python
    file and model; w_k their weights in `reward` (verl names its sources in gdpo_reward_keys, weighted 1
    unless gdpo_reward_weights says otherwise). With one source it is GRPO whitened over the batch.

    A group of one enters the whitening with verl's value (its raw scores, weighted), so every other
    sample's advantage is verl's; only after the whitening is its own advantage set to 0, as for the
    other group estimators here (verl keeps its whitened value)."""
    parts = inputs.reward_parts or {"reward": inputs.scores}
    total = torch.zeros_like(inputs.scores)
    for name, values in parts.items():
        weight = inputs.reward_weights.get(name, 1.0)
        total = total + weight * verl_grpo_advantages(values.to(inputs.scores.dtype), inputs.group, normalize_by_std)
    whitened = masked_whiten(broadcast_to_tokens(total, inputs.mask), inputs.mask)
    _, _, count = _group_stats(inputs.scores, inputs.group)
    return Advantages(whitened * (count > 1).to(whitened.dtype)[:, None])
