"""What the hybrid engine moves when the actor switches from training to generation. Pure.

Training layout (t, p, d) and generation layout (p_g = 1, t_g, d_g) share the same ranks, t_g
dividing t. vLLM, like megatron-core, puts consecutive ranks in one tensor-parallel group, so the
rank with training TP rank r is generation TP rank r % t_g, and its generation shard j is made of
the training shards of TP ranks j*t/t_g .. (j+1)*t/t_g - 1 (`wanted_tp_ranks`), on every stage.
A rank receives only the pieces of its generation shard that it does not hold, from the rank of
its model-parallel group that holds them: the gather stays inside the group, never the world.

- t_g = 1: every rank needs the whole model; its micro-DP group is its model-parallel group.
- t_g = t: a rank needs its own TP shard of every stage; its micro-DP group is its pipeline group.
  With p = 1 nothing moves at all.
In both cases the bytes a rank receives are HybridFlow's (Table 2) (tp - t_g) / (t_g * tp) * M for
a model of M bytes split evenly over tp = t*p ranks (`hybridflow_bytes`). For 1 < t_g < t the two
rank orders do not line up (rank r's training shard lies in generation shard r // (t/t_g), but it
serves generation shard r % t_g), so some ranks receive more than the formula; `received_bytes`
counts exactly what they receive.

A mixture of experts (tp = 1, so t_g = 1: every rank needs the whole model) splits its experts over
the ep ranks of each stage as well: expert rank e holds experts e*E/ep .. (e+1)*E/ep - 1 of its
stage's layers (`Piece.ep_rank`), while the rest of the model (attention, norms, the routers) is
replicated over the ep ranks as over every data-parallel rank. A rank receives its stage-mates'
experts and every other stage's from the rank holding them, over the group of every (stage, ep rank)
of its tensor-parallel rank (megatron-core's expert-tensor-model-pipeline group). The expert bytes
X, split evenly over pp * ep ranks, then arrive as HybridFlow's formula says for pp * ep ranks:
(pp*ep - 1) / (pp*ep) * X per rank (`moe_switch_bytes`), beside the rest's (tp*pp - 1) / (tp*pp) * M.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..models.arch import LlamaArch
from ..models.convert import MG_EXPERT, MG_LAYER, layer_norms, stage_layers


@dataclass(frozen=True)
class Piece:
    """One tensor as one training rank holds it."""

    stage: int
    tp_rank: int | None
    """None for a tensor every TP rank of the stage holds whole (norms): stage's TP rank 0 sends it."""
    name: str
    """Megatron's stage-local name (an expert's: its ep rank's local expert number)."""
    shape: tuple[int, ...]
    ep_rank: int | None = None
    """The expert rank holding an expert's piece; None for every other tensor (replicated over the ep ranks)."""

    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True)
class Unit:
    """Every piece of one Megatron parameter; gathered together, they convert to Hugging Face tensors."""

    stage: int
    name: str
    layer: int | None
    """The global layer index, for per-layer parameters."""
    pieces: tuple[Piece, ...]
    expert: int | None = None
    """The global expert number, for an expert's parameters."""


def hybridflow_bytes(model_bytes: float, tp: int, tg: int = 1, pg: int = 1) -> float:
    """Bytes each rank receives in one switch (HybridFlow): (tp - t_g p_g) / (t_g p_g tp) * M."""
    return (tp - tg * pg) / (tg * pg * tp) * model_bytes


def moe_switch_bytes(dense_bytes: float, expert_bytes: float, tp: int, pp: int, ep: int) -> float:
    """Bytes each rank receives, on average over the ranks, in one switch of a mixture of experts to t_g = 1:
    HybridFlow's for the experts split over pp * ep ranks, plus HybridFlow's for the rest split over tp * pp."""
    return hybridflow_bytes(dense_bytes, tp * pp) + hybridflow_bytes(expert_bytes, pp * ep)


def is_expert(unit: Unit) -> bool:
    return unit.expert is not None


def transfer_units(arch: LlamaArch, tp: int, pp: int, ep: int = 1) -> list[Unit]:
    """Every parameter the generation replica needs, with the pieces that make it, in a fixed order."""
    arch.check_layout(tp, pp, ep)
    # The training shards hold the padded vocabulary (LlamaArch.padded_vocab_size): its rows travel, and are cut off after.
    h, v, ffn = arch.hidden_size, arch.padded_vocab_size(tp), arch.intermediate_size
    units: list[Unit] = []

    def split(stage: int, name: str, layer: int | None, full: tuple[int, ...], dim: int) -> None:
        shape = list(full)
        shape[dim] //= tp
        units.append(Unit(stage, name, layer, tuple(Piece(stage, t, name, tuple(shape)) for t in range(tp))))

    def whole(stage: int, name: str, layer: int | None, shape: tuple[int, ...]) -> None:
        units.append(Unit(stage, name, layer, (Piece(stage, None, name, shape),)))

    norms = [norm for norm, _ in layer_norms(arch)]  # input_layernorm first, as a layer computes them
    split(0, "embedding.word_embeddings.weight", None, (v, h), 0)
    for stage in range(pp):
        for local, layer in enumerate(stage_layers(arch, stage, pp)):
            m = MG_LAYER.format(local)
            whole(stage, m + norms[0], layer, (h,))
            split(stage, m + "self_attention.linear_qkv.weight", layer, (arch.qkv_rows, h), 0)
            if arch.qkv_bias:
                split(stage, m + "self_attention.linear_qkv.bias", layer, (arch.qkv_rows,), 0)
            split(stage, m + "self_attention.linear_proj.weight", layer, (h, arch.num_heads * arch.head_dim), 1)
            if arch.qk_norm:
                whole(stage, m + "self_attention.q_layernorm.weight", layer, (arch.head_dim,))
                whole(stage, m + "self_attention.k_layernorm.weight", layer, (arch.head_dim,))
            for norm in norms[1:]:
                whole(stage, m + norm, layer, (h,))
            if arch.is_moe:  # tp is 1 (check_layout): the router whole, each expert on its ep rank
                whole(stage, m + "mlp.router.weight", layer, (arch.num_experts, h))
                per, ffn_e = arch.num_experts // ep, arch.moe_intermediate_size
                for expert in range(arch.num_experts):
                    prefix = m + MG_EXPERT.format(expert % per)  # its ep rank's local expert
                    for name, shape in (("linear_fc1.weight", (2 * ffn_e, h)), ("linear_fc2.weight", (h, ffn_e))):
                        piece = Piece(stage, None, prefix + name, shape, ep_rank=expert // per)
                        units.append(Unit(stage, prefix + name, layer, (piece,), expert=expert))
                continue
            split(stage, m + "mlp.linear_fc1.weight", layer, (2 * ffn, h), 0)
            split(stage, m + "mlp.linear_fc2.weight", layer, (h, ffn), 1)
    last = pp - 1
    whole(last, "decoder.final_layernorm.weight", None, (h,))
    if not arch.tie_word_embeddings:  # tied: vLLM's head is the embedding
        split(last, "output_layer.weight", None, (v, h), 0)
    return units


def buckets(units: list[Unit], bucket_bytes: int, element_size: int) -> list[list[Unit]]:
    """Units grouped in order into buckets of at most `bucket_bytes` (a larger unit gets its own)."""
    out: list[list[Unit]] = [[]]
    size = 0
    for unit in units:
        unit_bytes = sum(p.numel() for p in unit.pieces) * element_size
        if out[-1] and size + unit_bytes > bucket_bytes:
            out.append([])
            size = 0
        out[-1].append(unit)
        size += unit_bytes
    return [b for b in out if b]


def generation_tp_rank(tp_rank: int, tg: int) -> int:
    """The vLLM TP rank of the rank with training TP rank `tp_rank` (both group consecutive ranks)."""
    return tp_rank % tg


def wanted_tp_ranks(tp: int, tg: int, tp_rank: int) -> range:
    """The training TP ranks whose shards make up the generation shard of the rank at `tp_rank`."""
    if tg < 1 or tp % tg:
        raise ValueError(f"the rollout's tensor-parallel size {tg} must divide the training's {tp}")
    width = tp // tg
    j = generation_tp_rank(tp_rank, tg)
    return range(j * width, (j + 1) * width)


def needs(piece: Piece, tp: int, tg: int, tp_rank: int) -> bool:
    """Whether the rank at training TP rank `tp_rank` (any stage) needs `piece` for its generation shard."""
    return piece.tp_rank is None or piece.tp_rank in wanted_tp_ranks(tp, tg, tp_rank)


def holds(piece: Piece, stage: int, tp_rank: int, ep_rank: int = 0) -> bool:
    return (
        piece.stage == stage and (piece.tp_rank is None or piece.tp_rank == tp_rank) and (piece.ep_rank is None or piece.ep_rank == ep_rank)
    )


def received_bytes(units: list[Unit], stage: int, tp_rank: int, element_size: int, tg: int = 1, ep_rank: int = 0) -> int:
    """Bytes the training rank (stage, tp_rank, ep_rank) receives: every piece it needs and does not hold."""
    tp = max(len(unit.pieces) for unit in units)
    total = 0
    for unit in units:
        for piece in unit.pieces:
            if needs(piece, tp, tg, tp_rank) and not holds(piece, stage, tp_rank, ep_rank):
                total += piece.numel() * element_size
    return total
