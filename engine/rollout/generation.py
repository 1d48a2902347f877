"""Generation across the actor's ranks: each vLLM replica takes its share of the prompts, and every
rank gets all completions in prompt order."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from .vllm_backend import Completion, Sampling
from ..training.sequences import shard_rows


class Generator:
    def __init__(self, rollout: Any, rank: int, world: int, rollout_tp: int):
        """vLLM replicas of `rollout_tp` consecutive ranks each (rollout_tp = 1: one per rank)."""
        self.rollout, self.rank, self.world, self.rollout_tp = rollout, rank, world, rollout_tp
        self.replica, self.replicas = rank // rollout_tp, world // rollout_tp
        self.prefix_cache_hit_ratio: float | None = None
        """Of the last generate's prompt tokens on this replica, the share vLLM took from its prefix cache."""
        self.generated_tokens = 0
        """The tokens this replica generated in the last generate."""

    def generate(self, prompts: list[list[int]], sampling: Sampling, seed: int) -> list[Completion]:
        mine = shard_rows(len(prompts), self.replica, self.replicas)
        # vLLM samples from torch's global generator: seeding it per step and replica makes a resumed
        # run draw the same samples as an uninterrupted one, and the ranks of a replica draw alike.
        torch.manual_seed(seed)
        before = self.rollout.prefix_cache_counters()
        completions = self.rollout.generate([prompts[i] for i in mine], sampling) if len(mine) else []
        self.generated_tokens = sum(len(c.token_ids) for c in completions)
        queried, hits = (a - b for a, b in zip(self.rollout.prefix_cache_counters(), before))
        self.prefix_cache_hit_ratio = hits / queried if queried else None
        # Every rank of a tensor-parallel replica holds the same completions: its first rank reports them.
        first_of_replica = self.rank % self.rollout_tp == 0
        local = [replace(c, prompt_index=mine.start + c.prompt_index) for c in completions] if first_of_replica else []
        gathered: list = [None] * self.world
        dist.all_gather_object(gathered, local)
        return [item for part in gathered for item in part]
