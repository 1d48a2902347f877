"""The base of every manifest section: camelCase names, no unknown fields, and cross-field rules.

A cross-field rule is written once, as a `Rule`, and enforced twice: pydantic runs its Python
`check` when a manifest is parsed (the CLI, the operator, the engine), and the CRD generator emits
its `cel` expression as an `x-kubernetes-validations` entry, so the API server refuses the same
object before any of our code sees it. Keeping both halves in one declaration keeps them together.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Callable, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

RULE_ERROR_TYPE = "kuberl_rule"

PATTERN_MEANINGS: dict[str, str] = {}
"""What each field pattern means in words, for error messages: a registry, filled as the models are defined."""


def pattern(regex: str, meaning: str) -> str:
    """`regex`, remembered with its meaning ("a DNS-1123 subdomain: ..."), so that a mismatch is explained in
    words rather than shown as a regular expression (by whoever reports a validation error)."""
    PATTERN_MEANINGS[regex] = meaning
    return regex


_URL = r"^[A-Za-z][A-Za-z0-9+.-]*://"
_LOCAL_ONLY = "the engine reads local paths only: mount the files into the pod (a PersistentVolumeClaim or an image) and give their path; URLs such as s3://, gs:// or https:// are not read"


_NO_CLIMBING = (
    "must not contain .. segments (a path is checked against the volumes that hold it, and .. would "
    "climb out of them): write the path without .."
)
_DOT_DOT = "(^|/)[.][.](/|$)"
_NO_NUL = pattern(r"^[^\x00]*$", "a path without a NUL character")


def _local_path(value: str) -> str:
    if re.match(_URL, value):
        raise ValueError(f"{value!r}: {_LOCAL_ONLY}")
    if re.search(_DOT_DOT, value):
        raise ValueError(f"{value!r}: {_NO_CLIMBING}")
    return value


LocalPath = Annotated[
    str,
    # Field before the validator: pydantic leaves a pattern checked after a function out of the JSON schema (and so the CRD).
    Field(
        min_length=1,
        max_length=4096,
        pattern=_NO_NUL,
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": f"!self.matches('{_URL}')", "message": _LOCAL_ONLY},
                {"rule": f"!self.matches('{_DOT_DOT}')", "message": _NO_CLIMBING},
            ],
        },
    ),
    AfterValidator(_local_path),
]
"""A file or folder path the engine opens; a URL, a .. segment and a NUL are refused, here and by the API server."""


@dataclass(frozen=True)
class Rule:
    """A rule over one section. `check` returns True when the section obeys it.

    `field` names the offending field relative to the section, in manifest (camelCase) spelling,
    so that errors point at it; `cel` is the same rule over `self` for the API server, or None where
    CEL cannot say it (then only our own parsing enforces it). `detail` may add the values at fault
    to the Python message; CEL messages stay static.
    """

    message: str
    check: Callable[[Any], bool]
    cel: str | None = None
    field: str | None = None
    detail: Callable[[Any], str] | None = None

    def cel_validation(self) -> dict[str, str]:
        entry = {"rule": self.cel or "", "message": self.message}
        if self.field:
            entry["fieldPath"] = "." + self.field
        return entry


def _add_rules_to_schema(schema: dict[str, Any], cls: type) -> None:
    rules = [r.cel_validation() for r in getattr(cls, "RULES", ()) if r.cel]
    rules += [dict(rule) for rule in getattr(cls, "TRANSITION_RULES", ())]
    if rules:
        schema["x-kubernetes-validations"] = rules


class SpecModel(BaseModel):
    """Base of all manifest models.

    Fields are snake_case in Python and camelCase in manifests (Kubernetes convention); unknown
    fields are errors, so a misspelt key never silently falls back to a default. Every bound on a
    number says why in the field's description.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        # Code builds models by their Python names; manifests are parsed with by_name=False
        # (by the operator's manifest reader), so that only the API's names reach a cluster.
        validate_by_name=True,
        validate_by_alias=True,
        extra="forbid",
        # JSON, and so the API server, cannot carry inf or nan.
        allow_inf_nan=False,
        validate_default=False,
        json_schema_extra=_add_rules_to_schema,
        use_attribute_docstrings=True,
        # Validators are built on first use, as one tree from the model validated: `kuberl
        # validate` then builds what it needs once instead of every model on import.
        defer_build=True,
    )

    RULES: ClassVar[tuple[Rule, ...]] = ()
    # Rules over `self` and `oldSelf` that the API server applies to updates. Parsing a manifest has
    # no old object, so these live only in the CRD.
    TRANSITION_RULES: ClassVar[tuple[dict[str, str], ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> "SpecModel":
        problems = []
        for rule in type(self).RULES:
            if rule.check(self):
                continue
            message = rule.message
            if rule.detail is not None:
                message = f"{message} ({rule.detail(self)})"
            problems.append({"field": rule.field or "", "message": message})
        if problems:
            # One error carries every broken rule of this section; manifest.py unfolds them
            # into one problem per field.
            raise PydanticCustomError(
                RULE_ERROR_TYPE,
                "{summary}",
                {"summary": "; ".join(p["message"] for p in problems), "problems": problems},
            )
        return self

    def to_manifest(self) -> dict[str, Any]:
        """The manifest form: camelCase keys, unset optional fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
