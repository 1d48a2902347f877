"""Gemma 3 (text): its own layer, built in megatron-core from the engine's modules (training/gemma_layers.py).

What sets it apart from Llama, each computed as transformers' Gemma3ForCausalLM does: RMSNorms that scale by
1 + weight in float32; four norms a layer (before and after the attention, before and after the MLP, the "after"
ones applied to the block's output before the residual add); RMSNorms over each head's query and key; embeddings
times sqrt(hidden_size) in their dtype; a tanh-GELU gated MLP; an attention scale of query_pre_attn_scalar ** -0.5;
and a rope base of its own (rope_local_base_freq) on the sliding-window layers, the other layers rotating by
rope_theta with the config's rope scaling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..rope import read_rope_scaling
from ..unsupported import UnsupportedModel
from .registry import ATTENTION_BIAS, Get, ModelFamily, Parallelism, Refusal, register_family

TESTS = "tests/engine/test_gemma3.py"

SLIDING, FULL = "sliding_attention", "full_attention"
MAX_LAYERS = 1024
"""Far above any Gemma 3 (62 layers at 27B); a config asking for more is refused before a per-layer list is made."""


def layer_types(get: Get) -> list[str]:
    """Each layer's attention: the config's layer_types, else every sliding_window_pattern-th layer full (6: Gemma 3's)."""
    layers = get("num_hidden_layers")
    if not isinstance(layers, int) or not 0 < layers <= MAX_LAYERS:  # a list per layer is built from it
        raise UnsupportedModel(f"gemma3_text with num_hidden_layers={layers!r}: a whole number from 1 to {MAX_LAYERS} is supported")
    types = get("layer_types")
    if not types:
        pattern = int(get("sliding_window_pattern") or get("_sliding_window_pattern") or 6)
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(layers)]
    if len(types) != layers or set(types) - {SLIDING, FULL}:
        raise UnsupportedModel(f"gemma3_text with layer_types={types!r}: one of {SLIDING!r} or {FULL!r} per layer ({layers}) is supported")
    return list(types)


def rope_parameters(get: Get) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """(the full-attention layers' rope, the sliding layers'): transformers 5's rope_parameters per layer type, or
    a transformers 4 config's rope_theta and rope_scaling, and rope_local_base_freq."""
    nested = get("rope_parameters") or {}
    if FULL in nested or SLIDING in nested:
        return nested.get(FULL) or {}, nested.get(SLIDING) or {}
    full = {**(get("rope_scaling") or nested or {}), "rope_theta": get("rope_theta") or nested.get("rope_theta") or 1e6}
    return full, {"rope_type": "default", "rope_theta": get("rope_local_base_freq") or 1e4}


def _window_binds(get: Get) -> bool:
    window = get("sliding_window")
    return bool(window) and SLIDING in layer_types(get) and window < (get("max_position_embeddings") or 0)


def _not_tanh_gelu(get: Get) -> bool:
    return (get("hidden_activation") or "gelu_pytorch_tanh") != "gelu_pytorch_tanh"


SLIDING_WINDOW = Refusal(
    "sliding_window",
    "shorter than max_position_embeddings (with a sliding layer)",
    "the sliding layers attend to the whole context here, which is the same attention only where no sequence is "
    "longer than the window: set max_position_embeddings to at most sliding_window",
    _window_binds,
    512,
)


@dataclass(frozen=True)
class Gemma3Family(ModelFamily):
    def arch_fields(self, model_type: str, get: Get) -> dict[str, Any]:
        for refusal in self.refusals:
            refusal.check(model_type, get)
        full, local = rope_parameters(get)
        if (local.get("rope_type") or local.get("type") or "default") != "default":
            raise UnsupportedModel(
                f"{model_type} with a {local.get('rope_type') or local.get('type')!r} rope on its "
                "sliding layers is not supported: only their plain rope (rope_local_base_freq)"
            )
        types = layer_types(get)
        head_dim = get("head_dim") or get("hidden_size") // get("num_attention_heads")
        scalar = get("query_pre_attn_scalar") or head_dim
        return dict(
            qkv_bias=False,
            qk_norm=True,
            gemma=True,
            tie_word_embeddings=bool(get("tie_word_embeddings", True)),  # transformers' default for Gemma 3
            rope_theta=float(full.get("rope_theta") or 1e6),
            rope_scaling=read_rope_scaling(full, self.rope_scalings, get("max_position_embeddings")),
            local_rope_theta=float(local.get("rope_theta") or 1e4),
            local_layers=tuple(i for i, t in enumerate(types) if t == SLIDING),
            softmax_scale=float(scalar) ** -0.5,
        )


FAMILY = register_family(
    Gemma3Family(
        name="gemma3",
        model_types=("gemma3_text",),
        summary="Gemma 3 text models (Gemma3ForCausalLM: 270M, 1B, and the text of 4B-27B): norms scaling by 1 + weight "
        "before and after the attention and the MLP, q/k norms, scaled embeddings, tanh-GELU, a local rope base on "
        "the sliding-window layers",
        example={
            "model_type": "gemma3_text",
            "vocab_size": 256,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
            "query_pre_attn_scalar": 256,
            "sliding_window": 1024,
            "sliding_window_pattern": 2,
            "max_position_embeddings": 1024,
            "tie_word_embeddings": True,
            "hidden_activation": "gelu_pytorch_tanh",
            "final_logit_softcapping": None,
            "attn_logit_softcapping": None,
            "attention_bias": False,
            "use_bidirectional_attention": False,
        },
        tests=(
            f"{TESTS}::test_one_process_matches_transformers",
            f"{TESTS}::test_parallel_layout_matches_one_process",
            f"{TESTS}::test_conversion_round_trip_is_exact",
            f"{TESTS}::test_the_local_rope_base_and_the_attention_scale_matter",
            f"{TESTS}::test_vllm_logprobs_equal_transformers",
            "tests/rl/test_family_steps.py::test_one_grpo_step_per_family[gemma3]",
        ),
        parallelism=Parallelism(
            tp=True, pp=True, ep=False, notes="under tp each rank's heads give part of the q/k norms' gradient: megatron's DDP sums them"
        ),
        qk_norm=True,
        rope_scalings=("default", "linear"),
        refusals=(
            SLIDING_WINDOW,
            Refusal(
                "final_logit_softcapping",
                "set",
                "the output layer here computes the logits without a tanh cap (Gemma 2's; Gemma 3 has none)",
                lambda get: get("final_logit_softcapping") is not None,
                30.0,
            ),
            Refusal(
                "attn_logit_softcapping",
                "set",
                "the attention here takes the scores without a tanh cap (Gemma 2's; Gemma 3 has none)",
                lambda get: get("attn_logit_softcapping") is not None,
                50.0,
            ),
            Refusal(
                "use_bidirectional_attention",
                "true",
                "every layer here is causal (EmbeddingGemma's is not)",
                lambda get: bool(get("use_bidirectional_attention")),
                True,
            ),
            Refusal("hidden_activation", "other than gelu_pytorch_tanh", "the MLP here is Gemma 3's tanh-GELU", _not_tanh_gelu, "gelu"),
            ATTENTION_BIAS,
        ),
        weights="a layer's input_layernorm, post_attention_layernorm (after the attention), pre_feedforward_layernorm and "
        "post_feedforward_layernorm are megatron's input_layernorm, self_attention.post_layernorm, pre_mlp_layernorm "
        "and mlp.post_layernorm; self_attn.q_norm and k_norm are q_layernorm and k_layernorm. Norm weights are "
        "stored as Gemma stores them (the scale is 1 + weight), so a round trip is exact",
        notes=(
            "The sliding window is not computed: a config is taken only where no sequence can be longer than its "
            "sliding_window (max_position_embeddings at most sliding_window), where the window is the whole causal "
            "attention; Gemma 3's own configs (a 512- or 1024-token window, a 32K or 128K context) need "
            "max_position_embeddings lowered to their sliding_window first",
            "linear rope scaling (Gemma 3 4B-27B's factor 8) applies to the full-attention layers, as transformers "
            "and vLLM apply it; the sliding layers rotate by rope_local_base_freq unscaled",
            "model_type gemma3 (Gemma3ForConditionalGeneration, the vision-language checkpoints) is not taken: its "
            "text model's weights are under language_model",
        ),
    )
)
