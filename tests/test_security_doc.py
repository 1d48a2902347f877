"""The threat model (docs/security.md) names, for each defence, the test that attacks it: every test it
names exists, so the page cannot go on promising a test that was renamed or removed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

# `tests/agents/test_sandbox_escapes.py` or `tests/test_x.py::test_name`
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`")


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def references(page: str) -> list[tuple[str, str | None]]:
    return [(m.group(1), m.group(2)) for m in REFERENCE.finditer(page)]


def test_the_reference_pattern_finds_files_and_tests() -> None:
    text = "a `tests/agents/test_tools.py` and `tests/cluster/test_helm.py::test_chart` but not `engine/x.py`"
    assert references(text) == [("tests/agents/test_tools.py", None), ("tests/cluster/test_helm.py", "test_chart")]


def test_every_test_the_threat_model_names_exists(repo: Path) -> None:
    page = (repo / "docs" / "security.md").read_text()
    named = references(page)
    assert len(named) >= 5, "the threat model names no tests: each defence names the test that attacks it"
    missing = []
    for file, test in named:
        path = repo / file
        if not path.is_file():
            missing.append(file)
        elif test is not None and test not in _test_names(path):
            missing.append(f"{file}::{test}")
    assert not missing, f"docs/security.md names tests that do not exist: {missing}"
