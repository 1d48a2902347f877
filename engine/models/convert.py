"""Hugging Face <-> megatron-core GPTModel weights, per tensor-parallel rank. Pure tensor functions.

Megatron's layout (megatron-core, verified against its modules):
- linear_qkv rows are grouped per query group: [q heads of group g; k_g; v_g], and a TP rank holds
  whole groups (num_kv_heads / tp of them).
- linear_fc1 on TP rank r is cat(gate.chunk(tp)[r], up.chunk(tp)[r]) (gated linear unit).
- linear_proj and linear_fc2 are row-parallel: split along their input dimension.
- word embeddings and the output layer are split by vocabulary rows; norms are replicated.
Names are local to a pipeline stage: stage s of p holds layers s*L/p .. (s+1)*L/p - 1, numbered from 0.
"""

from __future__ import annotations

from typing import Iterator, Mapping

import torch

from .arch import LlamaArch

HF_LAYER = "model.layers.{}."
MG_LAYER = "decoder.layers.{}."


# --- fused QKV ---------------------------------------------------------------------------------


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arch: LlamaArch) -> torch.Tensor:
    """HF q, k, v (weights [out, in] or biases [out]) -> Megatron's full fused QKV, grouped per query group."""
    groups, per, hd = arch.num_kv_heads, arch.heads_per_group, arch.head_dim
    rest = q.shape[1:]
    q = q.reshape(groups, per * hd, *rest)
    k = k.reshape(groups, hd, *rest)
    v = v.reshape(groups, hd, *rest)
    return torch.cat([q, k, v], dim=1).reshape(arch.qkv_rows, *rest)


def split_qkv(qkv: torch.Tensor, arch: LlamaArch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Megatron's full fused QKV -> HF q, k, v."""
    groups, per, hd = arch.num_kv_heads, arch.heads_per_group, arch.head_dim
    rest = qkv.shape[1:]
    grouped = qkv.reshape(groups, (per + 2) * hd, *rest)
    q, k, v = torch.split(grouped, [per * hd, hd, hd], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


# --- tensor-parallel sharding -------------------------------------------------------------------


def shard(tensor: torch.Tensor, dim: int, rank: int, size: int) -> torch.Tensor:
    return tensor.chunk(size, dim=dim)[rank].contiguous()


def shard_fc1(gate: torch.Tensor, up: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    return torch.cat([shard(gate, 0, rank, size), shard(up, 0, rank, size)], dim=0)


def unshard_fc1(shards: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every TP rank's linear_fc1 -> HF gate_proj and up_proj."""
    gates, ups = zip(*(s.chunk(2, dim=0) for s in shards))
    return torch.cat(gates, dim=0), torch.cat(ups, dim=0)


# Megatron parameter suffix -> (how it is split across TP ranks): "column" on dim 0, "row" on dim 1,
# "replicated", or the special layouts "qkv" and "fc1".
TP_LAYOUT = {
    "embedding.word_embeddings.weight": "column",
    "output_layer.weight": "column",
    "decoder.final_layernorm.weight": "replicated",
    "input_layernorm.weight": "replicated",
    "pre_mlp_layernorm.weight": "replicated",
    "self_attention.linear_qkv.weight": "qkv",
    "self_attention.linear_qkv.bias": "qkv",
    "self_attention.linear_proj.weight": "row",
    "self_attention.q_layernorm.weight": "replicated",
    "self_attention.k_layernorm.weight": "replicated",
    "mlp.linear_fc1.weight": "fc1",
    "mlp.linear_fc2.weight": "row",
}


def tp_layout(name: str) -> str:
    for suffix, layout in TP_LAYOUT.items():
        if name.endswith(suffix):
            return layout
    raise KeyError(f"no tensor-parallel layout known for {name}")


def stage_layers(arch: LlamaArch, pp_rank: int, pp_size: int) -> range:
    per = arch.num_layers // pp_size
    return range(pp_rank * per, (pp_rank + 1) * per)


# --- whole state dicts ----------------------------------------------------------------------------


def hf_to_megatron(hf: Mapping[str, torch.Tensor], arch: LlamaArch, tp_rank: int = 0, tp_size: int = 1,
                   pp_rank: int = 0, pp_size: int = 1) -> dict[str, torch.Tensor]:
    """The Megatron state dict of one (TP, PP) rank from a full Hugging Face state dict."""
    arch.check_layout(tp_size, pp_size)
    out: dict[str, torch.Tensor] = {}
    first, last = pp_rank == 0, pp_rank == pp_size - 1
    embed = hf["model.embed_tokens.weight"]
    if first:
        out["embedding.word_embeddings.weight"] = shard(embed, 0, tp_rank, tp_size)
    if last:
        out["decoder.final_layernorm.weight"] = hf["model.norm.weight"].clone()
        head = embed if arch.tie_word_embeddings else hf["lm_head.weight"]
        if not (arch.tie_word_embeddings and first):  # tied and on one stage: the embedding is the head
            out["output_layer.weight"] = shard(head, 0, tp_rank, tp_size)
    groups_per_rank = arch.num_kv_heads // tp_size
    rows_per_group = (arch.heads_per_group + 2) * arch.head_dim
    for local, layer in enumerate(stage_layers(arch, pp_rank, pp_size)):
        h, m = HF_LAYER.format(layer), MG_LAYER.format(local)
        attn = h + "self_attn."
        qkv = fuse_qkv(hf[attn + "q_proj.weight"], hf[attn + "k_proj.weight"], hf[attn + "v_proj.weight"], arch)
        rows = slice(tp_rank * groups_per_rank * rows_per_group, (tp_rank + 1) * groups_per_rank * rows_per_group)
        out[m + "self_attention.linear_qkv.weight"] = qkv[rows].contiguous()
        if arch.qkv_bias:
            bias = fuse_qkv(hf[attn + "q_proj.bias"], hf[attn + "k_proj.bias"], hf[attn + "v_proj.bias"], arch)
            out[m + "self_attention.linear_qkv.bias"] = bias[rows].contiguous()
        out[m + "self_attention.linear_proj.weight"] = shard(hf[attn + "o_proj.weight"], 1, tp_rank, tp_size)
        if arch.qk_norm:  # over one head's dimension: every rank holds them whole
            out[m + "self_attention.q_layernorm.weight"] = hf[attn + "q_norm.weight"].clone()
            out[m + "self_attention.k_layernorm.weight"] = hf[attn + "k_norm.weight"].clone()
        out[m + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"].clone()
        out[m + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"].clone()
        mlp = h + "mlp."
        out[m + "mlp.linear_fc1.weight"] = shard_fc1(hf[mlp + "gate_proj.weight"], hf[mlp + "up_proj.weight"], tp_rank, tp_size)
        out[m + "mlp.linear_fc2.weight"] = shard(hf[mlp + "down_proj.weight"], 1, tp_rank, tp_size)
    return out


def megatron_to_hf(shards: Mapping[tuple[int, int], Mapping[str, torch.Tensor]], arch: LlamaArch) -> dict[str, torch.Tensor]:
    """A full Hugging Face state dict from every rank's Megatron state dict, keyed by (pp_rank, tp_rank)."""
    pp_size = 1 + max(p for p, _ in shards)
    tp_size = 1 + max(t for _, t in shards)
    hf: dict[str, torch.Tensor] = {}

    def gathered(pp: int, name: str) -> torch.Tensor:
        parts = [shards[(pp, t)][name] for t in range(tp_size)]
        layout = tp_layout(name)
        if layout == "replicated":
            return parts[0]
        if layout in ("column", "qkv"):
            return torch.cat(parts, dim=0)  # qkv: whole groups per rank, so ranks concatenate
        if layout == "row":
            return torch.cat(parts, dim=1)
        raise ValueError(layout)

    hf["model.embed_tokens.weight"] = gathered(0, "embedding.word_embeddings.weight")
    last = pp_size - 1
    hf["model.norm.weight"] = gathered(last, "decoder.final_layernorm.weight")
    if not arch.tie_word_embeddings:
        hf["lm_head.weight"] = gathered(last, "output_layer.weight")
    for pp in range(pp_size):
        for local, layer in enumerate(stage_layers(arch, pp, pp_size)):
            h, m = HF_LAYER.format(layer), MG_LAYER.format(local)
            attn = h + "self_attn."
            q, k, v = split_qkv(gathered(pp, m + "self_attention.linear_qkv.weight"), arch)
            hf[attn + "q_proj.weight"], hf[attn + "k_proj.weight"], hf[attn + "v_proj.weight"] = q, k, v
            if arch.qkv_bias:
                q, k, v = split_qkv(gathered(pp, m + "self_attention.linear_qkv.bias"), arch)
                hf[attn + "q_proj.bias"], hf[attn + "k_proj.bias"], hf[attn + "v_proj.bias"] = q, k, v
            hf[attn + "o_proj.weight"] = gathered(pp, m + "self_attention.linear_proj.weight")
            if arch.qk_norm:
                hf[attn + "q_norm.weight"] = gathered(pp, m + "self_attention.q_layernorm.weight")
                hf[attn + "k_norm.weight"] = gathered(pp, m + "self_attention.k_layernorm.weight")
            hf[h + "input_layernorm.weight"] = gathered(pp, m + "input_layernorm.weight")
            hf[h + "post_attention_layernorm.weight"] = gathered(pp, m + "pre_mlp_layernorm.weight")
            gate, up = unshard_fc1([shards[(pp, t)][m + "mlp.linear_fc1.weight"] for t in range(tp_size)])
            hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"] = gate, up
            hf[h + "mlp.down_proj.weight"] = gathered(pp, m + "mlp.linear_fc2.weight")
    return hf


def parameters_only(state: Mapping[str, object]) -> Iterator[tuple[str, torch.Tensor]]:
    """A Megatron module's state dict without the `_extra_state` entries of its linear layers."""
    for name, value in state.items():
        if not name.endswith("_extra_state") and isinstance(value, torch.Tensor):
            yield name, value
