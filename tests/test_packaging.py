"""The distribution's shape: one `kuberl` namespace over operator/ and engine/, nothing at top level."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import kuberl.engine
import kuberl.operator  # noqa: F401 - binds the same name as the line above; used as kuberl.operator below


def test_packages_come_from_the_repository_folders(repo: Path) -> None:
    import kuberl.client

    assert Path(kuberl.operator.__file__).parent == repo / "operator"
    assert Path(kuberl.engine.__file__).parent == repo / "engine"
    assert Path(kuberl.client.__file__).parent == repo / "client"


def test_operator_is_not_importable_at_top_level(repo: Path, tmp_path: Path) -> None:
    # A fresh interpreter outside the repository gets Python's own operator module.
    code = "import operator, sys; print(operator.__file__); import kuberl.operator; print(kuberl.operator.__name__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    stdlib_file, name = out.stdout.split()
    assert Path(stdlib_file).parent == Path(sysconfig.get_paths()["stdlib"])
    assert name == "kuberl.operator"


def test_every_subpackage_is_listed_in_pyproject(repo: Path) -> None:
    listed = set(tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for top in ("operator", "engine", "client"):
        for init in (repo / top).rglob("__init__.py"):
            rel = init.parent.relative_to(repo).parts
            found.add(".".join(("kuberl", *rel)))
    # All but the tests' harness, which the wheel leaves out (tests/test_dist.py lists the wheel's files).
    assert "kuberl.operator.testing" in found and not any(p.startswith("kuberl.operator.testing") for p in listed)
    shipped = {p for p in found if not p.startswith("kuberl.operator.testing")}
    assert shipped == listed, f"pyproject's [tool.setuptools] packages must list exactly {sorted(shipped)}"


def test_engine_config_imports_without_torch() -> None:
    # The operator image has no torch: the API must not pull it in.
    code = "import sys, kuberl.operator.cli.commands, kuberl.operator.api.crd; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_console_script_runs(kuberl_cli: str) -> None:
    out = subprocess.run([kuberl_cli, "version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("kuberl 0.1.0 (API kuberl.dev/v1alpha1)")


def test_the_operator_never_imports_the_client(repo: Path) -> None:
    """kuberl.client is the user's side: only the job commands' module (loaded by the CLI, not by the operator) uses it."""
    offenders = [
        str(path.relative_to(repo))
        for path in (repo / "operator").rglob("*.py")
        if path.relative_to(repo).as_posix() != "operator/cli/jobs.py"
        and ("kuberl.client" in path.read_text() or "from ..client" in path.read_text())
    ]
    assert offenders == []
    code = (
        "import sys, kuberl.operator.cli.commands, kuberl.operator.control.controller, kuberl.operator.control.reconcile; "
        "assert not [m for m in sys.modules if m.startswith('kuberl.client')], 'kuberl.client imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_engine_never_imports_the_operator(repo: Path) -> None:
    offenders = [
        str(path.relative_to(repo))
        for path in (repo / "engine").rglob("*.py")
        if "kuberl.operator" in path.read_text() or "from ..operator" in path.read_text()
    ]
    assert offenders == []


def test_the_heavy_dependencies_are_installed_compiled_to_bytecode() -> None:
    # With PYTHONDONTWRITEBYTECODE (set on many machines and in both images) nothing writes .pyc at
    # import: without compiled files every rank would compile torch, vLLM and megatron-core anew.
    import importlib.util

    missing = []
    for name in ("torch", "vllm", "megatron.core", "transformers"):
        source = importlib.util.find_spec(name).origin
        if not Path(importlib.util.cache_from_source(source)).is_file():
            missing.append(name)
    assert not missing, f"installed without bytecode: {missing} (scripts/setup.sh installs with --compile-bytecode)"
