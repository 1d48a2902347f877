"""The shape of a Llama-family causal LM (Llama, Qwen2, SmolLM2), read from a Hugging Face config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..config.termination import NotRetryable

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")


class UnsupportedModel(NotRetryable, ValueError):
    """A model this engine cannot train, or cannot split the way the job's layout asks; the message says
    what the model asks for and what is supported."""

    reason = "UnsupportedModel"


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
        heads = get("num_attention_heads")
        hidden = get("hidden_size")
        rope_theta = get("rope_theta")
        if rope_theta is None:  # transformers 5 keeps it under rope_parameters
            rope_theta = (get("rope_parameters") or {}).get("rope_theta", 10000.0)
        scaling = get("rope_scaling")
        if scaling and (scaling.get("rope_type") or scaling.get("type")) not in (None, "default"):
            raise UnsupportedModel(f"rope_scaling {scaling} is not supported yet (only the default rope)")
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
