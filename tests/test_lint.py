"""The linter and the formatter over the whole tree (pyproject.toml's [tool.ruff]: undefined and unused names,
shadowing imports, syntax errors; one layout), as part of the suite, so CI runs them with the tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--output-format", "concise", "--no-cache", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_would_change_nothing() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "."], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, "run `.venv/bin/ruff format .` and commit what it changes:\n" + result.stdout + result.stderr


def test_ruff_would_find_an_unused_import(tmp_path: Path) -> None:
    # The rules are on: the same configuration refuses a file with an unused import and an undefined name.
    (tmp_path / "bad.py").write_text("import os\n\n\ndef f():\n    return undefined_name\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--output-format",
            "concise",
            "--no-cache",
            "--config",
            str(REPO / "pyproject.toml"),
            str(tmp_path / "bad.py"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and "F401" in result.stdout and "F821" in result.stdout, result.stdout


def test_ruff_format_would_relayout_a_file(tmp_path: Path) -> None:
    (tmp_path / "ugly.py").write_text("x = {  'a':1 }\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "format",
            "--check",
            "--no-cache",
            "--config",
            str(REPO / "pyproject.toml"),
            str(tmp_path / "ugly.py"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and "would be reformatted" in result.stdout, result.stdout
