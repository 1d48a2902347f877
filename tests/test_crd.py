"""The generated CRD: it matches crds/, it is structural, and it refuses what our parser refuses.

The cluster tier checks the CRD against a real kube-apiserver. Here, without one, the API server's
validation is emulated: unknown-field rejection and defaulting by walking the schema, OpenAPI
checks by jsonschema's Draft 4 validator, and the x-kubernetes-validations rules by cel-python, a
CEL implementation other than the API server's. The tests that use it say so in their names.
"""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import celpy
from celpy import celtypes
import jsonschema
import pytest
import yaml

from kuberl.operator.api.crd import CRD_FILE_NAME, crd_yaml, rljob_crd
from kuberl.operator.validation.manifest import read_documents
from kuberl.operator.testing.corpus import rljob_files

MANIFESTS = Path(__file__).parent / "manifests"
EXAMPLES = rljob_files(Path(__file__).parent.parent / "examples")


def root_schema() -> dict[str, Any]:
    return rljob_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_crd_file_equals_generated(repo: Path) -> None:
    on_disk = (repo / "crds" / CRD_FILE_NAME).read_text()
    assert on_disk == crd_yaml(), f"crds/{CRD_FILE_NAME} is stale: run `kuberl crd > crds/{CRD_FILE_NAME}`"


def test_cli_crd_prints_the_file(repo: Path, kuberl_cli: str) -> None:
    out = subprocess.run([kuberl_cli, "crd"], capture_output=True, text=True, check=True).stdout
    assert out == (repo / "crds" / CRD_FILE_NAME).read_text()


def test_crd_identity_and_columns() -> None:
    crd = rljob_crd()
    names = crd["spec"]["names"]
    assert crd["metadata"]["name"] == "rljobs.kuberl.dev"
    assert (names["kind"], names["shortNames"], names["categories"]) == ("RLJob", ["rlj"], ["kuberl"])
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Phase"] == ".status.phase"
    assert columns["Step"] == ".status.step"
    assert columns["Reward"] == ".status.metrics.rewardMean"
    assert columns["Age"] == ".metadata.creationTimestamp"


def _walk(node: dict[str, Any], path: str = ""):
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}[*]")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[*]")


def test_schema_is_structural() -> None:
    allowed_untyped = ("x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields")
    for path, node in _walk(root_schema()):
        assert "$ref" not in node and "anyOf" not in node or node.get("x-kubernetes-int-or-string"), path
        assert "type" in node or any(node.get(k) for k in allowed_untyped), f"{path} has no type"
        assert node.get("additionalProperties") is not False, path
        for rule in node.get("x-kubernetes-validations", []):
            assert rule["rule"] and rule["message"], path


def test_every_rule_field_path_exists_in_the_schema() -> None:
    for path, node in _walk(root_schema()):
        for rule in node.get("x-kubernetes-validations", []):
            target = node
            for part in rule.get("fieldPath", "").split(".")[1:]:
                assert part in target.get("properties", {}), f"{path}: fieldPath {rule['fieldPath']} is not in the schema"
                target = target["properties"][part]


# --- the API server's validation, emulated ----------------------------------------------------


def _problems_emulated(obj: Any) -> list[tuple[str, str]]:
    """(path, message) pairs for what the API server would refuse in `obj` (see module doc)."""
    schema = root_schema()
    problems: list[tuple[str, str]] = []
    _unknown_fields(schema, obj, "", problems)
    obj = _defaulted(schema, copy.deepcopy(obj))
    validator = jsonschema.Draft4Validator(schema)
    for error in validator.iter_errors(obj):
        problems.append((_path(error.absolute_path), error.message))
    _list_map_keys(schema, obj, "", problems)
    if not problems:
        _cel(schema, obj, "", problems)
    return problems


def _path(parts) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) or not re.fullmatch(r"\w+", str(part)) else (f".{part}" if out else part)
    return out


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _unknown_fields(node: dict[str, Any], obj: Any, path: str, problems: list) -> None:
    if isinstance(obj, dict) and "properties" in node and path != "metadata":  # metadata is the server's
        for key, value in obj.items():
            if key not in node["properties"]:
                problems.append((_join(path, key), "unknown field"))
            else:
                _unknown_fields(node["properties"][key], value, _join(path, key), problems)
    elif isinstance(obj, dict) and isinstance(node.get("additionalProperties"), dict):
        for key, value in obj.items():
            _unknown_fields(node["additionalProperties"], value, f"{path}[{key}]", problems)
    elif isinstance(obj, list) and "items" in node:
        for i, value in enumerate(obj):
            _unknown_fields(node["items"], value, f"{path}[{i}]", problems)


def _list_map_keys(node: dict[str, Any], obj: Any, path: str, problems: list) -> None:
    """x-kubernetes-list-type: map: the API server refuses two items with the same keys ("Duplicate value")."""
    if isinstance(obj, list) and node.get("x-kubernetes-list-type") == "map":
        keys = [tuple(item.get(k) for k in node["x-kubernetes-list-map-keys"]) for item in obj if isinstance(item, dict)]
        if len(set(keys)) != len(keys):
            problems.append((path, "Duplicate value"))
    if isinstance(obj, dict) and "properties" in node:
        for key, value in obj.items():
            if key in node["properties"]:
                _list_map_keys(node["properties"][key], value, _join(path, key), problems)
    elif isinstance(obj, list) and "items" in node:
        for i, value in enumerate(obj):
            _list_map_keys(node["items"], value, f"{path}[{i}]", problems)


def _defaulted(node: dict[str, Any], obj: Any) -> Any:
    if isinstance(obj, dict) and "properties" in node:
        for key, sub in node["properties"].items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                obj[key] = _defaulted(sub, obj[key])
    elif isinstance(obj, list) and "items" in node:
        obj = [_defaulted(node["items"], v) for v in obj]
    elif node.get("type") == "number" and isinstance(obj, int) and not isinstance(obj, bool):
        obj = float(obj)  # the API server's CEL sees a `number` field as a double
    return obj


_CEL = celpy.Environment()


class _Quantity:
    """A value of the API server's CEL quantity library, parsed by the kubernetes client (not by us)."""

    def __init__(self, text: str):
        from kubernetes.utils import parse_quantity

        self.value = parse_quantity(str(text))


def _is_quantity(text) -> celtypes.BoolType:
    try:
        _Quantity(text)
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


# The part of Kubernetes' CEL quantity library that the CRD uses, which cel-python lacks.
_K8S_CEL_FUNCTIONS = {
    "isQuantity": _is_quantity,
    "quantity": _Quantity,
    "isLessThan": lambda a, b: celtypes.BoolType(a.value < b.value),
}


def _cel(node: dict[str, Any], obj: Any, path: str, problems: list) -> None:
    for rule in node.get("x-kubernetes-validations", []):
        if "oldSelf" in rule["rule"]:
            continue  # transition rules apply to updates only
        program = _CEL.program(_CEL.compile(rule["rule"]), functions=_K8S_CEL_FUNCTIONS)
        if not bool(program.evaluate({"self": celpy.json_to_cel(obj)})):
            problems.append((path + rule.get("fieldPath", ""), rule["message"]))
    if isinstance(obj, dict) and "properties" in node:
        for key, value in obj.items():
            if key in node["properties"]:
                _cel(node["properties"][key], value, _join(path, key), problems)
    elif isinstance(obj, list) and "items" in node:
        for i, value in enumerate(obj):
            _cel(node["items"], value, f"{path}[{i}]", problems)


def _document(path: Path) -> Any:
    return read_documents(path.read_text(), str(path))[-1].content


@pytest.mark.parametrize("path", EXAMPLES + sorted((MANIFESTS / "good").glob("*.yaml")), ids=lambda p: p.name)
def test_emulated_api_server_with_cel_python_accepts_good_manifests(path: Path) -> None:
    jobs = [d.content for d in read_documents(path.read_text(), str(path)) if d.content.get("kind") == "RLJob"]
    assert jobs
    for job in jobs:
        assert _problems_emulated(job) == []


def _api_server_cases() -> list[Path]:
    """Bad manifests the CRD judges: not those the API server cannot receive, and not metadata,
    which the API server validates itself (the real API server tests cover those)."""
    cases = []
    for path in sorted((MANIFESTS / "bad").glob("*.yaml")):
        text = path.read_text()
        if not re.search(r"^# api-server: ", text, flags=re.M) and not re.search(r"^# expect-path: metadata", text, flags=re.M):
            cases.append(path)
    return cases


@pytest.mark.parametrize("path", _api_server_cases(), ids=lambda p: p.stem)
def test_emulated_api_server_with_cel_python_refuses_bad_manifests(path: Path) -> None:
    expected = re.search(r"^# expect-path: (.*)$", path.read_text(), flags=re.M).group(1)
    problems = _problems_emulated(_document(path))
    assert problems, "the CRD accepts what our parser refuses"
    # The API server names the field, or for a missing field its parent.
    assert any(expected == where or expected.startswith((where + ".", where + "[")) for where, _ in problems), problems


def test_api_server_exemptions_are_few() -> None:
    # A cluster rule (expect-target: cluster) is the operator's to enforce, by design: tests/cluster/test_operator.py.
    exempt = [
        p.name
        for p in (MANIFESTS / "bad").glob("*.yaml")
        if "# api-server: accepts" in p.read_text() and "# expect-target: cluster" not in p.read_text()
    ]
    assert sorted(exempt) == [
        "advantage-option-unknown.yaml",
        "affinity-selector-label-bad.yaml",
        "dual-clip-at-most-one.yaml",
        "loss-option-not-one-of.yaml",
        "policy-loss-option-mistyped.yaml",
        "reinforce-pp-option-baseline-one-sample.yaml",
        "request-above-limit.yaml",
    ], "a manifest our parser refuses but the CRD accepts needs a good reason"


def test_crd_yaml_is_loadable() -> None:
    assert yaml.safe_load(crd_yaml())["kind"] == "CustomResourceDefinition"


# Kubernetes' own types embedded whole: `kubectl explain pod.spec.<field>` documents their insides, and
# copying every field's description would outgrow what the API server stores for a CRD.
# metadata: the API server refuses a CRD that says anything of it but name and generateName (not even a description).
KUBERNETES_TYPES = ("affinity", "volumes", "volumeMounts", "env", "envFrom", "metadata")


def test_every_field_has_a_description_for_kubectl_explain() -> None:
    missing = []

    def walk(node: dict, path: str) -> None:
        for key, sub in node.get("properties", {}).items():
            if "description" not in sub and key != "metadata":
                missing.append(f"{path}.{key}")
            if key not in KUBERNETES_TYPES:
                walk(sub, f"{path}.{key}")
        if "items" in node:
            walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], f"{path}{{}}")

    walk(root_schema(), "")
    assert not missing, f"fields without a description: {missing}"
