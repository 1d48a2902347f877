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
