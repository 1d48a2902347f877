"""Shared fixtures. Tests import the installed kuberl package, never the source folders directly."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def kuberl_cli() -> str:
    """The installed `kuberl` console script (the one a user runs)."""
    path = shutil.which("kuberl", path=os.pathsep.join([str(Path(os.sys.executable).parent), os.environ.get("PATH", "")]))
    if path is None:
        pytest.fail("the kuberl console script is not installed: run scripts/setup.sh")
    return path
