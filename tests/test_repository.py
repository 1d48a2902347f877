"""Promises the repository makes to a newcomer: the README's commands exist and CI runs them."""

from __future__ import annotations

import re
from pathlib import Path


def test_ci_runs_the_readme_test_command(repo: Path) -> None:
    readme = (repo / "README.md").read_text()
    assert "```sh\nmake test\n```" in readme
    ci = (repo / ".ci" / "run").read_text()
    assert re.search(r"^\S*\s*make test$", ci, flags=re.M), ".ci/run must call the README's test command"


def test_makefile_has_the_readme_targets(repo: Path) -> None:
    makefile = (repo / "Makefile").read_text()
    for target in ("setup", "test", "crd", "lock"):
        assert re.search(rf"^{target}:", makefile, flags=re.M), target


def test_design_card_layout_exists(repo: Path) -> None:
    for name in ("operator", "engine", "crds", "helm", "trainer_image", "tests", "examples", "bench"):
        assert (repo / name).is_dir(), name
    for name in ("pyproject.toml", "README.md", "Dockerfile"):
        assert (repo / name).is_file(), name


def test_every_subprocess_of_the_test_harness_is_bounded_in_time(repo: Path) -> None:
    """A hung helper (a probe, `ip`, a build script) must fail its test, not stall the run until pytest-timeout.
    Every subprocess.run / check_output call of the harness (daemons, namespaces, builds) and of the cluster and node
    tiers names a timeout; the unit tiers' quick CLI calls are left to pytest-timeout."""
    import ast

    files = [
        *(repo / "operator" / "testing").rglob("*.py"),
        *(repo / "tests" / "cluster").rglob("*.py"),
        *(repo / "tests" / "node").rglob("*.py"),
        repo / "tests" / "conftest.py",
    ]
    unbounded = []
    for path in files:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("run", "check_output")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "subprocess"
                and not any(k.arg == "timeout" for k in node.keywords)
            ):
                unbounded.append(f"{path.relative_to(repo)}:{node.lineno}")
    assert not unbounded, f"subprocess calls without a timeout: {unbounded}"
