"""Writes operator/api/kube_types.py: Kubernetes' own types, from the `kubernetes` client's models.

The RLJob embeds Kubernetes types (a pod's affinity, the object's metadata). The client's models
are the API's types at the client's version (field names, types, required fields, descriptions),
but they accept Python names beside the API's, and importing the client takes about 2 s. So this
generator turns them into SpecModels once, at development time; a test regenerates the file and
compares. What the client's models do not carry (enums and bounds stated only in descriptions, and
the label grammars) is added from OVERRIDES, each with the API's own rule.

    .venv/bin/python -m kuberl.operator.codegen.kube_types > operator/api/kube_types.py
"""

from __future__ import annotations

import datetime
import sys
import typing
from typing import Any

# What the RLJob embeds: a pod's affinity, the object's metadata, and the pod customisation of
# spec.volumes and each role's volumeMounts, env and envFrom.
ROOTS = ("V1Affinity", "V1ObjectMeta", "V1Volume", "V1VolumeMount", "V1EnvVar", "V1EnvFromSource")

# (class, field) -> the annotation to write instead of the client's, and why.
OVERRIDES: dict[tuple[str, str], str] = {
    # Valid operators, from the API's validation (the client has them only in prose).
    ("V1NodeSelectorRequirement", "operator"): 'Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]',
    ("V1LabelSelectorRequirement", "operator"): 'Literal["In", "NotIn", "Exists", "DoesNotExist"]',
    # Preferred terms weigh 1..100 (ValidatePreferredSchedulingTerms, validateWeightedPodAffinityTerms).
    ("V1PreferredSchedulingTerm", "weight"): "Annotated[int, Field(ge=1, le=100)]",
    ("V1WeightedPodAffinityTerm", "weight"): "Annotated[int, Field(ge=1, le=100)]",
    # Label grammar where the API server applies it.
    ("V1NodeSelectorRequirement", "key"): "LabelKey",
    ("V1LabelSelectorRequirement", "key"): "LabelKey",
    ("V1LabelSelector", "match_labels"): "SelectorLabels",
    ("V1PodAffinityTerm", "topology_key"): "LabelKey",
    # Names the API server checks: volumes are DNS-1123 labels, env var names a C-identifier-like grammar.
    ("V1Volume", "name"): "DNSLabel",
    ("V1VolumeMount", "name"): "DNSLabel",
    ("V1EnvVar", "name"): "EnvVarName",
    # One spelling of a container path, so that kuberl's reserved paths are a prefix test.
    ("V1VolumeMount", "mount_path"): "MountPath",
    # resource.Quantity is int-or-string in the API; the client types it as str.
    ("V1EmptyDirVolumeSource", "size_limit"): "Quantity",
    ("V1VolumeResourceRequirements", "limits"): "dict[str, Quantity]",
    ("V1VolumeResourceRequirements", "requests"): "dict[str, Quantity]",
    ("V1ResourceFieldSelector", "divisor"): "Quantity",
}

HEADER = '''"""Kubernetes types the RLJob embeds, generated from the kubernetes client {version}'s models.

Do not edit: run `.venv/bin/python -m kuberl.operator.codegen.kube_types > operator/api/kube_types.py`
(see kuberl.operator.codegen.kube_types for how and why).
"""

from typing import Annotated, Any, Literal

from pydantic import Field

from kuberl.engine.config import SpecModel

from .kube_grammar import DNSLabel, EnvVarName, LabelKey, MountPath, Quantity, SelectorLabels
'''


def _first_sentence(text: str | None) -> str:
    text = " ".join((text or "").split())
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def _annotation(tp: Any, wanted: list[type]) -> str:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union:
        inner = [a for a in args if a is not type(None)]
        return _annotation(inner[0], wanted) + " | None"
    if origin is typing.Annotated:
        return _annotation(args[0], wanted)
    if origin is list:
        return f"list[{_annotation(args[0], wanted)}]"
    if origin is dict:
        return f"dict[{_annotation(args[0], wanted)}, {_annotation(args[1], wanted)}]"
    if tp is datetime.datetime:
        return "str"  # RFC 3339 text, as JSON carries it
    if tp is Any:
        return "Any"
    if tp in (str, int, bool, float):
        return tp.__name__
    if isinstance(tp, type) and tp.__name__.startswith("V1"):
        wanted.append(tp)
        return tp.__name__[2:]
    raise TypeError(f"no mapping for {tp!r}")


def _class_source(model: type[Any], wanted: list[type]) -> str:
    name = model.__name__
    doc = _first_sentence((model.__doc__ or "").strip().split("\n\n")[0])
    lines = [f"class {name[2:]}(SpecModel):", f'    """{doc}"""', ""]
    for field_name, info in model.model_fields.items():
        alias = model.attribute_map[field_name]
        annotation = OVERRIDES.get((name, field_name)) or _annotation(info.annotation, wanted)
        if not info.is_required() and not annotation.endswith("| None"):
            annotation += " | None"
        default = "" if info.is_required() else "default=None, "
        # No per-field descriptions: four roles embed an Affinity each, and with them the CRD would
        # outgrow what `kubectl apply` can store (tests/test_crd.py); `kubectl explain
        # pod.spec.affinity` documents these fields.
        lines.append(f"    {field_name}: {annotation} = Field({default}alias={alias!r})")
    return "\n".join(lines) + "\n"


def generate() -> str:
    from importlib.metadata import version

    import kubernetes.client.models as models

    sources: dict[str, str] = {}
    uses: dict[str, list[str]] = {}
    wanted = [getattr(models, root) for root in ROOTS]
    while wanted:
        model = wanted.pop(0)
        if model.__name__ not in sources:
            found: list[type] = []
            sources[model.__name__] = _class_source(model, found)
            uses[model.__name__] = sorted({m.__name__ for m in found})
            wanted.extend(found)
    # Each class after the classes it uses (annotations are evaluated as the class is defined).
    ordered: list[str] = []

    def place(name: str) -> None:
        if name not in ordered:
            for used in uses[name]:
                place(used)
            ordered.append(name)

    for name in sorted(sources):
        place(name)
    body = "\n\n".join(sources[name] for name in ordered)
    return HEADER.format(version=version("kubernetes")) + "\n\n" + body


if __name__ == "__main__":
    sys.stdout.write(generate())
