"""Reading manifest files like kubectl: merge keys, Lists, and the bounds on hostile input."""

from __future__ import annotations

import pytest

from kuberl.operator.validation.manifest import ManifestError, read_documents, rljobs_from_text
from kuberl.operator.validation.yaml_reader import MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES, json_problems


def _problem(text: str) -> str:
    with pytest.raises(ManifestError) as caught:
        read_documents(text, "f.yaml")
    [problem] = caught.value.problems
    return str(problem)


def test_merge_keys_merge_and_explicit_keys_override_them() -> None:
    [doc] = read_documents("base: &b {a: 1, b: 2}\nother:\n  <<: *b\n  b: 3\n", "f.yaml")
    assert doc.content["other"] == {"a": 1, "b": 3}


def test_explicit_duplicate_keys_are_still_errors_beside_a_merge() -> None:
    assert "found duplicate key 'b'" in _problem("base: &b {a: 1}\nother:\n  <<: *b\n  b: 3\n  b: 4\n")


def test_a_list_is_read_item_by_item_with_its_labels() -> None:
    text = "apiVersion: v1\nkind: List\nitems:\n- {kind: A}\n- {kind: B}\n---\nkind: C\n"
    docs = read_documents(text, "f.yaml")
    assert [(d.label, d.content["kind"]) for d in docs] == [("document 1, item 0", "A"), ("document 1, item 1", "B"), ("document 2", "C")]
    assert docs[0].start == "f.yaml:1 (document 1, item 0)"


def test_unhashable_key_is_an_error_with_line_and_column() -> None:
    assert _problem("a: 1\nb: {[x, y]: 1}\n").startswith("f.yaml:2:")


def test_alias_expansion_is_counted_before_anything_expands() -> None:
    rows = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"] + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 12)]
    text = "\n".join(rows) + "\n"
    assert len(text) < 2048  # 10^12 strings once expanded
    assert f"expands to more than {MAX_NODES} values" in _problem(text)


def test_aliases_within_the_bound_are_fine() -> None:
    [doc] = read_documents("a: &a [1, 2]\nb: [*a, *a]\n", "f.yaml")
    assert doc.content["b"] == [[1, 2], [1, 2]]


def test_recursive_alias_is_refused() -> None:
    assert "refers to a node that contains it" in _problem("a: &a [1, *a]\n")


def test_nesting_is_bounded_with_the_line() -> None:
    depth = MAX_DEPTH + 1
    message = _problem("x:\n  y: " + "[" * depth + "]" * depth + "\n")
    assert message.startswith("f.yaml:2:") and f"nested more than {MAX_DEPTH} levels deep" in message


def test_deep_nesting_far_past_the_recursion_limit_is_our_error() -> None:
    assert "nested more than" in _problem("x: " + "[" * 100_000 + "]" * 100_000 + "\n")


def test_a_file_past_the_api_servers_request_limit_is_refused() -> None:
    assert "the API server's request limit" in _problem("a: " + "x" * MAX_FILE_BYTES + "\n")


def test_non_printable_character_names_the_line() -> None:
    assert _problem("a: 1\nb: \x07\n").startswith("f.yaml:2: YAML error: character 0x7")


def test_huge_integer_literal_is_our_error() -> None:
    assert "integer too large" in _problem("a: " + "9" * 5000 + "\n")


def test_json_problems_name_every_value_json_cannot_carry() -> None:
    problems = json_problems({"a": [1.0, float("nan")], "b": {"c": float("-inf"), "d": 2**64}, "e": b"x"}, "f")
    assert [p.path for p in problems] == ["a[1]", "b.c", "b.d", "e"]


def test_a_document_of_its_own_names_the_line_where_it_starts() -> None:
    with pytest.raises(ManifestError) as caught:
        rljobs_from_text("apiVersion: v1\nkind: ConfigMap\n---\n- not\n- an object\n", "f.yaml")
    assert [p.source for p in caught.value.problems] == ["f.yaml:4 (document 2)"]
