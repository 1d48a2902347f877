"""The optimal token baseline (OTB) and its variant for tool-integrated (multi-turn) responses.

A group baseline gives every token of a response the same baseline. OTB gives each token position
its own: the group's returns at that position weighted by how much gradient variance each
trajectory has accumulated up to it. With G_t the return-to-go, pi_t the old policy's probability
of the sampled token and S_t the sum of its squared probabilities over the vocabulary,

    w_t = 1 - 2 pi_t + S_t                (the squared norm of the score function's logit gradient)
    W_t = sum_{j <= t} w_j                (times the squared truncated IS weight with algorithm.tis)
    B_t = sum_i G_{i,t} W_{i,t} / (sum_i W_{i,t} + 1e-8)    over the group's trajectories i
    A_t = G_t - B_t

as verl's optimal_token_baseline and tir_optimal_token_baseline compute it. A group of one has no
baseline (A = G). With handleZeroTail, the part of a group's unique longest response beyond the
second longest gets baseline 0 (no other trajectory is there to estimate it).
"""

from __future__ import annotations

import torch

from .advantages import returns_to_go, token_rewards
from .registry import AdvantageInputs, Advantages, register_advantage

_EPS = 1e-8


def _path_variance(inputs: AdvantageInputs) -> torch.Tensor:
    """[B, T] W_t, the cumulative per-token weight (0 where masked, and carried across holes)."""
    assert inputs.old_logprobs is not None and inputs.sum_pi_squared is not None, (
        "the optimal token baseline needs the old log-probs and the sum of squared probabilities"
    )
    w = 1.0 - 2.0 * torch.exp(inputs.old_logprobs) + inputs.sum_pi_squared
    if inputs.is_weights is not None:
        w = w * inputs.is_weights**2
    return torch.cumsum(w * inputs.mask, dim=-1)


def _baselines(
    returns: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor, group: torch.Tensor, handle_zero_tail: bool
) -> torch.Tensor:
    """[B, T] B_t per group over aligned positions (column t is every trajectory's t-th token)."""
    baselines = torch.zeros_like(returns)
    for g in group.unique():
        rows = torch.nonzero(group == g).flatten()
        if len(rows) < 2:
            continue
        m = mask[rows]
        numerator = (returns[rows] * weights[rows] * m).sum(0)
        denominator = (weights[rows] * m).sum(0) + _EPS
        baselines[rows] = (numerator / denominator)[None, :].expand(len(rows), -1)
        if handle_zero_tail:
            lengths = m.sum(-1)
            ordered = torch.sort(lengths).values
            longest, second = int(ordered[-1]), int(ordered[-2])
            at_max = torch.nonzero(lengths == longest).flatten()
            if len(at_max) == 1 and longest > second:
                baselines[rows[at_max[0]], second:] = 0.0
    return baselines


@register_advantage(
    "optimal_token_baseline",
    min_samples=2,
    needs_pi_squared=True,
    summary="return-to-go minus a per-position baseline weighted by accumulated gradient variance (OTB)",
)
def optimal_token_baseline(inputs: AdvantageInputs, handle_zero_tail: bool = False) -> Advantages:
    """OTB over the responses' token positions (module docstring)."""
    returns = returns_to_go(token_rewards(inputs, inputs.scores), inputs.mask)
    weights = _path_variance(inputs)
    baselines = _baselines(returns, weights, inputs.mask, inputs.group, handle_zero_tail)
    return Advantages((returns - baselines) * inputs.mask, returns)


def _compact(x: torch.Tensor, mask: torch.Tensor, width: int) -> torch.Tensor:
    """[B, width] each row's masked entries moved to its front, in order (0 after them)."""
    out = x.new_zeros(x.shape[0], width)
    for i in range(x.shape[0]):
        kept = x[i][mask[i] > 0]
        out[i, : len(kept)] = kept
    return out


@register_advantage(
    "tir_optimal_token_baseline",
    min_samples=2,
    needs_pi_squared=True,
    summary="OTB aligned by each response's own tokens, skipping tool outputs (multi-turn, TIR)",
)
def tir_optimal_token_baseline(inputs: AdvantageInputs, handle_zero_tail: bool = True) -> Advantages:
    """OTB for tool-integrated reasoning: a multi-turn response's mask has holes (tool outputs), so
    the group's trajectories are compared at their k-th own token, not at the k-th position. Empty
    responses take no part."""
    mask = inputs.mask
    returns = returns_to_go(token_rewards(inputs, inputs.scores), mask)
    lengths = mask.sum(-1).long()
    width = int(lengths.max()) if lengths.numel() else 0
    aligned_returns, aligned_weights = _compact(returns, mask, width), _compact(_path_variance(inputs), mask, width)
    aligned_mask = (torch.arange(width)[None, :] < lengths[:, None]).to(mask.dtype)
    present = lengths > 0
    group = torch.where(present, inputs.group, torch.full_like(inputs.group, -1) - torch.arange(len(lengths)))
    baselines = _baselines(aligned_returns, aligned_weights, aligned_mask, group, handle_zero_tail)
    advantages = torch.zeros_like(returns)
    for i in range(len(lengths)):
        if lengths[i] > 0:
            advantages[i, mask[i] > 0] = aligned_returns[i, : lengths[i]] - baselines[i, : lengths[i]]
    return Advantages(advantages * mask, returns)
