"""Where a model's weights and tokenizer come from."""

from __future__ import annotations

from typing import Literal

from typing import Annotated

from pydantic import AfterValidator, Field

from .base import LocalPath, Rule, SpecModel, pattern

DNS_SUBDOMAIN = pattern(
    r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
    "a DNS-1123 subdomain: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit",
)
SECRET_KEY = pattern(r"^[-._a-zA-Z0-9]+$", "a Secret key: letters, digits, '-', '_' and '.'")

# The hub's repository id grammar (as huggingface_hub documents it): [namespace/]name, each part 1 to 96
# ASCII letters, digits, '-', '_' or '.', starting and ending with a letter, digit or '_'; no "--" or "..",
# no ".git" suffix. So an id can never climb out of the cache folder ("..", "../x").
_HUB_PART = r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
HUB_ID = pattern(
    rf"^({_HUB_PART}/)?{_HUB_PART}$",
    "a hub repository id, name or namespace/name (e.g. Qwen/Qwen2.5-0.5B-Instruct): "
    "letters, digits, '-', '_' and '.', each part starting and ending with a letter or digit",
)
_HUB_ID_CEL = "!self.contains('--') && !self.contains('..') && !self.endsWith('.git')"


def _hub_id(value: str) -> str:
    if "--" in value or ".." in value or value.endswith(".git"):
        raise ValueError(f"{value!r}: a hub repository id cannot contain -- or .. or end with .git")
    return value


HubId = Annotated[
    str,
    AfterValidator(_hub_id),
    Field(
        min_length=1,
        max_length=193,
        pattern=HUB_ID,
        json_schema_extra={
            "x-kubernetes-validations": [{"rule": _HUB_ID_CEL, "message": "a hub repository id cannot contain -- or .. or end with .git"}]
        },
    ),
]


# A revision is a branch, tag or commit; the hub client puts it into URLs and cache folders, so it
# follows git's ref grammar (git check-ref-format, one level allowed): these characters only, and the
# structural rules below. A 40-hex commit id passes both.
_REVISION_CHARS = pattern(
    r"^[^\x00-\x20\x7f~^:?*\[\\]+$", "a git branch, tag or commit: no spaces, control characters or any of ~ ^ : ? * [ \\"
)
_REVISION_RULES = (
    ("..", lambda v: ".." not in v, "!self.contains('..')"),
    ("//", lambda v: "//" not in v, "!self.contains('//')"),
    ("@{", lambda v: "@{" not in v, "!self.contains('@{')"),
    ("a leading or trailing /", lambda v: not v.startswith("/") and not v.endswith("/"), "!self.startsWith('/') && !self.endsWith('/')"),
    ("a part starting with .", lambda v: not v.startswith(".") and "/." not in v, "!self.startsWith('.') && !self.contains('/.')"),
    (
        "a trailing . or a part ending in .lock",
        lambda v: not v.endswith((".", ".lock")) and ".lock/" not in v,
        "!self.endsWith('.') && !self.endsWith('.lock') && !self.contains('.lock/')",
    ),
    ("@ alone", lambda v: v != "@", "self != '@'"),
)
_REVISION_MESSAGE = (
    "a revision follows git's ref grammar (a branch, tag or 40-hex commit): no .., //, @{, leading or trailing /, "
    "part starting with . or ending in .lock, or trailing ."
)


def _revision(value: str) -> str:
    broken = [what for what, check, _ in _REVISION_RULES if not check(value)]
    if broken:
        raise ValueError(f"{value!r}: {_REVISION_MESSAGE} (it has {', '.join(broken)})")
    return value


# Field before the validator: pydantic leaves a pattern checked after a function out of the JSON schema (and so the CRD).
Revision = Annotated[
    str,
    Field(
        min_length=1,
        max_length=256,
        pattern=_REVISION_CHARS,
        json_schema_extra={
            "x-kubernetes-validations": [{"rule": " && ".join(cel for _, _, cel in _REVISION_RULES), "message": _REVISION_MESSAGE}]
        },
    ),
    AfterValidator(_revision),
]
"""A branch, tag or commit of a hub repository, in git's ref grammar: never a path that climbs out of the cache."""


class SecretKeyRef(SpecModel):
    """A key of a Secret in the RLJob's namespace. Secrets are only ever referenced, never inlined."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    """The Secret's name."""
    key: str = Field(min_length=1, max_length=253, pattern=SECRET_KEY)
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
    hub_id: HubId | None = None
    """A Hugging Face hub id such as Qwen/Qwen2.5-0.5B-Instruct, for clusters that can reach the hub."""
    revision: Revision | None = None
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
