"""A Llama-family model as megatron-core's GPTModel (local layer spec), for one pipeline stage."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..compat import megatron_cpu
from ..models.arch import LlamaArch


def moe_config(arch: LlamaArch, ep: int = 1) -> dict:
    """TransformerConfig's mixture-of-experts fields: megatron-core's router computing what the Hugging Face family does.

    Both families take the softmax of the router's logits over all experts and keep the top k. Renormalised
    (Mixtral, Qwen3-MoE with norm_topk_prob), that equals megatron's softmax over the top k logits
    (moe_router_pre_softmax False); not renormalised (Qwen3-MoE's default), it is megatron's pre-softmax routing."""
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
        moe_token_dispatcher_type="allgather",
        moe_grouped_gemm=False,
        moe_router_dtype="fp32",
        expert_model_parallel_size=ep,
    )


def transformer_config(arch: LlamaArch, tp: int = 1, pp: int = 1, dtype: torch.dtype = torch.float32, ep: int = 1):
    """megatron-core's TransformerConfig for `arch`; fused kernels off, so CPU and GPU compute alike."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    arch.check_layout(tp, pp, ep)
    return TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.moe_intermediate_size if arch.is_moe else arch.intermediate_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=arch.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
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
    )


def build_gpt_model(arch: LlamaArch, tp: int = 1, pp: int = 1, pp_rank: int = 0, dtype: torch.dtype = torch.float32,
                    share_embeddings: bool | None = None, ep: int = 1):
    """The GPTModel of one pipeline stage. megatron's parallel_state must already be initialised (with
    expert_model_parallel_size=ep for a mixture of experts).

    share_embeddings defaults to the architecture's tied embeddings (a critic unties them: its
    output layer is a value head)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    megatron_cpu.apply()
    return GPTModel(
        config=transformer_config(arch, tp, pp, dtype, ep),
        transformer_layer_spec=get_gpt_layer_local_spec(num_experts=arch.num_experts or None, moe_grouped_gemm=False,
                                                        normalization="RMSNorm", qk_layernorm=arch.qk_norm),
        vocab_size=arch.vocab_size,
        max_sequence_length=arch.max_position_embeddings,
        pre_process=pp_rank == 0,
        post_process=pp_rank == pp - 1,
        share_embeddings_and_output_weights=arch.tie_word_embeddings if share_embeddings is None else share_embeddings,
        position_embedding_type="rope",
        rotary_base=int(arch.rope_theta),
        rope_scaling=arch.rope_scaling_factor is not None,
        rope_scaling_factor=arch.rope_scaling_factor or 8.0,
        parallel_output=True,
    )


def causal_mask(seq_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Megatron's mask convention: True where attention is forbidden, shape [1, 1, s, s]."""
    return torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=device), diagonal=1)[None, None]
