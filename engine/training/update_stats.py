"""Means of the statistics of updates: over one rank's updates, and over the ranks of its role."""

from __future__ import annotations

import torch.distributed as dist


def mean_of(stats: list[dict[str, float]]) -> dict[str, float]:
    """The mean of each statistic over several updates."""
    return {k: sum(s[k] for s in stats) / len(stats) for k in stats[0]}


def mean_over(stats: dict[str, float]) -> dict[str, float]:
    """The mean of each statistic over the ranks of this rank's world (its role's ranks)."""
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, stats)
    return {k: sum(g[k] for g in gathered) / len(gathered) for k in stats}
