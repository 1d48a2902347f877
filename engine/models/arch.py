"""The shape of a Llama-family causal LM (Llama, Qwen2, Qwen3, SmolLM2, and the mixture-of-experts Qwen3-MoE and
Mixtral), read from a Hugging Face config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..config.termination import NotRetryable

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral", "qwen3_moe", "mixtral")
MOE_MODEL_TYPES = ("qwen3_moe", "mixtral")


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
    num_experts: int = 0
    """Mixture of experts: routed experts in every layer's MLP (0: a dense MLP of intermediate_size)."""
    experts_per_token: int = 0
    """The router's top k."""
    moe_intermediate_size: int = 0
    """Each expert's hidden size (gate/up rows)."""
    norm_topk_prob: bool = True
    """Renormalise the top k routing probabilities to sum to 1 (Mixtral always; Qwen3-MoE per its config)."""
    router_aux_loss_coef: float = 0.0
    """The load-balancing loss's coefficient."""
    hf_moe_prefix: str = "mlp"
    """Where a layer's router and experts live in Hugging Face checkpoints: Mixtral's are under block_sparse_moe."""

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

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
        moe = moe_fields(model_type, get) if model_type in MOE_MODEL_TYPES else {}
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
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            **moe,
        )

    def check_layout(self, tp: int, pp: int, ep: int = 1) -> None:
        """Raise if tensor, pipeline or expert parallelism cannot split this model evenly."""
        problems = []
        if self.is_moe:
            if tp > 1:
                # megatron-core 0.16.1's MoE layer refuses to train under tp > 1 without sequence parallelism
                # (MoELayer.forward), and sequence parallelism needs Transformer Engine.
                problems.append(f"tp={tp} is not supported for mixture-of-experts models yet: megatron-core trains MoE "
                                "under tensor parallelism only with sequence parallelism; use tp=1 (and ep)")
            if self.num_experts % ep:
                problems.append(f"ep={ep} must divide the {self.num_experts} experts")
        elif ep != 1:
            problems.append(f"ep={ep}: expert parallelism needs a mixture-of-experts model")
        if self.num_kv_heads % tp:
            problems.append(f"tp={tp} must divide the {self.num_kv_heads} key/value heads (whole groups per rank)")
        if not self.is_moe and self.intermediate_size % tp:
            problems.append(f"tp={tp} must divide intermediate_size {self.intermediate_size}")
        if self.vocab_size % tp:
            problems.append(f"tp={tp} must divide the vocabulary of {self.vocab_size} tokens")
        if self.num_layers % pp:
            problems.append(f"pp={pp} must divide the {self.num_layers} layers")
        if problems:
            raise UnsupportedModel("; ".join(problems))


def moe_fields(model_type: str, get) -> dict[str, Any]:
    """LlamaArch's mixture-of-experts fields from a Qwen3-MoE or Mixtral config; what megatron-core's MoE layer
    cannot compute alike (shared experts, dense layers between sparse ones, router noise) is refused, naming the field."""
    if model_type == "qwen3_moe":
        if (get("decoder_sparse_step") or 1) != 1:
            raise UnsupportedModel(f"qwen3_moe with decoder_sparse_step={get('decoder_sparse_step')} is not supported: "
                                   "every layer must be a mixture of experts (decoder_sparse_step 1)")
        if get("mlp_only_layers"):
            raise UnsupportedModel(f"qwen3_moe with mlp_only_layers={list(get('mlp_only_layers'))} is not supported: "
                                   "every layer must be a mixture of experts")
        for field in ("shared_expert_intermediate_size", "n_shared_experts", "num_shared_experts"):
            if get(field):
                raise UnsupportedModel(f"qwen3_moe with {field}={get(field)} is not supported: no shared experts here")
        experts, size = get("num_experts") or get("num_local_experts"), get("moe_intermediate_size")  # transformers 5 renames it
        norm, prefix = bool(get("norm_topk_prob", False)), "mlp"
    else:  # mixtral: softmax over the top k, i.e. renormalised
        if get("router_jitter_noise"):
            raise UnsupportedModel(f"mixtral with router_jitter_noise={get('router_jitter_noise')} is not supported: "
                                   "megatron-core's router adds no noise to the router's logits")
        if get("sliding_window"):
            raise UnsupportedModel(f"mixtral with sliding_window={get('sliding_window')} is not supported: "
                                   "every layer attends to the whole context here")
        experts, size = get("num_local_experts"), get("intermediate_size")
        norm, prefix = True, "block_sparse_moe"
    topk = get("num_experts_per_tok")
    if not experts or not topk or topk > experts:
        raise UnsupportedModel(f"{model_type} with {experts} experts and num_experts_per_tok={topk} is not a mixture of experts")
    return dict(num_experts=int(experts), experts_per_token=int(topk), moe_intermediate_size=int(size),
                norm_topk_prob=norm, router_aux_loss_coef=float(get("router_aux_loss_coef") or 0.0), hf_moe_prefix=prefix)
