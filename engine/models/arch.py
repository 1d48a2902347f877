"""The shape of a Llama-family causal LM (Llama, Qwen2, SmolLM2), read from a Hugging Face config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..config.termination import NotRetryable

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


# Llama 3.1-3.3's rope scaling: megatron-core applies these three numbers, and only these, with any factor.
LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
SUPPORTED_ROPE_SCALING = ("default", "llama3")


class UnsupportedModel(NotRetryable, ValueError):
    """A model this engine cannot train, or cannot split the way the job's layout asks; the message says
    what the model asks for and what is supported."""

    reason = "UnsupportedModel"


def rope_scaling_factor(scaling: Mapping[str, Any]) -> float | None:
    """The llama3 rope scaling factor of a Hugging Face config's rope_scaling (rope_parameters in transformers 5),
    None for plain rope; anything megatron-core, vLLM and transformers do not all compute alike is refused."""
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return None
    if kind != "llama3":
        raise UnsupportedModel(f"rope_scaling of type {kind!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_SCALING)})")
    differs = {k: scaling.get(k) for k, v in LLAMA3_ROPE.items() if float(scaling.get(k, v)) != v}
    if differs:
        raise UnsupportedModel(f"llama3 rope_scaling with {differs} is not supported: megatron-core applies "
                               f"{LLAMA3_ROPE} (Llama 3.1-3.3's own), with any factor")
    factor = float(scaling.get("factor", 8.0))
    if not factor >= 1.0:
        raise UnsupportedModel(f"llama3 rope_scaling factor {factor} is not supported: it must be at least 1")
    return factor


@dataclass(frozen=True)
class LlamaArch:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    """Qwen2 has biases on q, k and v; Llama has none."""
    rope_scaling_factor: float | None = None
    """Llama 3.1+'s rope scaling (rope_type llama3) with this factor; None: plain rope."""
    qk_norm: bool = False
    """Qwen3 normalises each head's query and key (RMSNorm over the head dimension) before the rope."""

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def qkv_rows(self) -> int:
        """Rows of the fused QKV weight: every group's queries, key and value."""
        return self.num_kv_heads * (self.heads_per_group + 2) * self.head_dim

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | Any) -> "LlamaArch":
        get = config.get if isinstance(config, Mapping) else (lambda k, d=None: getattr(config, k, d))
        model_type = get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModel(f"model_type {model_type!r} is not a Llama-family model (supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
        if get("use_sliding_window", False):
            raise UnsupportedModel(f"{model_type} with use_sliding_window is not supported: every layer attends to the whole context here")
        heads = get("num_attention_heads")
        hidden = get("hidden_size")
        rope_theta = get("rope_theta")
        if rope_theta is None:  # transformers 5 keeps it under rope_parameters
            rope_theta = (get("rope_parameters") or {}).get("rope_theta", 10000.0)
        scaling_factor = rope_scaling_factor(get("rope_scaling") or get("rope_parameters") or {})
        return cls(
            vocab_size=get("vocab_size"),
            hidden_size=hidden,
            intermediate_size=get("intermediate_size"),
            num_layers=get("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=get("num_key_value_heads") or heads,
            head_dim=get("head_dim") or hidden // heads,
            rms_norm_eps=get("rms_norm_eps"),
            rope_theta=float(rope_theta),
            max_position_embeddings=get("max_position_embeddings"),
            tie_word_embeddings=bool(get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or bool(get("attention_bias", False)),
            rope_scaling_factor=scaling_factor,
            qk_norm=model_type == "qwen3",
        )

    def check_layout(self, tp: int, pp: int) -> None:
        """Raise if tensor or pipeline parallelism cannot split this model evenly."""
        problems = []
        if self.num_kv_heads % tp:
            problems.append(f"tp={tp} must divide the {self.num_kv_heads} key/value heads (whole groups per rank)")
        if self.intermediate_size % tp:
            problems.append(f"tp={tp} must divide intermediate_size {self.intermediate_size}")
        if self.vocab_size % tp:
            problems.append(f"tp={tp} must divide the vocabulary of {self.vocab_size} tokens")
        if self.num_layers % pp:
            problems.append(f"pp={pp} must divide the {self.num_layers} layers")
        if problems:
            raise UnsupportedModel("; ".join(problems))
