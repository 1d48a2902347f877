"""Advantage estimators, registered by name: each turns a step's scores into per-token advantages.

An estimator is a pure function of an `AdvantageInputs` record and its own options; it returns an
`Advantages` record. Register one with `@register_advantage(name, ...)`, stating what it needs
(a critic, several samples per prompt) so that jobs that cannot run it are refused before they start.
Each follows verl's core_algos definition of the same name unless its docstring says where it differs.
A group of one sample (which a job asking for a group baseline is refused) gets advantage 0 here
where verl would take its mean as 0 and give it its raw score; REINFORCE++'s baseline follows verl.
"""

from __future__ import annotations

from typing import Annotated

import torch

from ..config.options import Bound
from .registry import AdvantageInputs, Advantages, register_advantage
from .tensors import _group_stats, broadcast_to_tokens, last_token_rewards, masked_whiten

_DISCOUNT = Bound(ge=0.0, le=1.0, why="a discount above 1 would grow a return with the response's length")


def token_rewards(inputs: AdvantageInputs, scores: torch.Tensor) -> torch.Tensor:
    """[B, T] rewards: each response's score on its last token, minus the KL penalty when it is in the reward."""
    rewards = last_token_rewards(scores, inputs.mask)
    return rewards - inputs.kl_penalty if inputs.kl_penalty is not None else rewards


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over tokens; returns (advantages, returns), both [B, T].

    delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1}, R_t = A_t + V_t. The value
    after a response's last token is 0. A masked position (padding, or a tool's output inside a
    multi-turn response) is skipped: the next token's value and advantage carry across it, as in
    verl. Masked positions get 0.
    """
    B, T = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros(B, dtype=rewards.dtype)
    running = torch.zeros(B, dtype=rewards.dtype)
    for t in reversed(range(T)):
        m = mask[:, t].to(rewards.dtype)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = (delta + gamma * lam * running) * m + running * (1 - m)
        advantages[:, t] = running * m
        next_value = values[:, t] * m + next_value * (1 - m)
    returns = (advantages + values) * mask
    return advantages, returns


@register_advantage("gae", needs_critic=True, summary="generalised advantage estimation with a learned critic (PPO)")
def gae_advantages(
    inputs: AdvantageInputs,
    gamma: Annotated[float, _DISCOUNT] = 1.0,
    lam: Annotated[float, Bound(ge=0.0, le=1.0, why="lambda mixes one-step TD (0) and Monte Carlo (1)")] = 0.95,
    whiten: bool = True,
) -> Advantages:
    """GAE (Schulman et al., 2016) over tokens. Whitened over the batch by default, as PPO
    implementations do (verl, OpenRLHF, CleanRL): the scale of the advantages then no longer
    depends on the reward's."""
    assert inputs.values is not None, "gae needs the critic's values"
    advantages, returns = gae(token_rewards(inputs, inputs.scores), inputs.values, inputs.mask, gamma, lam)
    if whiten:
        advantages = masked_whiten(advantages, inputs.mask)
    return Advantages(advantages, returns)


def grpo_advantages(scores: torch.Tensor, group: torch.Tensor, normalize_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Per-response advantage: score minus its group's mean, divided by the group's (unbiased) std
    plus eps (GRPO), or not (Dr. GRPO). A group of one gets 0 (verl: its raw score)."""
    mean, std, _ = _group_stats(scores, group)
    centred = scores - mean
    return centred / (std + eps) if normalize_by_std else centred


def rloo_advantages(scores: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Leave-one-out baseline: score minus the mean of the other responses to the same prompt
    (n/(n-1) (r_i - mean), as verl computes it). A group of one is refused (verl: its raw score)."""
    mean, _, count = _group_stats(scores, group)
    if bool((count < 2).any()):
        raise ValueError("rloo needs at least 2 responses per prompt")
    others = (mean * count - scores) / (count - 1)
    return scores - others


@register_advantage("grpo", min_samples=2, summary="score minus its group's mean, over the group's std (or not: Dr. GRPO)")
def grpo(inputs: AdvantageInputs, normalize_by_std: bool = True) -> Advantages:
    """GRPO (Shao et al., 2024): A_i = (r_i - mean_G r) / (std_G r + 1e-6); without the std, Dr. GRPO."""
    return Advantages(broadcast_to_tokens(grpo_advantages(inputs.scores, inputs.group, normalize_by_std), inputs.mask))


@register_advantage("rloo", min_samples=2, summary="score minus the mean of the other samples of its prompt")
def rloo(inputs: AdvantageInputs) -> Advantages:
    """RLOO (Ahmadian et al., 2024): A_i = r_i - mean_{j in G, j != i} r_j."""
    return Advantages(broadcast_to_tokens(rloo_advantages(inputs.scores, inputs.group), inputs.mask))


def reinforce_pp_advantages(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """REINFORCE++: discounted return-to-go of token rewards, whitened over the whole batch. A masked
    position inside a response (a tool's output) passes the return through unchanged, as in verl."""
    B, T = token_rewards.shape
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros(B, dtype=token_rewards.dtype)
    for t in reversed(range(T)):
        m = mask[:, t].to(token_rewards.dtype)
        ahead = token_rewards[:, t] + gamma * running
        returns[:, t] = ahead * m
        running = ahead * m + running * (1 - m)
    return masked_whiten(returns, mask)


def group_baseline(scores: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """[B] the mean score of each response's group, 0 for a group of one (verl's REINFORCE++-baseline)."""
    mean, _, count = _group_stats(scores, group)
    return torch.where(count > 1, mean, torch.zeros_like(mean))


@register_advantage(
    "reinforce_pp",
    group_options={"baseline": True},
    summary="return-to-go whitened over the batch, after an optional group baseline (REINFORCE++)",
)
def reinforce_pp(inputs: AdvantageInputs, baseline: bool | None = None, gamma: Annotated[float, _DISCOUNT] = 1.0) -> Advantages:
    """REINFORCE++ (Hu, 2025): A_t = whiten(sum_{k >= t} gamma^(k-t) r_k) over the batch's tokens, r the
    token rewards (the score on the last token, minus the KL penalty with klInReward). With the
    baseline (REINFORCE++-baseline) each score first loses its group's mean; a group of one keeps its
    score, as in verl. `baseline` None: the baseline when prompts have several samples, not when each
    has one (then it would change nothing; a job asking for it with one sample is refused)."""
    if baseline is None:
        baseline = bool(inputs.group.numel()) and inputs.group.unique().numel() < inputs.group.numel()
    scores = inputs.scores - group_baseline(inputs.scores, inputs.group) if baseline else inputs.scores
    return Advantages(reinforce_pp_advantages(token_rewards(inputs, scores), inputs.mask, gamma))


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
