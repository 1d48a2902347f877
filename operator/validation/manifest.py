"""Reading RLJob manifests from YAML, with errors that name the file, the field and the rule.

Parsing follows the API server where it matters: types are strict (the string "2" is not an
integer), unknown fields are errors, and only the API's own (camelCase) field names are accepted,
never the Python attribute names the models also answer to in code. How files are read (duplicate
keys, merge keys, Lists, the bounds on hostile input) is yaml_reader's job.
"""

from __future__ import annotations

import difflib
import json
import os
import types
import typing
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from kuberl.engine.config import RULE_ERROR_TYPE
from kuberl.engine.config.base import PATTERN_MEANINGS

from ..api import API_VERSION, GROUP, KIND, RLJob
from .problems import ManifestError, NoRLJob, Problem, format_path
from .yaml_reader import Document, json_problems, read_documents, read_manifest_stream, read_manifest_text, shape_problems

__all__ = [
    "Document",
    "ManifestError",
    "Problem",
    "format_path",
    "load_rljob_documents",
    "load_rljobs",
    "manifest_files",
    "parse_rljob",
    "read_documents",
    "read_manifest",
    "rljobs_from_text",
]


# --- RLJob ----------------------------------------------------------------------------------


def is_rljob_document(doc: Any) -> bool:
    """Whether a document claims to be ours (so that it must validate) rather than another kind.

    A document that is not an object, or names no apiVersion or kind, is not "another kind":
    kubectl refuses it, so it is reported here too.
    """
    if not isinstance(doc, dict):
        return True
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str) or not api_version or not kind:
        return True
    return kind == KIND or api_version.startswith(GROUP + "/")


def parse_rljob(doc: Any, source: str) -> RLJob:
    """Validate one document as an RLJob, or raise ManifestError with every problem found."""
    if not isinstance(doc, dict):
        raise ManifestError([Problem(source, "", f"expected a mapping (an RLJob object), got {_kind_of(doc)}")])
    identity = [
        Problem(
            source,
            key,
            "required: every Kubernetes object names its apiVersion and kind" if key not in doc else f"must be {want!r}, got {doc[key]!r}",
        )
        for key, want in (("apiVersion", API_VERSION), ("kind", KIND))
        if doc.get(key) != want
    ]
    if identity:
        raise ManifestError(identity)
    too_big = shape_problems(doc, source)
    if too_big:
        raise ManifestError(too_big)
    not_json = json_problems(doc, source)
    if not_json:
        raise ManifestError(not_json)
    try:
        # Through JSON, as the API server sees it: strict JSON-mode validation rejects "2" for an
        # integer but accepts RFC 3339 strings for timestamps; by_name=False accepts only the
        # API's field names.
        return RLJob.model_validate_json(json.dumps(doc), strict=True, by_alias=True, by_name=False)
    except ValidationError as exc:
        raise ManifestError(problems_from_validation_error(exc, source, doc)) from None


def load_rljobs(path: Path) -> list[RLJob]:
    """Every RLJob in a file; ManifestError lists every problem of every document."""
    return [job for _, job in load_rljob_documents(path)]


def load_rljob_documents(path: Path) -> list[tuple[str, RLJob]]:
    """Every RLJob in a file with the source that names its document (file, and its number when there are several)."""
    return rljob_documents_from_text(read_manifest(path), str(path))


def read_manifest(path: Path | BinaryIO, source: str | None = None) -> str:
    """The text of a manifest file, or of an open binary stream (stdin), within yaml_reader's bounds; ManifestError
    naming `source` (default: the path, or the stream's name) when it cannot be read."""
    if source is None:
        source = str(path) if isinstance(path, (str, os.PathLike)) else str(getattr(path, "name", "the stream"))
    try:
        return read_manifest_text(path) if isinstance(path, (str, os.PathLike)) else read_manifest_stream(path, source)
    except IsADirectoryError:
        raise ManifestError(
            [
                Problem(
                    source,
                    "",
                    "is a directory: name its files, or pass the directory to `kuberl validate`, "
                    "which reads its .yaml, .yml and .json files",
                )
            ]
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError([Problem(source, "", f"cannot read: {exc}")]) from None


def rljobs_from_text(text: str, source: str) -> list[RLJob]:
    """Every RLJob in the text of a manifest file named `source`."""
    return [job for _, job in rljob_documents_from_text(text, source)]


def rljob_documents_from_text(text: str, source: str) -> list[tuple[str, RLJob]]:
    jobs: list[tuple[str, RLJob]] = []
    problems: list[Problem] = []
    kinds: list[str] = []
    for doc in read_documents(text, source):
        if not is_rljob_document(doc.content):
            kind = doc.content.get("kind") if isinstance(doc.content, dict) else None
            kinds.append(kind if isinstance(kind, str) and kind.isprintable() and len(kind) <= 63 else "a document with no kind")
            continue
        try:
            jobs.append((doc.source, parse_rljob(doc.content, doc.source)))
        except ManifestError as exc:
            # A problem of the whole object names the line where it starts.
            problems.extend(p if p.path else Problem(doc.start, "", p.message) for p in exc.problems)
    if problems:
        raise ManifestError(problems)
    if not jobs:
        raise NoRLJob([Problem(source, "", f"no {KIND} found (expected apiVersion: {API_VERSION}, kind: {KIND})")], kinds)
    return jobs


# --- turning pydantic's errors into problems ---------------------------------------------------


def problems_from_validation_error(exc: ValidationError, source: str, doc: Any) -> list[Problem]:
    problems = []
    for error in exc.errors(include_url=False):
        # pydantic marks an invalid dict key with "[key]" after it: the key itself is the place.
        loc = tuple(part for part in error["loc"] if part != "[key]")
        if error["type"] == RULE_ERROR_TYPE:
            for broken in error["ctx"]["problems"]:
                field = tuple(broken["field"].split(".")) if broken["field"] else ()
                problems.append(Problem(source, format_path(loc + field), broken["message"]))
        else:
            problems.append(Problem(source, format_path(loc), _message(error, loc)))
    return problems


def _message(error: ErrorDetails, loc: tuple[Any, ...]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        api_name = _api_name(loc[:-1], loc[-1])
        if api_name is not None:
            return f"unknown field: the API's name is {api_name}"
        allowed = _allowed_fields(loc[:-1])
        hint = ""
        if allowed:
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; allowed: {', '.join(allowed)}"
        return f"unknown field{hint}"
    if kind == "missing":
        return "required field is missing"
    message = error["msg"]
    if kind == "string_pattern_mismatch" and error.get("ctx", {}).get("pattern") in PATTERN_MEANINGS:
        return f"must be {PATTERN_MEANINGS[error['ctx']['pattern']]} (got {json.dumps(error['input'])})"
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if kind.endswith("_type") or kind in ("literal_error", "enum"):
        message += f" (got {_describe(error['input'])})"
    return message


def _describe(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return f"a {_kind_of(value)}"
    return f"{json.dumps(value)}, a {_kind_of(value)}"


def _kind_of(value: Any) -> str:
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "list",
        dict: "mapping",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _allowed_fields(loc: tuple[Any, ...]) -> list[str]:
    """The manifest field names of the model at `loc`, or [] where it is not a model."""
    model = _model_at(loc)
    return [f.alias or name for name, f in model.model_fields.items()] if model is not None else []


def _api_name(loc: tuple[Any, ...], key: Any) -> str | None:
    """The manifest name of the field that `key` is the Python name of, if it is one."""
    model = _model_at(loc)
    if model is None:
        return None
    field = model.model_fields.get(key) if isinstance(key, str) else None
    return field.alias if field is not None and field.alias and field.alias != key else None


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: Any = RLJob
    for part in loc:
        model = _field_type(model, part)
        if model is None:
            return None
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


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


MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


def manifest_files(names: list[str], recursive: bool = False) -> list[Path]:
    """Files named on a command line, a directory standing for its manifests as `kubectl apply -f DIR` reads them:
    its .yaml, .yml and .json files in name order (with `recursive`, those of its subdirectories too)."""
    files: list[Path] = []
    for name in names:
        path = Path(name)
        if path.is_dir():
            found = path.rglob("*") if recursive else path.glob("*")
            files.extend(sorted(f for f in found if f.is_file() and f.suffix in MANIFEST_SUFFIXES))
        else:
            files.append(path)
    return files
