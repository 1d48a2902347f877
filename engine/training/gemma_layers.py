"""Gemma 3's layer in megatron-core (no Gemma model there): its local layer spec with the engine's modules.

megatron-core's TransformerLayer takes its norms, attention and MLP from a spec; Gemma 3 needs, each as
transformers' Gemma3ForCausalLM computes it (models/families/gemma3.py):
- GemmaRMSNorm: x / rms(x) * (1 + weight), in float32, cast back (every norm, the q/k norms and the final one);
- GemmaSelfAttention / GemmaMLP: megatron's, with a norm on their output (post_layernorm) before the residual add;
- the sliding layers' own rope base: the model's rotary embedding is replaced by DualRotary, whose table holds the
  full layers' angles and then the sliding layers' along its last dimension; each attention takes its half. The
  engine's per-token lookup of the table (micro_batch_layers.rope_at_positions) sees one table as before;
- the embeddings times sqrt(hidden_size), in their dtype (a forward hook on the embedding).
"""

from __future__ import annotations

import math

import torch

from ..models.arch import LlamaArch


class GemmaRMSNorm(torch.nn.Module):
    """Gemma's RMSNorm: the weight starts at 0 and scales by 1 + weight; computed in float32."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-6, **_: object) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.zeros(hidden_size, dtype=config.params_dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


def _gemma_attention_class():
    from megatron.core.transformer.attention import SelfAttention

    class GemmaSelfAttention(SelfAttention):
        """megatron's self-attention, its output normed (post_attention_layernorm), rotating by its layer kind's rope."""

        def __init__(self, config, submodules, layer_number: int, *args, local_layers: tuple[int, ...] = (), **kwargs):
            super().__init__(config, submodules, layer_number, *args, **kwargs)
            self.local = (layer_number - 1) in local_layers  # layer_number: the model's, from 1
            self.post_layernorm = GemmaRMSNorm(config, config.hidden_size, config.layernorm_epsilon)

        def forward(self, hidden_states, attention_mask, *args, rotary_pos_emb=None, **kwargs):
            if rotary_pos_emb is not None:  # DualRotary's table: the full layers' half, then the sliding layers'
                full, local = rotary_pos_emb.chunk(2, dim=-1)
                rotary_pos_emb = local if self.local else full
            output, bias = super().forward(hidden_states, attention_mask, *args, rotary_pos_emb=rotary_pos_emb, **kwargs)
            return self.post_layernorm(output), bias  # bias: None (no linear biases)

    return GemmaSelfAttention


def _gemma_mlp_class():
    from megatron.core.transformer.mlp import MLP

    class GemmaMLP(MLP):
        """megatron's gated MLP, its output normed (post_feedforward_layernorm)."""

        def __init__(self, config, *args, **kwargs):
            super().__init__(config, *args, **kwargs)
            self.post_layernorm = GemmaRMSNorm(config, config.hidden_size, config.layernorm_epsilon)

        def forward(self, hidden_states, *args, **kwargs):
            output, bias = super().forward(hidden_states, *args, **kwargs)
            return self.post_layernorm(output), bias

    return GemmaMLP


def gemma_block_spec(arch: LlamaArch, pp: int):
    """The transformer block's spec of one pipeline stage: Gemma's layer, num_layers / pp of them, and its final norm."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    layer = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=True)
    sub = layer.submodules
    attention = sub.self_attention
    attention.module = _gemma_attention_class()
    attention.params = {**attention.params, "local_layers": arch.local_layers}
    attention.submodules.q_layernorm = GemmaRMSNorm
    attention.submodules.k_layernorm = GemmaRMSNorm
    sub.input_layernorm = GemmaRMSNorm
    sub.pre_mlp_layernorm = GemmaRMSNorm
    sub.mlp = ModuleSpec(module=_gemma_mlp_class(), submodules=sub.mlp.submodules)
    return TransformerBlockSubmodules(layer_specs=[layer] * (arch.num_layers // pp), layer_norm=GemmaRMSNorm)


class DualRotary(torch.nn.Module):
    """The model's rotary embedding (the full layers', with the config's rope scaling) and the sliding layers'
    (plain rope, local_rope_theta): one table [n, 1, 1, 2d] of both, full first."""

    def __init__(self, full: torch.nn.Module, arch: LlamaArch) -> None:
        from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

        super().__init__()
        self.full = full
        self.local = RotaryEmbedding(
            kv_channels=arch.head_dim,
            rotary_percent=1.0,
            rotary_base=int(arch.local_rope_theta or arch.rope_theta),
            use_cpu_initialization=True,
        )

    def get_rotary_seq_len(self, *args, **kwargs):
        return self.full.get_rotary_seq_len(*args, **kwargs)

    def forward(self, max_seq_len: int, *args, **kwargs) -> torch.Tensor:
        full = self.full(max_seq_len, *args, **kwargs)
        local = self.local(max_seq_len, *args, **kwargs)
        return torch.cat([full, local.to(full.device)], dim=-1)


def make_gemma(model: torch.nn.Module, arch: LlamaArch) -> None:
    """Gemma's parts around the layers of a GPTModel built with gemma_block_spec: the embeddings' scale and the
    sliding layers' rope."""
    if getattr(model, "pre_process", False):
        scale = torch.tensor(math.sqrt(arch.hidden_size))  # float32, then the embeddings' dtype, as transformers

        def scaled(module: torch.nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
            return output * scale.to(output.dtype)

        model.embedding.register_forward_hook(scaled)
    model.rotary_pos_emb = DualRotary(model.rotary_pos_emb, arch)
