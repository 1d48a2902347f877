"""The registry of model families: one file each in this folder, one `register_family` call in it.

A family says, as data and small pure functions, which Hugging Face `model_type`s it takes, how their
config maps to the architecture the engine builds in megatron-core (LlamaArch's fields), what it refuses
and why, how it splits, and which tests prove megatron-core computes what transformers does. LlamaArch
reads a config through its family, `check_model` asks it whether a job can run it, and docs/models.md is
written from it. No torch here: the operator image reads this too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ...common.registry import Registry
from ..rope import SUPPORTED_ROPE_SCALING, read_rope_scaling
from ..unsupported import UnsupportedModel

Get = Callable[..., Any]
"""A config's reader: get(key, default=None), over a dict or a transformers config object alike."""


@dataclass(frozen=True)
class Refusal:
    """A config value megatron-core would not compute alike: refused, naming the field, the value and why."""

    field: str
    when: str
    """The refused values, in words (for the docs): "true", "set and shorter than max_position_embeddings"."""
    why: str
    refuses: Callable[[Get], bool]
    example: Any
    """A value it refuses (on the family's example config): the registry's test shows each refusal refuses."""

    def check(self, model_type: str, get: Get) -> None:
        if self.refuses(get):
            raise UnsupportedModel(f"{model_type} with {self.field}={get(self.field)!r} is not supported: {self.why}")


@dataclass(frozen=True)
class Parallelism:
    """How the family splits in training. What the layout check refuses for it (LlamaArch.check_layout) is the
    same: tests/test_model_families.py holds the two together on each family's example config."""

    tp: bool
    pp: bool
    ep: bool
    notes: str = ""


@dataclass(frozen=True)
class ModelFamily:
    name: str
    model_types: tuple[str, ...]
    summary: str
    example: Mapping[str, Any]
    """A small config.json of the family (no weights), read by the registry's own test."""
    tests: tuple[str, ...]
    """The tests that prove megatron-core computes what transformers does for it: path::function, and [value] where
    the test is parametrized over families (its parameter, or its fixture's key, for this family)."""
    parallelism: Parallelism
    qkv_bias: bool = False
    """Biases on q, k and v (Qwen2); no family here has a bias on any other linear layer."""
    qk_norm: bool = False
    """An RMSNorm over each head's query and key before the rope (Qwen3)."""
    rope_scalings: tuple[str, ...] = SUPPORTED_ROPE_SCALING
    moe: Callable[[Get], dict[str, Any]] | None = None
    """LlamaArch's mixture-of-experts fields from a config (None: a dense MLP)."""
    routing: str = ""
    """How megatron-core's router computes this family's routing, in words (for the docs)."""
    refusals: tuple[Refusal, ...] = ()
    weights: str = ""
    """The family's own Hugging Face weight names, where they differ from Llama's (for the docs)."""
    job_refusal: str | None = None
    """Why a job cannot run this family yet, though the engine's layers train it; None: jobs run it."""
    notes: tuple[str, ...] = ()
    """What else a user of the family should know (for the docs)."""

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    def arch_fields(self, model_type: str, get: Get) -> dict[str, Any]:
        """The LlamaArch fields this family decides, after refusing what it cannot compute alike."""
        for refusal in self.refusals:
            refusal.check(model_type, get)
        return dict(
            qkv_bias=self.qkv_bias,
            qk_norm=self.qk_norm,
            rope_scaling=read_rope_scaling(
                get("rope_scaling") or get("rope_parameters") or {},
                self.rope_scalings,
                get("max_position_embeddings"),
                get("original_max_position_embeddings"),
            ),
            **(self.moe(get) if self.moe is not None else {}),
        )


FAMILIES: Registry[ModelFamily] = Registry("model family")


def register_family(family: ModelFamily) -> ModelFamily:
    if family.name not in FAMILIES:  # a name twice is the registry's to refuse, below
        taken = {t: f.name for f in FAMILIES.values() for t in f.model_types}
        for model_type in family.model_types:
            if model_type in taken:
                raise ValueError(f"model_type {model_type!r} of family {family.name!r} is already family {taken[model_type]!r}'s")
    FAMILIES[family.name] = family
    return family


def supported_model_types() -> tuple[str, ...]:
    return tuple(t for f in FAMILIES.values() for t in f.model_types)


def family_of(model_type: object) -> ModelFamily:
    """The family that takes `model_type`; UnsupportedModel naming the supported ones for any other."""
    for family in FAMILIES.values():
        if model_type in family.model_types:
            return family
    raise UnsupportedModel(f"model_type {model_type!r} is not a supported model family (supported: {', '.join(supported_model_types())})")


# What more than one family shares.

MOE_JOB_NOTES = (
    "In a job, `roles.<role>.layout.ep` splits each layer's experts over ep of the data-parallel ranks (ep divides dp "
    "and the experts); the switch into vLLM gathers every expert to every rank, (pp·ep - 1)/(pp·ep) of the experts' "
    "bytes per rank beside the rest's (engine/hybrid/plan.py).",
    "megatron-core's router adds router_aux_loss_coef times its load-balancing loss to the gradient; each step reports "
    "that loss, without the coefficient, as `moe_aux_loss` (`actor/moe_aux_loss` in the trackers).",
)
"""What a user of a mixture-of-experts family should know about running one in a job (its notes)."""

ATTENTION_BIAS = Refusal(
    "attention_bias",
    "true",
    "it puts a bias on o_proj too, which megatron-core's layers here do not have (only q, k and v biases, as Qwen2's)",
    lambda get: bool(get("attention_bias", False)),
    True,
)
MLP_BIAS = Refusal("mlp_bias", "true", "megatron-core's layers here have no MLP biases", lambda get: bool(get("mlp_bias", False)), True)
USE_SLIDING_WINDOW = Refusal(
    "use_sliding_window", "true", "every layer attends to the whole context here", lambda get: bool(get("use_sliding_window", False)), True
)


def _window_binds(get: Get) -> bool:
    window = get("sliding_window")
    return bool(window) and window < (get("max_position_embeddings") or 0)


SLIDING_WINDOW = Refusal(
    "sliding_window",
    "set and shorter than max_position_embeddings",
    "every layer attends to the whole context here (a window as long as the context is the same attention)",
    _window_binds,
    4096,
)
