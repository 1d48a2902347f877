"""Qwen2 and Qwen2.5: Llama's shape with biases on q, k and v."""

from __future__ import annotations

from .registry import ModelFamily, Parallelism, USE_SLIDING_WINDOW, register_family

MEGATRON = "tests/engine/test_megatron.py"

FAMILY = register_family(
    ModelFamily(
        name="qwen2",
        model_types=("qwen2",),
        summary="Qwen2 and Qwen2.5: Llama's shape with biases on q, k and v (megatron-core's add_qkv_bias)",
        example={
            "model_type": "qwen2",
            "vocab_size": 256,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "max_position_embeddings": 32768,
            "tie_word_embeddings": True,
            "use_sliding_window": False,
        },
        tests=(
            f"{MEGATRON}::test_one_process_matches_transformers[qwen2]",
            f"{MEGATRON}::test_parallel_layout_matches_one_process[qwen2]",
            f"{MEGATRON}::test_conversion_round_trip_is_exact[qwen2]",
            "tests/rl/test_family_steps.py::test_one_grpo_step_per_family[qwen2]",
        ),
        parallelism=Parallelism(tp=True, pp=True, ep=False),
        qkv_bias=True,
        refusals=(USE_SLIDING_WINDOW,),
        weights="q_proj, k_proj and v_proj have biases: fused into linear_qkv's bias, grouped like its weight",
    )
)
