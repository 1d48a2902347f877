"""Which rope scaling a Hugging Face config asks for, as far as megatron-core, vLLM and transformers compute it alike."""

from __future__ import annotations

from typing import Any, Mapping

from .unsupported import UnsupportedModel

# Llama 3.1-3.3's rope scaling: megatron-core applies these three numbers, and only these, with any factor.
LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
SUPPORTED_ROPE_SCALING = ("default", "llama3")


def rope_scaling_factor(scaling: Mapping[str, Any], accepted: tuple[str, ...] = SUPPORTED_ROPE_SCALING) -> float | None:
    """The llama3 rope scaling factor of a Hugging Face config's rope_scaling (rope_parameters in transformers 5),
    None for plain rope; a kind outside `accepted` (a family's own list), and anything megatron-core, vLLM and
    transformers do not all compute alike, is refused."""
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return None
    if kind not in accepted or kind != "llama3":
        raise UnsupportedModel(f"rope_scaling of type {kind!r} is not supported (supported: {', '.join(accepted)})")
    differs = {k: scaling.get(k) for k, v in LLAMA3_ROPE.items() if float(scaling.get(k, v)) != v}
    if differs:
        raise UnsupportedModel(f"llama3 rope_scaling with {differs} is not supported: megatron-core applies "
                               f"{LLAMA3_ROPE} (Llama 3.1-3.3's own), with any factor")
    factor = float(scaling.get("factor", 8.0))
    if not factor >= 1.0:
        raise UnsupportedModel(f"llama3 rope_scaling factor {factor} is not supported: it must be at least 1")
    return factor
