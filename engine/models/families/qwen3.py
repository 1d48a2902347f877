"""Qwen3 (dense): Llama's shape with an RMSNorm on each head's query and key, and a head size of its own."""

from __future__ import annotations

from .registry import ATTENTION_BIAS, ModelFamily, Parallelism, USE_SLIDING_WINDOW, register_family

MEGATRON = "tests/engine/test_megatron.py"

FAMILY = register_family(
    ModelFamily(
        name="qwen3",
        model_types=("qwen3",),
        summary="Qwen3 dense: Llama's shape with an RMSNorm over each head's query and key before the rope "
        "(megatron-core's qk_layernorm), and a head size apart from hidden_size / heads",
        example={
            "model_type": "qwen3",
            "vocab_size": 256,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "max_position_embeddings": 40960,
            "tie_word_embeddings": True,
            "attention_bias": False,
            "use_sliding_window": False,
        },
        tests=(
            f"{MEGATRON}::test_one_process_matches_transformers[qwen3]",
            f"{MEGATRON}::test_parallel_layout_matches_one_process[qwen3]",
            f"{MEGATRON}::test_conversion_round_trip_is_exact[qwen3]",
            f"{MEGATRON}::test_one_process_matches_transformers[qwen3_yarn]",
            f"{MEGATRON}::test_rope_scaling_matters_at_those_positions[qwen3_yarn]",
            "tests/engine/test_hybrid.py::test_vllm_generates_with_the_weights_the_switch_sent_before_and_after_an_optimizer_step[qwen3]",
            "tests/rl/test_family_steps.py::test_one_grpo_step_per_family[qwen3]",
        ),
        parallelism=Parallelism(
            tp=True, pp=True, ep=False, notes="under tp each rank's heads give part of the q/k norms' gradient: megatron's DDP sums them"
        ),
        qk_norm=True,
        refusals=(ATTENTION_BIAS, USE_SLIDING_WINDOW),
        weights="self_attn.q_norm and k_norm (one head's size) are q_layernorm and k_layernorm, whole on every tp rank",
    )
)
