"""The type checker over the packages (pyproject.toml's [tool.mypy]), as part of the suite, so CI runs it with the tests.

mypy runs from typecheck/, whose kuberl/ maps engine/, operator/ and client/ onto the kuberl namespace as
[tool.setuptools]'s package-dir does; an error is shown with its file's path in the repository."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TYPECHECK = REPO / "typecheck"
# Outside the checkout, so a fresh clone on a machine that ran the suite before starts warm: mypy keeps a
# module's entry while the file's hash matches, whatever its mtime. Per mypy version (its cache format).
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kuberl" / "mypy"


def _mypy(*args: str) -> subprocess.CompletedProcess[str]:
    from mypy.version import __version__

    return subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(CACHE / __version__), *args],
        cwd=TYPECHECK,
        capture_output=True,
        text=True,
        timeout=1500,
    )


def _repository_paths(output: str) -> str:
    # typecheck/kuberl/engine/x.py is engine/x.py
    return re.sub(r"^kuberl/", "", output, flags=re.MULTILINE)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_mypy_finds_nothing() -> None:
    # A cold run reads torch's and pydantic's types too (about a minute on 2 cores); the cache makes
    # the next run seconds.
    result = _mypy()
    assert result.returncode == 0, _repository_paths(result.stdout) + result.stderr


def test_mypy_maps_the_packages_and_keeps_python_operator(tmp_path: Path) -> None:
    # The same configuration, on a snippet instead of the packages: kuberl.client resolves to client/,
    # `operator` is Python's module (not the repository's operator/), and a wrong type is refused.
    config = (REPO / "pyproject.toml").read_text()
    start = config.index("\n[tool.mypy]\n")
    line = config.index("\npackages = ", start)
    config = config[:line] + config[config.index("\n", line + 1) :]  # [tool.mypy]'s packages: the snippet instead
    (tmp_path / "pyproject.toml").write_text(config)
    snippet = (
        "import operator\n"
        "from kuberl.client.errors import ClientError\n"
        "total: int = operator.add(1, 2)\n"
        "error: ClientError = ClientError('x')\n"
        "wrong: str = 1\n"
    )
    result = _mypy("--config-file", str(tmp_path / "pyproject.toml"), "-c", snippet)
    lines = [line for line in result.stdout.splitlines() if line.startswith("<string>:") and ": error:" in line]
    assert len(lines) == 1 and lines[0].startswith("<string>:5:") and "[assignment]" in lines[0], result.stdout + result.stderr
