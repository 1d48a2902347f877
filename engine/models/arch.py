"""The shape of a Llama-shaped causal LM, read from a Hugging Face config through its family (families/: Llama,
Qwen2, Qwen3, Mistral, Gemma 3, and the mixture-of-experts Qwen3-MoE and Mixtral), which decides and refuses what is its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .families import family_of
from .rope import (
    LLAMA3_ROPE,
    SUPPORTED_ROPE_SCALING,
    LinearScaling,
    Llama3Scaling,
    RopeScaling,
    YarnScaling,
    read_rope_scaling,
    rope_scaling_factor,
)
from .unsupported import UnsupportedModel

__all__ = [
    "LLAMA3_ROPE",
    "MAKE_VOCAB_SIZE_DIVISIBLE_BY",
    "SUPPORTED_ROPE_SCALING",
    "LinearScaling",
    "Llama3Scaling",
    "LlamaArch",
    "RopeScaling",
    "UnsupportedModel",
    "YarnScaling",
    "read_rope_scaling",
    "rope_scaling_factor",
]

MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128
"""Megatron-LM's default: a vocabulary that tp does not divide is padded to a multiple of this times tp."""


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
    rope_scaling: RopeScaling | None = None
    """The rope scaling (rope.py: llama3, linear or yarn, with its parameters); None: plain rope."""
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
    hf_expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    """An expert's gate, up and down projections in Hugging Face checkpoints (Mixtral's: w1, w3, w2)."""
    gemma: bool = False
    """Gemma 3's layer (families/gemma3.py): RMSNorms scaling by 1 + weight in float32, a norm after the attention
    and after the MLP as well as before each, the embeddings scaled by sqrt(hidden_size), a tanh-GELU gated MLP."""
    softmax_scale: float | None = None
    """The attention's scale of q.k (None: 1 / sqrt(head_dim)); Gemma 3's is query_pre_attn_scalar ** -0.5."""
    local_rope_theta: float | None = None
    """The rope base of the layers in local_layers (Gemma 3's sliding-window layers); rope_theta is the others'."""
    local_layers: tuple[int, ...] = ()
    """The layers (from 0) that rotate by local_rope_theta."""

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def rope_scaling_factor(self) -> float | None:
        """The rope scaling's factor, whichever its kind; None: plain rope."""
        return None if self.rope_scaling is None else self.rope_scaling.factor

    def padded_vocab_size(self, tp: int) -> int:
        """The vocabulary rows megatron-core's embedding and output layer hold under `tp`: the model's own where tp
        divides it (unchanged layouts for every model that split before), else padded up to a multiple of
        MAKE_VOCAB_SIZE_DIVISIBLE_BY x tp as Megatron-LM pads it. The padded rows are zero (convert.py), their
        logits are masked (megatron_model.py), and export and the switch into vLLM drop them."""
        if self.vocab_size % tp == 0:
            return self.vocab_size
        step = MAKE_VOCAB_SIZE_DIVISIBLE_BY * tp
        return -(-self.vocab_size // step) * step

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
        # What each family decides, and refuses, is its file's in families/: asked first, so a refusal is what is said.
        decided = family_of(model_type).arch_fields(model_type, get)
        heads = get("num_attention_heads")
        hidden = get("hidden_size")
        rope_theta = get("rope_theta")
        if rope_theta is None:  # transformers 5 keeps it under rope_parameters
            rope_theta = (get("rope_parameters") or {}).get("rope_theta", 10000.0)
        fields = dict(
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
        )
        return cls(**{**fields, **decided})  # a family may decide a field read here the Llama way (Gemma 3's rope_theta)

    LORA_ON_EXPERTS = (
        "LoRA on a mixture-of-experts model is not supported yet: the adapters are built for a dense "
        "MLP's linear_fc1/linear_fc2 and the attention, not for the experts (engine/training/lora.py)"
    )
    """Why a job cannot train LoRA adapters on a mixture of experts."""

    def check_layout(self, tp: int, pp: int, ep: int = 1) -> None:
        """Raise if tensor, pipeline or expert parallelism cannot split this model evenly."""
        problems = []
        if self.is_moe:
            if tp > 1:
                # megatron-core 0.16.1's MoE layer refuses to train under tp > 1 without sequence parallelism
                # (MoELayer.forward), and sequence parallelism needs Transformer Engine.
                problems.append(
                    f"tp={tp} is not supported for mixture-of-experts models yet: megatron-core trains MoE "
                    "under tensor parallelism only with sequence parallelism; use tp=1 (and ep)"
                )
            if self.num_experts % ep:
                problems.append(f"ep={ep} must divide the {self.num_experts} experts")
        elif ep != 1:
            problems.append(f"ep={ep}: expert parallelism needs a mixture-of-experts model")
        if self.num_kv_heads % tp:
            problems.append(f"tp={tp} must divide the {self.num_kv_heads} key/value heads (whole groups per rank)")
        if not self.is_moe and self.intermediate_size % tp:
            problems.append(f"tp={tp} must divide intermediate_size {self.intermediate_size}")
        # The vocabulary is padded where tp does not divide it (padded_vocab_size): no rule here.
        if self.num_layers % pp:
            problems.append(f"pp={pp} must divide the {self.num_layers} layers")
        if problems:
            raise UnsupportedModel("; ".join(problems))
