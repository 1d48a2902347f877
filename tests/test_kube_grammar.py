"""Kubernetes' grammars: our quantity parser against the kubernetes client's, names, and the generated types."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kuberl.operator.codegen import kube_types as kube_types_codegen
from kuberl.operator.api import RLJobSpec
from kuberl.operator.api.kube_grammar import (
    generate_name_errors,
    image_errors,
    label_value_errors,
    parse_quantity,
    qualified_name_errors,
)
from kuberl.operator.api.crd import crd_yaml

REPO = Path(__file__).parent.parent

_number = st.from_regex(r"\A[+-]?([0-9]{1,6}(\.[0-9]{0,3})?|\.[0-9]{1,3})\Z")
_suffix = st.sampled_from(["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E", "e3", "E-2", "e+1"])


@settings(max_examples=300, deadline=None)
@given(_number, _suffix)
def test_quantities_parse_as_the_kubernetes_client_parses_them(number: str, suffix: str) -> None:
    from kubernetes.utils import parse_quantity as client_parse_quantity

    text = number + suffix
    assert parse_quantity(text) == client_parse_quantity(text), text


@pytest.mark.parametrize("text", ["4GB", "1.2.3", "Gi", "", "--1", "1e", "0x10"])
def test_malformed_quantities_are_refused_like_the_client_does(text: str) -> None:
    from kubernetes.utils import parse_quantity as client_parse_quantity

    with pytest.raises(ValueError):
        client_parse_quantity(text)
    with pytest.raises(ValueError):
        parse_quantity(text)


def test_a_space_is_refused_as_the_api_server_refuses_it() -> None:
    # The Python client strips it; Go's resource.ParseQuantity, which the API server runs, does not.
    with pytest.raises(ValueError):
        parse_quantity("1 Gi")


def test_integer_quantities_are_exact() -> None:
    assert parse_quantity(2**62) == Decimal(2**62)


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("team", True),
        ("kuberl.dev/pool", True),
        ("a.b-c_d", True),
        ("x" * 63, True),
        ("x" * 64, False),
        ("-team", False),
        ("team name", False),
        ("/team", False),
        ("Example.com/team", False),
        ("a/b/c", False),
        ("example.com/", False),
        ("a" * 254 + "/b", False),
    ],
)
def test_label_keys_follow_apimachinery(key: str, ok: bool) -> None:
    assert (qualified_name_errors(key) == []) is ok, qualified_name_errors(key)


@pytest.mark.parametrize(("value", "ok"), [("", True), ("v1.2", True), ("a_b-c", True), ("a b", False), ("-a", False), ("x" * 64, False)])
def test_label_values_follow_apimachinery(value: str, ok: bool) -> None:
    assert (label_value_errors(value) == []) is ok


@pytest.mark.parametrize(("prefix", "ok"), [("sweep-", True), ("a", True), ("Sweep-", False), ("1sweep-", False), ("-", False)])
def test_generate_name_must_make_a_valid_name(prefix: str, ok: bool) -> None:
    assert (generate_name_errors(prefix) == []) is ok


@pytest.mark.parametrize(
    ("image", "ok"),
    [
        ("ubuntu", True),
        ("ghcr.io/kuberl/trainer:0.1.0", True),
        ("localhost:5000/a/b@sha256:" + "a" * 64, True),
        ("Ubuntu", False),
        ("ghcr.io/a/b:bad tag", False),
        ("a@sha256:abc", False),
        ("a:" + "t" * 129, False),
        ("", False),
    ],
)
def test_image_references_follow_distribution_reference(image: str, ok: bool) -> None:
    assert (image_errors(image) == []) is ok, image_errors(image)


def test_generated_kube_types_match_the_kubernetes_client(repo: Path) -> None:
    on_disk = (repo / "operator" / "api" / "kube_types.py").read_text()
    assert on_disk == kube_types_codegen.generate(), (
        "operator/api/kube_types.py is stale: run .venv/bin/python -m kuberl.operator.codegen.kube_types > operator/api/kube_types.py"
    )


def test_crd_fits_what_kubectl_apply_can_store() -> None:
    # Client-side `kubectl apply` keeps the whole object in an annotation, and an object's annotations hold at
    # most 256 KiB: 16 KiB of that is left for the other annotations and for the next fields.
    crd = yaml.safe_load(crd_yaml())
    assert len(json.dumps(crd, separators=(",", ":"))) < 240 * 1024


def _float_fields(model: Any, seen: set) -> list[tuple[str, Any]]:
    out = []
    if model in seen:
        return out
    seen.add(model)
    for name, field in model.model_fields.items():
        annotation = field.annotation
        args = getattr(annotation, "__args__", ())
        if annotation is float or float in args:
            out.append((f"{model.__name__}.{name}", field))
        for sub in (annotation, *args):
            if isinstance(sub, type) and hasattr(sub, "model_fields"):
                out += _float_fields(sub, seen)
    return out


def test_every_bounded_float_says_in_its_description_why() -> None:
    fields = _float_fields(RLJobSpec, set())
    assert len(fields) > 15
    bounded = [(name, f) for name, f in fields if any(type(m).__name__ in ("Ge", "Gt", "Le", "Lt") for m in f.metadata)]
    missing = [name for name, f in bounded if not f.description]
    assert missing == [], "a bounded number must give its reason in its description"
