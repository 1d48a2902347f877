"""Llama (1-3.3, and SmolLM2, which is a Llama): the reference the other families are told apart from."""

from __future__ import annotations

from .registry import ATTENTION_BIAS, MLP_BIAS, ModelFamily, Parallelism, register_family

MEGATRON = "tests/engine/test_megatron.py"

FAMILY = register_family(
    ModelFamily(
        name="llama",
        model_types=("llama",),
        summary="Llama 2, Llama 3.x and SmolLM2: grouped-query attention, no biases, SwiGLU, RMSNorm, rope "
        "(with Llama 3.1-3.3's llama3 scaling, or linear or YaRN scaling)",
        example={
            "model_type": "llama",
            "vocab_size": 256,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
            "max_position_embeddings": 131072,
            "tie_word_embeddings": False,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        },
        tests=(
            f"{MEGATRON}::test_one_process_matches_transformers[llama]",
            f"{MEGATRON}::test_one_process_matches_transformers[llama3]",
            f"{MEGATRON}::test_parallel_layout_matches_one_process[llama]",
            f"{MEGATRON}::test_parallel_layout_matches_one_process[llama3]",
            f"{MEGATRON}::test_conversion_round_trip_is_exact[llama]",
            f"{MEGATRON}::test_llama3_rope_scaling_matters_at_those_positions",
            f"{MEGATRON}::test_one_process_matches_transformers[linear]",
            f"{MEGATRON}::test_rope_scaling_matters_at_those_positions[linear]",
            f"{MEGATRON}::test_one_process_matches_transformers[yarn]",
            f"{MEGATRON}::test_parallel_layout_matches_one_process[yarn]",
            f"{MEGATRON}::test_rope_scaling_matters_at_those_positions[yarn]",
            "tests/engine/test_vllm_rope_scaling.py::test_vllm_greedy_logprobs_equal_transformers_past_the_original_context",
            "tests/engine/test_vllm_rope_scaling.py::test_vllm_greedy_logprobs_equal_transformers_with_linear_and_yarn_scaling[linear]",
            "tests/engine/test_vllm_rope_scaling.py::test_vllm_greedy_logprobs_equal_transformers_with_linear_and_yarn_scaling[yarn]",
            "tests/engine/test_hybrid.py::test_vllm_generates_with_the_weights_the_switch_sent_before_and_after_an_optimizer_step[llama]",
            "tests/rl/test_family_steps.py::test_one_grpo_step_per_family[llama]",
        ),
        parallelism=Parallelism(tp=True, pp=True, ep=False),
        refusals=(ATTENTION_BIAS, MLP_BIAS),
        notes=(
            "llama3 rope scaling is taken with Llama 3.1-3.3's own low_freq_factor 1, high_freq_factor 4 and "
            "original_max_position_embeddings 8192, and any factor of at least 1: megatron-core applies those numbers only",
            "linear rope scaling is megatron-core's seq_len_interpolation_factor; its factor must be written as a float "
            "(4.0, not 4): vLLM's linear scaling takes no other",
            "yarn rope scaling is megatron-core's YarnRotaryEmbedding, with factor, original_max_position_embeddings, "
            "beta_fast, beta_slow, mscale, mscale_all_dim and truncate as transformers reads them; an explicit "
            "attention_factor is refused: megatron-core derives it from factor, mscale and mscale_all_dim",
            "dynamic (NTK) rope scaling is refused: megatron-core has none, and vLLM's fixes at its longest context "
            "the base that transformers recomputes for each sequence's length",
        ),
    )
)
