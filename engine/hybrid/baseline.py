"""The baseline the hybrid engine is measured against: DeepSpeed-Chat's naive switch.

Every rank all-gathers every rank's whole shard across the world, (tpd - 1)/tpd * M bytes per rank.
Used by bench/reshard and the tests to show what the grouped switch saves.
"""

from __future__ import annotations

from typing import Mapping

import torch
import torch.distributed as dist


def naive_all_gather(local: Mapping[str, torch.Tensor], world: int) -> int:
    """All-gather this rank's flattened shard with every other rank's; returns the bytes received."""
    flat = torch.cat([t.flatten().float() for _, t in sorted(local.items())])
    sizes = [0] * world  # each rank's, filled in by the gather
    dist.all_gather_object(sizes, flat.numel())
    padded = torch.zeros(max(sizes))  # all_gather needs equal sizes: pipeline stages differ
    padded[: flat.numel()] = flat
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return 4 * (sum(sizes) - flat.numel())
