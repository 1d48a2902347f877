"""The switch of a LoRA actor: the whole adapter, gathered from the model-parallel group, instead
of every weight of the model.

vLLM's LoRA layers take an adapter's full tensors and cut their TP rank's slice themselves, so
every rank of a replica needs the whole adapter. It is small (megabytes where the model is
gigabytes), so each rank simply gathers every rank's shards over the model-parallel group (TP and
PP ranks of its DP replica, the group the full-weight switch streams over) and assembles them in
PEFT's names (models/lora_layout.py). The bytes counted are the adapter's: what vLLM receives and
what crossed the group to this rank.
"""

from __future__ import annotations

import time
from typing import Mapping

import torch
import torch.distributed as dist

from ..models.arch import LlamaArch
from ..models.lora_layout import gather_adapter
from .reshard import SwitchStats


def tensor_bytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


class AdapterGather:
    """Gathers this rank's replica's whole adapter; `place` is (pipeline stage, TP rank)."""

    def __init__(self, arch: LlamaArch, targets: list[str], place: tuple[int, int], group: dist.ProcessGroup | None, group_size: int):
        self.arch, self.targets, self.place, self.group, self.group_size = arch, list(targets), place, group, group_size
        self.stats = SwitchStats()

    def gather(self, local: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """PEFT name -> full tensor (on the host); a collective over the model-parallel group."""
        started = time.perf_counter()
        mine = {name: tensor.detach().to("cpu", copy=True) for name, tensor in local.items()}
        if self.group_size > 1:
            everyone: list = [None] * self.group_size
            dist.all_gather_object(everyone, (self.place, mine), group=self.group)
            shards = dict(everyone)
        else:
            shards = {self.place: mine}
        adapter = gather_adapter(shards, self.arch, self.targets)
        received = sum(tensor_bytes(s) for place, s in shards.items() if place != self.place)
        self.stats.seconds = time.perf_counter() - started
        self.stats.bytes_received = received
        self.stats.history.append({"bytes_received": received, "bytes": tensor_bytes(adapter), "seconds": self.stats.seconds})
        return adapter
