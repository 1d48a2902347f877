"""Hugging Face <-> megatron-core GPTModel weights, per tensor-parallel rank. Pure tensor functions.

Megatron's layout (megatron-core, verified against its modules):
- linear_qkv rows are grouped per query group: [q heads of group g; k_g; v_g], and a TP rank holds
  whole groups (num_kv_heads / tp of them).
- linear_fc1 on TP rank r is cat(gate.chunk(tp)[r], up.chunk(tp)[r]) (gated linear unit).
- linear_proj and linear_fc2 are row-parallel: split along their input dimension.
- word embeddings and the output layer are split by vocabulary rows; norms are replicated. A vocabulary that
  tp does not divide is padded with zero rows to LlamaArch.padded_vocab_size(tp) first, and cut back on the way out.
Names are local to a pipeline stage: stage s of p holds layers s*L/p .. (s+1)*L/p - 1, numbered from 0.
Mixture of experts (tp=1): the router (HF `gate`) is replicated; expert rank r of ep holds experts
r*E/ep .. (r+1)*E/ep - 1 as megatron's sequential experts `mlp.experts.local_experts.{j}`, numbered from 0,
each with linear_fc1 = cat(gate_proj, up_proj) and linear_fc2 = down_proj. Hugging Face names are the
checkpoints' (what save_pretrained writes and read_hf_state_dict reads): Qwen3-MoE
`mlp.experts.{e}.gate_proj/up_proj/down_proj`, Mixtral `block_sparse_moe.experts.{e}.w1/w3/w2`.
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


def pad_vocab(rows: torch.Tensor, padded: int) -> torch.Tensor:
    """An embedding or output layer [vocab, hidden] with zero rows up to `padded` (itself where none are needed)."""
    extra = padded - rows.shape[0]
    return rows if extra == 0 else torch.cat([rows, rows.new_zeros(extra, *rows.shape[1:])], dim=0)


def unpad_vocab(rows: torch.Tensor, arch: LlamaArch) -> torch.Tensor:
    """The model's own vocabulary rows of a (maybe padded) embedding or output layer."""
    return rows if rows.shape[0] == arch.vocab_size else rows[: arch.vocab_size].contiguous()


def unshard_fc1(shards: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every TP rank's linear_fc1 -> HF gate_proj and up_proj."""
    gates, ups = zip(*(s.chunk(2, dim=0) for s in shards))
    return torch.cat(gates, dim=0), torch.cat(ups, dim=0)


# --- mixture of experts -----------------------------------------------------------------------

MG_EXPERT = "mlp.experts.local_experts.{}."


def hf_expert(arch: LlamaArch, layer: int, expert: int) -> tuple[str, str, str]:
    """The checkpoint names of one expert's gate, up and down projections."""
    prefix = f"{HF_LAYER.format(layer)}{arch.hf_moe_prefix}.experts.{expert}."
    gate, up, down = (prefix + name + ".weight" for name in arch.hf_expert_names)  # the family's names
    return gate, up, down


def hf_router(arch: LlamaArch, layer: int) -> str:
    return f"{HF_LAYER.format(layer)}{arch.hf_moe_prefix}.gate.weight"


def unfuse_hf_experts(state: Mapping[str, torch.Tensor], arch: LlamaArch) -> dict[str, torch.Tensor]:
    """transformers 5 keeps a layer's experts fused in memory (`mlp.experts.gate_up_proj` [E, 2I, H] and
    `mlp.experts.down_proj` [E, H, I], Mixtral's under `mlp` too): the checkpoint's per-expert names instead."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.endswith(".mlp.experts.gate_up_proj"):
            layer = int(name.split(".")[2])
            for e in range(arch.num_experts):
                gate, up, _ = hf_expert(arch, layer, e)
                out[gate], out[up] = (t.clone() for t in tensor[e].chunk(2, dim=0))
        elif name.endswith(".mlp.experts.down_proj"):
            layer = int(name.split(".")[2])
            for e in range(arch.num_experts):
                out[hf_expert(arch, layer, e)[2]] = tensor[e].clone()
        elif name.endswith(".mlp.gate.weight"):
            out[hf_router(arch, int(name.split(".")[2]))] = tensor
        else:
            out[name] = tensor
    return out


def local_experts(arch: LlamaArch, ep_rank: int, ep_size: int) -> range:
    per = arch.num_experts // ep_size
    return range(ep_rank * per, (ep_rank + 1) * per)


def layer_norms(arch: LlamaArch) -> tuple[tuple[str, str], ...]:
    """A layer's norms (not the q/k norms): (megatron name, Hugging Face name), both after the layer's prefix.
    Llama's post_attention_layernorm is the MLP's input norm; Gemma 3's normalises the attention's output."""
    if arch.gemma:
        return (
            ("input_layernorm.weight", "input_layernorm.weight"),
            ("self_attention.post_layernorm.weight", "post_attention_layernorm.weight"),
            ("pre_mlp_layernorm.weight", "pre_feedforward_layernorm.weight"),
            ("mlp.post_layernorm.weight", "post_feedforward_layernorm.weight"),
        )
    return (("input_layernorm.weight", "input_layernorm.weight"), ("pre_mlp_layernorm.weight", "post_attention_layernorm.weight"))


# Megatron parameter suffix -> (how it is split across TP ranks): "column" on dim 0, "row" on dim 1,
# "replicated", or the special layouts "qkv" and "fc1".
TP_LAYOUT = {
    "embedding.word_embeddings.weight": "column",
    "output_layer.weight": "column",
    "decoder.final_layernorm.weight": "replicated",
    "input_layernorm.weight": "replicated",
    "pre_mlp_layernorm.weight": "replicated",
    "self_attention.post_layernorm.weight": "replicated",
    "mlp.post_layernorm.weight": "replicated",
    "self_attention.linear_qkv.weight": "qkv",
    "self_attention.linear_qkv.bias": "qkv",
    "self_attention.linear_proj.weight": "row",
    "self_attention.q_layernorm.weight": "replicated",
    "self_attention.k_layernorm.weight": "replicated",
    "mlp.linear_fc1.weight": "fc1",
    "mlp.linear_fc2.weight": "row",
    "mlp.router.weight": "replicated",
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


def hf_to_megatron(
    hf: Mapping[str, torch.Tensor],
    arch: LlamaArch,
    tp_rank: int = 0,
    tp_size: int = 1,
    pp_rank: int = 0,
    pp_size: int = 1,
    ep_rank: int = 0,
    ep_size: int = 1,
) -> dict[str, torch.Tensor]:
    """The Megatron state dict of one (TP, PP, EP) rank from a full Hugging Face state dict."""
    arch.check_layout(tp_size, pp_size, ep_size)
    out: dict[str, torch.Tensor] = {}
    first, last = pp_rank == 0, pp_rank == pp_size - 1
    padded = arch.padded_vocab_size(tp_size)
    embed = pad_vocab(hf["model.embed_tokens.weight"], padded)
    if first:
        out["embedding.word_embeddings.weight"] = shard(embed, 0, tp_rank, tp_size)
    if last:
        out["decoder.final_layernorm.weight"] = hf["model.norm.weight"].clone()
        head = embed if arch.tie_word_embeddings else pad_vocab(hf["lm_head.weight"], padded)
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
        for mg_norm, hf_norm in layer_norms(arch):
            out[m + mg_norm] = hf[h + hf_norm].clone()
        if arch.is_moe:  # tp is 1 (check_layout)
            out[m + "mlp.router.weight"] = hf[hf_router(arch, layer)].clone()
            for local_expert, expert in enumerate(local_experts(arch, ep_rank, ep_size)):
                gate, up, down = hf_expert(arch, layer, expert)
                out[m + MG_EXPERT.format(local_expert) + "linear_fc1.weight"] = torch.cat([hf[gate], hf[up]], dim=0)
                out[m + MG_EXPERT.format(local_expert) + "linear_fc2.weight"] = hf[down].clone()
            continue
        mlp = h + "mlp."
        out[m + "mlp.linear_fc1.weight"] = shard_fc1(hf[mlp + "gate_proj.weight"], hf[mlp + "up_proj.weight"], tp_rank, tp_size)
        out[m + "mlp.linear_fc2.weight"] = shard(hf[mlp + "down_proj.weight"], 1, tp_rank, tp_size)
    return out


def megatron_to_hf(shards: Mapping[tuple[int, ...], Mapping[str, torch.Tensor]], arch: LlamaArch) -> dict[str, torch.Tensor]:
    """A full Hugging Face state dict from every rank's Megatron state dict, keyed by (pp_rank, tp_rank), or by
    (pp_rank, tp_rank, ep_rank) under expert parallelism (the parts outside the experts are read from ep rank 0)."""
    by_ep = {key if len(key) == 3 else (*key, 0): value for key, value in shards.items()}
    ep_size = 1 + max(e for _, _, e in by_ep)
    experts = {(p, t, e): by_ep[(p, t, e)] for p, t, e in by_ep}
    shards = {(p, t): value for (p, t, e), value in by_ep.items() if e == 0}
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

    hf["model.embed_tokens.weight"] = unpad_vocab(gathered(0, "embedding.word_embeddings.weight"), arch)
    last = pp_size - 1
    hf["model.norm.weight"] = gathered(last, "decoder.final_layernorm.weight")
    if not arch.tie_word_embeddings:
        hf["lm_head.weight"] = unpad_vocab(gathered(last, "output_layer.weight"), arch)
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
            for mg_norm, hf_norm in layer_norms(arch):
                hf[h + hf_norm] = gathered(pp, m + mg_norm)
            if arch.is_moe:
                hf[hf_router(arch, layer)] = gathered(pp, m + "mlp.router.weight")
                for ep in range(ep_size):
                    for local_expert, expert in enumerate(local_experts(arch, ep, ep_size)):
                        mine = experts[(pp, 0, ep)]
                        gate, up, down = hf_expert(arch, layer, expert)
                        hf[gate], hf[up] = mine[m + MG_EXPERT.format(local_expert) + "linear_fc1.weight"].chunk(2, dim=0)
                        hf[down] = mine[m + MG_EXPERT.format(local_expert) + "linear_fc2.weight"]
                continue
            gate, up = unshard_fc1([shards[(pp, t)][m + "mlp.linear_fc1.weight"] for t in range(tp_size)])
            hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"] = gate, up
            hf[h + "mlp.down_proj.weight"] = gathered(pp, m + "mlp.linear_fc2.weight")
    return hf


def parameters_only(state: Mapping[str, object]) -> Iterator[tuple[str, torch.Tensor]]:
    """A Megatron module's state dict without the `_extra_state` entries of its linear layers."""
    for name, value in state.items():
        if not name.endswith("_extra_state") and isinstance(value, torch.Tensor):
            yield name, value
