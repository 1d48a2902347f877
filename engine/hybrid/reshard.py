"""The switch from training to generation layout, executed on one rank.

Every rank walks the same transfer plan in the same order, bucket by bucket. A piece's owner sends
it to the ranks of its model-parallel group that need it for their generation shard and lack it
(plan.py says which); gathered units become Hugging Face tensors and are yielded at once, so a
consumer (vLLM's reload) can take them while the next bucket is on its way and at most one bucket
of gathered weights is alive at a time.

With t_g > 1 a rank gathers only its generation shard. vLLM's weight loaders take a checkpoint's
full tensor and cut their rank's slice out of it themselves, so each shard is yielded inside a
tensor of the full shape of which only that slice is written: the loader reads nothing else, and
the bytes moved stay at the shard's. Such a buffer lives for one tensor at a time.

A mixture of experts' expert pieces travel over another group: every (stage, ep rank) of the
rank's TP rank (`expert_ranks`, megatron-core's expert-tensor-model-pipeline group), from the rank
that holds the expert to every other; the routers and the rest travel as any model's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Iterator, Mapping

import torch
import torch.distributed as dist

from ..models.arch import LlamaArch
from ..models.convert import HF_LAYER, hf_expert, hf_router, layer_norms, split_qkv, unpad_vocab, unshard_fc1
from .plan import Piece, Unit, buckets, generation_tp_rank, holds, needs, transfer_units, wanted_tp_ranks


@dataclass
class SwitchStats:
    bytes_received: int = 0
    bytes_sent: int = 0
    seconds: float = 0.0
    buckets: int = 0
    history: list[dict] = field(default_factory=list)


# vLLM pads the vocabulary to a multiple of this before splitting it over its TP ranks.
VLLM_VOCAB_PADDING = 64


class Resharder:
    """Streams this rank's generation shard (t_g = 1: the whole model) as Hugging Face tensors.

    `ranks` maps (pipeline stage, TP rank) to global ranks of the model-parallel group; `group` is
    that group. `tg` is the rollout's tensor-parallel size. A mixture of experts under expert
    parallelism (`ep` ranks, this one `ep_rank`) also needs `expert_ranks`, (pipeline stage, ep rank)
    to global ranks of this rank's expert-tensor-model-pipeline group, and that group; at ep = 1 they
    are the model-parallel group's TP rank 0 of each stage.
    """

    def __init__(
        self,
        arch: LlamaArch,
        tp: int,
        pp: int,
        stage: int,
        tp_rank: int,
        ranks: Mapping[tuple[int, int], int],
        group: dist.ProcessGroup | None,
        dtype: torch.dtype = torch.float32,
        bucket_bytes: int = 64 << 20,
        tg: int = 1,
        ep: int = 1,
        ep_rank: int = 0,
        expert_ranks: Mapping[tuple[int, int], int] | None = None,
        expert_group: dist.ProcessGroup | None = None,
    ):
        wanted_tp_ranks(tp, tg, tp_rank)  # tg must divide tp
        if ep > 1 and expert_ranks is None:
            raise ValueError(f"ep={ep}: the switch needs the ranks that hold the other experts (expert_ranks)")
        if tg > 1 and arch.padded_vocab_size(tp) != arch.vocab_size:
            raise ValueError(
                f"a rollout tensor-parallel size of {tg} needs a vocabulary that the training's tp={tp} "
                f"divides: {arch.vocab_size} is padded to {arch.padded_vocab_size(tp)} there, and vLLM "
                "would split it otherwise; use a rollout tp of 1"
            )
        if tg > 1 and arch.vocab_size % (VLLM_VOCAB_PADDING * tg):
            raise ValueError(
                f"a rollout tensor-parallel size of {tg} needs a vocabulary divisible by "
                f"{VLLM_VOCAB_PADDING * tg} (vLLM pads it to a multiple of {VLLM_VOCAB_PADDING} "
                f"before splitting it), not {arch.vocab_size}"
            )
        self.arch, self.tp, self.pp, self.stage, self.tp_rank, self.tg = arch, tp, pp, stage, tp_rank, tg
        self.ranks, self.group, self.dtype = ranks, group, dtype
        self.element_size = torch.empty((), dtype=dtype).element_size()
        self.plan = buckets(transfer_units(arch, tp, pp, ep), bucket_bytes, self.element_size)
        self.me = ranks[(stage, tp_rank)]
        self.ep, self.ep_rank = ep, ep_rank
        self.expert_ranks = dict(expert_ranks) if expert_ranks is not None else {(s, 0): r for (s, t), r in ranks.items() if t == 0}
        self.expert_group = expert_group if expert_ranks is not None else group
        self.gen_rank = generation_tp_rank(tp_rank, tg)
        # The generation shard's attention heads, for cutting q, k and v out of the fused QKV.
        self.shard_arch = replace(arch, num_heads=arch.num_heads // tg, num_kv_heads=arch.num_kv_heads // tg)
        self.stats = SwitchStats()

    def stream(self, local: Mapping[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (Hugging Face name, tensor) for vLLM's loader; `local` is this rank's Megatron state.

        t_g = 1: the whole model. t_g > 1: full-shaped tensors holding this rank's generation shard."""
        for name, shard, dim in self.stream_shards(local):
            yield name, self._in_full_shape(shard, dim)

    def stream_shards(self, local: Mapping[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor, int | None]]:
        """Yield (Hugging Face name, this rank's generation shard, the dimension it is split on, or
        None for a tensor every rank holds whole), in plan order. A collective: every rank of the
        group must walk it to the end."""
        started = time.perf_counter()
        received = sent = 0
        device = next(iter(local.values())).device  # NCCL sends and receives device tensors
        for bucket in self.plan:
            for unit in bucket:
                pieces = []
                for piece in unit.pieces:
                    # A piece every TP rank of its stage holds (a norm) is sent by the stage's TP rank 0; an
                    # expert by the rank of its stage and ep rank, over the expert group.
                    if piece.ep_rank is None:
                        owner, group = self.ranks[(piece.stage, piece.tp_rank or 0)], self.group
                    else:
                        owner, group = self.expert_ranks[(piece.stage, piece.ep_rank)], self.expert_group
                    wanted = needs(piece, self.tp, self.tg, self.tp_rank)
                    if holds(piece, self.stage, self.tp_rank, self.ep_rank):
                        tensor = local[piece.name].to(self.dtype).contiguous()
                        if self.me == owner:
                            for peer in self._receivers(piece):
                                dist.send(tensor, dst=peer, group=group)
                                sent += tensor.numel() * self.element_size
                    elif wanted:
                        tensor = torch.empty(piece.shape, dtype=self.dtype, device=device)
                        dist.recv(tensor, src=owner, group=group)
                        received += tensor.numel() * self.element_size
                    if wanted:
                        pieces.append(tensor)
                yield from self._to_hf(unit, pieces)
            self.stats.buckets += 1
        self.stats.bytes_received, self.stats.bytes_sent = received, sent
        self.stats.seconds = time.perf_counter() - started
        self.stats.history.append({"bytes_received": received, "bytes_sent": sent, "seconds": self.stats.seconds})

    def _receivers(self, piece: Piece) -> list[int]:
        """Ranks of the group that need `piece` and do not hold it."""
        if piece.ep_rank is not None:  # every rank needs every expert (tp and t_g are 1)
            return sorted(rank for (stage, ep_rank), rank in self.expert_ranks.items() if not holds(piece, stage, 0, ep_rank))
        return sorted(
            rank
            for (stage, tp_rank), rank in self.ranks.items()
            if needs(piece, self.tp, self.tg, tp_rank) and not holds(piece, stage, tp_rank)
        )

    def _in_full_shape(self, shard: torch.Tensor, dim: int | None) -> torch.Tensor:
        """The generation shard placed where vLLM's loader will cut it from a full tensor."""
        if self.tg == 1 or dim is None:
            return shard
        shape = list(shard.shape)
        width = shape[dim]
        shape[dim] = width * self.tg
        full = torch.empty(shape, dtype=shard.dtype, device=shard.device)
        full.narrow(dim, self.gen_rank * width, width).copy_(shard)
        return full

    def _to_hf(self, unit: Unit, pieces: list[torch.Tensor]) -> Iterator[tuple[str, torch.Tensor, int | None]]:
        """(Hugging Face name, this rank's generation shard of it, the dimension it is split on)."""
        name = unit.name
        if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
            rows = torch.cat(pieces, 0)  # a padded vocabulary only ever goes whole (tg 1, __init__): cut back to the model's
            hf_name = "model.embed_tokens.weight" if name.startswith("embedding") else "lm_head.weight"
            yield hf_name, unpad_vocab(rows, self.arch) if self.tg == 1 else rows, 0
            return
        if name == "decoder.final_layernorm.weight":
            yield "model.norm.weight", pieces[0], None
            return
        assert unit.layer is not None, name
        if unit.expert is not None:
            gate_name, up_name, down_name = hf_expert(self.arch, unit.layer, unit.expert)
            if name.endswith("linear_fc1.weight"):
                gate_rows, up_rows = pieces[0].chunk(2, dim=0)
                yield gate_name, gate_rows, None
                yield up_name, up_rows, None
            else:
                yield down_name, pieces[0], None
            return
        h = HF_LAYER.format(unit.layer)
        if name.endswith("mlp.router.weight"):
            yield hf_router(self.arch, unit.layer), pieces[0], None
        elif norm := next((hf for mg, hf in layer_norms(self.arch) if name.endswith("." + mg)), None):
            yield h + norm, pieces[0], None
        elif name.endswith("self_attention.q_layernorm.weight"):
            yield h + "self_attn.q_norm.weight", pieces[0], None
        elif name.endswith("self_attention.k_layernorm.weight"):
            yield h + "self_attn.k_norm.weight", pieces[0], None
        elif name.endswith("linear_qkv.weight") or name.endswith("linear_qkv.bias"):
            kind = name.rsplit(".", 1)[-1]
            q, k, v = split_qkv(torch.cat(pieces, 0), self.shard_arch)
            for proj, tensor in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
                yield f"{h}self_attn.{proj}.{kind}", tensor, 0
        elif name.endswith("linear_proj.weight"):
            yield h + "self_attn.o_proj.weight", torch.cat(pieces, 1), 1
        elif name.endswith("linear_fc1.weight"):
            gate, up = unshard_fc1(pieces)
            yield h + "mlp.gate_proj.weight", gate, 0
            yield h + "mlp.up_proj.weight", up, 0
        elif name.endswith("linear_fc2.weight"):
            yield h + "mlp.down_proj.weight", torch.cat(pieces, 1), 1
        else:
            raise KeyError(f"no Hugging Face name for {name}")
