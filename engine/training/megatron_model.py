"""A Llama-family model as megatron-core's GPTModel (local layer spec), for one pipeline stage."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, partial
from typing import Any

import torch
import torch.nn.functional as F

from ..compat import megatron_cpu
from ..models.arch import LinearScaling, Llama3Scaling, LlamaArch, YarnScaling


def moe_config(arch: LlamaArch, ep: int = 1) -> dict:
    """TransformerConfig's mixture-of-experts fields: megatron-core's router computing what the Hugging Face family does.

    Both families take the softmax of the router's logits over all experts and keep the top k. Renormalised
    (Mixtral, Qwen3-MoE with norm_topk_prob), that equals megatron's softmax over the top k logits
    (moe_router_pre_softmax False); not renormalised (Qwen3-MoE's default), it is megatron's pre-softmax routing.

    Under expert parallelism the tokens travel to their experts' ranks all-to-all: the ranks of an ep group are
    data-parallel ranks with micro-batches of their own, of different token counts, which megatron's all-gather
    dispatcher cannot take (it gathers equal shapes); on one rank the all-gather dispatcher moves nothing."""
    if not arch.is_moe:
        return {}
    return dict(
        num_moe_experts=arch.num_experts,
        moe_router_topk=arch.experts_per_token,
        moe_ffn_hidden_size=arch.moe_intermediate_size,
        moe_router_score_function="softmax",
        moe_router_pre_softmax=not arch.norm_topk_prob,
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=arch.router_aux_loss_coef,
        moe_token_dispatcher_type="alltoall" if ep > 1 else "allgather",
        moe_grouped_gemm=False,
        moe_router_dtype="fp32",
        expert_model_parallel_size=ep,
    )


@cache
def _yarn_transformer_config() -> type:
    """TransformerConfig with the yarn_* fields megatron-core's GPTModel reads for position_embedding_type "yarn"
    (gpt_model.py) and its attention reads for the cos/sin scale (_yarn_get_concentration_factor_from_config), which
    TransformerConfig itself does not declare."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    @dataclass
    class YarnTransformerConfig(TransformerConfig):
        yarn_rotary_scaling_factor: float = 1.0
        yarn_original_max_position_embeddings: int = 4096
        yarn_beta_fast: float = 32.0
        yarn_beta_slow: float = 1.0
        yarn_mscale: float = 1.0
        yarn_mscale_all_dim: float = 0.0
        yarn_correction_range_round_to_int: bool = True

    return YarnTransformerConfig


def rope_config(arch: LlamaArch) -> tuple[type | None, dict[str, Any], dict[str, Any]]:
    """How megatron-core computes arch's rope: the TransformerConfig subclass it needs (None: TransformerConfig),
    that config's rope fields, and GPTModel's."""
    scaling = arch.rope_scaling
    model: dict[str, Any] = dict(position_embedding_type="rope", rope_scaling=False)
    if isinstance(scaling, Llama3Scaling):
        return None, {}, {**model, "rope_scaling": True, "rope_scaling_factor": scaling.factor}
    if isinstance(scaling, LinearScaling):
        return None, {}, {**model, "seq_len_interpolation_factor": scaling.factor}
    if isinstance(scaling, YarnScaling):
        fields = dict(
            yarn_rotary_scaling_factor=scaling.factor,
            yarn_original_max_position_embeddings=scaling.original_max_position_embeddings,
            yarn_beta_fast=scaling.beta_fast,
            yarn_beta_slow=scaling.beta_slow,
            yarn_mscale=scaling.mscale,
            yarn_mscale_all_dim=scaling.mscale_all_dim,
            yarn_correction_range_round_to_int=scaling.truncate,
        )
        return _yarn_transformer_config(), fields, {"position_embedding_type": "yarn"}
    return None, {}, model


def transformer_config(arch: LlamaArch, tp: int = 1, pp: int = 1, dtype: torch.dtype = torch.float32, ep: int = 1):
    """megatron-core's TransformerConfig for `arch`; fused kernels off, so CPU and GPU compute alike."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    arch.check_layout(tp, pp, ep)
    config_class, rope_fields, _ = rope_config(arch)
    return (config_class or TransformerConfig)(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.moe_intermediate_size if arch.is_moe else arch.intermediate_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=arch.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=partial(F.gelu, approximate="tanh") if arch.gemma else F.silu,
        softmax_scale=arch.softmax_scale,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        pipeline_dtype=dtype,
        use_cpu_initialization=True,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        attention_softmax_in_fp32=True,
        qk_layernorm=arch.qk_norm,
        **moe_config(arch, ep),
        **rope_fields,
    )


def build_gpt_model(
    arch: LlamaArch,
    tp: int = 1,
    pp: int = 1,
    pp_rank: int = 0,
    dtype: torch.dtype = torch.float32,
    share_embeddings: bool | None = None,
    ep: int = 1,
):
    """The GPTModel of one pipeline stage. megatron's parallel_state must already be initialised (with
    expert_model_parallel_size=ep for a mixture of experts).

    share_embeddings defaults to the architecture's tied embeddings (a critic unties them: its
    output layer is a value head)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    megatron_cpu.apply()
    if arch.gemma:  # Gemma 3's layer: the engine's modules in megatron-core's local spec (gemma_layers.py)
        from .gemma_layers import gemma_block_spec

        spec = gemma_block_spec(arch, pp)
    else:
        spec = get_gpt_layer_local_spec(
            num_experts=arch.num_experts or None, moe_grouped_gemm=False, normalization="RMSNorm", qk_layernorm=arch.qk_norm
        )
    model = GPTModel(
        config=transformer_config(arch, tp, pp, dtype, ep),
        transformer_layer_spec=spec,
        vocab_size=arch.padded_vocab_size(tp),
        max_sequence_length=arch.max_position_embeddings,
        pre_process=pp_rank == 0,
        post_process=pp_rank == pp - 1,
        share_embeddings_and_output_weights=arch.tie_word_embeddings if share_embeddings is None else share_embeddings,
        rotary_base=int(arch.rope_theta),
        parallel_output=True,
        **rope_config(arch)[2],
    )
    if arch.gemma:
        from .gemma_layers import make_gemma

        make_gemma(model, arch)
    if pp_rank == pp - 1 and arch.padded_vocab_size(tp) != arch.vocab_size:
        mask_padded_vocab(model.output_layer, arch, tp)
    return model


PADDED_LOGIT = -1e9
"""The logit of a padded vocabulary id: its softmax probability is exactly 0 in fp32 and bf16, and, finite, it keeps
p * logit (the entropy) at 0 where -inf would make it nan."""


def mask_padded_vocab(output_layer: torch.nn.Module, arch: LlamaArch, tp: int) -> None:
    """Make the output layer's logits of the padding ids (vocab_size and up) PADDED_LOGIT on the TP ranks that hold them,
    so that log-probs, entropies and every softmax over the vocabulary are the unpadded model's. A critic replaces
    this output layer with its value head, and the hook with it."""
    from megatron.core import parallel_state as ps

    per_rank = arch.padded_vocab_size(tp) // tp
    first = max(0, arch.vocab_size - ps.get_tensor_model_parallel_rank() * per_rank)  # this rank's first padding column
    if first >= per_rank:
        return

    def hook(module: torch.nn.Module, args: object, output: tuple[torch.Tensor, object]) -> tuple[torch.Tensor, object]:
        logits, bias = output
        padding = torch.arange(first, per_rank, device=logits.device)
        return logits.index_fill(-1, padding, PADDED_LOGIT), bias

    output_layer.register_forward_hook(hook)


def causal_mask(seq_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Megatron's mask convention: True where attention is forbidden, shape [1, 1, s, s]."""
    return torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=device), diagonal=1)[None, None]
