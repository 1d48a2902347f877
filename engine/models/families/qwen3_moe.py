"""Qwen3-MoE: Qwen3's attention, and a mixture of experts in every layer's MLP."""

from __future__ import annotations

from typing import Any

from ..unsupported import UnsupportedModel
from .registry import MOE_JOB_NOTES, ATTENTION_BIAS, USE_SLIDING_WINDOW, Get, ModelFamily, Parallelism, Refusal, register_family

MOE_TESTS = "tests/engine/test_moe.py"


def moe_fields(get: Get) -> dict[str, Any]:
    """LlamaArch's mixture-of-experts fields. Routing: softmax over all experts, top k, renormalised only with
    norm_topk_prob (off by default), which megatron-core's pre-softmax router computes when it is off."""
    experts = get("num_experts") or get("num_local_experts")  # transformers 5 renames it
    topk = get("num_experts_per_tok")
    if not experts or not topk or topk > experts:
        raise UnsupportedModel(f"qwen3_moe with {experts} experts and num_experts_per_tok={topk} is not a mixture of experts")
    return dict(
        num_experts=int(experts),
        experts_per_token=int(topk),
        moe_intermediate_size=int(get("moe_intermediate_size")),
        norm_topk_prob=bool(get("norm_topk_prob", False)),
        router_aux_loss_coef=float(get("router_aux_loss_coef") or 0.0),
        hf_moe_prefix="mlp",
        hf_expert_names=("gate_proj", "up_proj", "down_proj"),
    )


def _shared(field: str) -> Refusal:
    return Refusal(field, "set", "no shared experts here", lambda get: bool(get(field)), 64)


FAMILY = register_family(
    ModelFamily(
        name="qwen3_moe",
        model_types=("qwen3_moe",),
        summary="Qwen3-MoE (30B-A3B, 235B-A22B): Qwen3's attention with q/k norms, every layer's MLP a mixture of experts",
        example={
            "model_type": "qwen3_moe",
            "vocab_size": 256,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "max_position_embeddings": 40960,
            "tie_word_embeddings": False,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "norm_topk_prob": False,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "router_aux_loss_coef": 0.001,
        },
        tests=(
            f"{MOE_TESTS}::test_one_process_matches_transformers[qwen3_moe]",
            f"{MOE_TESTS}::test_expert_parallel_matches_transformers[qwen3_moe]",
            f"{MOE_TESTS}::test_conversion_round_trip_is_exact[qwen3_moe]",
            f"{MOE_TESTS}::test_exported_folder_loads_in_transformers[qwen3_moe]",
            f"{MOE_TESTS}::test_routing_is_what_the_equality_tests[qwen3_moe]",
            "tests/rl/test_family_steps.py::test_one_grpo_step_per_family[qwen3_moe]",
            "tests/rl/test_moe_step.py::test_grpo_step_with_expert_parallelism",
        ),
        parallelism=Parallelism(
            tp=False,
            pp=True,
            ep=True,
            notes="tp > 1 is refused: megatron-core trains a mixture of experts under tensor parallelism "
            "only with sequence parallelism, which needs Transformer Engine; ep must divide the experts",
        ),
        qk_norm=True,
        moe=moe_fields,
        routing="softmax over all experts, top k; renormalised over the top k only with norm_topk_prob (megatron-core's "
        "router with moe_router_pre_softmax when it is off); router_aux_loss_coef is the load-balancing loss's coefficient",
        refusals=(
            ATTENTION_BIAS,
            USE_SLIDING_WINDOW,
            Refusal(
                "decoder_sparse_step",
                "other than 1",
                "every layer must be a mixture of experts (decoder_sparse_step 1)",
                lambda get: (get("decoder_sparse_step") or 1) != 1,
                2,
            ),
            Refusal(
                "mlp_only_layers", "non-empty", "every layer must be a mixture of experts", lambda get: bool(get("mlp_only_layers")), [0]
            ),
            *(_shared(f) for f in ("shared_expert_intermediate_size", "n_shared_experts", "num_shared_experts")),
        ),
        weights="a layer's router is mlp.gate and its experts mlp.experts.{e}.gate_proj, up_proj and down_proj (transformers 5's "
        "fused in-memory experts are split into these names first); each expert's gate and up are fused into its linear_fc1",
        notes=MOE_JOB_NOTES,
    )
)
