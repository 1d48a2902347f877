"""LoRA adapters' layouts: Megatron's per-rank shards <-> PEFT's full tensors, and merging. Pure.

One adapter per Hugging Face projection (q, k, v, o, gate, up, down), as PEFT keeps them:
A is [r, in], B is [out, r], and the layer computes W x + scale * B A x (scale = alpha / r).
Under tensor parallelism an adapter is cut like its layer:
- column-parallel layers (linear_qkv: q, k, v; linear_fc1: gate, up) split their output rows, so
  A stays whole on every TP rank and B is split by rows (q by query heads, k and v by KV heads,
  gate and up in halves like the layer itself);
- row-parallel layers (linear_proj: o; linear_fc2: down) split their input, so A is split by
  columns and B stays whole.
Each rank then computes its own rows (column) or its partial sum (row) without gathering x.
"""

from __future__ import annotations

import math
from typing import Mapping

import torch

from ..config.lora import HF_MODULES, LoRASpec
from .arch import LlamaArch
from .convert import MG_LAYER, stage_layers

# target -> (Megatron module of the layer, "column" | "row")
MEGATRON_MODULE = {
    "q": ("self_attention.linear_qkv", "column"),
    "k": ("self_attention.linear_qkv", "column"),
    "v": ("self_attention.linear_qkv", "column"),
    "o": ("self_attention.linear_proj", "row"),
    "gate": ("mlp.linear_fc1", "column"),
    "up": ("mlp.linear_fc1", "column"),
    "down": ("mlp.linear_fc2", "row"),
}
HF_PARENT = {"q": "self_attn", "k": "self_attn", "v": "self_attn", "o": "self_attn", "gate": "mlp", "up": "mlp", "down": "mlp"}
PEFT_PREFIX = "base_model.model."


def full_shapes(arch: LlamaArch, target: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """(in, out) of a target's projection as (A's shape without r, B's shape without r): in, out."""
    h, ffn, hd = arch.hidden_size, arch.intermediate_size, arch.head_dim
    return {
        "q": (h, arch.num_heads * hd),
        "k": (h, arch.num_kv_heads * hd),
        "v": (h, arch.num_kv_heads * hd),
        "o": (arch.num_heads * hd, h),
        "gate": (h, ffn),
        "up": (h, ffn),
        "down": (ffn, h),
    }[target]


def split_kind(target: str) -> str:
    return MEGATRON_MODULE[target][1]


def shard_pair(a: torch.Tensor, b: torch.Tensor, target: str, tp_rank: int, tp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A TP rank's (A, B) of a target's full adapter."""
    if split_kind(target) == "column":
        return a.clone(), b.chunk(tp, dim=0)[tp_rank].contiguous()
    return a.chunk(tp, dim=1)[tp_rank].contiguous(), b.clone()


def init_pair(
    arch: LlamaArch, target: str, rank: int, layer: int, seed: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """A target's full adapter at the start: A uniform in +-1/sqrt(in) (PEFT's kaiming_uniform_ with
    a = sqrt(5)), B zero, so the adapter adds nothing. Drawn from a generator seeded by (seed, layer,
    target): every layout starts from the same adapter."""
    fan_in, fan_out = full_shapes(arch, target)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + layer * 101 + list(HF_MODULES).index(target))
    bound = 1.0 / math.sqrt(fan_in)
    a = (torch.rand(rank, fan_in, generator=gen, dtype=torch.float64) * 2 - 1) * bound
    return a.to(dtype), torch.zeros(fan_out, rank, dtype=dtype)


def megatron_name(local_layer: int, target: str, which: str) -> str:
    """The stage-local Megatron name of an adapter's A or B."""
    return f"{MG_LAYER.format(local_layer)}{MEGATRON_MODULE[target][0]}.lora_{target}.{which}"


def peft_name(layer: int, target: str, which: str) -> str:
    """PEFT's saved name (what `peft` and vLLM load) of an adapter's A or B."""
    return f"{PEFT_PREFIX}model.layers.{layer}.{HF_PARENT[target]}.{HF_MODULES[target]}.lora_{which}.weight"


def hf_weight_name(layer: int, target: str) -> str:
    return f"model.layers.{layer}.{HF_PARENT[target]}.{HF_MODULES[target]}.weight"


def gather_adapter(
    shards: Mapping[tuple[int, int], Mapping[str, torch.Tensor]], arch: LlamaArch, targets: list[str]
) -> dict[str, torch.Tensor]:
    """The full adapter in PEFT's names from every rank's Megatron shards, keyed by (pp_rank, tp_rank)."""
    pp = 1 + max(p for p, _ in shards)
    tp = 1 + max(t for _, t in shards)
    out: dict[str, torch.Tensor] = {}
    for stage in range(pp):
        for local, layer in enumerate(stage_layers(arch, stage, pp)):
            for target in targets:
                a = [shards[(stage, t)][megatron_name(local, target, "A")] for t in range(tp)]
                b = [shards[(stage, t)][megatron_name(local, target, "B")] for t in range(tp)]
                column = split_kind(target) == "column"
                out[peft_name(layer, target, "A")] = a[0] if column else torch.cat(a, dim=1)
                out[peft_name(layer, target, "B")] = torch.cat(b, dim=0) if column else b[0]
    return out


def merged(hf_state: Mapping[str, torch.Tensor], adapter: Mapping[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """The base weights (Hugging Face names) with the adapter (PEFT names) merged in: W + scale B A,
    computed in float32 and cast back (PEFT's merge_and_unload)."""
    out = dict(hf_state)
    for name, a in adapter.items():
        if not name.endswith(".lora_A.weight"):
            continue
        b = adapter[name.replace(".lora_A.", ".lora_B.")]
        weight = name.removeprefix(PEFT_PREFIX).replace(".lora_A.weight", ".weight")
        base = out[weight]
        out[weight] = (base.float() + scale * (b.float() @ a.float())).to(base.dtype)
    return out


def adapter_config(spec: LoRASpec, base_model: str) -> dict:
    """adapter_config.json of a PEFT LoRA folder (what peft.PeftModel.from_pretrained and vLLM read)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": spec.dropout,
        "bias": "none",
        "target_modules": sorted(HF_MODULES[t] for t in spec.target_modules),
        "fan_in_fan_out": False,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "inference_mode": True,
    }
