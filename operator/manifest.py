"""Reading RLJob manifests from YAML, with errors that name the file, the field and the rule.

Parsing follows the API server where it matters: types are strict (the string "2" is not an
integer), unknown fields are errors, timestamps stay strings, and YAML 1.2 numbers such as 1e-6 are
floats (PyYAML's YAML 1.1 would read them as strings). Duplicate keys, which YAML parsers silently
collapse, are errors too: one of the two values would be lost.
"""

from __future__ import annotations

import difflib
import json
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from kuberl.engine.config import RULE_ERROR_TYPE

from .api import API_VERSION, GROUP, KIND, RLJob


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a manifest: where it is and what rule it breaks."""

    source: str
    """The file, and the document's number when the file holds several."""
    path: str
    """The field, e.g. spec.roles.actor.layout; empty for the document as a whole."""
    message: str

    def __str__(self) -> str:
        return f"{self.source}: {self.path}: {self.message}" if self.path else f"{self.source}: {self.message}"


class ManifestError(Exception):
    """A manifest that cannot be used; `problems` lists every reason found."""

    def __init__(self, problems: list[Problem]):
        super().__init__("\n".join(map(str, problems)))
        self.problems = problems


# --- YAML -----------------------------------------------------------------------------------

_YAML12_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)[eE][-+]?[0-9]+$")


class _ManifestLoader(yaml.SafeLoader):
    """SafeLoader that reads like the API server's YAML-to-JSON step."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"found duplicate key {key!r}", key_node.start_mark
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


# Timestamps stay strings (JSON has no dates); YAML 1.2 exponent floats become floats.
_ManifestLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ManifestLoader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_FLOAT, list("-+.0123456789"))


def load_documents(text: str, source: str) -> list[tuple[str, Any]]:
    """The non-empty YAML documents of `text`, each with the name errors should use for it."""
    try:
        docs = [d for d in yaml.load_all(text, Loader=_ManifestLoader) if d is not None]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise ManifestError([Problem(where, "", f"YAML syntax error: {exc.problem or exc}")]) from None
    except yaml.YAMLError as exc:
        raise ManifestError([Problem(source, "", f"YAML syntax error: {exc}")]) from None
    if len(docs) == 1:
        return [(source, docs[0])]
    return [(f"{source} (document {i})", doc) for i, doc in enumerate(docs, start=1)]


# --- RLJob ----------------------------------------------------------------------------------


def is_rljob_document(doc: Any) -> bool:
    """Whether a document claims to be ours (so that it must validate) rather than another kind."""
    if not isinstance(doc, dict):
        return True  # not a Kubernetes object at all: report it
    api_version = doc.get("apiVersion")
    return doc.get("kind") == KIND or (isinstance(api_version, str) and api_version.startswith(GROUP + "/"))


def parse_rljob(doc: Any, source: str) -> RLJob:
    """Validate one document as an RLJob, or raise ManifestError with every problem found."""
    if not isinstance(doc, dict):
        raise ManifestError([Problem(source, "", f"expected a mapping (an RLJob object), got {_kind_of(doc)}")])
    identity = [
        Problem(source, key, f"must be {want!r}, got {doc.get(key)!r}")
        for key, want in (("apiVersion", API_VERSION), ("kind", KIND))
        if doc.get(key) != want
    ]
    if identity:
        raise ManifestError(identity)
    try:
        # Through JSON, as the API server sees it: strict JSON-mode validation rejects "2" for an
        # integer but accepts RFC 3339 strings for timestamps.
        return RLJob.model_validate_json(json.dumps(doc), strict=True)
    except ValidationError as exc:
        raise ManifestError(problems_from_validation_error(exc, source, doc)) from None
    except (TypeError, ValueError) as exc:  # e.g. a YAML key that JSON cannot hold
        raise ManifestError([Problem(source, "", f"not representable as JSON: {exc}")]) from None


def load_rljobs(path: Path) -> list[RLJob]:
    """Every RLJob in a file; ManifestError lists every problem of every document."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError([Problem(source, "", f"cannot read: {exc}")]) from None
    jobs, problems = [], []
    documents = load_documents(text, source)
    for name, doc in documents:
        if not is_rljob_document(doc):
            continue
        try:
            jobs.append(parse_rljob(doc, name))
        except ManifestError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ManifestError(problems)
    if not jobs:
        raise ManifestError([Problem(source, "", f"no {KIND} found (expected apiVersion: {API_VERSION}, kind: {KIND})")])
    return jobs


# --- turning pydantic's errors into problems ---------------------------------------------------


def problems_from_validation_error(exc: ValidationError, source: str, doc: Any) -> list[Problem]:
    problems = []
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        if error["type"] == RULE_ERROR_TYPE:
            for broken in error["ctx"]["problems"]:
                field = tuple(broken["field"].split(".")) if broken["field"] else ()
                problems.append(Problem(source, format_path(loc + field), broken["message"]))
        else:
            problems.append(Problem(source, format_path(loc), _message(error, loc)))
    return problems


def format_path(loc: tuple[Any, ...]) -> str:
    """("spec", "roles", "actor", "tolerations", 0) -> "spec.roles.actor.tolerations[0]"."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(part)):
            out += f".{part}" if out else str(part)
        else:
            out += f"[{part}]"
    return out


def _message(error: dict[str, Any], loc: tuple[Any, ...]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_fields(loc[:-1])
        hint = ""
        if allowed:
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; allowed: {', '.join(allowed)}"
        return f"unknown field{hint}"
    if kind == "missing":
        return "required field is missing"
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    if kind.endswith("_type") or kind in ("literal_error", "enum"):
        message += f" (got {_describe(error['input'])})"
    return message


def _describe(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return f"a {_kind_of(value)}"
    return f"{json.dumps(value)}, a {_kind_of(value)}"


def _kind_of(value: Any) -> str:
    return {
        bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "mapping",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _allowed_fields(loc: tuple[Any, ...]) -> list[str]:
    """The manifest field names of the model at `loc`, or [] where it is not a model."""
    model: Any = RLJob
    for part in loc:
        model = _field_type(model, part)
        if model is None:
            return []
    if isinstance(model, type) and issubclass(model, BaseModel):
        return [f.alias or name for name, f in model.model_fields.items()]
    return []


def _field_type(model: Any, part: Any) -> Any:
    if isinstance(model, type) and issubclass(model, BaseModel):
        for name, field in model.model_fields.items():
            if part in (name, field.alias):
                return _unwrap(field.annotation)
        return None
    origin = typing.get_origin(model)
    if (origin is list and isinstance(part, int)) or origin is dict:
        return _unwrap(typing.get_args(model)[-1])
    return None


def _unwrap(annotation: Any) -> Any:
    """Optional[X] -> X."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _unwrap(args[0])
    return annotation
