"""Reward shaping and batch filtering that presets use: pure functions of scores and lengths."""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_tokens: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """[B] DAPO's soft overlong punishment, added to the reward of each response.

    0 up to max_tokens - buffer tokens, then falling linearly to -factor at max_tokens, where the
    response was cut: a truncated answer is penalised in proportion to how far into the buffer it
    ran, instead of a cliff that punishes a good but long line of reasoning as hard as garbage."""
    if buffer <= 0:
        return torch.zeros(len(lengths))
    over = (lengths.to(torch.float32) - (max_tokens - buffer)).clamp(min=0.0, max=float(buffer))
    return -factor * over / buffer


def informative_groups(scores: torch.Tensor, group: torch.Tensor) -> list[int]:
    """The group ids, in order of first appearance, whose samples did not all get the same score.

    A group whose rewards are all equal has advantage 0 for every sample under a group baseline, so
    it adds no gradient and only dilutes the batch (DAPO's dynamic sampling drops it)."""
    kept: list[int] = []
    for g in dict.fromkeys(group.tolist()):
        members = scores[group == g]
        if len(members) > 1 and bool((members != members[0]).any()):
            kept.append(int(g))
    return kept
