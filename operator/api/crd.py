"""The RLJob CustomResourceDefinition, generated from the pydantic models.

pydantic writes JSON Schema (draft 2020-12, with $refs and anyOf for optional fields); the API
server wants a structural OpenAPI v3 schema: every node typed, no $ref, no `type` inside anyOf,
exclusive bounds as booleans. `structural_schema` does that translation and nothing else, so the
models stay the single source of truth and crds/ is only ever regenerated, never edited.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel

from . import (
    API_VERSION,
    CATEGORIES,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    RLJobSpec,
    RLJobStatus,
)
from . import kube_types
from .resource import metadata_schema

CRD_FILE_NAME = f"{GROUP}_{PLURAL}.yaml"

# Kubernetes' own types (affinity, volumes, ...) keep only the description of the RLJob field that
# holds them; their inner fields are documented by Kubernetes (`kubectl explain pod.spec.affinity`).
# Repeated in every role, their inner descriptions would cost about 25 KiB of a CRD that client-side
# `kubectl apply` must fit in one 256 KiB annotation.
_KUBE_TYPES = frozenset(
    name for name, value in vars(kube_types).items() if isinstance(value, type) and value.__module__ == kube_types.__name__
)

# Keys of JSON Schema that a structural schema may carry over unchanged.
_KEPT = {
    "type",
    "description",
    "default",
    "enum",
    "format",
    "pattern",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
}


class SchemaError(ValueError):
    """A model uses a construct that has no structural-schema equivalent."""


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of `model`, in its manifest (camelCase) spelling."""
    schema = model.model_json_schema(by_alias=True, mode="validation")
    defs = schema.pop("$defs", {})
    return _convert(schema, defs, where=model.__name__)


def _convert(node: dict[str, Any], defs: dict[str, Any], where: str) -> dict[str, Any]:
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        # A field's own description and default win over those of the model it refers to.
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        converted = _convert(merged, defs, where)
        if node["$ref"].rsplit("/", 1)[-1] in _KUBE_TYPES:
            own = {"description": converted["description"]} if "description" in converted else {}
            return {**own, **_without_descriptions(converted)}
        return converted

    if node.get("x-kubernetes-int-or-string"):
        return {k: v for k, v in node.items() if k in _KEPT}

    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        if len(branches) != 1:
            raise SchemaError(f"{where}: unions other than Optional[X] have no structural schema")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if rest.get("default", 0) is None:
            del rest["default"]  # None means "leave the field out"
        return _convert({**branches[0], **rest}, defs, where)

    if "const" in node:
        node = {**{k: v for k, v in node.items() if k != "const"}, "enum": [node["const"]]}

    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "default":
            out[key] = _without_nulls(value)
        elif key in _KEPT:
            out[key] = value
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and node.get("default") == 0:
            # kube-apiserver 1.37 refuses a CRD whose default 0 sits under an exclusive bound
            # ("default: Invalid value: 0: in body should be less than 0", measured), so such a
            # bound is said in CEL instead.
            op = ">" if key == "exclusiveMinimum" else "<"
            out.setdefault("x-kubernetes-validations", []).append(
                {"rule": f"self {op} {value}", "message": f"must be {'greater' if op == '>' else 'less'} than {value}"}
            )
        elif key == "exclusiveMinimum":
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum":
            out["maximum"], out["exclusiveMaximum"] = value, True
    if "enum" in out and "type" not in out:
        out["type"] = _enum_type(out["enum"], where)

    if "x-kubernetes-validations" in out:
        # rule first: it is what a reader looks for
        out["x-kubernetes-validations"] = [
            {k: v[k] for k in ("rule", "message", "fieldPath") if k in v} for v in out["x-kubernetes-validations"]
        ]

    kind = out.get("type")
    if kind == "object":
        props = node.get("properties")
        extra = node.get("additionalProperties")
        if extra is None and len(node.get("patternProperties", {})) == 1:
            # A map with constrained keys: structural schemas have no key patterns, so the keys'
            # rule is a CEL rule of the map (kube_grammar.label_keys_cel), and the values stay typed.
            [extra] = node["patternProperties"].values()
        if props is not None:
            out["properties"] = {name: _convert(sub, defs, f"{where}.{name}") for name, sub in props.items()}
            if node.get("required"):
                out["required"] = list(node["required"])
            # additionalProperties: false is pydantic's extra="forbid"; the API server prunes and,
            # with kubectl's default strict field validation, rejects unknown fields anyway.
        elif isinstance(extra, dict) and extra:
            out["additionalProperties"] = _convert(extra, defs, f"{where}[*]")
        else:
            out["x-kubernetes-preserve-unknown-fields"] = True
    elif kind == "array":
        out["items"] = _convert(node["items"], defs, f"{where}[*]")
    elif kind is None:
        raise SchemaError(f"{where}: every schema node needs a type")
    return out


def _without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_without_descriptions(v) for v in node]
    return node


def _without_nulls(value: Any) -> Any:
    """A default as the API server must see it: unset optional fields left out, not null."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _enum_type(values: list[Any], where: str) -> str:
    kinds = {type(v) for v in values}
    if kinds == {str}:
        return "string"
    if kinds == {int}:
        return "integer"
    raise SchemaError(f"{where}: enum of mixed or unsupported types {sorted(map(str, kinds))}")


def rljob_crd() -> dict[str, Any]:
    """The CustomResourceDefinition object for RLJob."""
    root = {
        "type": "object",
        "description": "An RL post-training job for a large language model: one group of pods per role.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": f"{API_VERSION}: the API group and version of the object."},
            "kind": {"type": "string", "description": f"{KIND}: the kind of the object."},
            "metadata": metadata_schema(),
            "spec": structural_schema(RLJobSpec),
            "status": structural_schema(RLJobStatus),
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "kuberl"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": list(CATEGORIES),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "Step", "type": "integer", "jsonPath": ".status.step"},
                        {"name": "Reward", "type": "number", "jsonPath": ".status.metrics.rewardMean"},
                        {
                            "name": "Progress",
                            "type": "integer",
                            "jsonPath": ".status.progress",
                            "description": "percent of totalSteps done",
                        },
                        {
                            "name": "ETA",
                            "type": "integer",
                            "jsonPath": ".status.etaSeconds",
                            "description": "seconds until the last step, as estimated at the last step",
                        },
                        {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts", "priority": 1},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def crd_yaml() -> str:
    """The CRD as the YAML text that crds/ holds."""
    header = (
        "# Generated by `kuberl crd` from the pydantic models in operator/api and engine/config.\n"
        f"# Do not edit: change the models and run `kuberl crd > crds/{CRD_FILE_NAME}`.\n"
    )
    body = yaml.dump(rljob_crd(), Dumper=_NoAliasDumper, sort_keys=False, width=120, allow_unicode=True)
    return header + body


class _NoAliasDumper(yaml.SafeDumper):
    """Writes repeated defaults out in full: anchors would make the file hard to read and diff."""

    def ignore_aliases(self, data: Any) -> bool:
        return True
