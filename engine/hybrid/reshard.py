"""The switch from training to generation layout, executed on one rank (t_g = 1).

Every rank walks the same transfer plan in the same order, bucket by bucket. A piece's owner sends
it to the ranks of its model-parallel group that lack it; gathered units become Hugging Face
tensors and are yielded at once, so a consumer (vLLM's reload) can take them while the next
bucket is on its way and at most one bucket of gathered weights is alive at a time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator, Mapping

import torch
import torch.distributed as dist

from ..models.arch import LlamaArch
from ..models.convert import HF_LAYER, split_qkv, unshard_fc1
from .plan import Unit, buckets, transfer_units


@dataclass
class SwitchStats:
    bytes_received: int = 0
    bytes_sent: int = 0
    seconds: float = 0.0
    buckets: int = 0
    history: list[dict] = field(default_factory=list)


class Resharder:
    """Streams the full Hugging Face weights of the model on every rank of a model-parallel group.

    `ranks` maps (pipeline stage, TP rank) to global ranks of the group; `group` is that group.
    """

    def __init__(self, arch: LlamaArch, tp: int, pp: int, stage: int, tp_rank: int,
                 ranks: Mapping[tuple[int, int], int], group: dist.ProcessGroup | None,
                 dtype: torch.dtype = torch.float32, bucket_bytes: int = 64 << 20):
        self.arch, self.tp, self.pp, self.stage, self.tp_rank = arch, tp, pp, stage, tp_rank
        self.ranks, self.group, self.dtype = ranks, group, dtype
        self.element_size = torch.empty((), dtype=dtype).element_size()
        self.plan = buckets(transfer_units(arch, tp, pp), bucket_bytes, self.element_size)
        self.me = ranks[(stage, tp_rank)]
        self.stats = SwitchStats()

    def stream(self, local: Mapping[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (Hugging Face name, tensor) for the whole model; `local` is this rank's Megatron state."""
        started = time.perf_counter()
        received = sent = 0
        device = next(iter(local.values())).device  # NCCL sends and receives device tensors
        for bucket in self.plan:
            for unit in bucket:
                pieces = []
                for piece in unit.pieces:
                    owner = self.ranks[(piece.stage, piece.tp_rank or 0)]
                    holders = {self.ranks[(piece.stage, t)] for t in range(self.tp)} if piece.tp_rank is None else {owner}
                    if self.me in holders:
                        tensor = local[piece.name].to(self.dtype).contiguous()
                        if self.me == owner:
                            for peer in sorted(set(self.ranks.values()) - holders):
                                dist.send(tensor, dst=peer, group=self.group)
                                sent += tensor.numel() * self.element_size
                    else:
                        tensor = torch.empty(piece.shape, dtype=self.dtype, device=device)
                        dist.recv(tensor, src=owner, group=self.group)
                        received += tensor.numel() * self.element_size
                    pieces.append(tensor)
                yield from self._to_hf(unit, pieces)
            self.stats.buckets += 1
        self.stats.bytes_received, self.stats.bytes_sent = received, sent
        self.stats.seconds = time.perf_counter() - started
        self.stats.history.append({"bytes_received": received, "bytes_sent": sent, "seconds": self.stats.seconds})

    def _to_hf(self, unit: Unit, pieces: list[torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
        name, arch = unit.name, self.arch
        if name == "embedding.word_embeddings.weight":
            yield "model.embed_tokens.weight", torch.cat(pieces, 0)
            return
        if name == "output_layer.weight":
            yield "lm_head.weight", torch.cat(pieces, 0)
            return
        if name == "decoder.final_layernorm.weight":
            yield "model.norm.weight", pieces[0]
            return
        h = HF_LAYER.format(unit.layer)
        if name.endswith("input_layernorm.weight"):
            yield h + "input_layernorm.weight", pieces[0]
        elif name.endswith("pre_mlp_layernorm.weight"):
            yield h + "post_attention_layernorm.weight", pieces[0]
        elif name.endswith("linear_qkv.weight") or name.endswith("linear_qkv.bias"):
            kind = name.rsplit(".", 1)[-1]
            q, k, v = split_qkv(torch.cat(pieces, 0), arch)
            for proj, tensor in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
                yield f"{h}self_attn.{proj}.{kind}", tensor
        elif name.endswith("linear_proj.weight"):
            yield h + "self_attn.o_proj.weight", torch.cat(pieces, 1)
        elif name.endswith("linear_fc1.weight"):
            gate, up = unshard_fc1(pieces)
            yield h + "mlp.gate_proj.weight", gate
            yield h + "mlp.up_proj.weight", up
        elif name.endswith("linear_fc2.weight"):
            yield h + "mlp.down_proj.weight", torch.cat(pieces, 1)
        else:
            raise KeyError(f"no Hugging Face name for {name}")
