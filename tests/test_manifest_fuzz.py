"""Fuzzing manifest validation: whatever a file holds, the outcome is an RLJob or our own error.

Hypothesis mutates the valid manifests (examples/ and tests/manifests/good/): keys deleted, renamed
or added, values swapped for other types, huge or negative numbers, NaN and infinities, unicode,
deep nesting, anchors and aliases, and the YAML text itself cut short or with lines repeated.
Every outcome must be either a parsed job or a ManifestError whose every problem names the file
and a field or a line; any other exception fails the test with the input that raised it.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kuberl.operator.validation.manifest import ManifestError, read_documents, rljobs_from_text

ROOT = Path(__file__).parent.parent
SEEDS = [
    d.content
    for path in sorted((ROOT / "examples").glob("*.yaml")) + sorted((ROOT / "tests" / "manifests" / "good").glob("*.yaml"))
    for d in read_documents(path.read_text(), str(path))
    if isinstance(d.content, dict) and d.content.get("kind") == "RLJob"
]
SOURCE = "fuzz.yaml"
# A problem names the file, and either a field or where in the file (file:line:column, file:line);
# only a problem of the whole file names the file alone.
LOCATED = re.compile(rf"^{re.escape(SOURCE)}:\d+(:\d+)?( \(.+\))?$")
WHOLE_FILE = ("no RLJob found", "larger than")

_tricky_text = st.sampled_from(
    [
        "",
        " ",
        "-1",
        "0",
        "1e999",
        "500m",
        "-4Gi",
        "4GB",
        "s3://bucket/x",
        "https://x/y.py",
        "NaN",
        "~",
        "null",
        "yes",
        "<<",
        "*",
        "&a",
        "a" * 300,
        "ÄÖÜ",
        "名前",
        "🧮",
        "\u202e",
        "x/y/z",
        "-bad",
        "Bad_Name",
        "a" * 64,
    ]
)
_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    _tricky_text,
)
_value = st.recursive(
    _leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12) | _tricky_text, inner, max_size=4),
    max_leaves=12,
)


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _paths(value, (*prefix, i))
    return out


def _get(node: Any, path: tuple) -> Any:
    for part in path:
        node = node[part]
    return node


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower()


@st.composite
def mutated_documents(draw: st.DrawFn) -> Any:
    doc = copy.deepcopy(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(doc)))
        target = _get(doc, path)
        op = draw(st.sampled_from(["replace", "delete", "rename", "add", "deep", "snake"]))
        if not path:
            if op == "replace":
                doc = draw(_value)
            continue
        parent, last = _get(doc, path[:-1]), path[-1]
        if op == "replace":
            parent[last] = draw(_value)
        elif op == "deep":
            parent[last] = _nested(draw(st.integers(1, 120)))
        elif op == "delete":
            del parent[last]
        elif op in ("rename", "snake") and isinstance(parent, dict):
            new = _snake(str(last)) if op == "snake" else draw(st.text(max_size=12) | _tricky_text)
            parent[new] = parent.pop(last)
        elif op == "add" and isinstance(target, dict):
            target[draw(st.text(max_size=12) | _tricky_text)] = draw(_value)
        elif op == "add" and isinstance(target, list):
            target.append(draw(_value))
        if not isinstance(doc, (dict, list)):
            break
    return doc


@st.composite
def manifest_texts(draw: st.DrawFn) -> str:
    text = yaml.safe_dump(draw(mutated_documents()), sort_keys=False, allow_unicode=draw(st.booleans()))
    lines = text.splitlines(keepends=True)
    edit = draw(st.sampled_from(["none", "none", "cut", "repeat-line", "alias", "bomb", "deep-text", "other-kind-first", "char"]))
    if edit == "cut" and text:
        text = text[: draw(st.integers(0, len(text)))]
    elif edit == "repeat-line" and lines:
        i = draw(st.integers(0, len(lines) - 1))
        text = "".join(lines[: i + 1] + [lines[i]] + lines[i + 1 :])
    elif edit == "alias":
        text = "x-anchor: &a {k: [1, 2]}\n" + text + "x-alias: *a\nx-merge: {<<: *a, k: 3}\n"
    elif edit == "bomb":
        width, depth = draw(st.integers(2, 10)), draw(st.integers(2, 12))
        rows = ["a0: &a0 [x, x]"] + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, depth)]
        text = "\n".join(rows) + "\n" + text
    elif edit == "deep-text":
        n = draw(st.integers(50, 3000))
        text += f"x-deep: {'[' * n}{']' * n}\n"
    elif edit == "other-kind-first":
        text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\n" + text
    elif edit == "char" and text:
        i = draw(st.integers(0, len(text) - 1))
        text = text[:i] + draw(st.characters()) + text[i + 1 :]
    return text


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(manifest_texts())
def test_every_input_is_a_job_or_our_own_error_naming_file_and_field_or_line(text: str) -> None:
    try:
        jobs = rljobs_from_text(text, SOURCE)
    except ManifestError as exc:
        assert exc.problems
        for problem in exc.problems:
            assert problem.message
            assert problem.source.startswith(SOURCE), problem
            assert problem.path or LOCATED.match(problem.source) or problem.message.startswith(WHOLE_FILE), problem
        return
    assert jobs and all(job.kind == "RLJob" for job in jobs)
