"""Which rope scaling a Hugging Face config asks for, as far as megatron-core, vLLM and transformers compute it alike.

Accepted: llama3 (Llama 3.1-3.3), linear (position interpolation: megatron-core's seq_len_interpolation_factor)
and yarn (megatron-core's YarnRotaryEmbedding). Refused: dynamic (megatron-core 0.16 has no dynamic NTK, and
vLLM's fixes the base at its longest context where transformers recomputes it per sequence length), and every
other kind (longrope, ntk, ...), which megatron-core's GPT model does not compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Union

from .unsupported import UnsupportedModel

# Llama 3.1-3.3's rope scaling: megatron-core applies these three numbers, and only these, with any factor.
LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
SUPPORTED_ROPE_SCALING = ("default", "llama3", "linear", "yarn")


@dataclass(frozen=True)
class Llama3Scaling:
    """Llama 3.1+'s rope scaling with this factor (megatron-core's rope_scaling, its other numbers LLAMA3_ROPE's)."""

    kind: ClassVar[str] = "llama3"
    factor: float


@dataclass(frozen=True)
class LinearScaling:
    """Position interpolation: every position divided by the factor (megatron-core's seq_len_interpolation_factor)."""

    kind: ClassVar[str] = "linear"
    factor: float


@dataclass(frozen=True)
class YarnScaling:
    """YaRN (megatron-core's YarnRotaryEmbedding). The attention factor applied to cos and sin is transformers' and
    vLLM's: get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim); mscale 1 and mscale_all_dim 0 give
    their default, get_mscale(factor)."""

    kind: ClassVar[str] = "yarn"
    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    truncate: bool = True
    """Round the correction range to whole dimensions (megatron-core's correction_range_round_to_int)."""


RopeScaling = Union[Llama3Scaling, LinearScaling, YarnScaling]


def _refuse(kind: str, what: str) -> UnsupportedModel:
    return UnsupportedModel(f"{kind} rope_scaling {what}")


def _factor(kind: str, scaling: Mapping[str, Any], default: float | None = None) -> float:
    factor = scaling.get("factor", default)
    if factor is None:
        raise _refuse(kind, "without a factor is not supported: vLLM reads it from the config")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not float(factor) >= 1.0:
        raise _refuse(kind, f"factor {factor!r} is not supported: it must be a number of at least 1")
    return float(factor)


def read_rope_scaling(
    scaling: Mapping[str, Any],
    accepted: tuple[str, ...] = SUPPORTED_ROPE_SCALING,
    max_position_embeddings: int | None = None,
    original_max_position_embeddings: int | None = None,
) -> RopeScaling | None:
    """The rope scaling of a Hugging Face config's rope_scaling (rope_parameters in transformers 5), None for plain
    rope; a kind outside `accepted` (a family's own list), and anything megatron-core, vLLM and transformers do not
    all compute alike, is refused. max_position_embeddings and a top-level original_max_position_embeddings are the
    config's own: transformers reads yarn's pretraining context from them where rope_scaling does not say it."""
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return None
    if kind not in accepted or kind not in ("llama3", "linear", "yarn"):
        raise UnsupportedModel(f"rope_scaling of type {kind!r} is not supported (supported: {', '.join(accepted)})")
    if kind == "linear":
        factor = _factor(kind, scaling)
        if not isinstance(scaling["factor"], float):
            # vLLM 0.32's LinearScalingRotaryEmbedding wraps a float factor in a list and iterates anything else.
            raise _refuse(kind, f"factor {scaling['factor']!r} is not supported: vLLM takes it only as a float (write {factor!r})")
        return LinearScaling(factor)
    if kind == "yarn":
        return _yarn(scaling, max_position_embeddings, original_max_position_embeddings)
    missing = [k for k in ("factor", *LLAMA3_ROPE) if scaling.get(k) is None]
    if missing:
        # Left out, each library fills its own default (transformers takes max_position_embeddings for the
        # original context, megatron-core 8192): the three would compute different rope.
        raise _refuse(
            kind,
            f"without {', '.join(missing)} is not supported: every Llama 3.1-3.3 config names them, "
            f"and left out, transformers and megatron-core fill in different values",
        )
    differs = {k: scaling.get(k) for k, v in LLAMA3_ROPE.items() if float(scaling[k]) != v}
    if differs:
        raise UnsupportedModel(
            f"llama3 rope_scaling with {differs} is not supported: megatron-core applies "
            f"{LLAMA3_ROPE} (Llama 3.1-3.3's own), with any factor"
        )
    return Llama3Scaling(_factor(kind, scaling))


def _yarn(scaling: Mapping[str, Any], max_position_embeddings: int | None, top_level_original: int | None) -> YarnScaling:
    factor = _factor("yarn", scaling)
    if scaling.get("attention_factor") is not None:
        raise _refuse(
            "yarn",
            f"with attention_factor={scaling['attention_factor']!r} is not supported: megatron-core "
            "derives it from factor, mscale and mscale_all_dim",
        )
    # transformers' order: a top-level original_max_position_embeddings (Phi-3's), rope_scaling's, max_position_embeddings.
    original = top_level_original or scaling.get("original_max_position_embeddings") or max_position_embeddings
    if not isinstance(original, int) or isinstance(original, bool) or original < 1:
        raise _refuse("yarn", f"with original_max_position_embeddings={original!r} is not supported: it must be a positive whole number")
    betas = {}
    for key, default in (("beta_fast", 32.0), ("beta_slow", 1.0)):
        value = scaling.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise _refuse("yarn", f"with {key}={value!r} is not supported: it must be a positive number")
        betas[key] = float(value)
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    for key, value in (("mscale", mscale), ("mscale_all_dim", mscale_all_dim)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise _refuse("yarn", f"with {key}={value!r} is not supported: it must be a number")
    truncate = scaling.get("truncate", True)
    if not isinstance(truncate, bool):
        raise _refuse("yarn", f"with truncate={truncate!r} is not supported: it must be true or false")
    # transformers and vLLM take the ratio only where both are set and non-zero, else get_mscale(factor): the same as
    # megatron-core's ratio with mscale 1 over mscale_all_dim 0.
    both = bool(mscale) and bool(mscale_all_dim)
    return YarnScaling(
        factor=factor,
        original_max_position_embeddings=original,
        **betas,
        mscale=float(mscale) if both else 1.0,
        mscale_all_dim=float(mscale_all_dim) if both else 0.0,
        truncate=truncate,
    )


def rope_scaling_factor(scaling: Mapping[str, Any], accepted: tuple[str, ...] = SUPPORTED_ROPE_SCALING) -> float | None:
    """The factor of read_rope_scaling's record (None for plain rope), refusing what it refuses."""
    found = read_rope_scaling(scaling, accepted)
    return None if found is None else found.factor
