"""Mixtral: Mistral's attention, and a mixture of experts (block_sparse_moe) in every layer."""

from __future__ import annotations

from typing import Any

from ..unsupported import UnsupportedModel
from .registry import MOE_JOB_NOTES, SLIDING_WINDOW, Get, ModelFamily, Parallelism, Refusal, register_family

MOE_TESTS = "tests/engine/test_moe.py"


def moe_fields(get: Get) -> dict[str, Any]:
    """LlamaArch's mixture-of-experts fields. Routing: softmax over the top k logits, always renormalised."""
    experts, topk = get("num_local_experts"), get("num_experts_per_tok")
    if not experts or not topk or topk > experts:
        raise UnsupportedModel(f"mixtral with {experts} experts and num_experts_per_tok={topk} is not a mixture of experts")
    return dict(
        num_experts=int(experts),
        experts_per_token=int(topk),
        moe_intermediate_size=int(get("intermediate_size")),
        norm_topk_prob=True,
        router_aux_loss_coef=float(get("router_aux_loss_coef") or 0.0),
        hf_moe_prefix="block_sparse_moe",
        hf_expert_names=("w1", "w3", "w2"),
    )


FAMILY = register_family(
    ModelFamily(
        name="mixtral",
        model_types=("mixtral",),
        summary="Mixtral 8x7B and 8x22B: Mistral's attention, every layer's MLP a mixture of experts",
        example={
            "model_type": "mixtral",
            "vocab_size": 256,
            "hidden_size": 64,
            "intermediate_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-5,
            "rope_theta": 1000000.0,
            "max_position_embeddings": 32768,
            "tie_word_embeddings": False,
            "sliding_window": None,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "router_aux_loss_coef": 0.02,
            "router_jitter_noise": 0.0,
        },
        tests=(
            f"{MOE_TESTS}::test_one_process_matches_transformers[mixtral]",
            f"{MOE_TESTS}::test_expert_parallel_matches_transformers[mixtral]",
            f"{MOE_TESTS}::test_conversion_round_trip_is_exact[mixtral]",
            f"{MOE_TESTS}::test_exported_folder_loads_in_transformers[mixtral]",
            f"{MOE_TESTS}::test_expert_e_lives_on_ep_rank_e_over_experts_per_rank[mixtral]",
            "tests/rl/test_family_steps.py::test_one_grpo_step_per_family[mixtral]",
        ),
        parallelism=Parallelism(
            tp=False,
            pp=True,
            ep=True,
            notes="tp > 1 is refused: megatron-core trains a mixture of experts under tensor parallelism "
            "only with sequence parallelism, which needs Transformer Engine; ep must divide the experts",
        ),
        moe=moe_fields,
        routing="softmax over the top k logits (megatron-core's router without pre-softmax); router_aux_loss_coef is the "
        "load-balancing loss's coefficient",
        refusals=(
            Refusal(
                "router_jitter_noise",
                "non-zero",
                "megatron-core's router adds no noise to the router's logits",
                lambda get: bool(get("router_jitter_noise")),
                0.1,
            ),
            SLIDING_WINDOW,
        ),
        weights="a layer's router is block_sparse_moe.gate and its experts block_sparse_moe.experts.{e}.w1 (gate), w3 (up) and "
        "w2 (down); each expert's w1 and w3 are fused into its linear_fc1",
        notes=MOE_JOB_NOTES,
    )
)
