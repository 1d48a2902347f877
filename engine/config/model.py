"""Where a model's weights and tokenizer come from."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import LocalPath, Rule, SpecModel

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


class SecretKeyRef(SpecModel):
    """A key of a Secret in the RLJob's namespace. Secrets are only ever referenced, never inlined."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    """The Secret's name."""
    key: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    """The key inside the Secret."""


def _count_set(*values: object) -> int:
    return sum(v is not None for v in values)


_ONE_SOURCE_CEL = "(has(self.path) ? 1 : 0) + (has(self.gguf) ? 1 : 0) + (has(self.hubId) ? 1 : 0)"
_HUB_ONLY_RULES = (
    Rule(
        message="revision applies only to hubId",
        check=lambda s: s.revision is None or s.hub_id is not None,
        cel="!has(self.revision) || has(self.hubId)",
        field="revision",
    ),
    Rule(
        message="tokenSecretRef applies only to hubId",
        check=lambda s: s.token_secret_ref is None or s.hub_id is not None,
        cel="!has(self.tokenSecretRef) || has(self.hubId)",
        field="tokenSecretRef",
    ),
    Rule(
        message="gguf must name a .gguf file",
        check=lambda s: s.gguf is None or s.gguf.endswith(".gguf"),
        cel="!has(self.gguf) || self.gguf.endsWith('.gguf')",
        field="gguf",
    ),
)


class WeightsSource(SpecModel):
    """One of: a Hugging Face folder, a GGUF file, or a hub id."""

    path: LocalPath | None = None
    """A local Hugging Face folder: config.json, *.safetensors and the tokenizer files."""
    gguf: LocalPath | None = None
    """A local GGUF file (weights, config and tokenizer in one file)."""
    hub_id: str | None = Field(default=None, min_length=1, max_length=256, pattern=r"^[\w.-]+(/[\w.-]+)?$")
    """A Hugging Face hub id such as Qwen/Qwen2.5-0.5B-Instruct, for clusters that can reach the hub."""
    revision: str | None = Field(default=None, min_length=1, max_length=256)
    """A branch, tag or commit of hubId."""
    token_secret_ref: SecretKeyRef | None = None
    """The hub token for gated models, read from a Secret."""

    def source(self) -> str | None:
        """The one location that is set, as written."""
        return self.path or self.gguf or self.hub_id


class ModelSpec(WeightsSource):
    """The policy's initial weights (also the reference policy's and, by default, the critic's)."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Parameter dtype; auto is bfloat16 on GPUs and float32 on CPU."""

    RULES = (
        Rule(
            message="set exactly one of path, gguf and hubId",
            check=lambda s: _count_set(s.path, s.gguf, s.hub_id) == 1,
            cel=f"{_ONE_SOURCE_CEL} == 1",
        ),
        *_HUB_ONLY_RULES,
    )


class TokenizerSpec(WeightsSource):
    """The tokenizer, when it is not the model's own."""

    chat_template: str | None = Field(default=None, min_length=1, max_length=65536)
    """A Jinja chat template that replaces the tokenizer's."""

    RULES = (
        Rule(
            message="set at most one of path, gguf and hubId (none: the model's tokenizer)",
            check=lambda s: _count_set(s.path, s.gguf, s.hub_id) <= 1,
            cel=f"{_ONE_SOURCE_CEL} <= 1",
        ),
        *_HUB_ONLY_RULES,
    )
