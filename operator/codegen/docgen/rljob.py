"""The RLJob reference page: every field of the API, from the pydantic models and the CRD built from them.

The models are walked beside the CRD's structural schema (kuberl.operator.api.crd.rljob_crd): the schema
gives each field's type, default, bounds and description as the API server sees them; the models
give the cross-field rules (each class's RULES) and the fields that are Kubernetes' own types.
"""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from .markdown import cell, code, header, table
from .rljob_text import GLANCE, cluster_rules, validating

_POD = "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/"
# Kubernetes' own types, embedded as they are in a PodSpec: one line each, with a link to their documentation.
EMBEDDED = {
    "Affinity": ("Kubernetes' Affinity, as in a PodSpec", "https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/"),
    "Volume": ("Kubernetes' Volume, as in a PodSpec", "https://kubernetes.io/docs/concepts/storage/volumes/"),
    "VolumeMount": ("Kubernetes' VolumeMount, as in a Container's volumeMounts", _POD),
    "EnvVar": ("Kubernetes' EnvVar, as in a Container's env", _POD),
    "EnvFromSource": ("Kubernetes' EnvFromSource, as in a Container's envFrom", _POD),
    "ObjectMeta": ("Kubernetes' ObjectMeta", "https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/object-meta/"),
}


@dataclass
class Row:
    path: str
    type: str
    default: str
    bounds: list[str]
    description: str
    notes: list[str] = field(default_factory=list)


@dataclass
class Section:
    path: str
    description: str
    rows: list[Row] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)


def anchor(path: str) -> str:
    """The HTML id of a field's row: its path without the list and map markers."""
    return path.replace("[]", "").replace("[name]", "")


def _embedded(cls: type) -> str | None:
    from ...api import kube_types

    for base in cls.__mro__:
        if base.__module__ == kube_types.__name__ and base.__name__ in EMBEDDED:
            return base.__name__
    return None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside a field's annotation (Optional, list, dict, Annotated unwrapped)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _type(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "quantity" if "pattern" in node else "integer or string"
    kind = node.get("type", "")
    if kind == "array":
        items = node.get("items", {})
        return "list of objects" if items.get("type") == "object" else f"list of {_type(items)}"
    if kind == "object":
        if node.get("x-kubernetes-preserve-unknown-fields"):
            return "object (free-form)"
        if "additionalProperties" in node:
            value = node["additionalProperties"]
            return "map of objects" if value.get("properties") else f"map of string to {_type(value)}"
        return "object"
    if node.get("format") == "date-time":
        return "timestamp"
    return kind


def _pattern(regex: str) -> str:
    from kuberl.engine.config.base import PATTERN_MEANINGS

    from ...api import kube_grammar as g

    words = {
        **PATTERN_MEANINGS,
        g.DNS1123_SUBDOMAIN: "a DNS-1123 subdomain",
        g.DNS1123_LABEL: "a DNS-1123 label",
        g.LABEL_VALUE: "a label value",
        g.LABEL_KEY: "a label key ([prefix/]name)",
        g.ENV_VAR_NAME: "an environment variable name",
    }
    if regex in words:
        return cell(words[regex])
    # Kubernetes' image reference grammar is longer than a page is wide: the CRD holds it.
    return "pattern " + code(regex) if len(regex) <= 80 else f"a pattern of {len(regex)} characters (the CRD's)"


def _bounds(node: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    if "enum" in node:
        out.append("one of " + ", ".join(code(v) for v in node["enum"]))
    if "minimum" in node:
        out.append(("> " if node.get("exclusiveMinimum") else "≥ ") + code(node["minimum"]))
    if "maximum" in node:
        out.append(("< " if node.get("exclusiveMaximum") else "≤ ") + code(node["maximum"]))
    lo, hi = node.get("minLength"), node.get("maxLength")
    if lo is not None or hi is not None:
        out.append(f"length {lo}..{hi}" if lo and hi is not None else f"length ≤ {hi}" if hi is not None else f"length ≥ {lo}")
    if "minItems" in node:
        out.append(f"at least {node['minItems']} items")
    if "maxItems" in node:
        out.append(f"at most {node['maxItems']} items")
    if "maxProperties" in node:
        out.append(f"at most {node['maxProperties']} entries")
    if "pattern" in node and not node.get("x-kubernetes-int-or-string"):
        out.append(_pattern(node["pattern"]))
    value = node.get("additionalProperties")
    if isinstance(value, dict) and not value.get("properties"):
        out += [f"values: {b}" for b in _bounds(value)]
    return [prefix + b for b in out]


def _default(node: dict[str, Any], required: bool) -> str:
    if required:
        return "required"
    if "default" not in node:
        return "unset"
    value = node["default"]
    if isinstance(value, dict) and value:
        return "its fields' defaults"
    return code('""' if value == "" else value)


def _checks(node: dict[str, Any]) -> list[str]:
    """A scalar or map field's own CEL checks (a model's rules come from its RULES instead)."""
    return [f"**Check:** {cell(v['message'])}" for v in node.get("x-kubernetes-validations", []) if "oldSelf" not in v["rule"]]


class Walk:
    """The models and their schema, walked together into sections of rows."""

    def __init__(self) -> None:
        self.sections: list[Section] = []
        self.rows: dict[str, Row] = {}
        self.models: list[tuple[str, type[BaseModel]]] = []

    def model(self, cls: type[BaseModel], node: dict[str, Any], path: str) -> None:
        section = Section(path, cell(node.get("description", "") or (cls.__doc__ or "").strip()))
        self.sections.append(section)
        self.models.append((path, cls))
        props, required = node.get("properties", {}), set(node.get("required", []))
        for name, info in cls.model_fields.items():
            alias = info.alias or name
            if alias not in props:
                continue
            self.field(section, info.annotation, props[alias], f"{path}.{alias}" if path else alias, alias in required)

    def field(self, section: Section, annotation: Any, node: dict[str, Any], path: str, required: bool) -> None:
        inner = _model_in(annotation)
        kind = _type(node)
        row = Row(path, kind, _default(node, required), _bounds(node), cell(node.get("description", "")))
        section.rows.append(row)
        self.rows[path] = row
        if inner is None:
            row.notes += _checks(node)
            return
        embedded = _embedded(inner)
        child: dict[str, Any] = (
            node["items"] if kind.startswith("list") else node["additionalProperties"] if kind.startswith("map") else node
        )
        child_path = path + ("[]" if kind.startswith("list") else "[name]" if kind.startswith("map") else "")
        if embedded is not None:
            what, url = EMBEDDED[embedded]
            row.type = kind.replace("objects", embedded).replace("object", embedded)
            row.notes.append(f"[{what}]({url}).")
            self.models.append((child_path, inner))  # its own RULES (kuberl's additions) still apply
            if embedded == "ObjectMeta":  # the CRD restricts two of its fields: list those
                for name, sub in child.get("properties", {}).items():
                    info = next(i for n, i in inner.model_fields.items() if (i.alias or n) == name)
                    extra = Row(f"{path}.{name}", _type(sub), "unset", _bounds(sub), cell(info.description or ""))
                    section.rows.append(extra)
                    self.rows[extra.path] = extra
            return
        row.notes.append(f"See [{child_path}](#{anchor(child_path)}-section).")
        self.model(inner, child, child_path)


_MENTION = re.compile(r"\b[a-z][A-Za-z0-9]*(?:\.[a-z][A-Za-z0-9]*)+\b|\b[a-z]+[A-Z][A-Za-z0-9]*\b")


def _resolve(walk: Walk, base: str, name: str) -> str | None:
    """A field named in a rule (relative to its section, or to spec) as a row's path."""
    for root in (base, "spec"):
        candidate = f"{root}.{name}"
        if candidate in walk.rows:
            return candidate
    return None


def attach_rules(walk: Walk) -> None:
    sections = {s.path: s for s in walk.sections}
    for path, cls in walk.models:
        for rule in getattr(cls, "RULES", ()):
            where = "" if rule.cel else " *(not in the CRD: `kuberl validate` and the operator check it)*"
            text = f"**Rule:** {cell(rule.message)}{where}"
            target = f"{path}.{rule.field}" if rule.field else path
            if rule.field is None and path in sections:
                sections[path].rules.append(text)
            else:
                while target not in walk.rows and "." in target:  # a rule of an embedded type: its field's row
                    target = target.removesuffix("[]") if target.endswith("[]") else target.rsplit(".", 1)[0]
                walk.rows[target].notes.append(text)
            mentioned = {r for m in _MENTION.findall(rule.message) if (r := _resolve(walk, path, m)) is not None} - {target}
            for other in sorted(mentioned):
                walk.rows[other].notes.append(f"{text} (a rule of [{target}](#{anchor(target)}))")


def _immutable(walk: Walk) -> None:
    from ...api.spec import IMMUTABLE_FIELDS

    for name in IMMUTABLE_FIELDS:
        walk.rows[f"spec.{name}"].notes.append("Immutable once the RLJob exists (the API server refuses a change).")


def _field_cell(path: str) -> str:
    """The field's name, and under it its whole path, which may break after a dot; the row's id is the path."""
    name = path.rsplit(".", 1)[-1]
    return f'<span id="{anchor(path)}"></span>`{name}`<br><small>{".<wbr>".join(cell(path).split("."))}</small>'


def page(repo: Path) -> str:
    from ...api import RLJob
    from ...api.crd import rljob_crd

    crd = rljob_crd()
    version = crd["spec"]["versions"][0]
    walk = Walk()
    walk.model(RLJob, version["schema"]["openAPIV3Schema"], "")
    attach_rules(walk)
    _immutable(walk)
    names = crd["spec"]["names"]
    columns = ", ".join(c["name"] for c in version["additionalPrinterColumns"])
    out = [
        header("the API models (kuberl.operator.api, kuberl.engine.config) and the CRD made from them"),
        "# RLJob reference\n\n",
        f"`apiVersion: {crd['spec']['group']}/{version['name']}`, `kind: {names['kind']}`, namespaced; short name "
        f"`{names['shortNames'][0]}` (`kubectl get {names['shortNames'][0]}` shows {columns}). Every field below is in the "
        "CRD with its description (`kubectl explain rljob.spec.trainer`). Each rule is checked by `kuberl validate`, "
        "by the operator and, unless marked otherwise, by the API server itself (a CEL rule of the CRD).\n\n"
        "## The spec at a glance\n\n",
        GLANCE,
        "\n",
        validating(),
        "## Fields\n\nPaths: `[]` is an item of a list, `[name]` an entry of a map. Defaults are applied by the API server.\n\n",
    ]
    for section in walk.sections:
        title = section.path or "RLJob"
        out.append(f"## {title} {{ #{anchor(section.path) + '-section' if section.path else 'rljob'} }}\n\n")
        if section.description:
            out.append(section.description + "\n\n")
        out += [f"- {rule}\n" for rule in section.rules]
        if section.rules:
            out.append("\n")
        rows = [
            [_field_cell(r.path), cell(r.type), r.default, "<br>".join(r.bounds), "<br>".join(x for x in [r.description, *r.notes] if x)]
            for r in section.rows
        ]
        out.append(table(["Field", "Type", "Default", "Bounds", "Description and rules"], rows) + "\n")
    out.append(cluster_rules())
    return "".join(out)
