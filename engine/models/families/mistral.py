"""Mistral (dense): Llama's shape; its sliding window is refused where it would bind."""

from __future__ import annotations

from .registry import SLIDING_WINDOW, ModelFamily, Parallelism, register_family

MEGATRON = "tests/engine/test_megatron.py"

FAMILY = register_family(
    ModelFamily(
        name="mistral",
        model_types=("mistral",),
        summary="Mistral 7B v0.2 and later, Mistral Nemo and Small: Llama's shape under another name",
        example={
            "model_type": "mistral",
            "vocab_size": 256,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "rms_norm_eps": 1e-5,
            "rope_theta": 1000000.0,
            "max_position_embeddings": 32768,
            "tie_word_embeddings": False,
            "sliding_window": None,
        },
        tests=(
            f"{MEGATRON}::test_one_process_matches_transformers[mistral]",
            f"{MEGATRON}::test_conversion_round_trip_is_exact[mistral]",
            "tests/rl/test_family_steps.py::test_one_grpo_step_per_family[mistral]",
        ),
        parallelism=Parallelism(tp=True, pp=True, ep=False),
        refusals=(SLIDING_WINDOW,),
        notes=("Mistral 7B v0.1's 4096-token sliding_window is refused: megatron-core's attention here is over the whole context",),
    )
)
